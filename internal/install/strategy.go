package install

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
)

// StrategyAnnotation, on the Deployment, records the operator's own
// rollout strategy while a run rolls the pods with a temporary one: the
// patch that sets the temporary strategy writes it, and the patch that
// puts the operator's back takes it out. Found on a Deployment no run
// holds, it is the mark of a run that was killed during its wait: the
// next install finishes that rollout and puts the operator's strategy
// back, uninstall gives it back too, and status says so.
const StrategyAnnotation = "k8s-event.coredns.io/strategy"

// rolloutRecord is the value of StrategyAnnotation: the operator's
// strategy and minReadySeconds, which a run changes for its rollout.
type rolloutRecord struct {
	Strategy        appsv1.DeploymentStrategy `json:"strategy"`
	MinReadySeconds int32                     `json:"minReadySeconds,omitempty"`
	// Temporary and TemporaryMinReadySeconds are what the run set in
	// their place: live settings that differ from them are the
	// operator's, set since. Nil in a record written before they were.
	Temporary                *appsv1.DeploymentStrategy `json:"temporary,omitempty"`
	TemporaryMinReadySeconds int32                      `json:"temporaryMinReadySeconds,omitempty"`
}

// stale reports whether d's live strategy or minReadySeconds are no
// longer the temporary ones the record r says its run set: the operator
// set their own since, and r is out of date.
func (r *rolloutRecord) stale(d *appsv1.Deployment) bool {
	return r.Temporary != nil && (!equalJSON(*r.Temporary, d.Spec.Strategy) || r.TemporaryMinReadySeconds != d.Spec.MinReadySeconds)
}

// recordedStrategy is what a run recorded of the operator's rollout
// settings on d, or nil when none did.
func recordedStrategy(d *appsv1.Deployment) (*rolloutRecord, error) {
	v, ok := d.Annotations[StrategyAnnotation]
	if !ok {
		return nil, nil
	}
	var s rolloutRecord
	if err := json.Unmarshal([]byte(v), &s); err != nil {
		return nil, fmt.Errorf("deployment %s/%s: annotation %s: %w", d.Namespace, d.Name, StrategyAnnotation, err)
	}
	return &s, nil
}

// operatorView is d as its operator set it: the strategy and
// minReadySeconds a run recorded in place of the temporary ones that run
// left, and no record. Where the live ones are no longer those the run
// set, the operator set them since: they stay, and only the record goes.
// A record that does not parse is left as it is.
func operatorView(d *appsv1.Deployment) *appsv1.Deployment {
	s, err := recordedStrategy(d)
	if s == nil || err != nil {
		return d
	}
	v := d.DeepCopy()
	if !s.stale(d) {
		v.Spec.Strategy, v.Spec.MinReadySeconds = s.Strategy, s.MinReadySeconds
	}
	delete(v.Annotations, StrategyAnnotation)
	return v
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
	b, _ := json.Marshal(rolloutRecord{Strategy: operator.Spec.Strategy, MinReadySeconds: operator.Spec.MinReadySeconds,
		Temporary: tmp.DeepCopy(), TemporaryMinReadySeconds: want.Spec.MinReadySeconds})
	if want.Annotations == nil {
		want.Annotations = map[string]string{}
	}
	want.Annotations[StrategyAnnotation] = string(b)
}

// interruptedRollout says, for status, what a run killed during its wait
// left, and what to do; "" when there is nothing.
func interruptedRollout(d *appsv1.Deployment) string {
	s, err := recordedStrategy(d)
	switch {
	case err != nil:
		return err.Error()
	case s == nil:
		return ""
	case s.stale(d):
		return fmt.Sprintf("a run was cut off during its rollout, and its record of your strategy (annotation %s) is out of date: the strategy was set since (%s) and is kept; the next install or uninstall drops the record", StrategyAnnotation, strategyString(d.Spec.Strategy))
	}
	return fmt.Sprintf("a run was cut off during its rollout: the Deployment rolls with the strategy it set (%s) in place of yours (%s), recorded in annotation %s; run install again to finish that rollout and put yours back, or uninstall", strategyString(d.Spec.Strategy), strategyString(s.Strategy), StrategyAnnotation)
}

// onePerNode reports whether d's pods require a node each: a required pod
// anti-affinity on the node's hostname that selects d's own pods.
func onePerNode(d *appsv1.Deployment) bool {
	a := d.Spec.Template.Spec.Affinity
	if a == nil || a.PodAntiAffinity == nil {
		return false
	}
	for _, term := range a.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution {
		sel, err := metav1.LabelSelectorAsSelector(term.LabelSelector)
		if err == nil && term.TopologyKey == corev1.LabelHostname && !sel.Empty() && sel.Matches(labels.Set(d.Spec.Template.Labels)) {
			return true
		}
	}
	return false
}

