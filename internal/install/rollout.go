package install

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
)

// waitRollout waits, for up to within, until every pod of the workload w
// runs its current template and is available. On time out it says why
// the new pods are not Ready. With t, a container of the new template
// that restarts fails the wait at once.
func waitRollout(ctx context.Context, c kubernetes.Interface, w workload, within time.Duration, t *target) (workload, error) {
	var last workload
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, within, true, func(ctx context.Context) (bool, error) {
		d, err := w.get(ctx, c)
		if err != nil {
			return false, stopOn(err)
		}
		last = d
		if t != nil {
			if err := restarted(ctx, c, d, t); err != nil {
				return false, err
			}
		}
		return d.rolledOut(), nil
	})
	if err == nil {
		return last, nil
	}
	if !wait.Interrupted(err) {
		return last, err
	}
	st := ""
	if last != nil {
		st = ": " + last.progress()
		if why := podTrouble(context.WithoutCancel(ctx), c, last); len(why) > 0 {
			st += "; " + strings.Join(why, "; ")
		}
	}
	return last, fmt.Errorf("%s did not roll out within %v%s", ref(w), within, st)
}

// podTrouble says why the workload's pods that are not Ready are not.
func podTrouble(ctx context.Context, c kubernetes.Interface, w workload) []string {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	list, err := pods(ctx, c, w)
	if err != nil {
		return nil
	}
	var why []string
	for _, p := range list {
		if podReady(&p) || p.DeletionTimestamp != nil {
			continue
		}
		var s []string
		for _, cs := range p.Status.ContainerStatuses {
			switch {
			case cs.State.Waiting != nil:
				s = append(s, fmt.Sprintf("container %s waiting: %s %s", cs.Name, cs.State.Waiting.Reason, cs.State.Waiting.Message))
			case cs.State.Terminated != nil:
				s = append(s, fmt.Sprintf("container %s terminated: %s (exit %d)", cs.Name, cs.State.Terminated.Reason, cs.State.Terminated.ExitCode))
			case !cs.Ready:
				s = append(s, fmt.Sprintf("container %s running, not ready (restarts %d)", cs.Name, cs.RestartCount))
			}
		}
		evs, err := c.CoreV1().Events(p.Namespace).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + p.Name + ",type=Warning"})
		if err == nil && len(evs.Items) > 0 {
			sort.Slice(evs.Items, func(i, j int) bool { return evs.Items[i].LastTimestamp.Before(&evs.Items[j].LastTimestamp) })
			e := evs.Items[len(evs.Items)-1]
			s = append(s, fmt.Sprintf("%s: %s", e.Reason, e.Message))
		}
		if len(s) == 0 {
			s = append(s, string(p.Status.Phase))
		}
		why = append(why, fmt.Sprintf("pod %s: %s", p.Name, strings.Join(s, ", ")))
	}
	return why
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// putBack patches back to before's what the run sets in the workload's
// template (the image and variables of t's container, the config volume,
// the record), keeping what others changed meanwhile and the strategy it
// has now, deletes the pods no controller replaces, and waits for that
// rollout. It returns what it went through.
func putBack(ctx context.Context, c kubernetes.Interface, before workload, t *target, within time.Duration) (applied, error) {
	a, err := applyStep(ctx, templatePutBack(c, before, t))
	if err != nil {
		return a, err
	}
	now, err := before.get(ctx, c)
	if err != nil {
		return a, err
	}
	stale, err := now.staleSteps(ctx, c, t)
	if err != nil {
		return a, err
	}
	b, err := apply(ctx, stale, false)
	a = a.add(b)
	if err != nil {
		return a, fmt.Errorf("deleting the pods of the failed template: %w", err)
	}
	_, err = waitRollout(ctx, c, before, within, nil)
	return a, err
}

// templatePutBack is the patch that puts back the template as before had
// it (see putBack), after a rollout that failed.
func templatePutBack(c kubernetes.Interface, before workload, t *target) step {
	return step{
		change: Change{Action: "update", Kind: kindName(before), Name: nsName(before), Detail: "template put back as it was: the rollout failed"},
		line:   "put back " + ref(before),
		do: func(ctx context.Context) error {
			return retry.RetryOnConflict(retry.DefaultRetry, func() error {
				now, err := before.get(ctx, c)
				if err != nil {
					return err
				}
				p, err := workloadPatch(now, putBackTemplate(now, before, t))
				if err != nil || p == nil {
					return err
				}
				return now.patch(ctx, c, types.StrategicMergePatchType, p.body, metav1.PatchOptions{FieldManager: FieldManager})
			})
		},
	}
}

