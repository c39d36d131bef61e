package install

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"path"
	"slices"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
)

// GeneratedName is the name of the ConfigMap with data and binary made
// from the ConfigMap source for the workload of that name: source's name,
// the workload's when it is not source's (two workloads that read one
// ConfigMap get a copy each, as each prunes its own), then a hash of what
// the config volume vol mounts of it, so that a change to a key the pods
// do not read does not roll them.
func GeneratedName(source, workload string, vol corev1.Volume, data map[string]string, binary map[string][]byte) string {
	if workload != source {
		source += "-" + workload
	}
	return source + "-k8s-event-" + mountedHash(vol, data, binary)[:10]
}

// mountedHash is a hash of what the ConfigMap volume vol puts in the pods
// of data and binary: the keys it leaves out change nothing they read.
func mountedHash(vol corev1.Volume, data map[string]string, binary map[string][]byte) string {
	keep := func(k string, _ any) bool { return !mounts(vol, k) }
	d, b := maps.Clone(data), maps.Clone(binary)
	maps.DeleteFunc(d, func(k, v string) bool { return keep(k, v) })
	maps.DeleteFunc(b, func(k string, v []byte) bool { return keep(k, v) })
	return contentHash(d, b)
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

// planner works out a run's plan from what discovery finds: it reads the
// cluster and writes nothing. What it decides, and what it warns of, is
// the plan's report, which the run's report and -o json take whole.
type planner struct {
	o *Options
	// command is install or uninstall, for messages.
	command string
	rep     planReport
	// fleet is what the install does about the fleet option.
	fleet fleetPlan
	// level is the level line the install adds (planLevels); "" when none.
	level string
}

// planReport is what a plan says of itself: the fields of Result it
// fills (see Result), and its warnings.
type planReport struct {
	Deployment, Kind, Layout    string
	ImageBefore, ImageAfter     string
	CoreDNSBefore, CoreDNSAfter string
	Keys                        []string
	Rollout, FlowControl, Fleet string
	Warnings                    []string
}

func (pl *planner) warn(msg string) {
	pl.rep.Warnings = append(pl.rep.Warnings, msg)
}

// found begins the plan's report with what discovery found.
func (pl *planner) found(t *target) {
	pl.rep.Deployment, pl.rep.Kind = nsName(t.w), t.w.kind()
}

// installPlan is what an install changes, worked out before anything is.
type installPlan struct {
	w        workload
	t        *target
	gen      *corev1.ConfigMap
	genThere bool
	ann      string
	rbac     []step
	patch    *patch
	strategy bool // temporary rollout settings; false: the operator's
	// before is the workload as the operator has it (operatorView);
	// finish, that the template is installed already but a run cut off
	// during its rollout left its temporary strategy: the rollout is
	// waited for, and the operator's strategy put back.
	before workload
	finish bool
	// release, that nothing rolls but a run cut off after its rollout
	// left the fields it set owned by the install: they are given up.
	release bool
	prunes  []string
	// source is the operator's ConfigMap the Corefile comes from, and
	// diff the Corefile's change, when gen is to be made.
	source, diff string
}

// planInstall works out, from what discovery found, what the install
// changes, and refuses what it must not do. It reads the objects it would
// write, and writes nothing.
func (pl *planner) planInstall(ctx context.Context, c kubernetes.Interface, t *target) (*installPlan, error) {
	p, want, err := pl.decide(ctx, c, t)
	if err != nil {
		return nil, err
	}
	if err := pl.planWrites(ctx, c, p, want); err != nil {
		return nil, err
	}
	return p, nil
}

// decide works out what the pods will run, the ConfigMap they will read
// and how they roll, from what discovery found alone: of the cluster it
// reads only the nodes, for a Deployment whose pods need a node each
// (surgeOrRefuse). It returns the workload as the install wants it.
func (pl *planner) decide(ctx context.Context, c kubernetes.Interface, t *target) (*installPlan, workload, error) {
	pl.found(t)
	orig := t.current()
	src, err := sourceConfigMap(t, orig)
	if err != nil {
		return nil, nil, err
	}
	l, err := pl.layout(t, src)
	if err != nil {
		return nil, nil, err
	}
	t = t.withLayout(l)
	refuse := pl.ownerRefusals(t, l)
	more, err := pl.checkRelease(t, orig.Image)
	if err != nil {
		return nil, nil, err
	}
	refuse = append(refuse, more...)
	m := t.mountedFiles(orig.Volume, src.Data)
	cf, err := parseCorefile(src.Data[t.key], m)
	if err != nil {
		return nil, nil, fmt.Errorf("ConfigMap %s/%s, key %s: %w", src.Namespace, src.Name, t.key, err)
	}
	cf.everyBlock = l.everyBlock
	if err := otherInstall(t, src, cf); err != nil {
		return nil, nil, err
	}
	pl.planFleet(t.w.kind(), int(t.w.replicas()), cf)
	pl.planLevels(t, cf)
	refuse = append(refuse, pl.extraKeyRefusals(src, orig)...)
	p := &installPlan{w: t.w, t: t}
	if p.gen, err = pl.planConfigMap(t, orig, src, cf, m); err != nil {
		return nil, nil, err
	}
	refuse = append(refuse, pl.planEvent(t, p.gen.Data[t.key], m)...)
	want, err := pl.planTemplate(p, orig, src)
	if err != nil {
		return nil, nil, err
	}
	refuse = append(refuse, pl.planStrategy(ctx, c, p, want)...)
	if len(refuse) > 0 {
		return nil, nil, &RefusedError{refuse}
	}
	return p, want, nil
}

// ownerRefusals are why the install must leave the workload alone:
// another owner keeps it (with Force, a warning), or it is paused.
func (pl *planner) ownerRefusals(t *target, l *layout) []string {
	d := t.w
	var refuse []string
	for _, why := range otherOwners(d, t, l) {
		if pl.o.Force {
			pl.warn("--force: " + why)
		} else {
			refuse = append(refuse, why)
		}
	}
	if held := lastApplied(d, t); len(held) > 0 && applyingController(d.meta()) == "" {
		pl.warn(fmt.Sprintf("%s was applied with kubectl apply, and its last-applied configuration holds %s: applying that manifest again puts back what install sets; change it there too", ref(d), strings.Join(held, " and ")))
	}
	if d.paused() {
		refuse = append(refuse, fmt.Sprintf("%s is paused: its pods would not roll to what install sets; kubectl -n %s rollout resume %s first", ref(d), d.meta().Namespace, kubectlRef(d)))
	}
	return refuse
}

// sourceConfigMap is the operator's ConfigMap that the Corefile comes
// from, as discovery found it.
func sourceConfigMap(t *target, orig original) (*corev1.ConfigMap, error) {
	ns, src := t.w.meta().Namespace, t.source
	if src == nil {
		gone := apierrors.NewNotFound(corev1.Resource("configmaps"), orig.Volume.ConfigMap.Name)
		return nil, fmt.Errorf("the Corefile's ConfigMap: %w", gone)
	}
	if _, ok := src.Data[t.key]; !ok {
		return nil, fmt.Errorf("ConfigMap %s/%s has no key %q, which the %s reads as its Corefile", ns, src.Name, t.key, t.w.kind())
	}
	return src, nil
}

// layout tells the workload's layout, and refuses the layouts the tool
// leaves alone.
func (pl *planner) layout(t *target, src *corev1.ConfigMap) (*layout, error) {
	l := layoutOf(subject{kind: t.w.kind(), meta: t.w.meta(), corefile: src.Data[t.key], configMap: src.Labels, program: programOf(&t.w.template().Spec)})
	pl.rep.Layout = l.name
	if l.refused != "" {
		return nil, &RefusedError{[]string{fmt.Sprintf("%s: %s", ref(t.w), l.refused)}}
	}
	if err := pl.imageRefusal(l); err != nil {
		return nil, err
	}
	if l.warning != "" {
		pl.warn(l.warning)
	}
	return l, nil
}

// extraKeyRefusals are why a key of the operator's ConfigMap that another
// controller keeps current must not be copied (with Force, a warning).
func (pl *planner) extraKeyRefusals(src *corev1.ConfigMap, orig original) []string {
	var refuse []string
	for _, key := range extraKeys() {
		if _, ok := src.Data[key]; !ok || !mounts(orig.Volume, key) {
			continue
		}
		who := extraKeyOwner(key)
		why := fmt.Sprintf("ConfigMap %s/%s has the key %s, which %s rewrites as nodes come and go: the pods would read a copy made now, which goes stale (status tells when it has)", src.Namespace, src.Name, key, who)
		if pl.o.Force {
			pl.warn("--force: " + why)
			continue
		}
		refuse = append(refuse, why+"; on "+who+", disable the packaged CoreDNS (--disable coredns) and run your own")
	}
	return refuse
}

// planConfigMap is the ConfigMap the pods will read: the operator's, with
// kubeapi and k8s_event in the Corefile, named by its content.
func (pl *planner) planConfigMap(t *target, orig original, src *corev1.ConfigMap, cf *corefileText, m *mountedFiles) (*corev1.ConfigMap, error) {
	d, ns := t.w.meta(), t.w.meta().Namespace
	out, err := cf.withPlugins(pl.options(), m)
	if err != nil {
		return nil, fmt.Errorf("ConfigMap %s/%s, key %s: %w", ns, src.Name, t.key, err)
	}
	if err := out.check(); err != nil {
		return nil, fmt.Errorf("ConfigMap %s/%s, key %s: the Corefile made from it would not load: %w", ns, src.Name, t.key, err)
	}
	data := maps.Clone(src.Data)
	data[t.key] = out.src
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
	pl.rep.Keys = describeKeys(t.key, orig.Volume, data, binary)
	return &corev1.ConfigMap{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"},
		ObjectMeta: metav1.ObjectMeta{
			Name:      GeneratedName(src.Name, d.Name, orig.Volume, data, binary),
			Namespace: ns,
			Labels:    map[string]string{DeploymentLabel: d.Name, managedByLabel: FieldManager},
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: "apps/v1", Kind: t.w.kind(), Name: d.Name, UID: d.UID,
			}},
		},
		Data:       data,
		BinaryData: binary,
	}, nil
}

