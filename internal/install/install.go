// Package install adds k8s_event to the CoreDNS a cluster already runs, and
// takes it out again, changing only what k8s_event needs: the container's
// image, four downward-API variables, the Corefile the pods read (a
// ConfigMap of its own, named by its content, made from the operator's
// Corefile with kubeapi and k8s_event added) and a Role and RoleBinding
// that let the Deployment's ServiceAccount create and patch events. What
// it replaced is recorded in an annotation of the pod template, so that
// uninstalling gives back exactly that, and so that the record travels
// with the template through `kubectl rollout undo` and tools that rewrite
// the Deployment.
package install

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	k8s_event "github.com/dnsops/k8s_event"
	"io"
	"k8s.io/apimachinery/pkg/api/equality"
	"slices"
	"sort"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/strategicpatch"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/yaml"
)

const (
	// Annotation on the pod template records what the install replaced.
	Annotation = "k8s-event.coredns.io/installed"
	// DeploymentLabel names, on the objects the install makes, the
	// Deployment they are for.
	DeploymentLabel = "k8s-event.coredns.io/deployment"
	managedByLabel  = "app.kubernetes.io/managed-by"
	// FieldManager is the name the install's writes are made under.
	FieldManager = "kubectl-k8s-event"
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

// Options say which CoreDNS to change, and how.
type Options struct {
	// Namespace of the CoreDNS Deployment; kube-system when empty.
	Namespace string
	// Deployment is its name; when empty, the one Deployment in Namespace
	// labelled k8s-app=kube-dns (kubeadm, kind) or
	// app.kubernetes.io/name=coredns (the CoreDNS helm chart).
	Deployment string
	// Container is the CoreDNS container's name; when empty, the one
	// named coredns, or the only one.
	Container string
	// Image is the CoreDNS image with k8s_event; install needs it.
	Image string
	// Options are the lines of the k8s_event block added to the
	// Corefile, e.g. "level info warning error"; none takes the
	// plugin's defaults.
	Options []string
	// DryRun prints what would change and changes nothing.
	DryRun bool
	// Wait, when positive, waits that long for the rollout.
	Wait time.Duration
	// Out receives what is done (or, with DryRun, would be done).
	Out io.Writer
}

// record is the value of Annotation: what the install set, and what was
// there before.
type record struct {
	// Image, ConfigMap are what the install set.
	Image     string `json:"image"`
	ConfigMap string `json:"configMap"`
	// Original is what they replaced.
	Original original `json:"original"`
}

type original struct {
	Image  string          `json:"image"`
	Env    []corev1.EnvVar `json:"env,omitempty"`
	Volume corev1.Volume   `json:"volume"`
}

// target is the CoreDNS Deployment and where its Corefile comes from.
type target struct {
	dep       *appsv1.Deployment
	container int // index in the pod template
	volume    int // index of the config volume
	key       string
	rec       *record // nil when k8s_event is not installed
}

func (o *Options) namespace() string {
	if o.Namespace == "" {
		return "kube-system"
	}
	return o.Namespace
}

func (o *Options) printf(format string, args ...any) {
	if o.Out != nil {
		fmt.Fprintf(o.Out, format, args...)
	}
}

// findDeployment returns the CoreDNS Deployment that o names.
func findDeployment(ctx context.Context, c kubernetes.Interface, o *Options) (*appsv1.Deployment, error) {
	ns := o.namespace()
	if o.Deployment != "" {
		d, err := c.AppsV1().Deployments(ns).Get(ctx, o.Deployment, metav1.GetOptions{})
		if err != nil {
			return nil, fmt.Errorf("--deployment %q in namespace %q: %w", o.Deployment, ns, err)
		}
		return d, nil
	}
	found := map[string]appsv1.Deployment{}
	for _, sel := range []string{"k8s-app=kube-dns", "app.kubernetes.io/name=coredns"} {
		list, err := c.AppsV1().Deployments(ns).List(ctx, metav1.ListOptions{LabelSelector: sel})
		if err != nil {
			return nil, fmt.Errorf("looking for CoreDNS in namespace %q: %w", ns, err)
		}
		for _, d := range list.Items {
			found[d.Name] = d
		}
	}
	switch len(found) {
	case 0:
		return nil, fmt.Errorf("no Deployment labelled k8s-app=kube-dns or app.kubernetes.io/name=coredns in namespace %q: name it with --deployment (and --namespace)", ns)
	case 1:
		for _, d := range found {
			return &d, nil
		}
	}
	names := make([]string, 0, len(found))
	for n := range found {
		names = append(names, n)
	}
	sort.Strings(names)
	return nil, fmt.Errorf("namespace %q has %d CoreDNS Deployments (%s): name one with --deployment", ns, len(names), strings.Join(names, ", "))
}

// inspect finds the container, the config volume and the Corefile's key.
func inspect(d *appsv1.Deployment, o *Options) (*target, error) {
	t := &target{dep: d, container: -1, volume: -1}
	spec := &d.Spec.Template.Spec
	for i, c := range spec.Containers {
		if (o.Container != "" && c.Name == o.Container) || (o.Container == "" && c.Name == "coredns") {
			t.container = i
		}
	}
	if t.container < 0 {
		if o.Container != "" || len(spec.Containers) != 1 {
			var names []string
			for _, c := range spec.Containers {
				names = append(names, c.Name)
			}
			return nil, fmt.Errorf("deployment %s/%s: --container %q: not among its containers %v", d.Namespace, d.Name, o.Container, names)
		}
		t.container = 0
	}
	c := spec.Containers[t.container]
	conf := confPath(append(slices.Clone(c.Command), c.Args...))
	if conf == "" {
		return nil, fmt.Errorf("deployment %s/%s: container %s has no -conf argument: cannot tell where its Corefile comes from", d.Namespace, d.Name, c.Name)
	}
	var mount *corev1.VolumeMount
	rel := ""
	for i, m := range c.VolumeMounts {
		switch {
		case m.SubPath != "" && m.MountPath == conf:
			mount, rel = &c.VolumeMounts[i], m.SubPath
		case m.SubPath == "" && strings.HasPrefix(conf, strings.TrimSuffix(m.MountPath, "/")+"/"):
			if mount == nil || len(m.MountPath) > len(mount.MountPath) {
				mount, rel = &c.VolumeMounts[i], strings.TrimPrefix(conf, strings.TrimSuffix(m.MountPath, "/")+"/")
			}
		}
	}
	if mount == nil {
		return nil, fmt.Errorf("deployment %s/%s: no volume of container %s holds -conf %s", d.Namespace, d.Name, c.Name, conf)
	}
	for i, v := range spec.Volumes {
		if v.Name == mount.Name {
			t.volume = i
		}
	}
	if t.volume < 0 || spec.Volumes[t.volume].ConfigMap == nil {
		return nil, fmt.Errorf("deployment %s/%s: volume %q of -conf %s is not a ConfigMap", d.Namespace, d.Name, mount.Name, conf)
	}
	t.key = rel
	for _, it := range spec.Volumes[t.volume].ConfigMap.Items {
		if it.Path == rel {
			t.key = it.Key
		}
	}
	if a, ok := d.Spec.Template.Annotations[Annotation]; ok {
		var r record
		if err := json.Unmarshal([]byte(a), &r); err != nil {
			return nil, fmt.Errorf("deployment %s/%s: annotation %s: %w", d.Namespace, d.Name, Annotation, err)
		}
		t.rec = &r
	}
	return t, nil
}

// confPath is the value of CoreDNS's -conf flag in args.
func confPath(args []string) string {
	for i, a := range args {
		a = strings.TrimPrefix(a, "-")
		if v, ok := strings.CutPrefix(a, "-conf="); ok {
			return v
		}
		if v, ok := strings.CutPrefix(a, "conf="); ok {
			return v
		}
		if a == "conf" || a == "-conf" {
			if i+1 < len(args) {
				return args[i+1]
			}
		}
	}
	return ""
}

// current returns what the template has now in the fields the install
// sets, with what k8s_event added taken out: what an install records as
// the original, and what an uninstall gives back. Fields that something
// else has set since the install (kubeadm, a helm upgrade) are kept as
// they are now.
func (t *target) current() original {
	spec := &t.dep.Spec.Template.Spec
	c := spec.Containers[t.container]
	o := original{Image: c.Image, Volume: *spec.Volumes[t.volume].DeepCopy()}
	r := t.rec
	if r != nil && c.Image == r.Image {
		o.Image = r.Original.Image
	}
	if r != nil && o.Volume.ConfigMap.Name == r.ConfigMap {
		o.Volume = *r.Original.Volume.DeepCopy()
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

// checkOptions refuses k8s_event block lines that would keep CoreDNS from
// starting, before any pod rolls, with the plugin's own parser.
func checkOptions(lines []string) error {
	seen := map[string]bool{}
	for _, l := range lines {
		f := strings.Fields(l)
		if len(f) == 0 {
			return fmt.Errorf("--option %q: empty", l)
		}
		if seen[f[0]] {
			return fmt.Errorf("--option %q: %s given twice", l, f[0])
		}
		seen[f[0]] = true
		if err := k8s_event.CheckOption(l); err != nil {
			return fmt.Errorf("--option %q: %w", l, err)
		}
	}
	return nil
}

// GeneratedName is the name of the ConfigMap with data made from the
// ConfigMap source: source's name, then a hash of the content.
func GeneratedName(source string, data map[string]string) string {
	keys := make([]string, 0, len(data))
	for k := range data {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	h := sha256.New()
	for _, k := range keys {
		fmt.Fprintf(h, "%d:%s%d:%s", len(k), k, len(data[k]), data[k])
	}
	return source + "-k8s-event-" + hex.EncodeToString(h.Sum(nil))[:10]
}

// Install adds k8s_event to the CoreDNS Deployment that o names.
func Install(ctx context.Context, c kubernetes.Interface, o Options) error {
	if o.Image == "" {
		return errors.New("--image: empty: name the CoreDNS image with k8s_event")
	}
	if err := checkOptions(o.Options); err != nil {
		return err
	}
	return retry.RetryOnConflict(retry.DefaultRetry, func() error { return install(ctx, c, &o) })
}

func install(ctx context.Context, c kubernetes.Interface, o *Options) error {
	d, err := findDeployment(ctx, c, o)
	if err != nil {
		return err
	}
	t, err := inspect(d, o)
	if err != nil {
		return err
	}
	orig := t.current()
	ns := d.Namespace
	src, err := c.CoreV1().ConfigMaps(ns).Get(ctx, orig.Volume.ConfigMap.Name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("the Corefile's ConfigMap: %w", err)
	}
	text, ok := src.Data[t.key]
	if !ok {
		return fmt.Errorf("ConfigMap %s/%s has no key %q, which the Deployment reads as its Corefile", ns, src.Name, t.key)
	}
	corefile, _, err := AddPlugins(text, o.Options)
	if err != nil {
		return fmt.Errorf("ConfigMap %s/%s, key %s: %w", ns, src.Name, t.key, err)
	}
	data := map[string]string{}
	for k, v := range src.Data {
		data[k] = v
	}
	data[t.key] = corefile
	gen := &corev1.ConfigMap{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"},
		ObjectMeta: metav1.ObjectMeta{
			Name:      GeneratedName(src.Name, data),
			Namespace: ns,
			Labels:    map[string]string{DeploymentLabel: d.Name, managedByLabel: FieldManager},
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: "apps/v1", Kind: "Deployment", Name: d.Name, UID: d.UID,
			}},
		},
		Data: data,
	}

	rec := record{Image: o.Image, ConfigMap: gen.Name, Original: orig}
	ann, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	want := d.DeepCopy()
	tmpl := &want.Spec.Template
	if tmpl.Annotations == nil {
		tmpl.Annotations = map[string]string{}
	}
	tmpl.Annotations[Annotation] = string(ann)
	ctr := &tmpl.Spec.Containers[t.container]
	ctr.Image = o.Image
	ctr.Env = nil
	for _, e := range orig.Env {
		if !isOurEnv(e.Name) {
			ctr.Env = append(ctr.Env, e)
		}
	}
	ctr.Env = append(ctr.Env, Env...)
	vol := orig.Volume.DeepCopy()
	vol.ConfigMap.Name = gen.Name
	tmpl.Spec.Volumes[t.volume] = *vol

	sa := d.Spec.Template.Spec.ServiceAccountName
	if sa == "" {
		sa = "default"
	}
	role, binding := rbacFor(d, sa)

	patch, err := deploymentPatch(d, want)
	if err != nil {
		return err
	}
	if o.DryRun {
		o.printf("# dry run: nothing is changed\n")
	}
	if _, err := c.CoreV1().ConfigMaps(ns).Get(ctx, gen.Name, metav1.GetOptions{}); apierrors.IsNotFound(err) {
		o.printf("create configmap %s/%s, the Corefile of %s with kubeapi and k8s_event:\n%s\n", ns, gen.Name, src.Name, indent(Diff(text, corefile)))
		if !o.DryRun {
			if _, err := c.CoreV1().ConfigMaps(ns).Create(ctx, gen, metav1.CreateOptions{FieldManager: FieldManager}); err != nil {
				return fmt.Errorf("create configmap %s/%s: %w", ns, gen.Name, err)
			}
		}
	} else if err != nil {
		return err
	} else {
		o.printf("configmap %s/%s is there\n", ns, gen.Name)
	}
	if err := ensureRBAC(ctx, c, o, role, binding); err != nil {
		return err
	}
	if patch == nil {
		o.printf("deployment %s/%s has k8s_event already\n", ns, d.Name)
	} else {
		o.printf("patch deployment %s/%s:\n%s", ns, d.Name, indent(string(patch.display)))
		if !o.DryRun {
			if _, err := c.AppsV1().Deployments(ns).Patch(ctx, d.Name, types.StrategicMergePatchType, patch.body, metav1.PatchOptions{FieldManager: FieldManager}); err != nil {
				return fmt.Errorf("patch deployment %s/%s: %w", ns, d.Name, err)
			}
		}
	}
	if o.DryRun {
		return nil
	}
	if err := waitRollout(ctx, c, o, ns, d.Name); err != nil {
		return err
	}
	return prune(ctx, c, o, ns, d.Name)
}

func rbacFor(d *appsv1.Deployment, sa string) (*rbacv1.Role, *rbacv1.RoleBinding) {
	meta := metav1.ObjectMeta{
		Name:      d.Name + "-k8s-event",
		Namespace: d.Namespace,
		Labels:    map[string]string{DeploymentLabel: d.Name, managedByLabel: FieldManager},
	}
	role := &rbacv1.Role{
		TypeMeta:   metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "Role"},
		ObjectMeta: meta,
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}}},
	}
	binding := &rbacv1.RoleBinding{
		TypeMeta:   metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "RoleBinding"},
		ObjectMeta: *meta.DeepCopy(),
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: meta.Name},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: sa, Namespace: d.Namespace}},
	}
	return role, binding
}