// spareNodes counts the Ready, schedulable nodes that match d's
// nodeSelector and required node affinity, and whose NoSchedule and
// NoExecute taints its pods tolerate, beyond its replicas: where its pods need a node each,
// the nodes a surge pod can go to.
func spareNodes(ctx context.Context, c kubernetes.Interface, d *appsv1.Deployment) (int, error) {
	nodes, err := c.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: labels.SelectorFromSet(d.Spec.Template.Spec.NodeSelector).String()})
	if err != nil {
		return 0, err
	}
	n := 0
	spec := &d.Spec.Template.Spec
	for _, node := range nodes.Items {
		if node.Spec.Unschedulable || !toleratesNode(spec.Tolerations, &node) || !affinityMatches(spec.Affinity, &node) {
			continue
		}
		for _, cond := range node.Status.Conditions {
			if cond.Type == corev1.NodeReady && cond.Status == corev1.ConditionTrue {
				n++
			}
		}
	}
	return n - int(ptrOr(d.Spec.Replicas, 1)), nil
}

// toleratesNode reports whether tolerations tolerate every NoSchedule and
// NoExecute taint of node.
func toleratesNode(tolerations []corev1.Toleration, node *corev1.Node) bool {
	for i := range node.Spec.Taints {
		taint := &node.Spec.Taints[i]
		if taint.Effect == corev1.TaintEffectPreferNoSchedule {
			continue
		}
		if !slices.ContainsFunc(tolerations, func(t corev1.Toleration) bool { return t.ToleratesTaint(taint) }) {
			return false
		}
	}
	return true
}

// affinityMatches reports whether node matches a's required node
// affinity: any of its terms, each with all its expressions.
func affinityMatches(a *corev1.Affinity, node *corev1.Node) bool {
	if a == nil || a.NodeAffinity == nil || a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil {
		return true
	}
	fields := labels.Set{"metadata.name": node.Name}
	return slices.ContainsFunc(a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms, func(term corev1.NodeSelectorTerm) bool {
		if len(term.MatchExpressions) == 0 && len(term.MatchFields) == 0 {
			return false
		}
		return requirementsMatch(term.MatchExpressions, labels.Set(node.Labels)) && requirementsMatch(term.MatchFields, fields)
	})
}

// nodeSelectorOps are the selection operators of a node selector's.
var nodeSelectorOps = map[corev1.NodeSelectorOperator]selection.Operator{
	corev1.NodeSelectorOpIn: selection.In, corev1.NodeSelectorOpNotIn: selection.NotIn,
	corev1.NodeSelectorOpExists: selection.Exists, corev1.NodeSelectorOpDoesNotExist: selection.DoesNotExist,
	corev1.NodeSelectorOpGt: selection.GreaterThan, corev1.NodeSelectorOpLt: selection.LessThan,
}

// requirementsMatch reports whether set meets every requirement of reqs;
// one that does not parse is not met.
func requirementsMatch(reqs []corev1.NodeSelectorRequirement, set labels.Set) bool {
	for _, r := range reqs {
		op, ok := nodeSelectorOps[r.Operator]
		if !ok {
			return false
		}
		req, err := labels.NewRequirement(r.Key, op, r.Values)
		if err != nil || !req.Matches(set) {
			return false
		}
	}
	return true
}

// checkSurge refuses, unless Force, a temporary surge strategy that could
// never finish: the pods need a node each and no node is spare for the
// pod the surge adds. With Force the pods roll with the operator's own
// strategy, one down at a time.
func (r *run) checkSurge(ctx context.Context, c kubernetes.Interface, p *installPlan, want *appsv1.Deployment) []string {
	var why []string
	p.strategy, why = r.surgeOrRefuse(ctx, c, p.d, p.before, p.strategy, want)
	return why
}

// surgeOrRefuse is checkSurge for a rollout of d with the temporary
// strategy tmp, before being the operator's Deployment: it returns the
// strategy the pods roll with, and why the run must not start.
func (r *run) surgeOrRefuse(ctx context.Context, c kubernetes.Interface, d, before *appsv1.Deployment, tmp *appsv1.DeploymentStrategy, want *appsv1.Deployment) (*appsv1.DeploymentStrategy, []string) {
	if tmp == nil || !onePerNode(d) {
		return tmp, nil
	}
	surge, _ := intstr.GetScaledValueFromIntOrPercent(tmp.RollingUpdate.MaxSurge, int(ptrOr(d.Spec.Replicas, 1)), true)
	spare, err := spareNodes(ctx, c, d)
	if err == nil && spare >= surge {
		return tmp, nil
	}
	what := fmt.Sprintf("no node is spare for the %d pod(s) it adds", surge)
	if err != nil {
		what = fmt.Sprintf("whether a node is spare for the pod(s) it adds cannot be told (listing nodes: %v)", err)
	}
	why := fmt.Sprintf("the pods of deployment %s/%s need a node each (a required pod anti-affinity on %s), and %s: a rollout that adds a pod before it takes one away could not finish", d.Namespace, d.Name, corev1.LabelHostname, what)
	if !r.o.Force {
		return tmp, []string{why + "; --force rolls with the Deployment's own strategy (" + strategyString(before.Spec.Strategy) + "), which takes a pod away before its replacement is Ready"}
	}
	r.warn("--force: " + why)
	setRolloutStrategy(want, before, nil, 0)
	r.res.Rollout = "with the Deployment's own strategy (--force): " + why
	return nil, nil
}