// mountedFiles are the keys of data other than the Corefile that vol
// puts beside it in the pods; nil when only the Corefile is mounted.
func (t *target) mountedFiles(vol corev1.Volume, data map[string]string) *mountedFiles {
	if t.mountDir == "" || vol.ConfigMap == nil {
		return nil
	}
	m := &mountedFiles{dir: path.Dir(t.conf), files: map[string]string{}}
	for k, v := range data {
		p, ok := k, len(vol.ConfigMap.Items) == 0
		for _, it := range vol.ConfigMap.Items {
			if it.Key == k {
				p, ok = it.Path, true
			}
		}
		if full := path.Join(t.mountDir, p); ok && full != t.conf {
			m.files[full] = v
		}
	}
	return m
}

// describeKeys says, key by key, what the ConfigMap the pods read keeps
// of the operator's.
func describeKeys(corefileKey string, vol corev1.Volume, data map[string]string, binary map[string][]byte) []string {
	keys := append(slices.Collect(maps.Keys(data)), slices.Collect(maps.Keys(binary))...)
	slices.Sort(keys)
	var out []string
	for _, k := range keys {
		var what string
		switch v, inData := data[k]; {
		case k == corefileKey:
			what = "the Corefile, with kubeapi and k8s_event"
		case inData:
			what = fmt.Sprintf("copied (%d bytes)", len(v))
		default:
			what = fmt.Sprintf("copied from binaryData (%d bytes)", len(binary[k]))
		}
		if !mounts(vol, k) {
			what += ", not mounted (the volume's items leave it out)"
		}
		out = append(out, k+": "+what)
	}
	return out
}