// ensureRBAC creates the Role and RoleBinding, or sets their rules and
// subjects when they are there.
func ensureRBAC(ctx context.Context, c kubernetes.Interface, o *Options, role *rbacv1.Role, binding *rbacv1.RoleBinding) error {
	ns := role.Namespace
	roles := c.RbacV1().Roles(ns)
	have, err := roles.Get(ctx, role.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		o.printf("create role %s/%s: create, patch events\n", ns, role.Name)
		if !o.DryRun {
			if _, err := roles.Create(ctx, role, metav1.CreateOptions{FieldManager: FieldManager}); err != nil {
				return fmt.Errorf("create role %s/%s: %w", ns, role.Name, err)
			}
		}
	case err != nil:
		return err
	case !equalJSON(have.Rules, role.Rules):
		o.printf("update role %s/%s: create, patch events\n", ns, role.Name)
		if !o.DryRun {
			have.Rules = role.Rules
			if _, err := roles.Update(ctx, have, metav1.UpdateOptions{FieldManager: FieldManager}); err != nil {
				return fmt.Errorf("update role %s/%s: %w", ns, role.Name, err)
			}
		}
	}
	bindings := c.RbacV1().RoleBindings(ns)
	hb, err := bindings.Get(ctx, binding.Name, metav1.GetOptions{})
	subject := binding.Subjects[0]
	switch {
	case apierrors.IsNotFound(err):
		o.printf("create rolebinding %s/%s: role %s to serviceaccount %s/%s\n", ns, binding.Name, role.Name, subject.Namespace, subject.Name)
		if !o.DryRun {
			if _, err := bindings.Create(ctx, binding, metav1.CreateOptions{FieldManager: FieldManager}); err != nil {
				return fmt.Errorf("create rolebinding %s/%s: %w", ns, binding.Name, err)
			}
		}
	case err != nil:
		return err
	case !equalJSON(hb.Subjects, binding.Subjects) || !equalJSON(hb.RoleRef, binding.RoleRef):
		o.printf("replace rolebinding %s/%s: role %s to serviceaccount %s/%s\n", ns, binding.Name, role.Name, subject.Namespace, subject.Name)
		if !o.DryRun {
			// The role it refers to cannot change in place.
			if err := bindings.Delete(ctx, binding.Name, metav1.DeleteOptions{}); err != nil {
				return err
			}
			if _, err := bindings.Create(ctx, binding, metav1.CreateOptions{FieldManager: FieldManager}); err != nil {
				return fmt.Errorf("create rolebinding %s/%s: %w", ns, binding.Name, err)
			}
		}
	}
	return nil
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

// Uninstall gives back what the install replaced in the Deployment that o
// names, and removes the Role, the RoleBinding and the Corefile
// ConfigMaps no ReplicaSet of the Deployment refers to any more.
func Uninstall(ctx context.Context, c kubernetes.Interface, o Options) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error { return uninstall(ctx, c, &o) })
}

