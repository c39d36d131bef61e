package install

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// target is the workload that runs CoreDNS and where its Corefile comes
// from.
type target struct {
	w         workload
	container int // index in the pod template
	volume    int // index of the config volume
	key       string
	// conf is the Corefile's path in the pods; mountDir the directory the
	// config volume is mounted on whole, "" when only the Corefile is
	// mounted (subPath).
	conf, mountDir string
	rec            *record // nil when k8s_event is not installed
	// source is the operator's ConfigMap the Corefile comes from (that
	// of current()), nil when it is gone.
	source *corev1.ConfigMap
	// layout is the workload's layout, on the plan's copy of the target
	// once the plan has told it.
	layout *layout
	// events is how an install's rollout waits for k8s_event's startup
	// event, where the layout settles on it (planEvent).
	events eventSettle
}

// findWorkload returns the CoreDNS workload that o names.
func findWorkload(ctx context.Context, c kubernetes.Interface, o *Options) (workload, error) {
	ns := o.namespace()
	if o.Kind == kindDaemonSet {
		ds := daemonSets(ctx, c, ns, o.Deployment)
		if len(ds) == 0 {
			return nil, elsewhere(ctx, c, ns, o.Deployment)
		}
		if err := refusedLayout(ds[0]); err != nil {
			return nil, err
		}
		return ds[0], nil
	}
	if o.Deployment != "" {
		d, err := getDeployment(ctx, c, ns, o.Deployment)
		if err != nil {
			if ds := daemonSets(ctx, c, ns, o.Deployment); len(ds) > 0 {
				return nil, daemonSetError(ns, ds)
			}
			return nil, fmt.Errorf("--deployment %q in namespace %q: %w", o.Deployment, ns, err)
		}
		return d, nil
	}
	found := map[string]workload{}
	for _, sel := range selectors(kindDeployment) {
		if err := listDeployments(ctx, c, ns, sel, found); err != nil {
			return nil, fmt.Errorf("looking for CoreDNS in namespace %q: %w", ns, err)
		}
	}
	switch len(found) {
	case 0:
		if ds := daemonSets(ctx, c, ns, ""); len(ds) > 0 {
			return nil, daemonSetError(ns, ds)
		}
		return nil, fmt.Errorf("no Deployment labelled %s in namespace %q: name it with --workload deployment/NAME or daemonset/NAME (and --namespace)", strings.Join(selectors(kindDeployment), " or "), ns)
	case 1:
		for _, d := range found {
			return d, nil
		}
	}
	names := slices.Sorted(maps.Keys(found))
	return nil, fmt.Errorf("namespace %q has %d CoreDNS Deployments (%s): name one with --deployment", ns, len(names), strings.Join(names, ", "))
}

// elsewhere is the error for a DaemonSet named name that ns does not hold: where a layout runs
// one of that name in its own namespace, refused with the vendor's way, or told to add
// --namespace.
func elsewhere(ctx context.Context, c kubernetes.Interface, ns, name string) error {
	for _, l := range layouts {
		if l.namespace == "" || l.namespace == ns || l.kind != kindDaemonSet {
			continue
		}
		if d, err := getDaemonSet(ctx, c, l.namespace, name); err == nil {
			if err := refusedLayout(d); err != nil {
				return err
			}
			return fmt.Errorf("--workload daemonset/%s: no such DaemonSet in namespace %q; namespace %q has one: add --namespace %s", name, ns, l.namespace, l.namespace)
		}
	}
	return fmt.Errorf("--workload daemonset/%s: no such DaemonSet in namespace %q", name, ns)
}

// twin refuses a run on w when a workload of the other kind and the same name in its namespace
// has k8s_event installed: the objects the tool makes are named and labelled by the workload's
// name alone, so the two would share them, and uninstalling one would take the other's away.
func twin(ctx context.Context, c kubernetes.Interface, o *Options, w workload) error {
	get, ns, name := getDeployment, w.meta().Namespace, w.meta().Name
	if w.kind() == kindDeployment {
		get = getDaemonSet
	}
	other, err := get(ctx, c, ns, name)
	if err != nil {
		return nil // none, or not ours to read: the run's own reads say more
	}
	if t, err := inspect(other, o); err != nil || t.rec == nil {
		return nil
	}
	return &RefusedError{[]string{fmt.Sprintf("%s has k8s_event installed, and the objects k8s_event makes "+
		"are named by the workload's name alone (%s-k8s-event and the others): %s would share them. "+
		"Uninstall k8s_event from %s first, or rename one of the two", ref(other), name, ref(w), kubectlRef(other))}}
}