// mounts reports whether the ConfigMap volume vol puts key in the pods.
func mounts(vol corev1.Volume, key string) bool {
	items := vol.ConfigMap.Items
	return len(items) == 0 || slices.ContainsFunc(items, func(it corev1.KeyToPath) bool { return it.Key == key })
}

// planTemplate is the workload with the install's image, variables,
// ConfigMap and record in its pod template.
func (pl *planner) planTemplate(p *installPlan, orig original, src *corev1.ConfigMap) (workload, error) {
	d, t, o := p.w, p.t, pl.o
	rec := record{Image: o.Image, ConfigMap: p.gen.Name, Source: mountedHash(orig.Volume, src.Data, src.BinaryData), Original: orig}
	ann, err := json.Marshal(rec)
	if err != nil {
		return nil, err
	}
	p.ann = string(ann)
	want := d.copyOf()
	tmpl := want.template()
	if tmpl.Annotations == nil {
		tmpl.Annotations = map[string]string{}
	}
	tmpl.Annotations[Annotation] = p.ann
	wc := &tmpl.Spec.Containers[t.container]
	wc.Image = o.Image
	wc.Env = append(notOurs(orig.Env), Env...)
	vol := orig.Volume.DeepCopy()
	vol.ConfigMap.Name = p.gen.Name
	tmpl.Spec.Volumes[t.volume] = *vol
	pl.rep.ImageBefore, pl.rep.ImageAfter = d.template().Spec.Containers[t.container].Image, o.Image
	return want, nil
}

