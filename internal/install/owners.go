package install

import (
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// otherOwners says who else keeps the Deployment as they want it, and so
// would put back, or conflict with, what an install changes: each reason
// with the path that fits.
func otherOwners(w workload, t *target, l *layout) []string {
	var reasons []string
	ref := ref(w)
	d := w.meta()
	if rel := d.Annotations["meta.helm.sh/release-name"]; rel != "" || d.Labels["app.kubernetes.io/managed-by"] == "Helm" {
		if rel == "" {
			rel = d.Labels["app.kubernetes.io/instance"]
		}
		reasons = append(reasons, fmt.Sprintf("%s belongs to the helm release %q (app.kubernetes.io/managed-by: Helm): the next helm upgrade puts back the chart's image and Corefile, and helm 4, which applies server-side, stops on a conflict; set it in the chart's values instead: image.repository and image.tag, k8s_event in servers[].plugins, the four downward-API variables in env (chart 1.36.0 or later), and an events Role and RoleBinding from outside the chart", ref, rel))
	}
	if key := withPrefix(*d, "argocd.argoproj.io/"); key != "" {
		reasons = append(reasons, fmt.Sprintf("%s is synced by Argo CD (%s): a sync puts back its image and Corefile; change the Application's source instead, for example with the kustomize component deploy/k8s_event/component", ref, key))
	}
	for _, p := range []string{"kustomize.toolkit.fluxcd.io/", "helm.toolkit.fluxcd.io/"} {
		if key := withPrefix(*d, p); key != "" {
			reasons = append(reasons, fmt.Sprintf("%s is reconciled by Flux (%s): the next reconciliation puts back its image and Corefile; change the source Flux applies instead, for example with the kustomize component deploy/k8s_event/component", ref, key))
		}
	}
	if key := withPrefix(*d, "objectset.rio.cattle.io/"); key != "" {
		reasons = append(reasons, fmt.Sprintf("%s is applied by the k3s (or RKE2) deploy controller (%s), which puts back its manifest; on k3s, disable the packaged CoreDNS (--disable coredns) and run your own", ref, key))
	}
	if held := lastApplied(w, t); len(held) > 0 {
		if who := applyingController(d); who != "" {
			reasons = append(reasons, fmt.Sprintf("%s is applied client-side by %s, and its last-applied configuration holds %s: the next sync puts back what install sets; change the Application's source instead, for example with the kustomize component deploy/k8s_event/component", ref, who, strings.Join(held, " and ")))
		}
	}
	if t != nil {
		ctr := w.template().Spec.Containers[t.container].Name
		vol := w.template().Spec.Volumes[t.volume].Name
		for _, m := range d.ManagedFields {
			if m.Operation != metav1.ManagedFieldsOperationApply || m.Manager == FieldManager || m.FieldsV1 == nil {
				continue
			}
			var owned []string
			if ownsField(m.FieldsV1.Raw, "f:spec", "f:template", "f:spec", "f:containers", fmt.Sprintf(`k:{"name":%q}`, ctr), "f:image") {
				owned = append(owned, fmt.Sprintf(".spec.template.spec.containers[name=%q].image", ctr))
			}
			if ownsField(m.FieldsV1.Raw, "f:spec", "f:template", "f:spec", "f:volumes", fmt.Sprintf(`k:{"name":%q}`, vol), "f:configMap", "f:name") {
				owned = append(owned, fmt.Sprintf(".spec.template.spec.volumes[name=%q].configMap.name", vol))
			}
			if len(owned) > 0 {
				reasons = append(reasons, fmt.Sprintf("%s is applied server-side by field manager %q, which owns %s: its next apply conflicts with or puts back what install sets; change it in what %s applies", ref, m.Manager, strings.Join(owned, " and "), m.Manager))
			}
		}
	}
	return reasons
}

// withPrefix is the first label or annotation key of m with prefix p.
func withPrefix(m metav1.ObjectMeta, p string) string {
	var keys []string
	for k := range m.Labels {
		if strings.HasPrefix(k, p) {
			keys = append(keys, k)
		}
	}
	for k := range m.Annotations {
		if strings.HasPrefix(k, p) {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	if len(keys) == 0 {
		return ""
	}
	return keys[0]
}

// ownsField reports whether the managedFields set raw holds the path.
func ownsField(raw []byte, path ...string) bool {
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		return false
	}
	for i, p := range path {
		next, ok := m[p]
		if !ok {
			return false
		}
		if i == len(path)-1 {
			return true
		}
		if m, ok = next.(map[string]any); !ok {
			return false
		}
	}
	return false
}

// changedBy names who last set the fields install sets, other than install.
func changedBy(w workload, t *target) string {
	d := w.meta()
	spec := &w.template().Spec
	if t.container >= len(spec.Containers) {
		return ""
	}
	ctr := spec.Containers[t.container].Name
	var who []string
	for _, m := range d.ManagedFields {
		if m.Manager == FieldManager || m.FieldsV1 == nil {
			continue
		}
		if ownsField(m.FieldsV1.Raw, "f:spec", "f:template", "f:spec", "f:containers", fmt.Sprintf(`k:{"name":%q}`, ctr), "f:image") {
			w := fmt.Sprintf("field manager %q (%s", m.Manager, m.Operation)
			if m.Time != nil {
				w += " at " + m.Time.UTC().Format(time.RFC3339)
			}
			who = append(who, w+")")
		}
	}
	if len(who) == 0 {
		return ""
	}
	return ", by " + strings.Join(who, " or ")
}

// lastApplied names the fields install sets that the Deployment's
// last-applied configuration (kubectl apply's, client-side) holds: the
// next apply of that configuration puts them back.
func lastApplied(w workload, t *target) []string {
	raw := w.meta().Annotations[corev1.LastAppliedConfigAnnotation]
	if raw == "" || t == nil {
		return nil
	}
	applied, ok := lastAppliedTemplate(raw)
	if !ok {
		return nil
	}
	ctr := w.template().Spec.Containers[t.container].Name
	vol := w.template().Spec.Volumes[t.volume].Name
	spec := applied.Spec
	var held []string
	if slices.ContainsFunc(spec.Containers, func(c corev1.Container) bool { return c.Name == ctr && c.Image != "" }) {
		held = append(held, "the image")
	}
	if slices.ContainsFunc(spec.Volumes, func(v corev1.Volume) bool { return v.Name == vol && v.ConfigMap != nil && v.ConfigMap.Name != "" }) {
		held = append(held, "the config volume")
	}
	return held
}

// applyingController names the controller that keeps applying the
// Deployment client-side: Argo CD, by an argocd-* field manager or its
// tracking label, or "" for none known.
func applyingController(d *metav1.ObjectMeta) string {
	for _, m := range d.ManagedFields {
		if strings.HasPrefix(m.Manager, "argocd") {
			return fmt.Sprintf("Argo CD (field manager %q)", m.Manager)
		}
	}
	if app, ok := d.Labels["app.kubernetes.io/instance"]; ok && d.Labels["app.kubernetes.io/managed-by"] != "Helm" {
		return fmt.Sprintf("Argo CD (its tracking label app.kubernetes.io/instance: %s)", app)
	}
	return ""
}
