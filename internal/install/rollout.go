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

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
)

// safeRollout decides how the rollout keeps the Ready pods the Deployment
// has: when its own strategy may take them below that count (the helm
// chart's one replica with maxUnavailable 1, kubeadm's two with 1,
// Recreate), the rollout runs with a temporary strategy that adds a pod
// before it takes one away, and the operator's is put back after. It
// returns that strategy (nil when the operator's is safe) and what the
// rollout does to availability.
func safeRollout(d *appsv1.Deployment) (*appsv1.DeploymentStrategy, string) {
	replicas := ptrOr(d.Spec.Replicas, 1)
	// Mid-rollout there may be more Ready pods than replicas; the
	// Deployment keeps no more than its replicas in the end.
	ready := min(d.Status.ReadyReplicas, replicas)
	s := d.Spec.Strategy
	unavailable, surge := int32(0), int32(0)
	switch s.Type {
	case appsv1.RecreateDeploymentStrategyType:
		unavailable = replicas
	default:
		mu, ms := intstr.FromString("25%"), intstr.FromString("25%")
		if s.RollingUpdate != nil && s.RollingUpdate.MaxUnavailable != nil {
			mu = *s.RollingUpdate.MaxUnavailable
		}
		if s.RollingUpdate != nil && s.RollingUpdate.MaxSurge != nil {
			ms = *s.RollingUpdate.MaxSurge
		}
		u, _ := intstr.GetScaledValueFromIntOrPercent(&mu, int(replicas), false)
		g, _ := intstr.GetScaledValueFromIntOrPercent(&ms, int(replicas), true)
		unavailable, surge = int32(u), int32(g)
	}
	floor := max(replicas-unavailable, 0)
	if floor >= ready {
		return nil, fmt.Sprintf("%d Ready of %d replicas; the Deployment's strategy keeps at least %d available: as it is", ready, replicas, floor)
	}
	surge = max(surge, 1)
	tmp := &appsv1.DeploymentStrategy{Type: appsv1.RollingUpdateDeploymentStrategyType, RollingUpdate: &appsv1.RollingUpdateDeployment{
		MaxUnavailable: ptrTo(intstr.FromInt32(0)), MaxSurge: ptrTo(intstr.FromInt32(surge)),
	}}
	return tmp, fmt.Sprintf("%d Ready of %d replicas; the Deployment's strategy (%s) could leave %d available, so the rollout runs with maxSurge %d, maxUnavailable 0 (no pod goes before its replacement is Ready), and the strategy is put back after", ready, replicas, strategyString(s), floor, surge)
}

func strategyString(s appsv1.DeploymentStrategy) string {
	if s.Type == appsv1.RecreateDeploymentStrategyType {
		return "Recreate"
	}
	mu, ms := "25%", "25%"
	if s.RollingUpdate != nil && s.RollingUpdate.MaxUnavailable != nil {
		mu = s.RollingUpdate.MaxUnavailable.String()
	}
	if s.RollingUpdate != nil && s.RollingUpdate.MaxSurge != nil {
		ms = s.RollingUpdate.MaxSurge.String()
	}
	return fmt.Sprintf("RollingUpdate, maxSurge %s, maxUnavailable %s", ms, mu)
}

// strategyPatch is the merge patch that sets the strategy to s.
func strategyPatch(op *appsv1.Deployment) []byte {
	s := op.Spec.Strategy
	m := map[string]any{"type": s.Type}
	if s.RollingUpdate != nil {
		m["rollingUpdate"] = s.RollingUpdate
	} else {
		m["rollingUpdate"] = nil
	}
	if s.Type == "" {
		m["type"] = nil
	}
	b, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]any{StrategyAnnotation: nil}}, "spec": map[string]any{"strategy": m, "minReadySeconds": op.Spec.MinReadySeconds}})
	return b
}

// setStrategy puts s back as the Deployment's strategy.
func setStrategy(ctx context.Context, c kubernetes.Interface, op *appsv1.Deployment) error {
	_, err := c.AppsV1().Deployments(op.Namespace).Patch(ctx, op.Name, types.MergePatchType, strategyPatch(op), metav1.PatchOptions{FieldManager: FieldManager})
	return err
}

// strategyCommand is the command that puts s back.
func strategyCommand(op *appsv1.Deployment) string {
	return fmt.Sprintf("kubectl -n %s patch deployment %s --type=merge -p '%s'", op.Namespace, op.Name, strategyPatch(op))
}

