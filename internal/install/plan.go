package install

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"sort"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/strategicpatch"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"
)

// GeneratedName is the name of the ConfigMap with data and binary made
// from the ConfigMap source: source's name, then a hash of the content.
func GeneratedName(source string, data map[string]string, binary map[string][]byte) string {
	return source + "-k8s-event-" + contentHash(data, binary)[:10]
}

// contentHash is a hash of a ConfigMap's data and binaryData.
func contentHash(data map[string]string, binary map[string][]byte) string {
	keys := make([]string, 0, len(data)+len(binary))
	for k := range data {
		keys = append(keys, k)
	}
	for k := range binary {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	h := sha256.New()
	for _, k := range keys {
		if v, ok := data[k]; ok {
			fmt.Fprintf(h, "%d:%s%d:%s", len(k), k, len(v), v)
		} else {
			// binaryData keys are told apart from data keys of the same
			// content; a ConfigMap cannot have one key in both.
			fmt.Fprintf(h, "b%d:%s%d:%s", len(k), k, len(binary[k]), binary[k])
		}
	}
	return hex.EncodeToString(h.Sum(nil))
}

// installPlan is what an install changes, worked out before anything is.
type installPlan struct {
	d        *appsv1.Deployment
	t        *target
	gen      *corev1.ConfigMap
	genThere bool
	ann      string
	rbac     []rbacStep
	patch    *patch
	strategy *appsv1.DeploymentStrategy // temporary, for the rollout; nil: the operator's
	prunes   []string
}

// planInstall works out what the install changes, and refuses what it
// must not do.
func (r *run) planInstall(ctx context.Context, c kubernetes.Interface) (*installPlan, error) {
	o := r.o
	d, err := findDeployment(ctx, c, o)
	if err != nil {
		return nil, err
	}
	t, err := inspect(d, o)
	if err != nil {
		return nil, err
	}
	ns := d.Namespace
	r.res.Deployment = ns + "/" + d.Name
	var refuse []string
	if reasons := otherOwners(d, t); len(reasons) > 0 {
		if !o.Force {
			refuse = append(refuse, reasons...)
		}
		for _, why := range reasons {
			if o.Force {
				r.warn("--force: " + why)
			}
		}
	}
	if d.Spec.Paused {
		refuse = append(refuse, fmt.Sprintf("deployment %s/%s is paused: its pods would not roll to what install sets; kubectl -n %s rollout resume deployment/%s first", ns, d.Name, ns, d.Name))
	}
	orig := t.current()
	r.res.CoreDNSBefore = release(orig.Image)
	if o.Image == "" {
		return nil, fmt.Errorf("%w: deployment %s/%s runs %s; name the image of k8s_event on that release (%s)", ErrNoImage, ns, d.Name, releaseOf(orig.Image), buildHint(orig.Image))
	}
	r.res.CoreDNSAfter = release(o.Image)
	if before, after := r.res.CoreDNSBefore, r.res.CoreDNSAfter; before != after || before == "unknown" {
		why := fmt.Sprintf("image %s runs %s and deployment %s/%s %s: the install would change the CoreDNS release too (CoreDNS %s -> %s)", o.Image, releaseOf(o.Image), ns, d.Name, releaseOf(orig.Image), before, after)
		if before != "unknown" && after != "unknown" && !o.Force {
			refuse = append(refuse, why+"; name the image of k8s_event on the release it runs ("+buildHint(orig.Image)+"), or --force to change the release with it")
		} else {
			r.warn(why)
		}
	}
	src, err := c.CoreV1().ConfigMaps(ns).Get(ctx, orig.Volume.ConfigMap.Name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("the Corefile's ConfigMap: %w", err)
	}
	text, ok := src.Data[t.key]
	if !ok {
		return nil, fmt.Errorf("ConfigMap %s/%s has no key %q, which the Deployment reads as its Corefile", ns, src.Name, t.key)
	}
	ctr := d.Spec.Template.Spec.Containers[t.container]
	if t.rec == nil && HasPlugins(text) && len(notOurs(ctr.Env)) == len(ctr.Env)-len(Env) {
		return nil, &RefusedError{[]string{fmt.Sprintf("deployment %s/%s runs k8s_event already, set up by other means (its Corefile, configmap %s, has k8s_event and its container the downward-API variables; image %s): install would take that image for the stock one; change it where it was set up (for example the kustomize component deploy/k8s_event/component)", ns, d.Name, src.Name, ctr.Image)}}
	}
	mounted := func(key string) bool {
		items := orig.Volume.ConfigMap.Items
		return len(items) == 0 || slices.ContainsFunc(items, func(it corev1.KeyToPath) bool { return it.Key == key })
	}
	if _, ok := src.Data["NodeHosts"]; ok && mounted("NodeHosts") {
		why := fmt.Sprintf("ConfigMap %s/%s has the key NodeHosts, which k3s rewrites as nodes come and go: the pods would read a copy made now, which goes stale (status tells when it has)", ns, src.Name)
		if !o.Force {
			refuse = append(refuse, why+"; on k3s, disable the packaged CoreDNS (--disable coredns) and run your own")
		} else {
			r.warn("--force: " + why)
		}
	}
	corefile, _, err := AddPlugins(text, o.Options)
	if err != nil {
		return nil, fmt.Errorf("ConfigMap %s/%s, key %s: %w", ns, src.Name, t.key, err)
	}
	if err := CheckCorefile(corefile); err != nil {
		return nil, fmt.Errorf("ConfigMap %s/%s, key %s: the Corefile made from it would not load: %w", ns, src.Name, t.key, err)
	}
	data := map[string]string{}
	for k, v := range src.Data {
		data[k] = v
	}
	data[t.key] = corefile
	var binary map[string][]byte
	if len(src.BinaryData) > 0 {
		binary = map[string][]byte{}
		for k, v := range src.BinaryData {
			binary[k] = slices.Clone(v)
		}
	}
	for _, it := range orig.Volume.ConfigMap.Items {
		_, inData := data[it.Key]
		_, inBinary := binary[it.Key]
		if !inData && !inBinary {
			return nil, fmt.Errorf("the volume %s lists key %q, which ConfigMap %s/%s has in neither data nor binaryData: the pods could not mount it", orig.Volume.Name, it.Key, ns, src.Name)
		}
	}
	r.res.Keys = nil
	keys := make([]string, 0, len(data)+len(binary))
	for k := range data {
		keys = append(keys, k)
	}
	for k := range binary {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		var what string
		switch v, inData := data[k]; {
		case k == t.key:
			what = "the Corefile, with kubeapi and k8s_event"
		case inData:
			what = fmt.Sprintf("copied (%d bytes)", len(v))
		default:
			what = fmt.Sprintf("copied from binaryData (%d bytes)", len(binary[k]))
		}
		if !mounted(k) {
			what += ", not mounted (the volume's items leave it out)"
		}
		r.res.Keys = append(r.res.Keys, k+": "+what)
	}
	gen := &corev1.ConfigMap{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"},
		ObjectMeta: metav1.ObjectMeta{
			Name:      GeneratedName(src.Name, data, binary),
			Namespace: ns,
			Labels:    map[string]string{DeploymentLabel: d.Name, managedByLabel: FieldManager},
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: "apps/v1", Kind: "Deployment", Name: d.Name, UID: d.UID,
			}},
		},
		Data:       data,
		BinaryData: binary,
	}

	rec := record{Image: o.Image, ConfigMap: gen.Name, Source: contentHash(src.Data, src.BinaryData), Original: orig}
	ann, err := json.Marshal(rec)
	if err != nil {
		return nil, err
	}
	want := d.DeepCopy()
	tmpl := &want.Spec.Template
	if tmpl.Annotations == nil {
		tmpl.Annotations = map[string]string{}
	}
	tmpl.Annotations[Annotation] = string(ann)
	wc := &tmpl.Spec.Containers[t.container]
	wc.Image = o.Image
	wc.Env = nil
	for _, e := range orig.Env {
		if !isOurEnv(e.Name) {
			wc.Env = append(wc.Env, e)
		}
	}
	wc.Env = append(wc.Env, Env...)
	vol := orig.Volume.DeepCopy()
	vol.ConfigMap.Name = gen.Name
	tmpl.Spec.Volumes[t.volume] = *vol

	p := &installPlan{d: d, t: t, gen: gen, ann: string(ann)}
	r.res.ImageBefore, r.res.ImageAfter = ctr.Image, o.Image
	if equality.Semantic.DeepEqual(d.Spec.Template, want.Spec.Template) {
		r.res.Rollout = "none: the Deployment has k8s_event already"
	} else {
		tmp, avail := safeRollout(d)
		r.res.Rollout = avail
		if tmp != nil && o.Wait <= 0 {
			why := fmt.Sprintf("the rollout could take the Ready pods below their count (%s), and with --timeout 0 install does not wait, so it could not put back a temporary strategy", avail)
			if !o.Force {
				refuse = append(refuse, why+": give a --timeout, or --force to roll with the Deployment's own strategy")
			} else {
				r.warn("--force: " + why)
			}
			tmp = nil
			r.res.Rollout = "with the Deployment's own strategy (--force)"
		}
		if tmp != nil {
			want.Spec.Strategy = *tmp
			p.strategy = tmp
		}
	}
	if len(refuse) > 0 {
		return nil, &RefusedError{refuse}
	}

	sa := d.Spec.Template.Spec.ServiceAccountName
	if sa == "" {
		sa = "default"
	}
	role, binding := rbacFor(d, sa)
	if p.rbac, err = planRBAC(ctx, c, role, binding, d.Name); err != nil {
		return nil, err
	}
	if p.patch, err = deploymentPatch(d, want); err != nil {
		return nil, err
	}
	switch have, err := c.CoreV1().ConfigMaps(ns).Get(ctx, gen.Name, metav1.GetOptions{}); {
	case err == nil && (!ours(have.ObjectMeta, d.Name) || !equalJSON(have.Data, gen.Data) || !equalJSON(have.BinaryData, gen.BinaryData)):
		return nil, &RefusedError{[]string{fmt.Sprintf("configmap %s/%s is there and is not what install would write (its labels or its content differ): the pods would read it; delete it, or rename it, and run install again", ns, gen.Name)}}
	case err == nil:
		p.genThere = true
	case !apierrors.IsNotFound(err):
		return nil, err
	}
	if p.prunes, err = unusedConfigMaps(ctx, c, d, gen.Name); err != nil {
		return nil, err
	}
	return p, nil
}

