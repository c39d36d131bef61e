package install

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
)

// daemonSet is CoreDNS run as a DaemonSet: a pod on every node it is
// scheduled on. Its rollout goes a canary first, then batch by batch (see
// planRollout and rollStages).
type daemon struct{ d *appsv1.DaemonSet }

func daemonSetOf(d *appsv1.DaemonSet) *daemon { return &daemon{d} }

func (w *daemon) kind() string                      { return kindDaemonSet }
func (w *daemon) meta() *metav1.ObjectMeta          { return &w.d.ObjectMeta }
func (w *daemon) template() *corev1.PodTemplateSpec { return &w.d.Spec.Template }
func (w *daemon) selector() *metav1.LabelSelector   { return w.d.Spec.Selector }
func (w *daemon) minReadySeconds() int32            { return w.d.Spec.MinReadySeconds }
func (w *daemon) object() runtime.Object            { return w.d }
func (w *daemon) copyOf() workload                  { return daemonSetOf(w.d.DeepCopy()) }
func (w *daemon) replicas() int32                   { return w.d.Status.DesiredNumberScheduled }
func (w *daemon) ready() int32                      { return w.d.Status.NumberReady }
func (w *daemon) available() int32                  { return w.d.Status.NumberAvailable }
func (w *daemon) paused() bool                      { return false }
func (w *daemon) stalled() []string                 { return nil }
func (w *daemon) resource() string                  { return "daemonsets" }
func (w *daemon) revisionResource() string          { return "controllerrevisions" }

// rolledOut is `kubectl rollout status daemonset`: every node it is
// scheduled on runs a pod of the current template, available.
func (w *daemon) rolledOut() bool {
	s := w.d.Status
	return s.ObservedGeneration >= w.d.Generation && s.UpdatedNumberScheduled >= s.DesiredNumberScheduled && s.NumberAvailable >= s.DesiredNumberScheduled
}

func (w *daemon) progress() string {
	s := w.d.Status
	return fmt.Sprintf("%d scheduled, %d updated, %d available, %d unavailable", s.DesiredNumberScheduled, s.UpdatedNumberScheduled, s.NumberAvailable, s.NumberUnavailable)
}

func (w *daemon) get(ctx context.Context, c kubernetes.Interface) (workload, error) {
	return getDaemonSet(ctx, c, w.d.Namespace, w.d.Name)
}

func (w *daemon) patch(ctx context.Context, c kubernetes.Interface, pt types.PatchType, body []byte, o metav1.PatchOptions) error {
	_, err := c.AppsV1().DaemonSets(w.d.Namespace).Patch(ctx, w.d.Name, pt, body, o)
	return err
}