// putBackTemplate is now with what the run sets in the template (see
// putBack) as before has it; without t, or where the container or the
// volume is no longer found by name, before's whole template.
func putBackTemplate(now, before workload, t *target) workload {
	want := now.copyOf()
	tmpl, was := want.template(), before.template()
	if t == nil || t.container >= len(was.Spec.Containers) || t.volume >= len(was.Spec.Volumes) {
		*tmpl = *was.DeepCopy()
		return want
	}
	old, vol := was.Spec.Containers[t.container], was.Spec.Volumes[t.volume]
	ci := slices.IndexFunc(tmpl.Spec.Containers, func(c corev1.Container) bool { return c.Name == old.Name })
	vi := slices.IndexFunc(tmpl.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == vol.Name })
	if ci < 0 || vi < 0 {
		*tmpl = *was.DeepCopy()
		return want
	}
	ctr := &tmpl.Spec.Containers[ci]
	ctr.Image, ctr.Env = old.Image, slices.Clone(old.Env)
	tmpl.Spec.Volumes[vi] = *vol.DeepCopy()
	if a, ok := was.Annotations[Annotation]; ok {
		if tmpl.Annotations == nil {
			tmpl.Annotations = map[string]string{}
		}
		tmpl.Annotations[Annotation] = a
	} else if delete(tmpl.Annotations, Annotation); len(tmpl.Annotations) == 0 {
		tmpl.Annotations = nil
	}
	return want
}

// releaseFields drops the install's entries from the workload's
// managedFields: what it set stays, owned by nobody, so that whoever
// applies the workload server-side next (helm 4, kubectl apply
// --server-side) sets those fields without a conflict.
func releaseFields(ctx context.Context, c kubernetes.Interface, w workload) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		now, err := w.get(ctx, c)
		if err != nil {
			return err
		}
		d := now.meta()
		var keep []metav1.ManagedFieldsEntry
		for _, m := range d.ManagedFields {
			if m.Manager != FieldManager {
				keep = append(keep, m)
			}
		}
		// An empty list would not be taken as one: the fields stay the
		// install's, with no other manager to conflict with.
		if len(keep) == len(d.ManagedFields) || len(keep) == 0 {
			return nil
		}
		body, err := json.Marshal(map[string]any{"metadata": map[string]any{"managedFields": keep, "resourceVersion": d.ResourceVersion}})
		if err != nil {
			return err
		}
		return now.patch(ctx, c, types.MergePatchType, body, metav1.PatchOptions{})
	})
}

// fieldsHeld reports whether the install still owns fields of d beside
// another manager: a run was cut off after its rollout, before it gave
// them up (releaseFields), and the next server-side apply conflicts.
func fieldsHeld(d metav1.Object) bool {
	ours := slices.ContainsFunc(d.GetManagedFields(), func(m metav1.ManagedFieldsEntry) bool { return m.Manager == FieldManager })
	others := slices.ContainsFunc(d.GetManagedFields(), func(m metav1.ManagedFieldsEntry) bool { return m.Manager != FieldManager })
	return ours && others
}

// unusedConfigMaps are the Corefile ConfigMaps made for the workload
// that neither it nor any of the revisions its controller keeps refers
// to, besides keep: `kubectl rollout undo` to any revision kept finds the
// Corefile that revision reads.
func unusedConfigMaps(ctx context.Context, c kubernetes.Interface, w workload, keep string) ([]string, error) {
	d := w.meta()
	ns := d.Namespace
	cms, err := c.CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{LabelSelector: DeploymentLabel + "=" + d.Name})
	if err != nil {
		return nil, err
	}
	used := map[string]bool{keep: true}
	refs := func(spec *corev1.PodSpec) {
		for _, v := range spec.Volumes {
			if v.ConfigMap != nil {
				used[v.ConfigMap.Name] = true
			}
			if v.Projected != nil {
				for _, s := range v.Projected.Sources {
					if s.ConfigMap != nil {
						used[s.ConfigMap.Name] = true
					}
				}
			}
		}
	}
	refs(&w.template().Spec)
	revs, err := w.revisions(ctx, c)
	if err != nil {
		return nil, err
	}
	for i := range revs {
		refs(&revs[i].Spec)
	}
	var out []string
	for _, cm := range cms.Items {
		if !used[cm.Name] && ours(cm.ObjectMeta, d.Name) {
			out = append(out, cm.Name)
		}
	}
	sort.Strings(out)
	return out, nil
}

// prune deletes the Corefile ConfigMaps nothing reads any more, and
// returns what it went through.
func prune(ctx context.Context, c kubernetes.Interface, w workload, keep string) (applied, error) {
	d, err := w.get(ctx, c)
	if err != nil {
		return applied{}, err
	}
	ns, name := w.meta().Namespace, w.meta().Name
	unused, err := unusedConfigMaps(ctx, c, d, keep)
	if err != nil {
		return applied{}, err
	}
	var steps []step
	for _, cm := range unused {
		steps = append(steps, step{
			change: Change{Action: "delete", Kind: "configmap", Name: ns + "/" + cm, Detail: "no revision of " + strings.ToLower(w.kind()) + " " + name + " reads it"},
			line:   "delete configmap " + ns + "/" + cm,
			do: func(ctx context.Context) error {
				err := c.CoreV1().ConfigMaps(ns).Delete(ctx, cm, metav1.DeleteOptions{})
				if apierrors.IsNotFound(err) {
					return nil
				}
				return err
			},
		})
	}
	return apply(ctx, steps, false)
}