// daemonSets are the DaemonSets of ns named name, or, when name is
// empty, labelled as CoreDNS is, there or in the namespace a layout runs
// it in: CoreDNS may run as one.
func daemonSets(ctx context.Context, c kubernetes.Interface, ns, name string) []workload {
	if name != "" {
		ds, err := getDaemonSet(ctx, c, ns, name)
		if err != nil {
			return nil
		}
		return []workload{ds}
	}
	var out []workload
	look := func(ns, sel string) {
		for _, d := range listDaemonSets(ctx, c, ns, sel) {
			if !slices.ContainsFunc(out, func(o workload) bool { return nsName(o) == nsName(d) }) {
				out = append(out, d)
			}
		}
	}
	for _, sel := range selectors(kindDaemonSet) {
		look(ns, sel)
	}
	for _, l := range layouts {
		if l.namespace != "" && l.namespace != ns && l.kind == kindDaemonSet {
			look(l.namespace, l.selector)
		}
	}
	return out
}

// refusedLayout refuses, with the vendor's way, a workload whose layout
// the tool leaves alone.
func refusedLayout(w workload) error {
	if l := layoutOf(subject{kind: w.kind(), meta: w.meta(), program: programOf(&w.template().Spec)}); l.refused != "" {
		return &RefusedError{[]string{fmt.Sprintf("%s: %s", ref(w), l.refused)}}
	}
	return nil
}

// daemonSetError says that CoreDNS runs as the DaemonSets ds: refused
// with the vendor's way where a layout leaves it alone, else how to name
// one.
func daemonSetError(ns string, ds []workload) error {
	var names []string
	for _, d := range ds {
		if err := refusedLayout(d); err != nil {
			return err
		}
		names = append(names, "--workload "+kubectlRef(d))
		if d.meta().Namespace != ns {
			names[len(names)-1] += " --namespace " + d.meta().Namespace
		}
	}
	return fmt.Errorf("namespace %q runs CoreDNS as a DaemonSet, not a Deployment: name it with %s", ns, strings.Join(names, ", or "))
}

// inspect finds the container, the config volume and the Corefile's key.
func inspect(w workload, o *Options) (*target, error) {
	t := &target{w: w, container: -1, volume: -1}
	spec := &w.template().Spec
	ref := ref(w)
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
			return nil, fmt.Errorf("%s: --container %q: not among its containers %v", ref, o.Container, names)
		case len(spec.Containers) != 1:
			return nil, fmt.Errorf("%s: none of its containers %v is named coredns: name the CoreDNS one with --container", ref, names)
		}
		t.container = 0
	}
	c := spec.Containers[t.container]
	conf := corefilePath(append(slices.Clone(c.Command), c.Args...))
	if conf == "" {
		return nil, fmt.Errorf("%s: container %s has no -conf argument: cannot tell where its Corefile comes from", ref, c.Name)
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
		return nil, fmt.Errorf("%s: no volume of container %s holds -conf %s", ref, c.Name, conf)
	}
	for i, v := range spec.Volumes {
		if v.Name == mount.Name {
			t.volume = i
		}
	}
	if t.volume < 0 || spec.Volumes[t.volume].ConfigMap == nil {
		return nil, fmt.Errorf("%s: volume %q of -conf %s is not a ConfigMap", ref, mount.Name, conf)
	}
	t.key, t.conf = rel, conf
	if mount.SubPath == "" {
		t.mountDir = mount.MountPath
	}
	for _, it := range spec.Volumes[t.volume].ConfigMap.Items {
		if it.Path == rel {
			t.key = it.Key
		}
	}
	if a, ok := w.template().Annotations[Annotation]; ok {
		var r record
		if err := json.Unmarshal([]byte(a), &r); err != nil {
			return nil, fmt.Errorf("%s: annotation %s: %w", ref, Annotation, err)
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

// discover finds the workload that o names, inspects it, and reads the
// operator's ConfigMap its Corefile comes from: the target is what
// discovery found, the input of the plan, which does not read the
// workload again.
func discover(ctx context.Context, c kubernetes.Interface, o *Options) (*target, error) {
	t, err := findTarget(ctx, c, o)
	if err != nil {
		return nil, err
	}
	if err := twin(ctx, c, o, t.w); err != nil {
		return nil, err
	}
	ns, name := t.w.meta().Namespace, t.current().Volume.ConfigMap.Name
	switch cm, err := c.CoreV1().ConfigMaps(ns).Get(ctx, name, metav1.GetOptions{}); {
	case err == nil:
		t.source = cm
	case !apierrors.IsNotFound(err):
		return nil, fmt.Errorf("the Corefile's ConfigMap: %w", err)
	}
	return t, nil
}

// withLayout is a copy of t with the layout l: the plan's, which leaves
// what discovery found as it found it.
func (t *target) withLayout(l *layout) *target {
	c := *t
	c.layout = l
	return &c
}

// findTarget finds the workload that o names and inspects it.
func findTarget(ctx context.Context, c kubernetes.Interface, o *Options) (*target, error) {
	d, err := findWorkload(ctx, c, o)
	if err != nil {
		return nil, err
	}
	return inspect(d, o)
}