func uninstall(ctx context.Context, c kubernetes.Interface, o *Options) error {
	d, err := findDeployment(ctx, c, o)
	if err != nil {
		return err
	}
	t, err := inspect(d, o)
	if err != nil {
		return err
	}
	ns := d.Namespace
	if o.DryRun {
		o.printf("# dry run: nothing is changed\n")
	}
	if t.rec == nil {
		o.printf("deployment %s/%s does not have k8s_event\n", ns, d.Name)
	} else {
		orig := t.current()
		want := d.DeepCopy()
		tmpl := &want.Spec.Template
		delete(tmpl.Annotations, Annotation)
		if len(tmpl.Annotations) == 0 {
			tmpl.Annotations = nil
		}
		ctr := &tmpl.Spec.Containers[t.container]
		ctr.Image = orig.Image
		ctr.Env = orig.Env
		tmpl.Spec.Volumes[t.volume] = orig.Volume
		patch, err := deploymentPatch(d, want)
		if err != nil {
			return err
		}
		if patch != nil {
			o.printf("patch deployment %s/%s:\n%s", ns, d.Name, indent(string(patch.display)))
			if !o.DryRun {
				if _, err := c.AppsV1().Deployments(ns).Patch(ctx, d.Name, types.StrategicMergePatchType, patch.body, metav1.PatchOptions{FieldManager: FieldManager}); err != nil {
					return fmt.Errorf("patch deployment %s/%s: %w", ns, d.Name, err)
				}
			}
		}
	}
	name := d.Name + "-k8s-event"
	if _, err := c.RbacV1().RoleBindings(ns).Get(ctx, name, metav1.GetOptions{}); err == nil {
		o.printf("delete rolebinding %s/%s\n", ns, name)
		if !o.DryRun {
			if err := c.RbacV1().RoleBindings(ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				return err
			}
		}
	}
	if _, err := c.RbacV1().Roles(ns).Get(ctx, name, metav1.GetOptions{}); err == nil {
		o.printf("delete role %s/%s\n", ns, name)
		if !o.DryRun {
			if err := c.RbacV1().Roles(ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				return err
			}
		}
	}
	if o.DryRun {
		return nil
	}
	if err := waitRollout(ctx, c, o, ns, d.Name); err != nil {
		return err
	}
	return prune(ctx, c, o, ns, d.Name)
}