// strategyStep is the patch that gives before's rollout settings back,
// said as ch.
func strategyStep(c kubernetes.Interface, before workload, ch Change, line string) step {
	return step{change: ch, line: line, do: func(ctx context.Context) error { return setStrategy(ctx, c, before) }}
}

// rollout waits for the rollout the run started, checks it and waits for
// it to settle; on failure it puts back the workload's template and
// rollout settings as before had them, or says what to do as the cluster
// now is. Then it puts back the operator's settings, gives up the fields
// it set, and deletes the Corefile ConfigMaps nothing reads any more. tmp
// says the run set temporary rollout settings; gen, when not nil, is the
// ConfigMap the workload must read.
func (r *run) rollout(ctx context.Context, c kubernetes.Interface, before workload, tmp bool, t *target, verify func(workload) error, gen *corev1.ConfigMap) error {
	o := r.o
	// What follows runs to its end even when the run is interrupted: an
	// interrupted rollout is put back.
	after := func() (context.Context, context.CancelFunc) {
		return context.WithTimeout(context.WithoutCancel(ctx), min(o.Wait, 2*time.Minute)+30*time.Second)
	}
	if o.Wait > 0 {
		err := r.rollAndSettle(ctx, c, before, tmp, t, verify)
		var other *changedError
		if errors.As(err, &other) {
			// Someone else's template is rolling: leave it, but give
			// back the operator's settings.
			return r.strategyBack(after, c, before, tmp, other.err)
		}
		if err != nil {
			bctx, cancel := after()
			defer cancel()
			return r.putBackFailed(bctx, c, before, tmp, t, err)
		}
	}
	bctx, cancel := after()
	defer cancel()
	if tmp {
		a, err := applyStep(bctx, strategyStep(c, before, Change{Action: "patch", Kind: kindName(before), Name: nsName(before), Detail: "strategy back to " + before.rolloutString()}, "patch "+ref(before)))
		if err != nil {
			r.res.Undo = strategyCommand(before)
			return fmt.Errorf("the rollout is done, but putting back the strategy failed (%v): run\n  %s", err, r.res.Undo)
		}
		r.wrote(a)
	}
	a, err := afterRollout(bctx, c, before, gen)
	r.wrote(a)
	if err != nil {
		return err
	}
	if o.Wait > 0 {
		r.printf("%s rolled out\n", ref(before))
	}
	return nil
}

// changedError is a workload that something else changed during the
// rollout.
type changedError struct{ err error }

func (e *changedError) Error() string { return e.err.Error() }

// rollAndSettle runs the workload's stages, waits for its rollout,
// checks that it is the run's, and waits for its pods to settle, all
// within --timeout and one settle time.
func (r *run) rollAndSettle(ctx context.Context, c kubernetes.Interface, before workload, tmp bool, t *target, verify func(workload) error) error {
	// One deadline bounds the canary, the batches, the rollout and the
	// settle alike: --timeout, and the settle time the last pods must
	// then stay Ready for; where the rollout settles on k8s_event's
	// startup event, the longest a pod may take to write it too.
	ctx, cancel := context.WithTimeout(ctx, r.o.Wait+settleFor(before, r.o)+t.events.wait)
	defer cancel()
	if tmp {
		if err := before.rollStages(ctx, c, r, t, settleFor(before, r.o)); err != nil {
			return err
		}
	}
	now, err := waitRollout(ctx, c, before, r.o.Wait, t)
	if err != nil {
		return err
	}
	if err := verify(now); err != nil {
		return &changedError{err}
	}
	note, err := settle(ctx, c, now, t, settleFor(now, r.o))
	if note != "" {
		r.printf("%s\n", note)
	}
	return err
}

// kindName is the kind of w as a Change names it; nsName its name.
func kindName(w workload) string { return strings.ToLower(w.kind()) }
func nsName(w workload) string   { return w.meta().Namespace + "/" + w.meta().Name }

// strategyBack gives back the operator's settings after err, when the run
// set temporary ones.
func (r *run) strategyBack(after func() (context.Context, context.CancelFunc), c kubernetes.Interface, before workload, tmp bool, err error) error {
	if !tmp {
		return err
	}
	bctx, cancel := after()
	defer cancel()
	a, serr := applyStep(bctx, strategyPutBack(c, before))
	r.wrote(a)
	if serr != nil {
		r.res.Undo = strategyCommand(before)
		return fmt.Errorf("%w; putting back the strategy failed (%v): run\n  %s", err, serr, r.res.Undo)
	}
	return err
}

