package install

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// target is the CoreDNS Deployment and where its Corefile comes from.
type target struct {
	dep       *appsv1.Deployment
	container int // index in the pod template
	volume    int // index of the config volume
	key       string
	// conf is the Corefile's path in the pods; mountDir the directory the
	// config volume is mounted on whole, "" when only the Corefile is
	// mounted (subPath).
	conf, mountDir string
	rec            *record // nil when k8s_event is not installed
	// layout is the workload's layout, once the plan has told it.
	layout *layout
}

// findDeployment returns the CoreDNS Deployment that o names.
func findDeployment(ctx context.Context, c kubernetes.Interface, o *Options) (*appsv1.Deployment, error) {
	ns := o.namespace()
	if o.Kind == kindDaemonSet {
		ds := daemonSets(ctx, c, ns, o.Deployment)
		if len(ds) == 0 {
			return nil, fmt.Errorf("--workload daemonset/%s: no such DaemonSet in namespace %q", o.Deployment, ns)
		}
		return nil, daemonSetError(ns, ds)
	}
	if o.Deployment != "" {
		d, err := c.AppsV1().Deployments(ns).Get(ctx, o.Deployment, metav1.GetOptions{})
		if err != nil {
			if ds := daemonSets(ctx, c, ns, o.Deployment); len(ds) > 0 {
				return nil, daemonSetError(ns, ds)
			}
			return nil, fmt.Errorf("--deployment %q in namespace %q: %w", o.Deployment, ns, err)
		}
		return d, nil
	}
	found := map[string]appsv1.Deployment{}
	for _, sel := range selectors(kindDeployment) {
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
		if ds := daemonSets(ctx, c, ns, ""); len(ds) > 0 {
			return nil, daemonSetError(ns, ds)
		}
		return nil, fmt.Errorf("no Deployment labelled %s in namespace %q: name it with --deployment (and --namespace)", strings.Join(selectors(kindDeployment), " or "), ns)
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

// daemonSets are the DaemonSets of ns named name, or, when name is
// empty, labelled as CoreDNS is, there or in the namespace a layout runs
// it in: CoreDNS may run as one.
func daemonSets(ctx context.Context, c kubernetes.Interface, ns, name string) []appsv1.DaemonSet {
	if name != "" {
		ds, err := c.AppsV1().DaemonSets(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return nil
		}
		return []appsv1.DaemonSet{*ds}
	}
	var out []appsv1.DaemonSet
	look := func(ns, sel string) {
		list, err := c.AppsV1().DaemonSets(ns).List(ctx, metav1.ListOptions{LabelSelector: sel})
		if err != nil {
			return
		}
		for _, d := range list.Items {
			if !slices.ContainsFunc(out, func(o appsv1.DaemonSet) bool { return o.Namespace == d.Namespace && o.Name == d.Name }) {
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

// daemonSetError says that CoreDNS runs as the DaemonSets ds: refused
// with the vendor's way where a layout leaves it alone, else that install
// does not change it, and the way that works.
func daemonSetError(ns string, ds []appsv1.DaemonSet) error {
	var names []string
	for _, d := range ds {
		if l := layoutOf(subject{kind: kindDaemonSet, meta: &d.ObjectMeta, program: programOf(&d.Spec.Template.Spec)}); l.refused != "" {
			return &RefusedError{[]string{fmt.Sprintf("daemonset %s/%s: %s", d.Namespace, d.Name, l.refused)}}
		}
		names = append(names, d.Namespace+"/"+d.Name)
	}
	return fmt.Errorf("namespace %q runs CoreDNS as DaemonSet %s, and install changes a Deployment only: copy the kustomize component deploy/k8s_event/component, set kind: DaemonSet and the names in its patch, and apply it with your manifests (docs/install.md, With kustomize)", ns, strings.Join(names, ", "))
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
	conf := corefilePath(append(slices.Clone(c.Command), c.Args...))
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
	t.key, t.conf = rel, conf
	if mount.SubPath == "" {
		t.mountDir = mount.MountPath
	}
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

// discover finds the Deployment that the options name and inspects it.
func (r *run) discover(ctx context.Context, c kubernetes.Interface) (*target, error) {
	d, err := findDeployment(ctx, c, r.o)
	if err != nil {
		return nil, err
	}
	t, err := inspect(d, r.o)
	if err != nil {
		return nil, err
	}
	r.res.Deployment = d.Namespace + "/" + d.Name
	return t, nil
}
