package install

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
)

// deployment is CoreDNS run as a Deployment.
type deploy struct{ d *appsv1.Deployment }

func deploymentOf(d *appsv1.Deployment) *deploy { return &deploy{d} }

func (w *deploy) kind() string                      { return kindDeployment }
func (w *deploy) meta() *metav1.ObjectMeta          { return &w.d.ObjectMeta }
func (w *deploy) template() *corev1.PodTemplateSpec { return &w.d.Spec.Template }
func (w *deploy) selector() *metav1.LabelSelector   { return w.d.Spec.Selector }
func (w *deploy) minReadySeconds() int32            { return w.d.Spec.MinReadySeconds }
func (w *deploy) object() runtime.Object            { return w.d }
func (w *deploy) copyOf() workload                  { return deploymentOf(w.d.DeepCopy()) }
func (w *deploy) replicas() int32                   { return ptrOr(w.d.Spec.Replicas, 1) }
func (w *deploy) ready() int32                      { return w.d.Status.ReadyReplicas }
func (w *deploy) available() int32                  { return w.d.Status.AvailableReplicas }
func (w *deploy) rolledOut() bool                   { return RolledOut(w.d) }
func (w *deploy) paused() bool                      { return w.d.Spec.Paused }
func (w *deploy) resource() string                  { return "deployments" }
func (w *deploy) revisionResource() string          { return "replicasets" }

func (w *deploy) progress() string {
	s := w.d.Status
	return fmt.Sprintf("%d replicas, %d updated, %d available", s.Replicas, s.UpdatedReplicas, s.AvailableReplicas)
}

func (w *deploy) stalled() []string {
	var out []string
	for _, cond := range w.d.Status.Conditions {
		// The rollout stalled, or its ReplicaSet cannot make pods (a quota,
		// an admission webhook): no pod may be there to be not Ready.
		stalled := cond.Type == appsv1.DeploymentProgressing && cond.Status == corev1.ConditionFalse
		if stalled || cond.Type == appsv1.DeploymentReplicaFailure && cond.Status == corev1.ConditionTrue {
			out = append(out, fmt.Sprintf("%s: %s", cond.Reason, cond.Message))
		}
	}
	return out
}

func (w *deploy) get(ctx context.Context, c kubernetes.Interface) (workload, error) {
	d, err := c.AppsV1().Deployments(w.d.Namespace).Get(ctx, w.d.Name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	return deploymentOf(d), nil
}

func (w *deploy) patch(ctx context.Context, c kubernetes.Interface, pt types.PatchType, body []byte, o metav1.PatchOptions) error {
	_, err := c.AppsV1().Deployments(w.d.Namespace).Patch(ctx, w.d.Name, pt, body, o)
	return err
}

func (w *deploy) revisions(ctx context.Context, c kubernetes.Interface) ([]corev1.PodTemplateSpec, error) {
	rss, err := c.AppsV1().ReplicaSets(w.d.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	var out []corev1.PodTemplateSpec
	for _, rs := range rss.Items {
		for _, ref := range rs.OwnerReferences {
			if ref.UID == w.d.UID {
				out = append(out, rs.Spec.Template)
			}
		}
	}
	return out, nil
}

// RolledOut reports whether every replica of d runs its current template
// and is available, as `kubectl rollout status` tells.
func RolledOut(d *appsv1.Deployment) bool {
	want := ptrOr(d.Spec.Replicas, 1)
	s := d.Status
	return s.ObservedGeneration >= d.Generation && s.UpdatedReplicas == want && s.Replicas == want && s.AvailableReplicas == want
}

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

func (w *deploy) rolloutString() string { return strategyString(w.d.Spec.Strategy) }

// strategyPatch is the merge patch that sets the strategy to the
// Deployment's.
func (w *deploy) strategyPatch() []byte {
	s := w.d.Spec.Strategy
	m := map[string]any{"type": s.Type}
	if s.RollingUpdate != nil {
		m["rollingUpdate"] = s.RollingUpdate
	} else {
		m["rollingUpdate"] = nil
	}
	if s.Type == "" {
		m["type"] = nil
	}
	b, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]any{StrategyAnnotation: nil}}, "spec": map[string]any{"strategy": m, "minReadySeconds": w.d.Spec.MinReadySeconds}})
	return b
}

// operatorView is d as its operator set it (see workload.operatorView).
// Where the live settings are no longer those the run set, the operator
// set them since: they stay, and only the record goes. A record that
// does not parse is left as it is.
func (w *deploy) operatorView() workload {
	d := w.d
	s, err := recordedStrategy(&d.ObjectMeta)
	if s == nil || err != nil {
		return w
	}
	v := d.DeepCopy()
	var op appsv1.DeploymentStrategy
	if !s.stale(d.Spec.Strategy, d.Spec.MinReadySeconds) && json.Unmarshal(s.Strategy, &op) == nil {
		v.Spec.Strategy, v.Spec.MinReadySeconds = op, s.MinReadySeconds
	}
	delete(v.Annotations, StrategyAnnotation)
	return deploymentOf(v)
}

// setRolloutStrategy gives want the strategy its pods roll with: tmp,
// with minReadySeconds raised to the settle time, so that the controller
// takes no old pod away before a new one has been Ready that long (on a
// node's network an old pod can answer a new pod's readiness probe), and
// the operator's settings recorded beside them; or, when tmp is nil, the
// operator's, with no record.
func setRolloutStrategy(want, operator *appsv1.Deployment, tmp *appsv1.DeploymentStrategy, settle time.Duration) {
	want.Spec.Strategy, want.Spec.MinReadySeconds = operator.Spec.Strategy, operator.Spec.MinReadySeconds
	delete(want.Annotations, StrategyAnnotation)
	if tmp == nil {
		return
	}
	want.Spec.Strategy = *tmp
	want.Spec.MinReadySeconds = max(operator.Spec.MinReadySeconds, int32(settle/time.Second))
	recordRollout(&want.ObjectMeta, operator.Spec.Strategy, operator.Spec.MinReadySeconds, tmp, want.Spec.MinReadySeconds)
}

