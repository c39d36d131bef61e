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
	imageref "github.com/dnsops/k8s_event/internal/image"
	"io"
	"k8s.io/apimachinery/pkg/api/equality"
	"slices"
	"sort"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/strategicpatch"
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

// ErrNoImage is an install without Options.Image: its message names the
// CoreDNS release the Deployment runs, and how to build k8s_event on it.
var ErrNoImage = errors.New("--image: not given")

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
	// Image is the CoreDNS image with k8s_event; install needs it, on
	// the CoreDNS release the Deployment runs (or Force).
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
	// JSON writes one JSON document (a Result, or for status a
	// StatusReport) to Out in place of text.
	JSON bool
	// Force goes on where another owner keeps the Deployment (the addon
	// manager in Reconcile mode, helm, Argo CD, Flux, k3s, another
	// server-side applier), where the Corefile's ConfigMap has keys that
	// another controller keeps current, where a run that does not wait
	// could take the Ready pods below their count, and where Image is
	// on another CoreDNS release than the one the Deployment runs.
	Force bool
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
		var names []string
		for _, c := range spec.Containers {
			names = append(names, c.Name)
		}
		switch {
		case o.Container != "":
			return nil, fmt.Errorf("deployment %s/%s: --container %q: not among its containers %v", d.Namespace, d.Name, o.Container, names)
		case len(spec.Containers) != 1:
			return nil, fmt.Errorf("deployment %s/%s: none of its containers %v is named coredns: name the CoreDNS one with --container", d.Namespace, d.Name, names)
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

// Install adds k8s_event to the CoreDNS Deployment that o names.
func Install(ctx context.Context, c kubernetes.Interface, o Options) error {
	r := newRun(&o, "install")
	return r.finish(r.install(ctx, c))
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

func (r *run) install(ctx context.Context, c kubernetes.Interface) error {
	o := r.o
	if err := checkOptions(o.Options); err != nil {
		return err
	}
	unlock, held, err := lockDeployment(ctx, c, o)
	if err != nil {
		return err
	}
	defer unlock()
	var p *installPlan
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		r.restart()
		var err error
		if p, err = r.planInstall(ctx, c); err != nil {
			return err
		}
		return r.applyInstall(ctx, c, p)
	})
	if held != "" && err == nil {
		r.warn("the run would be refused now: " + held)
	}
	if err != nil {
		// Cut off before the Deployment was patched (an error, a refusal
		// on a retry, or interrupted): take back what the run created.
		r.takeBack(ctx)
	}
	if err != nil || o.DryRun {
		return err
	}
	if p.patch == nil {
		// Nothing rolls: prune what the dry run said it would.
		return r.prune(ctx, c, p.d.Namespace, p.d.Name, p.gen.Name)
	}
	ns, name := p.d.Namespace, p.d.Name
	verify := func(now *appsv1.Deployment) error {
		spec := &now.Spec.Template.Spec
		if p.t.container >= len(spec.Containers) || p.t.volume >= len(spec.Volumes) || spec.Volumes[p.t.volume].ConfigMap == nil {
			return fmt.Errorf("deployment %s/%s changed during the rollout: its containers or volumes are not the ones install patched", ns, name)
		}
		img, cm := spec.Containers[p.t.container].Image, spec.Volumes[p.t.volume].ConfigMap.Name
		if img != o.Image || cm != p.gen.Name || now.Spec.Template.Annotations[Annotation] != p.ann {
			return fmt.Errorf("deployment %s/%s changed during the rollout%s: it runs image %s with configmap %s, not %s with %s; whatever changed it keeps CoreDNS as it wants: k8s_event is not installed", ns, name, changedBy(now, p.t), img, cm, o.Image, p.gen.Name)
		}
		return nil
	}
	return r.rollout(ctx, c, p.d, p.strategy, verify, p.gen)
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

// applyInstall makes the changes up to the Deployment's patch, or with
// DryRun says them.
func (r *run) applyInstall(ctx context.Context, c kubernetes.Interface, p *installPlan) error {
	o, d, gen := r.o, p.d, p.gen
	ns := d.Namespace
	if o.DryRun {
		r.printf("# dry run: nothing is changed\n")
	}
	r.printf("deployment %s/%s: image %s -> %s (CoreDNS %s -> %s)\n", ns, d.Name, r.res.ImageBefore, r.res.ImageAfter, r.res.CoreDNSBefore, r.res.CoreDNSAfter)
	r.printf("configmap keys the pods read:\n%s", indent(strings.Join(r.res.Keys, "\n")))
	r.printf("rollout: %s\n", r.res.Rollout)
	if p.genThere {
		r.change(Change{Action: "keep", Kind: "configmap", Name: ns + "/" + gen.Name, Detail: "there already"}, "configmap "+ns+"/"+gen.Name+" is there")
	} else {
		src := d.Spec.Template.Spec.Volumes[p.t.volume].ConfigMap.Name
		if p.t.rec != nil && src == p.t.rec.ConfigMap {
			src = p.t.rec.Original.Volume.ConfigMap.Name
		}
		r.change(Change{Action: "create", Kind: "configmap", Name: ns + "/" + gen.Name, Detail: Diff(r.sourceText(ctx, c, ns, src, p.t.key), gen.Data[p.t.key])},
			fmt.Sprintf("create configmap %s/%s, the Corefile of %s with kubeapi and k8s_event", ns, gen.Name, src))
		if !o.DryRun {
			switch _, err := c.CoreV1().ConfigMaps(ns).Create(ctx, gen, metav1.CreateOptions{FieldManager: FieldManager}); {
			case err == nil:
				r.done = append(r.done, r.res.Changes[len(r.res.Changes)-1])
				r.created = append(r.created, func(ctx context.Context) error {
					// Unless the Deployment reads it all the same (a patch
					// that went through, its answer lost).
					now, err := c.AppsV1().Deployments(ns).Get(ctx, d.Name, metav1.GetOptions{})
					if err != nil || slices.ContainsFunc(now.Spec.Template.Spec.Volumes, func(v corev1.Volume) bool {
						return v.ConfigMap != nil && v.ConfigMap.Name == gen.Name
					}) {
						return err
					}
					return c.CoreV1().ConfigMaps(ns).Delete(ctx, gen.Name, metav1.DeleteOptions{})
				})
			case !apierrors.IsAlreadyExists(err):
				return fmt.Errorf("create configmap %s/%s: %w", ns, gen.Name, err)
			}
		}
	}
	for _, s := range p.rbac {
		r.change(s.change, s.line)
		if !o.DryRun && s.do != nil {
			if err := s.do(ctx); err != nil {
				return fmt.Errorf("%s: %w", s.line, err)
			}
			r.done = append(r.done, s.change)
			if s.undo != nil {
				r.created = append(r.created, s.undo)
			}
		}
	}
	if p.patch == nil {
		r.change(Change{Action: "keep", Kind: "deployment", Name: ns + "/" + d.Name, Detail: "has k8s_event already"}, fmt.Sprintf("deployment %s/%s has k8s_event already", ns, d.Name))
	} else {
		r.change(Change{Action: "patch", Kind: "deployment", Name: ns + "/" + d.Name, Detail: string(p.patch.display)}, fmt.Sprintf("patch deployment %s/%s", ns, d.Name))
		if !o.DryRun {
			if _, err := c.AppsV1().Deployments(ns).Patch(ctx, d.Name, types.StrategicMergePatchType, p.patch.body, metav1.PatchOptions{FieldManager: FieldManager}); err != nil {
				return fmt.Errorf("patch deployment %s/%s: %w", ns, d.Name, err)
			}
		}
		if p.strategy != nil && o.DryRun {
			r.change(Change{Action: "patch", Kind: "deployment", Name: ns + "/" + d.Name, When: "after the rollout", Detail: "strategy back to " + strategyString(d.Spec.Strategy)},
				fmt.Sprintf("after the rollout, patch deployment %s/%s", ns, d.Name))
		}
	}
	if o.DryRun {
		for _, cm := range p.prunes {
			r.change(Change{Action: "delete", Kind: "configmap", Name: ns + "/" + cm, When: "after the rollout", Detail: "no revision of deployment " + d.Name + " reads it"}, "after the rollout, delete configmap "+ns+"/"+cm)
		}
	}
	return nil
}

// sourceText is the Corefile of the operator's ConfigMap, for the diff.
func (r *run) sourceText(ctx context.Context, c kubernetes.Interface, ns, name, key string) string {
	cm, err := c.CoreV1().ConfigMaps(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return ""
	}
	return cm.Data[key]
}

// changedBy names who last set the fields install sets, other than install.
func changedBy(d *appsv1.Deployment, t *target) string {
	spec := &d.Spec.Template.Spec
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

// takeBack deletes, or puts back, what the run created, even when ctx
// is done.
func (r *run) takeBack(ctx context.Context) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	for _, undo := range slices.Backward(r.created) {
		if err := undo(ctx); err != nil && !apierrors.IsNotFound(err) {
			r.warn(fmt.Sprintf("taking back what the run created: %v", err))
		}
	}
	r.created = nil
}

// rollout waits for the rollout the run started and checks it; on failure
// it puts back the Deployment's template and strategy as before had them,
// or says the commands that do. Then it puts back the operator's strategy,
// gives up the fields it set, and deletes the Corefile ConfigMaps nothing
// reads any more. gen, when not nil, is the ConfigMap the Deployment must
// read.
func (r *run) rollout(ctx context.Context, c kubernetes.Interface, before *appsv1.Deployment, tmp *appsv1.DeploymentStrategy, verify func(*appsv1.Deployment) error, gen *corev1.ConfigMap) error {
	o := r.o
	ns, name := before.Namespace, before.Name
	undo := fmt.Sprintf("kubectl -n %s rollout undo deployment/%s", ns, name)
	if tmp != nil {
		undo += "\n" + strategyCommand(ns, name, before.Spec.Strategy)
	}
	// What follows runs to its end even when the run is interrupted: an
	// interrupted rollout is put back.
	after := func() (context.Context, context.CancelFunc) {
		return context.WithTimeout(context.WithoutCancel(ctx), min(o.Wait, 2*time.Minute)+30*time.Second)
	}
	if o.Wait > 0 {
		now, err := waitRollout(ctx, c, ns, name, o.Wait)
		if err == nil {
			err = verify(now)
			if err != nil {
				// Someone else's template is rolling: leave it, but give
				// back the operator's strategy.
				if tmp != nil {
					bctx, cancel := after()
					defer cancel()
					if serr := setStrategy(bctx, c, ns, name, before.Spec.Strategy); serr != nil {
						r.res.Undo = strategyCommand(ns, name, before.Spec.Strategy)
						return fmt.Errorf("%w; putting back the strategy failed (%v): run\n  %s", err, serr, r.res.Undo)
					}
				}
				return err
			}
		} else {
			bctx, cancel := after()
			defer cancel()
			r.printf("%v\nputting back deployment %s/%s as it was\n", err, ns, name)
			perr := putBack(bctx, c, before, min(o.Wait, 2*time.Minute))
			var serr error
			if tmp != nil {
				serr = setStrategy(bctx, c, ns, name, before.Spec.Strategy)
			}
			if perr != nil || serr != nil {
				r.res.Undo = undo
				return fmt.Errorf("%w; putting it back failed too (%v): run\n  %s", err, errors.Join(perr, serr), strings.ReplaceAll(undo, "\n", "\n  "))
			}
			// What the run created for the pods that did not start goes too.
			r.takeBack(bctx)
			return fmt.Errorf("%w; deployment %s/%s is back as it was (template and strategy)", err, ns, name)
		}
	}
	bctx, cancel := after()
	defer cancel()
	if tmp != nil {
		if err := setStrategy(bctx, c, ns, name, before.Spec.Strategy); err != nil {
			r.res.Undo = strategyCommand(ns, name, before.Spec.Strategy)
			return fmt.Errorf("the rollout is done, but putting back the strategy failed (%v): run\n  %s", err, r.res.Undo)
		}
		r.change(Change{Action: "patch", Kind: "deployment", Name: ns + "/" + name, Detail: "strategy back to " + strategyString(before.Spec.Strategy)}, fmt.Sprintf("patch deployment %s/%s", ns, name))
	}
	if err := releaseFields(bctx, c, ns, name); err != nil {
		return fmt.Errorf("deployment %s/%s: giving up the install's field ownership: %w", ns, name, err)
	}
	keep := ""
	if gen != nil {
		keep = gen.Name
	}
	if err := r.prune(bctx, c, ns, name, keep); err != nil {
		return err
	}
	if gen != nil {
		// Whatever ran meanwhile, the Corefile the Deployment reads is there.
		if _, err := c.CoreV1().ConfigMaps(ns).Get(bctx, gen.Name, metav1.GetOptions{}); apierrors.IsNotFound(err) {
			r.change(Change{Action: "create", Kind: "configmap", Name: ns + "/" + gen.Name, Detail: "it was gone"}, "create configmap "+ns+"/"+gen.Name)
			if _, err := c.CoreV1().ConfigMaps(ns).Create(bctx, gen, metav1.CreateOptions{FieldManager: FieldManager}); err != nil && !apierrors.IsAlreadyExists(err) {
				return err
			}
		}
	}
	if o.Wait > 0 {
		r.printf("deployment %s/%s rolled out\n", ns, name)
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

func ptrOr(p *int32, v int32) int32 {
	if p == nil {
		return v
	}
	return *p
}

// lockDeployment finds the Deployment and takes the lock that keeps other
// runs off it until unlock. A dry run takes none: held says which run
// holds it, as the real run would be refused now.
func lockDeployment(ctx context.Context, c kubernetes.Interface, o *Options) (unlock func(), held string, err error) {
	d, err := findDeployment(ctx, c, o)
	if err != nil {
		return nil, "", err
	}
	if o.DryRun {
		return func() {}, leaseHeld(ctx, c, d.Namespace, d.Name), nil
	}
	unlock, err = lock(ctx, c, d.Namespace, d.Name, 2*o.Wait+2*time.Minute)
	return unlock, "", err
}

// release is the CoreDNS release that ref runs, as its tag names it, or
// "unknown".
func release(ref string) string {
	if v, ok := imageref.CoreDNSVersion(ref); ok {
		return v.String()
	}
	return "unknown"
}

// releaseOf says which CoreDNS release ref runs, for a message.
func releaseOf(ref string) string {
	if v, ok := imageref.CoreDNSVersion(ref); ok {
		return "CoreDNS " + v.String() + " (image " + ref + ")"
	}
	return "image " + ref + ", whose tag does not name its CoreDNS release"
}

// buildHint says how to build k8s_event on the release ref runs.
func buildHint(ref string) string {
	if v, ok := imageref.CoreDNSVersion(ref); ok {
		return fmt.Sprintf("make image COREDNS_VERSION=%s builds it, and prints its reference", v)
	}
	return "make image COREDNS_VERSION=<that release> builds it, and prints its reference"
}
