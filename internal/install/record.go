package install

import (
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
)

// Env is what k8s_event reads from the downward API.
var Env = []corev1.EnvVar{
	fieldEnv("COREDNS_POD_NAME", "metadata.name"),
	fieldEnv("COREDNS_NAMESPACE", "metadata.namespace"),
	fieldEnv("COREDNS_POD_UID", "metadata.uid"),
	fieldEnv("COREDNS_NODE_NAME", "spec.nodeName"),
}

func fieldEnv(name, field string) corev1.EnvVar {
	return corev1.EnvVar{Name: name, ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: field}}}
}

func isOurEnv(name string) bool {
	return slices.ContainsFunc(Env, func(e corev1.EnvVar) bool { return e.Name == name })
}

// record is the value of Annotation: what the install set, and what was
// there before.
type record struct {
	// Image, ConfigMap are what the install set.
	Image     string `json:"image"`
	ConfigMap string `json:"configMap"`
	// Source is a hash of the operator's ConfigMap (its data and
	// binaryData) that ConfigMap was made from: status tells when it
	// changed since.
	Source string `json:"source,omitempty"`
	// Original is what they replaced.
	Original original `json:"original"`
}

type original struct {
	Image  string          `json:"image"`
	Env    []corev1.EnvVar `json:"env,omitempty"`
	Volume corev1.Volume   `json:"volume"`
}

// current returns what the template has now in the fields the install
// sets, with what k8s_event added taken out: what an install records as
// the original, and what an uninstall gives back. Fields that something
// else has set since the install (kubeadm, a helm upgrade) are kept as
// they are now.
func (t *target) current() original {
	spec := &t.w.template().Spec
	c := spec.Containers[t.container]
	o := original{Image: c.Image, Volume: *spec.Volumes[t.volume].DeepCopy()}
	r := t.rec
	if r != nil && (c.Image == r.Image || repository(c.Image) == repository(r.Image)) {
		// The install's image, or another build of it set by hand
		// (kubectl set image to a newer k8s_event): what it replaced is
		// still the original.
		o.Image = r.Original.Image
	}
	if r != nil && o.Volume.ConfigMap.Name == r.ConfigMap {
		// The install changed only the ConfigMap's name: give that back,
		// and keep what was changed since (an item the operator added).
		o.Volume.ConfigMap.Name = r.Original.Volume.ConfigMap.Name
	}
	if r == nil {
		// Not installed: the environment is the original, whole and in
		// order, even where it sets one of the four names itself.
		o.Env = slices.Clone(c.Env)
		return o
	}
	live := notOurs(c.Env)
	if equality.Semantic.DeepEqual(live, notOurs(r.Original.Env)) {
		// Nobody changed the rest since the install: give it all back as
		// it was, in its order.
		o.Env = slices.Clone(r.Original.Env)
		return o
	}
	// The rest was changed since: keep it as it is now, and bring back
	// the variables of the four names that were there before.
	o.Env = live
	for _, e := range r.Original.Env {
		if isOurEnv(e.Name) {
			o.Env = append(o.Env, e)
		}
	}
	return o
}

// repository is ref without its tag and digest.
func repository(ref string) string {
	ref, _, _ = strings.Cut(ref, "@")
	if i := strings.LastIndex(ref, ":"); i > strings.LastIndex(ref, "/") {
		ref = ref[:i]
	}
	return ref
}

// notOurs is env without the variables k8s_event sets.
func notOurs(env []corev1.EnvVar) []corev1.EnvVar {
	var out []corev1.EnvVar
	for _, e := range env {
		if !isOurEnv(e.Name) {
			out = append(out, e)
		}
	}
	return out
}

// otherInstall refuses a Deployment that runs k8s_event set up by other
// means, whole or in part (k8s_event in its Corefile and any of the four
// variables): its image and Corefile are not the originals to record.
func otherInstall(t *target, src *corev1.ConfigMap, cf *corefileText) error {
	d := t.w
	ctr := d.template().Spec.Containers[t.container]
	var have, missing []string
	for _, e := range Env {
		if slices.ContainsFunc(ctr.Env, func(v corev1.EnvVar) bool { return v.Name == e.Name }) {
			have = append(have, e.Name)
		} else {
			missing = append(missing, e.Name)
		}
	}
	if t.rec != nil || !cf.has("k8s_event") || len(have) == 0 {
		return nil
	}
	vars := "the downward-API variables"
	if len(missing) > 0 {
		vars = fmt.Sprintf("%s but not %s: a partial install", strings.Join(have, ", "), strings.Join(missing, ", "))
	}
	return &RefusedError{[]string{fmt.Sprintf("%s runs k8s_event already, set up by other means (its Corefile, configmap %s, has k8s_event and its container %s; image %s): install would take that image and Corefile for the stock ones; change it where it was set up (for example the kustomize component deploy/k8s_event/component)", ref(d), src.Name, vars, ctr.Image)}}
}