// strategyPutBack is the patch that gives before's settings back after a
// rollout that did not finish.
func strategyPutBack(c kubernetes.Interface, before workload) step {
	return strategyStep(c, before, Change{Action: "update", Kind: kindName(before), Name: nsName(before), Detail: "strategy put back as it was: " + before.rolloutString()}, "put back "+ref(before))
}

// putBackFailed puts back the template and the strategy after a rollout
// that failed with err, and says what is left to do as the cluster now
// is: never kubectl rollout undo when the template is the operator's
// already, as undo would roll to the failed revision.
func (r *run) putBackFailed(ctx context.Context, c kubernetes.Interface, before workload, tmp bool, t *target, err error) error {
	ns := before.meta().Namespace
	r.printf("%v\nputting back %s as it was\n", err, ref(before))
	a, perr := putBack(ctx, c, before, t, min(r.o.Wait, 2*time.Minute))
	r.wrote(a)
	var serr error
	if tmp {
		a, serr = applyStep(ctx, strategyPutBack(c, before))
		r.wrote(a)
	}
	// The put back is written as the install: what it set is the operator's again, owned by
	// nobody, so that the next server-side apply sets it without a conflict.
	if ferr := releaseFields(ctx, c, before); ferr != nil {
		err = fmt.Errorf("%w; the install's field ownership not given up (%v): uninstall gives it up", err, ferr)
	}
	if perr == nil && serr == nil {
		// What the run created for the pods that did not start goes too.
		r.takeBack(ctx)
		return fmt.Errorf("%w; %s is back as it was (template and strategy)", err, ref(before))
	}
	now, gerr := before.get(ctx, c)
	var todo []string
	switch {
	case gerr != nil || !equality.Semantic.DeepEqual(*now.template(), *putBackTemplate(now, before, t).template()):
		todo = append(todo, fmt.Sprintf("kubectl -n %s rollout undo %s", ns, kubectlRef(before)))
	case perr != nil:
		// The template is the operator's again; only its rollout has not
		// finished, as it had not before the install.
		r.takeBack(ctx)
		have, want := now.available(), now.replicas()
		if serr == nil && have >= before.available() {
			return fmt.Errorf("%w; %s is back as it was (template and strategy), with %d of %d available as before the install: its rollout had not finished then either (kubectl -n %s describe %s says why)", err, ref(before), have, want, ns, kubectlRef(before))
		}
		perr = fmt.Errorf("the template is back as it was, but its rollout has not finished (%d of %d available; %d were before the install): kubectl -n %s describe %s says why; undoing the rollout would go back to the failed revision", have, want, before.available(), ns, kubectlRef(before))
	}
	if serr != nil {
		todo = append(todo, strategyCommand(before))
	}
	if len(todo) == 0 {
		return fmt.Errorf("%w; %v", err, perr)
	}
	r.res.Undo = strings.Join(todo, "\n")
	return fmt.Errorf("%w; putting it back failed too (%v): run\n  %s", err, errors.Join(perr, serr), strings.Join(todo, "\n  "))
}

// afterRollout gives up the install's fields, prunes the ConfigMaps no
// revision reads, and makes sure gen is there; it returns what it went
// through.
func afterRollout(ctx context.Context, c kubernetes.Interface, w workload, gen *corev1.ConfigMap) (applied, error) {
	ns := w.meta().Namespace
	if err := releaseFields(ctx, c, w); err != nil {
		return applied{}, fmt.Errorf("%s: giving up the install's field ownership: %w", ref(w), err)
	}
	keep := ""
	if gen != nil {
		keep = gen.Name
	}
	a, err := prune(ctx, c, w, keep)
	if err != nil || gen == nil {
		return a, err
	}
	// Whatever ran meanwhile, the Corefile the workload reads is there.
	if _, err := c.CoreV1().ConfigMaps(ns).Get(ctx, gen.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		return a, nil
	}
	b, err := apply(ctx, []step{{
		change: Change{Action: "create", Kind: "configmap", Name: ns + "/" + gen.Name, Detail: "it was gone"},
		line:   "create configmap " + ns + "/" + gen.Name,
		do: func(ctx context.Context) error {
			_, err := c.CoreV1().ConfigMaps(ns).Create(ctx, gen, metav1.CreateOptions{FieldManager: FieldManager})
			if apierrors.IsAlreadyExists(err) {
				return errKept
			}
			return err
		},
	}}, false)
	return a.add(b), err
}

func ptrOr(p *int32, v int32) int32 {
	if p == nil {
		return v
	}
	return *p
}