// waitRollout waits, for up to within, until every replica of the
// Deployment runs its current template and is available. On time out it
// says why the new pods are not Ready. With t, a container of the new
// template that restarts fails the wait at once.
func waitRollout(ctx context.Context, c kubernetes.Interface, ns, name string, within time.Duration, t *target) (*appsv1.Deployment, error) {
	var last *appsv1.Deployment
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, within, true, func(ctx context.Context) (bool, error) {
		d, err := c.AppsV1().Deployments(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, stopOn(err)
		}
		last = d
		if t != nil {
			if err := restarted(ctx, c, d, t); err != nil {
				return false, err
			}
		}
		return RolledOut(d), nil
	})
	if err == nil {
		return last, nil
	}
	if !wait.Interrupted(err) {
		return last, err
	}
	st := ""
	if last != nil {
		st = fmt.Sprintf(": %d replicas, %d updated, %d available", last.Status.Replicas, last.Status.UpdatedReplicas, last.Status.AvailableReplicas)
		if why := podTrouble(context.WithoutCancel(ctx), c, last); len(why) > 0 {
			st += "; " + strings.Join(why, "; ")
		}
	}
	return last, fmt.Errorf("deployment %s/%s did not roll out within %v%s", ns, name, within, st)
}

// podTrouble says why the Deployment's pods that are not Ready are not.
func podTrouble(ctx context.Context, c kubernetes.Interface, d *appsv1.Deployment) []string {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	sel, err := metav1.LabelSelectorAsSelector(d.Spec.Selector)
	if err != nil {
		return nil
	}
	pods, err := c.CoreV1().Pods(d.Namespace).List(ctx, metav1.ListOptions{LabelSelector: sel.String()})
	if err != nil {
		return nil
	}
	var why []string
	for _, p := range pods.Items {
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
		evs, err := c.CoreV1().Events(d.Namespace).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + p.Name + ",type=Warning"})
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

// RolledOut reports whether every replica of d runs its current template
// and is available, as `kubectl rollout status` tells.
func RolledOut(d *appsv1.Deployment) bool {
	want := ptrOr(d.Spec.Replicas, 1)
	s := d.Status
	return s.ObservedGeneration >= d.Generation && s.UpdatedReplicas == want && s.Replicas == want && s.AvailableReplicas == want
}

// putBack patches back to before's what the run sets in the Deployment's
// template (the image and variables of t's container, the config volume,
// the record), keeping what others changed meanwhile and the strategy it
// has now, and waits for that rollout.
func putBack(ctx context.Context, c kubernetes.Interface, before *appsv1.Deployment, t *target, within time.Duration) error {
	ns, name := before.Namespace, before.Name
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		now, err := c.AppsV1().Deployments(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		p, err := deploymentPatch(now, putBackTemplate(now, before, t))
		if err != nil || p == nil {
			return err
		}
		_, err = c.AppsV1().Deployments(ns).Patch(ctx, name, types.StrategicMergePatchType, p.body, metav1.PatchOptions{FieldManager: FieldManager})
		return err
	})
	if err != nil {
		return err
	}
	_, err = waitRollout(ctx, c, ns, name, within, nil)
	return err
}

// putBackTemplate is now with what the run sets in the template (see
// putBack) as before has it; without t, or where the container or the
// volume is no longer found by name, before's whole template.
func putBackTemplate(now, before *appsv1.Deployment, t *target) *appsv1.Deployment {
	want := now.DeepCopy()
	tmpl, was := &want.Spec.Template, &before.Spec.Template
	if t == nil || t.container >= len(was.Spec.Containers) || t.volume >= len(was.Spec.Volumes) {
		want.Spec.Template = *was.DeepCopy()
		return want
	}
	old, vol := was.Spec.Containers[t.container], was.Spec.Volumes[t.volume]
	ci := slices.IndexFunc(tmpl.Spec.Containers, func(c corev1.Container) bool { return c.Name == old.Name })
	vi := slices.IndexFunc(tmpl.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == vol.Name })
	if ci < 0 || vi < 0 {
		want.Spec.Template = *was.DeepCopy()
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

// releaseFields drops the install's entries from the Deployment's
// managedFields: what it set stays, owned by nobody, so that whoever
// applies the Deployment server-side next (helm 4, kubectl apply
// --server-side) sets those fields without a conflict.
func releaseFields(ctx context.Context, c kubernetes.Interface, ns, name string) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		d, err := c.AppsV1().Deployments(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
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
		_, err = c.AppsV1().Deployments(ns).Patch(ctx, name, types.MergePatchType, body, metav1.PatchOptions{})
		return err
	})
}