// revisions are the templates of the ControllerRevisions of the
// DaemonSet: each holds a patch that replaces the template whole.
func (w *daemon) revisions(ctx context.Context, c kubernetes.Interface) ([]corev1.PodTemplateSpec, error) {
	revs, err := c.AppsV1().ControllerRevisions(w.d.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	var out []corev1.PodTemplateSpec
	for _, rev := range revs.Items {
		if !slices.ContainsFunc(rev.OwnerReferences, func(r metav1.OwnerReference) bool { return r.UID == w.d.UID }) {
			continue
		}
		if tmpl, ok := lastAppliedTemplate(string(rev.Data.Raw)); ok {
			out = append(out, *tmpl)
		}
	}
	return out, nil
}

func getDaemonSet(ctx context.Context, c kubernetes.Interface, ns, name string) (workload, error) {
	d, err := c.AppsV1().DaemonSets(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	return daemonSetOf(d), nil
}

// listDaemonSets are the DaemonSets of ns that sel selects; none when
// they cannot be listed.
func listDaemonSets(ctx context.Context, c kubernetes.Interface, ns, sel string) []workload {
	list, err := c.AppsV1().DaemonSets(ns).List(ctx, metav1.ListOptions{LabelSelector: sel})
	if err != nil {
		return nil
	}
	var out []workload
	for i := range list.Items {
		out = append(out, daemonSetOf(&list.Items[i]))
	}
	return out
}

func updateStrategyString(s appsv1.DaemonSetUpdateStrategy) string {
	if s.Type == appsv1.OnDeleteDaemonSetStrategyType {
		return "OnDelete"
	}
	mu, ms := "1", "0"
	if s.RollingUpdate != nil && s.RollingUpdate.MaxUnavailable != nil {
		mu = s.RollingUpdate.MaxUnavailable.String()
	}
	if s.RollingUpdate != nil && s.RollingUpdate.MaxSurge != nil {
		ms = s.RollingUpdate.MaxSurge.String()
	}
	return fmt.Sprintf("RollingUpdate, maxSurge %s, maxUnavailable %s", ms, mu)
}

func (w *daemon) rolloutString() string { return updateStrategyString(w.d.Spec.UpdateStrategy) }

// updateStrategyJSON is s as a merge patch sets it whole.
func updateStrategyJSON(s appsv1.DaemonSetUpdateStrategy) map[string]any {
	m := map[string]any{"type": s.Type, "rollingUpdate": nil}
	if s.RollingUpdate != nil {
		m["rollingUpdate"] = s.RollingUpdate
	}
	if s.Type == "" {
		m["type"] = nil
	}
	return m
}

func (w *daemon) strategyPatch() []byte {
	b, _ := json.Marshal(map[string]any{
		"metadata": map[string]any{"annotations": map[string]any{StrategyAnnotation: nil}},
		"spec":     map[string]any{"updateStrategy": updateStrategyJSON(w.d.Spec.UpdateStrategy), "minReadySeconds": w.d.Spec.MinReadySeconds},
	})
	return b
}

// operatorView: see workload.operatorView.
func (w *daemon) operatorView() workload {
	d := w.d
	s, err := recordedStrategy(&d.ObjectMeta)
	if s == nil || err != nil {
		return w
	}
	v := d.DeepCopy()
	var op appsv1.DaemonSetUpdateStrategy
	if !s.stale(d.Spec.UpdateStrategy, d.Spec.MinReadySeconds) && json.Unmarshal(s.Strategy, &op) == nil {
		v.Spec.UpdateStrategy, v.Spec.MinReadySeconds = op, s.MinReadySeconds
	}
	delete(v.Annotations, StrategyAnnotation)
	return daemonSetOf(v)
}

func (w *daemon) interruptedRollout() string {
	d := w.d
	s, err := recordedStrategy(&d.ObjectMeta)
	switch {
	case err != nil:
		return err.Error()
	case s == nil:
		return ""
	case s.stale(d.Spec.UpdateStrategy, d.Spec.MinReadySeconds):
		return fmt.Sprintf("a run was cut off during its rollout, and its record of your updateStrategy (annotation %s) is out of date: the updateStrategy was set since (%s) and is kept; the next install or uninstall drops the record", StrategyAnnotation, w.rolloutString())
	}
	var op appsv1.DaemonSetUpdateStrategy
	_ = json.Unmarshal(s.Strategy, &op)
	return fmt.Sprintf("a run was cut off during its rollout: the DaemonSet rolls with the updateStrategy it set (%s) in place of yours (%s), recorded in annotation %s; run install again to finish that rollout and put yours back, or uninstall", w.rolloutString(), updateStrategyString(op), StrategyAnnotation)
}

// surgeAllowed reports whether a surge pod can run beside the old one on
// its node: not where the pods use the node's network or a host port,
// which the old pod holds.
func surgeAllowed(spec *corev1.PodSpec) bool {
	if spec.HostNetwork {
		return false
	}
	for _, cs := range [][]corev1.Container{spec.InitContainers, spec.Containers} {
		for _, c := range cs {
			if slices.ContainsFunc(c.Ports, func(p corev1.ContainerPort) bool { return p.HostPort != 0 }) {
				return false
			}
		}
	}
	return true
}

// batchStrategy is the RollingUpdate the pods roll with after the
// canary: the operator's maxUnavailable (1 when they set none, or
// OnDelete) as the batch; where a surge pod can run beside the old one,
// the batch is added before the old pods go (maxSurge), else the batch
// goes down at a time (maxUnavailable).
func (w *daemon) batchStrategy() appsv1.DaemonSetUpdateStrategy {
	batch := intstr.FromInt32(1)
	if ru := w.d.Spec.UpdateStrategy.RollingUpdate; w.d.Spec.UpdateStrategy.Type != appsv1.OnDeleteDaemonSetStrategyType && ru != nil {
		if ru.MaxUnavailable != nil && ru.MaxUnavailable.String() != "0" && ru.MaxUnavailable.String() != "0%" {
			batch = *ru.MaxUnavailable
		}
	}
	ru := &appsv1.RollingUpdateDaemonSet{MaxUnavailable: ptrTo(batch), MaxSurge: ptrTo(intstr.FromInt32(0))}
	if surgeAllowed(&w.d.Spec.Template.Spec) {
		ru.MaxUnavailable, ru.MaxSurge = ptrTo(intstr.FromInt32(0)), ptrTo(batch)
	}
	return appsv1.DaemonSetUpdateStrategy{Type: appsv1.RollingUpdateDaemonSetStrategyType, RollingUpdate: ru}
}

// planRollout: a canary first, with updateStrategy OnDelete and
// minReadySeconds raised to the settle time; then batches (rollStages).
// Without a wait there is no canary: refused, or with Force the
// operator's updateStrategy.
func (w *daemon) planRollout(_ context.Context, _ kubernetes.Interface, pl *planner, want workload, settle time.Duration) (bool, []string) {
	wd, op := want.(*daemon).d, w.d
	wd.Spec.UpdateStrategy, wd.Spec.MinReadySeconds = op.Spec.UpdateStrategy, op.Spec.MinReadySeconds
	delete(wd.Annotations, StrategyAnnotation)
	if pl.o.Wait <= 0 {
		why := fmt.Sprintf("a DaemonSet rolls a canary first and then batch by batch, which the run must watch, and with --timeout 0 %s does not wait", pl.command)
		pl.rep.Rollout = "with the DaemonSet's own updateStrategy (" + w.rolloutString() + ")"
		if !pl.o.Force {
			return false, []string{why + ": give a --timeout, or --force to roll with the DaemonSet's own updateStrategy"}
		}
		pl.warn("--force: " + why)
		return false, nil
	}
	tmp := appsv1.DaemonSetUpdateStrategy{Type: appsv1.OnDeleteDaemonSetStrategyType}
	wd.Spec.UpdateStrategy = tmp
	wd.Spec.MinReadySeconds = max(op.Spec.MinReadySeconds, int32(settle/time.Second))
	recordRollout(&wd.ObjectMeta, op.Spec.UpdateStrategy, op.Spec.MinReadySeconds, tmp, wd.Spec.MinReadySeconds)
	batch := w.batchStrategy()
	surge := "maxSurge " + batch.RollingUpdate.MaxSurge.String() + ", maxUnavailable 0 (a node's new pod starts beside its old one)"
	if !surgeAllowed(&op.Spec.Template.Spec) {
		surge = "maxUnavailable " + batch.RollingUpdate.MaxUnavailable.String() + ", no surge (the pods use the node's network or a host port, which the old pod holds)"
	}
	canary := "updateStrategy OnDelete: one pod deleted and replaced"
	if surgeAllowed(&op.Spec.Template.Spec) {
		canary = "RollingUpdate, maxSurge 1, maxUnavailable 0: one node's new pod beside its old one"
	}
	pl.rep.Rollout = fmt.Sprintf("a canary first (%s, which must be Ready without a restart for %v), then RollingUpdate batch by batch with %s, each batch Ready without a restart for %v (minReadySeconds %d) before the next; your updateStrategy (%s) and minReadySeconds (%d) are put back after", canary, settle, surge, settle, wd.Spec.MinReadySeconds, w.rolloutString(), op.Spec.MinReadySeconds)
	return true, nil
}

// rollStages replaces one pod (the canary) and waits for its
// replacement to settle; then sets the batch strategy and watches the
// batches roll (updatedNumberScheduled, numberUnavailable) until every
// node runs the new template. A restart of a new pod fails the rollout.
func (w *daemon) rollStages(ctx context.Context, c kubernetes.Interface, r *run, t *target, settle time.Duration) error {
	now, err := w.get(ctx, c)
	if err != nil {
		return err
	}
	if surgeAllowed(&w.d.Spec.Template.Spec) {
		err = r.surgeCanary(ctx, c, w, now.(*daemon), t, settle)
	} else {
		err = r.canary(ctx, c, now.(*daemon), t, settle)
	}
	if err != nil {
		return err
	}
	live, err := w.get(ctx, c)
	if err != nil {
		return err
	}
	a, err := w.setTemporary(ctx, c, live.(*daemon), w.batchStrategy(), "the batches")
	r.wrote(a)
	if err != nil {
		return err
	}
	return r.watchBatches(ctx, c, w, t)
}

// surgeCanaryStrategy starts one node's new pod beside its old one.
func surgeCanaryStrategy() appsv1.DaemonSetUpdateStrategy {
	return appsv1.DaemonSetUpdateStrategy{Type: appsv1.RollingUpdateDaemonSetStrategyType, RollingUpdate: &appsv1.RollingUpdateDaemonSet{
		MaxUnavailable: ptrTo(intstr.FromInt32(0)), MaxSurge: ptrTo(intstr.FromInt32(1)),
	}}
}

// stageSteps are, for a dry run, the writes rollStages makes during the
// rollout: the canary's (a strategy patch, or the delete of one pod,
// which the run picks then), then the batches' strategy patch.
func (w *daemon) stageSteps() []step {
	kind, name := kindName(w), nsName(w)
	const when = "during the rollout"
	canary := step{
		change: Change{Action: "patch", Kind: kind, Name: name, When: when, Detail: "updateStrategy for the canary: " + updateStrategyString(surgeCanaryStrategy())},
		line:   when + ", patch " + ref(w) + " for the canary",
	}
	if !surgeAllowed(&w.d.Spec.Template.Spec) {
		pod := w.d.Namespace + "/(one pod of " + ref(w) + ")"
		canary = step{
			change: Change{Action: "delete", Kind: "pod", Name: pod, When: when, Detail: "the canary, picked during the rollout (a Ready one first): its replacement runs the new template first"},
			line:   when + ", delete one pod of " + ref(w) + " (the canary)",
		}
	}
	return []step{canary, {
		change: Change{Action: "patch", Kind: kind, Name: name, When: when, Detail: "updateStrategy for the batches: " + updateStrategyString(w.batchStrategy())},
		line:   when + ", patch " + ref(w) + " for the batches",
	}}
}

// dryStageSteps are the writes w's rollStages makes, for a dry run.
func dryStageSteps(w workload) []step {
	if ds, ok := w.(*daemon); ok {
		return ds.stageSteps()
	}
	return nil
}

// surgeCanary is the canary where a new pod can run beside the old one:
// RollingUpdate with maxSurge 1 and maxUnavailable 0 starts the new pod
// on one node beside its old one, which goes only once the new one has
// been available for minReadySeconds (the settle time); the run waits for
// that pod to settle. A canary that does not start stalls the controller
// there, and no node loses its pod.
func (r *run) surgeCanary(ctx context.Context, c kubernetes.Interface, op, live *daemon, t *target, settle time.Duration) error {
	old, err := pods(ctx, c, live)
	if err != nil {
		return err
	}
	if !slices.ContainsFunc(old, func(p corev1.Pod) bool { return !runsTemplate(&p, live.template(), t) }) {
		return nil
	}
	a, err := op.setTemporary(ctx, c, live, surgeCanaryStrategy(), "the canary")
	r.wrote(a)
	if err != nil {
		return err
	}
	var node string
	err = wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, r.o.Wait, true, func(ctx context.Context) (bool, error) {
		list, err := templatePods(ctx, c, live, t)
		if err != nil {
			return false, stopOn(err)
		}
		for _, p := range list {
			if p.Spec.NodeName != "" {
				node = p.Spec.NodeName
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		return fmt.Errorf("%s: no canary pod of the new template was scheduled within %v: %w", ref(live), r.o.Wait, err)
	}
	r.printf("canary: a new pod beside the old one on node %s\n", node)
	return r.settleCanary(ctx, c, live, t, settle, node)
}

// settleCanary waits for the pod of the new template on node to be Ready
// without a restart for the settle time.
func (r *run) settleCanary(ctx context.Context, c kubernetes.Interface, ds *daemon, t *target, settle time.Duration, node string) error {
	onNode := func(p *corev1.Pod) bool { return p.Spec.NodeName == node }
	note, err := settlePods(ctx, c, ds, t, settle, 1, onNode)
	if note != "" {
		r.printf("%s\n", note)
	}
	if err != nil {
		return fmt.Errorf("%s: the canary on node %s failed: %w", ref(ds), node, err)
	}
	r.printf("canary: the new pod on node %s settled\n", node)
	return nil
}

// canary deletes one pod of ds that does not run its template, and waits
// for the pod that replaces it on its node to be Ready without a restart
// for the settle time. With no such pod there is none to replace.
func (r *run) canary(ctx context.Context, c kubernetes.Interface, ds *daemon, t *target, settle time.Duration) error {
	list, err := pods(ctx, c, ds)
	if err != nil {
		return err
	}
	list = slices.DeleteFunc(list, func(p corev1.Pod) bool {
		return p.DeletionTimestamp != nil || runsTemplate(&p, ds.template(), t) || p.Spec.NodeName == ""
	})
	if len(list) == 0 {
		return nil
	}
	// A Ready pod first: the canary's node then had DNS before it.
	slices.SortStableFunc(list, func(a, b corev1.Pod) int { return boolCmp(podReady(&b), podReady(&a)) })
	old := list[0]
	node := old.Spec.NodeName
	r.printf("canary: replacing pod %s on node %s\n", old.Name, node)
	a, err := applyStep(ctx, canaryStep(c, &old))
	if err != nil {
		return fmt.Errorf("canary: delete pod %s: %w", old.Name, err)
	}
	r.wrote(a)
	return r.settleCanary(ctx, c, ds, t, settle, node)
}

// canaryStep deletes old, the canary's pod: its replacement on its node
// runs the new template first.
func canaryStep(c kubernetes.Interface, old *corev1.Pod) step {
	ns, name, uid := old.Namespace, old.Name, old.UID
	return step{
		change: Change{Action: "delete", Kind: "pod", Name: ns + "/" + name, Detail: "the canary: its replacement on node " + old.Spec.NodeName + " runs the new template first"},
		line:   "delete pod " + ns + "/" + name + " (the canary)",
		do: func(ctx context.Context) error {
			err := c.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
			if apierrors.IsNotFound(err) {
				return nil
			}
			return err
		},
	}
}

func boolCmp(a, b bool) int {
	switch {
	case a == b:
		return 0
	case a:
		return 1
	}
	return -1
}

// setTemporary sets the updateStrategy batch on live, recording it as
// the temporary one beside the operator's (w's); what says what for. It
// returns what it went through.
func (w *daemon) setTemporary(ctx context.Context, c kubernetes.Interface, live *daemon, batch appsv1.DaemonSetUpdateStrategy, what string) (applied, error) {
	want := live.d.DeepCopy()
	want.Spec.UpdateStrategy = batch
	recordRollout(&want.ObjectMeta, w.d.Spec.UpdateStrategy, w.d.Spec.MinReadySeconds, batch, live.d.Spec.MinReadySeconds)
	body, _ := json.Marshal(map[string]any{
		// No resourceVersion: the controller writes the status all the
		// while, and the patch sets only these two fields, the run's.
		"metadata": map[string]any{"annotations": map[string]any{StrategyAnnotation: want.Annotations[StrategyAnnotation]}},
		"spec":     map[string]any{"updateStrategy": updateStrategyJSON(batch)},
	})
	a, err := applyStep(ctx, step{
		change: Change{Action: "patch", Kind: kindName(w), Name: nsName(w), Detail: "updateStrategy for " + what + ": " + updateStrategyString(batch)},
		line:   "patch " + ref(w) + " for " + what,
		do: func(ctx context.Context) error {
			return live.patch(ctx, c, types.MergePatchType, body, metav1.PatchOptions{FieldManager: FieldManager})
		},
	})
	if err != nil {
		return a, fmt.Errorf("%s: setting the updateStrategy for %s: %w", ref(w), what, err)
	}
	return a, nil
}

// watchBatches waits until every node runs the new template, saying each
// batch as updatedNumberScheduled grows; a new pod that restarts fails
// it. The controller starts no batch before the last is available, which
// minReadySeconds holds to the settle time.
func (r *run) watchBatches(ctx context.Context, c kubernetes.Interface, w workload, t *target) error {
	var updated int32 = -1
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, r.o.Wait, true, func(ctx context.Context) (bool, error) {
		now, err := w.get(ctx, c)
		if err != nil {
			return false, stopOn(err)
		}
		if err := restarted(ctx, c, now, t); err != nil {
			return false, err
		}
		s := now.(*daemon).d.Status
		if s.UpdatedNumberScheduled != updated {
			updated = s.UpdatedNumberScheduled
			r.printf("batches: %d of %d nodes run the new template, %d unavailable\n", s.UpdatedNumberScheduled, s.DesiredNumberScheduled, s.NumberUnavailable)
		}
		return now.rolledOut(), nil
	})
	if wait.Interrupted(err) {
		return fmt.Errorf("%s did not roll out within %v", ref(w), r.o.Wait)
	}
	return err
}

// staleSteps are the deletes, under OnDelete, of the pods that do not
// run the template: the controller does not replace them (a canary that
// failed, its template since put back).
func (w *daemon) staleSteps(ctx context.Context, c kubernetes.Interface, t *target) ([]step, error) {
	if w.d.Spec.UpdateStrategy.Type != appsv1.OnDeleteDaemonSetStrategyType || t == nil {
		return nil, nil
	}
	list, err := pods(ctx, c, w)
	if err != nil {
		return nil, err
	}
	var steps []step
	for _, p := range list {
		if p.DeletionTimestamp != nil || runsTemplate(&p, w.template(), t) {
			continue
		}
		ns, name, uid := p.Namespace, p.Name, p.UID
		steps = append(steps, deleteStep(Change{Action: "delete", Kind: "pod", Name: ns + "/" + name, Detail: "runs the failed template, which OnDelete does not replace"}, "delete pod "+ns+"/"+name+" of the failed template", func(ctx context.Context) error {
			return c.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
		}))
	}
	return steps, nil
}