// planStrategy decides how the pods roll: with the workload's own
// rollout settings, or temporary ones (planRollout). It returns why the
// rollout must not start.
func (pl *planner) planStrategy(ctx context.Context, c kubernetes.Interface, p *installPlan, want workload) []string {
	d, o := p.w, pl.o
	p.before = d.operatorView()
	if rec, _ := recordedStrategy(d.meta()); rec != nil && p.before != d && equalJSON(p.before.object(), operatorRecordDropped(d)) {
		pl.warn(fmt.Sprintf("%s: the strategy was set since a run that was cut off recorded it (annotation %s): the strategy set since is kept, and the record dropped", ref(d), StrategyAnnotation))
	}
	if equality.Semantic.DeepEqual(*d.template(), *want.template()) {
		pl.rep.Rollout = "none: the " + d.kind() + " has k8s_event already"
		p.release = fieldsHeld(d.meta())
		if p.before != d {
			p.finish, p.strategy = true, true
			pl.rep.Rollout = "none to start: " + d.interruptedRollout()
		}
		return nil
	}
	var refuse []string
	p.strategy, refuse = p.before.planRollout(ctx, c, pl, want, settleFor(p.before, o))
	return refuse
}

// operatorRecordDropped is d without its record of the operator's
// settings, and with its live ones: what operatorView gives when the
// record is stale.
func operatorRecordDropped(d workload) runtime.Object {
	v := d.copyOf()
	delete(v.meta().Annotations, StrategyAnnotation)
	return v.object()
}

// planWrites works out the RBAC, the workload's patch, whether the
// ConfigMap is there already, and which ConfigMaps go after the rollout.
func (pl *planner) planWrites(ctx context.Context, c kubernetes.Interface, p *installPlan, want workload) error {
	d, gen := p.w, p.gen
	ns := d.meta().Namespace
	sa := d.template().Spec.ServiceAccountName
	if sa == "" {
		sa = "default"
	}
	role, binding := rbacFor(d.meta(), sa)
	var err error
	if p.rbac, err = planRBAC(ctx, c, role, binding, d.meta().Name); err != nil {
		return err
	}
	if p.rbac, err = pl.planExtras(ctx, c, p.rbac, ns, d.meta().Name, d.kind(), sa); err != nil {
		return err
	}
	if p.patch, err = workloadPatch(d, want); err != nil {
		return err
	}
	switch have, err := c.CoreV1().ConfigMaps(ns).Get(ctx, gen.Name, metav1.GetOptions{}); {
	case err == nil && (!ours(have.ObjectMeta, d.meta().Name) || mountedHash(p.t.current().Volume, have.Data, have.BinaryData) != mountedHash(p.t.current().Volume, gen.Data, gen.BinaryData)):
		return &RefusedError{[]string{fmt.Sprintf("configmap %s/%s is there and is not what install would write (its labels or its content differ): the pods would read it; delete it, or rename it, and run install again", ns, gen.Name)}}
	case err == nil:
		p.genThere = true
	case !apierrors.IsNotFound(err):
		return err
	default:
		p.source = p.t.source.Name
		p.diff = Diff(p.t.source.Data[p.t.key], gen.Data[p.t.key])
	}
	p.prunes, err = unusedConfigMaps(ctx, c, d, gen.Name)
	return err
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