// interruptedRollout says, for status, what a run killed during its wait
// left, and what to do; "" when there is nothing.
func (w *deploy) interruptedRollout() string {
	d := w.d
	s, err := recordedStrategy(&d.ObjectMeta)
	switch {
	case err != nil:
		return err.Error()
	case s == nil:
		return ""
	case s.stale(d.Spec.Strategy, d.Spec.MinReadySeconds):
		return fmt.Sprintf("a run was cut off during its rollout, and its record of your strategy (annotation %s) is out of date: the strategy was set since (%s) and is kept; the next install or uninstall drops the record", StrategyAnnotation, strategyString(d.Spec.Strategy))
	}
	var op appsv1.DeploymentStrategy
	_ = json.Unmarshal(s.Strategy, &op)
	return fmt.Sprintf("a run was cut off during its rollout: the Deployment rolls with the strategy it set (%s) in place of yours (%s), recorded in annotation %s; run install again to finish that rollout and put yours back, or uninstall", strategyString(d.Spec.Strategy), strategyString(op), StrategyAnnotation)
}

// planRollout decides how the pods roll: with the Deployment's own
// strategy, or a temporary one that keeps the Ready pods at their count.
func (w *deploy) planRollout(ctx context.Context, c kubernetes.Interface, pl *planner, want workload, settle time.Duration) (bool, []string) {
	o := pl.o
	tmp, avail := safeRollout(w.d)
	pl.rep.Rollout = avail
	var refuse []string
	if tmp != nil && o.Wait <= 0 {
		why := fmt.Sprintf("the rollout could take the Ready pods below their count (%s), and with --timeout 0 %s does not wait, so it could not put back a temporary strategy", avail, pl.command)
		if !o.Force {
			refuse = append(refuse, why+": give a --timeout, or --force to roll with the Deployment's own strategy")
		} else {
			pl.warn("--force: " + why)
		}
		tmp = nil
		pl.rep.Rollout = "with the Deployment's own strategy (--force)"
	}
	wd := want.(*deploy).d
	setRolloutStrategy(wd, w.d, tmp, settle)
	tmp, more := pl.surgeOrRefuse(ctx, c, w.d, tmp, wd)
	return tmp != nil, append(refuse, more...)
}

// surgeOrRefuse refuses, unless Force, a temporary surge strategy tmp for
// the rollout of the operator's Deployment d that could never finish:
// the pods need a node each and no node is spare for the pod the surge
// adds. With Force the pods roll with the operator's own strategy, one
// down at a time. It returns the strategy the pods roll with, and why the
// run must not start.
func (pl *planner) surgeOrRefuse(ctx context.Context, c kubernetes.Interface, d *appsv1.Deployment, tmp *appsv1.DeploymentStrategy, want *appsv1.Deployment) (*appsv1.DeploymentStrategy, []string) {
	w := deploymentOf(d)
	if tmp == nil || !onePerNode(w) {
		return tmp, nil
	}
	surge, _ := intstr.GetScaledValueFromIntOrPercent(tmp.RollingUpdate.MaxSurge, int(ptrOr(d.Spec.Replicas, 1)), true)
	spare, err := spareNodes(ctx, c, w)
	if err == nil && spare >= surge {
		return tmp, nil
	}
	what := fmt.Sprintf("no node is spare for the %d pod(s) it adds", surge)
	if err != nil {
		what = fmt.Sprintf("whether a node is spare for the pod(s) it adds cannot be told (listing nodes: %v)", err)
	}
	why := fmt.Sprintf("the pods of deployment %s/%s need a node each (a required pod anti-affinity on %s), and %s: a rollout that adds a pod before it takes one away could not finish", d.Namespace, d.Name, corev1.LabelHostname, what)
	if !pl.o.Force {
		return tmp, []string{why + "; --force rolls with the Deployment's own strategy (" + strategyString(d.Spec.Strategy) + "), which takes a pod away before its replacement is Ready"}
	}
	pl.warn("--force: " + why)
	setRolloutStrategy(want, d, nil, 0)
	pl.rep.Rollout = "with the Deployment's own strategy (--force): " + why
	return nil, nil
}

// rollStages: the Deployment controller rolls the pods itself.
func (w *deploy) rollStages(context.Context, kubernetes.Interface, *run, *target, time.Duration) error {
	return nil
}

// staleSteps: the Deployment controller replaces the pods itself.
func (w *deploy) staleSteps(context.Context, kubernetes.Interface, *target) ([]step, error) {
	return nil, nil
}

// getDeployment reads the Deployment ns/name.
func getDeployment(ctx context.Context, c kubernetes.Interface, ns, name string) (workload, error) {
	d, err := c.AppsV1().Deployments(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	return deploymentOf(d), nil
}

// listDeployments are the Deployments of ns that sel selects, by name.
func listDeployments(ctx context.Context, c kubernetes.Interface, ns, sel string, found map[string]workload) error {
	list, err := c.AppsV1().Deployments(ns).List(ctx, metav1.ListOptions{LabelSelector: sel})
	if err != nil {
		return err
	}
	for i := range list.Items {
		found[list.Items[i].Name] = deploymentOf(&list.Items[i])
	}
	return nil
}