func equalJSON(a, b any) bool {
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	return string(ja) == string(jb)
}

type patch struct {
	body    []byte // with the resourceVersion it applies to
	display []byte // YAML, without it
}

// deploymentPatch is the strategic merge patch from have to want, or nil
// when they are the same. It carries have's resourceVersion, so that it
// applies only to the object it was made from.
func deploymentPatch(have, want *appsv1.Deployment) (*patch, error) {
	a, err := json.Marshal(have)
	if err != nil {
		return nil, err
	}
	b, err := json.Marshal(want)
	if err != nil {
		return nil, err
	}
	p, err := strategicpatch.CreateTwoWayMergePatch(a, b, appsv1.Deployment{})
	if err != nil {
		return nil, err
	}
	if string(p) == "{}" {
		return nil, nil
	}
	display, err := yaml.JSONToYAML(p)
	if err != nil {
		return nil, err
	}
	var m map[string]any
	if err := json.Unmarshal(p, &m); err != nil {
		return nil, err
	}
	meta, _ := m["metadata"].(map[string]any)
	if meta == nil {
		meta = map[string]any{}
		m["metadata"] = meta
	}
	meta["resourceVersion"] = have.ResourceVersion
	body, err := json.Marshal(m)
	if err != nil {
		return nil, err
	}
	return &patch{body: body, display: display}, nil
}