// prune deletes the Corefile ConfigMaps made for the Deployment that
// neither it nor any of its ReplicaSets refers to: `kubectl rollout undo`
// to any revision kept finds the Corefile that revision reads.
func prune(ctx context.Context, c kubernetes.Interface, o *Options, ns, name string) error {
	d, err := c.AppsV1().Deployments(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	used := map[string]bool{}
	refs := func(spec *corev1.PodSpec) {
		for _, v := range spec.Volumes {
			if v.ConfigMap != nil {
				used[v.ConfigMap.Name] = true
			}
		}
	}
	refs(&d.Spec.Template.Spec)
	rss, err := c.AppsV1().ReplicaSets(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	for _, rs := range rss.Items {
		for _, ref := range rs.OwnerReferences {
			if ref.UID == d.UID {
				refs(&rs.Spec.Template.Spec)
			}
		}
	}
	cms, err := c.CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{LabelSelector: DeploymentLabel + "=" + name})
	if err != nil {
		return err
	}
	for _, cm := range cms.Items {
		if used[cm.Name] {
			continue
		}
		o.printf("delete configmap %s/%s: no revision of deployment %s reads it\n", ns, cm.Name, name)
		if err := c.CoreV1().ConfigMaps(ns).Delete(ctx, cm.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return err
		}
	}
	return nil
}

// waitRollout waits, for up to o.Wait, until every replica of the
// Deployment runs its current template and is available.
func waitRollout(ctx context.Context, c kubernetes.Interface, o *Options, ns, name string) error {
	if o.Wait <= 0 {
		return nil
	}
	var last *appsv1.Deployment
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, o.Wait, true, func(ctx context.Context) (bool, error) {
		d, err := c.AppsV1().Deployments(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		last = d
		return RolledOut(d), nil
	})
	if err != nil {
		st := ""
		if last != nil {
			st = fmt.Sprintf(": %d replicas, %d updated, %d available", last.Status.Replicas, last.Status.UpdatedReplicas, last.Status.AvailableReplicas)
		}
		return fmt.Errorf("deployment %s/%s did not roll out within %v%s", ns, name, o.Wait, st)
	}
	o.printf("deployment %s/%s rolled out\n", ns, name)
	return nil
}

// RolledOut reports whether every replica of d runs its current template
// and is available, as `kubectl rollout status` tells.
func RolledOut(d *appsv1.Deployment) bool {
	want := int32(1)
	if d.Spec.Replicas != nil {
		want = *d.Spec.Replicas
	}
	s := d.Status
	return s.ObservedGeneration >= d.Generation && s.UpdatedReplicas == want && s.Replicas == want && s.AvailableReplicas == want
}

// Status describes whether the Deployment that o names has k8s_event.
func Status(ctx context.Context, c kubernetes.Interface, o Options) error {
	d, err := findDeployment(ctx, c, &o)
	if err != nil {
		return err
	}
	t, err := inspect(d, &o)
	if err != nil {
		return err
	}
	ns := d.Namespace
	spec := &d.Spec.Template.Spec
	ctr := spec.Containers[t.container]
	state := "not installed"
	if t.rec != nil {
		state = "installed"
		if ctr.Image != t.rec.Image || spec.Volumes[t.volume].ConfigMap.Name != t.rec.ConfigMap {
			state = "partly undone (run install again, or uninstall)"
		}
	}
	o.printf("deployment %s/%s: k8s_event %s\n", ns, d.Name, state)
	o.printf("  image %s\n", ctr.Image)
	o.printf("  Corefile: configmap %s, key %s\n", spec.Volumes[t.volume].ConfigMap.Name, t.key)
	var env []string
	for _, e := range ctr.Env {
		if isOurEnv(e.Name) {
			env = append(env, e.Name)
		}
	}
	o.printf("  downward-API variables: %s\n", strings.Join(env, " "))
	if t.rec != nil {
		o.printf("  before the install: image %s, configmap %s\n", t.rec.Original.Image, t.rec.Original.Volume.ConfigMap.Name)
	}
	name := d.Name + "-k8s-event"
	for kind, get := range map[string]func() error{
		"role":        func() error { _, err := c.RbacV1().Roles(ns).Get(ctx, name, metav1.GetOptions{}); return err },
		"rolebinding": func() error { _, err := c.RbacV1().RoleBindings(ns).Get(ctx, name, metav1.GetOptions{}); return err },
	} {
		switch err := get(); {
		case err == nil:
			o.printf("  %s %s: present\n", kind, name)
		case apierrors.IsNotFound(err):
			o.printf("  %s %s: absent\n", kind, name)
		default:
			return err
		}
	}
	rolled := "rolling out"
	if RolledOut(d) {
		rolled = "rolled out"
	}
	o.printf("  replicas: %d available of %d, %s\n", d.Status.AvailableReplicas, ptrOr(d.Spec.Replicas, 1), rolled)
	return nil
}

func ptrOr(p *int32, v int32) int32 {
	if p == nil {
		return v
	}
	return *p
}

func indent(s string) string {
	var b strings.Builder
	for _, l := range strings.SplitAfter(s, "\n") {
		if l != "" {
			b.WriteString("    " + l)
		}
	}
	if !strings.HasSuffix(b.String(), "\n") {
		b.WriteString("\n")
	}
	return b.String()
}