// fieldsHeld reports whether the install still owns fields of d beside
// another manager: a run was cut off after its rollout, before it gave
// them up (releaseFields), and the next server-side apply conflicts.
func fieldsHeld(d *appsv1.Deployment) bool {
	ours := slices.ContainsFunc(d.ManagedFields, func(m metav1.ManagedFieldsEntry) bool { return m.Manager == FieldManager })
	others := slices.ContainsFunc(d.ManagedFields, func(m metav1.ManagedFieldsEntry) bool { return m.Manager != FieldManager })
	return ours && others
}

// unusedConfigMaps are the Corefile ConfigMaps made for the Deployment
// that neither it nor any of its ReplicaSets refers to, besides keep:
// `kubectl rollout undo` to any revision kept finds the Corefile that
// revision reads.
func unusedConfigMaps(ctx context.Context, c kubernetes.Interface, d *appsv1.Deployment, keep string) ([]string, error) {
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
	refs(&d.Spec.Template.Spec)
	rss, err := c.AppsV1().ReplicaSets(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	for _, rs := range rss.Items {
		for _, ref := range rs.OwnerReferences {
			if ref.UID == d.UID {
				refs(&rs.Spec.Template.Spec)
			}
		}
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

// prune deletes the Corefile ConfigMaps nothing reads any more.
func (r *run) prune(ctx context.Context, c kubernetes.Interface, ns, name, keep string) error {
	d, err := c.AppsV1().Deployments(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	unused, err := unusedConfigMaps(ctx, c, d, keep)
	if err != nil {
		return err
	}
	for _, cm := range unused {
		r.change(Change{Action: "delete", Kind: "configmap", Name: ns + "/" + cm, Detail: "no revision of deployment " + name + " reads it"}, "delete configmap "+ns+"/"+cm)
		if err := c.CoreV1().ConfigMaps(ns).Delete(ctx, cm, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return err
		}
	}
	return nil
}

// rollout waits for the rollout the run started, checks it and waits for
// it to settle; on failure it puts back the Deployment's template and
// strategy as before had them, or says what to do as the cluster now is.
// Then it puts back the operator's strategy, gives up the fields it set,
// and deletes the Corefile ConfigMaps nothing reads any more. gen, when
// not nil, is the ConfigMap the Deployment must read.
func (r *run) rollout(ctx context.Context, c kubernetes.Interface, before *appsv1.Deployment, tmp *appsv1.DeploymentStrategy, t *target, verify func(*appsv1.Deployment) error, gen *corev1.ConfigMap) error {
	o := r.o
	ns, name := before.Namespace, before.Name
	// What follows runs to its end even when the run is interrupted: an
	// interrupted rollout is put back.
	after := func() (context.Context, context.CancelFunc) {
		return context.WithTimeout(context.WithoutCancel(ctx), min(o.Wait, 2*time.Minute)+30*time.Second)
	}
	if o.Wait > 0 {
		now, err := waitRollout(ctx, c, ns, name, o.Wait, t)
		if err == nil {
			if err := verify(now); err != nil {
				// Someone else's template is rolling: leave it, but give
				// back the operator's strategy.
				return r.strategyBack(after, c, before, tmp, err)
			}
			var note string
			note, err = settle(ctx, c, now, t, settleFor(now, o))
			if note != "" {
				r.printf("%s\n", note)
			}
		}
		if err != nil {
			bctx, cancel := after()
			defer cancel()
			return r.putBackFailed(bctx, c, before, tmp, t, err)
		}
	}
	bctx, cancel := after()
	defer cancel()
	if tmp != nil {
		if err := setStrategy(bctx, c, before); err != nil {
			r.res.Undo = strategyCommand(before)
			return fmt.Errorf("the rollout is done, but putting back the strategy failed (%v): run\n  %s", err, r.res.Undo)
		}
		r.change(Change{Action: "patch", Kind: "deployment", Name: ns + "/" + name, Detail: "strategy back to " + strategyString(before.Spec.Strategy)}, fmt.Sprintf("patch deployment %s/%s", ns, name))
	}
	if err := r.afterRollout(bctx, c, ns, name, gen); err != nil {
		return err
	}
	if o.Wait > 0 {
		r.printf("deployment %s/%s rolled out\n", ns, name)
	}
	return nil
}

// strategyBack gives back the operator's strategy after err, when the run
// set a temporary one.
func (r *run) strategyBack(after func() (context.Context, context.CancelFunc), c kubernetes.Interface, before *appsv1.Deployment, tmp *appsv1.DeploymentStrategy, err error) error {
	if tmp == nil {
		return err
	}
	bctx, cancel := after()
	defer cancel()
	if serr := setStrategy(bctx, c, before); serr != nil {
		r.res.Undo = strategyCommand(before)
		return fmt.Errorf("%w; putting back the strategy failed (%v): run\n  %s", err, serr, r.res.Undo)
	}
	r.strategyChanged(before)
	return err
}

// strategyChanged lists the patch that gave before's strategy back.
func (r *run) strategyChanged(before *appsv1.Deployment) {
	ns, name := before.Namespace, before.Name
	r.change(Change{Action: "update", Kind: "deployment", Name: ns + "/" + name, Detail: "strategy put back as it was: " + strategyString(before.Spec.Strategy)}, fmt.Sprintf("put back deployment %s/%s", ns, name))
}

// putBackFailed puts back the template and the strategy after a rollout
// that failed with err, and says what is left to do as the cluster now
// is: never kubectl rollout undo when the template is the operator's
// already, as undo would roll to the failed revision.
func (r *run) putBackFailed(ctx context.Context, c kubernetes.Interface, before *appsv1.Deployment, tmp *appsv1.DeploymentStrategy, t *target, err error) error {
	o := r.o
	ns, name := before.Namespace, before.Name
	r.printf("%v\nputting back deployment %s/%s as it was\n", err, ns, name)
	perr := putBack(ctx, c, before, t, min(o.Wait, 2*time.Minute))
	if perr == nil {
		r.change(Change{Action: "update", Kind: "deployment", Name: ns + "/" + name, Detail: "template put back as it was: the rollout failed"}, "put back deployment "+ns+"/"+name)
	}
	var serr error
	if tmp != nil {
		if serr = setStrategy(ctx, c, before); serr == nil {
			r.strategyChanged(before)
		}
	}
	if perr == nil && serr == nil {
		// What the run created for the pods that did not start goes too.
		r.takeBack(ctx)
		return fmt.Errorf("%w; deployment %s/%s is back as it was (template and strategy)", err, ns, name)
	}
	now, gerr := c.AppsV1().Deployments(ns).Get(ctx, name, metav1.GetOptions{})
	var todo []string
	switch {
	case gerr != nil || !equality.Semantic.DeepEqual(now.Spec.Template, putBackTemplate(now, before, t).Spec.Template):
		todo = append(todo, fmt.Sprintf("kubectl -n %s rollout undo deployment/%s", ns, name))
	case perr != nil:
		// The template is the operator's again; only its rollout has not
		// finished, as it had not before the install.
		r.takeBack(ctx)
		have, want := now.Status.AvailableReplicas, ptrOr(now.Spec.Replicas, 1)
		if serr == nil && have >= before.Status.AvailableReplicas {
			return fmt.Errorf("%w; deployment %s/%s is back as it was (template and strategy), with %d of %d available as before the install: its rollout had not finished then either (kubectl -n %s describe deployment/%s says why)", err, ns, name, have, want, ns, name)
		}
		perr = fmt.Errorf("the template is back as it was, but its rollout has not finished (%d of %d available; %d were before the install): kubectl -n %s describe deployment/%s says why; undoing the rollout would go back to the failed revision", have, want, before.Status.AvailableReplicas, ns, name)
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
// revision reads, and makes sure gen is there.
func (r *run) afterRollout(ctx context.Context, c kubernetes.Interface, ns, name string, gen *corev1.ConfigMap) error {
	if err := releaseFields(ctx, c, ns, name); err != nil {
		return fmt.Errorf("deployment %s/%s: giving up the install's field ownership: %w", ns, name, err)
	}
	keep := ""
	if gen != nil {
		keep = gen.Name
	}
	if err := r.prune(ctx, c, ns, name, keep); err != nil {
		return err
	}
	if gen == nil {
		return nil
	}
	// Whatever ran meanwhile, the Corefile the Deployment reads is there.
	if _, err := c.CoreV1().ConfigMaps(ns).Get(ctx, gen.Name, metav1.GetOptions{}); apierrors.IsNotFound(err) {
		r.change(Change{Action: "create", Kind: "configmap", Name: ns + "/" + gen.Name, Detail: "it was gone"}, "create configmap "+ns+"/"+gen.Name)
		if _, err := c.CoreV1().ConfigMaps(ns).Create(ctx, gen, metav1.CreateOptions{FieldManager: FieldManager}); err != nil && !apierrors.IsAlreadyExists(err) {
			return err
		}
	}
	return nil
}

func ptrOr(p *int32, v int32) int32 {
	if p == nil {
		return v
	}
	return *p
}
