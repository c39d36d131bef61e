package install

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
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
// rollout settings (a Deployment's strategy, a DaemonSet's
// updateStrategy) and minReadySeconds, which a run changes for its
// rollout.
type rolloutRecord struct {
	Strategy        json.RawMessage `json:"strategy"`
	MinReadySeconds int32           `json:"minReadySeconds,omitempty"`
	// Temporary and TemporaryMinReadySeconds are what the run set in
	// their place: live settings that differ from them are the
	// operator's, set since. Empty in a record written before they were.
	Temporary                json.RawMessage `json:"temporary,omitempty"`
	TemporaryMinReadySeconds int32           `json:"temporaryMinReadySeconds,omitempty"`
}

// stale reports whether the live strategy or minReadySeconds are no
// longer the temporary ones the record r says its run set: the operator
// set their own since, and r is out of date.
func (r *rolloutRecord) stale(live any, minReady int32) bool {
	return len(r.Temporary) > 0 && (!equalJSON(r.Temporary, live) || r.TemporaryMinReadySeconds != minReady)
}

// recordedStrategy is what a run recorded of the operator's rollout
// settings on the workload of m, or nil when none did.
func recordedStrategy(m *metav1.ObjectMeta) (*rolloutRecord, error) {
	v, ok := m.Annotations[StrategyAnnotation]
	if !ok {
		return nil, nil
	}
	var s rolloutRecord
	if err := json.Unmarshal([]byte(v), &s); err != nil {
		return nil, fmt.Errorf("%s/%s: annotation %s: %w", m.Namespace, m.Name, StrategyAnnotation, err)
	}
	return &s, nil
}

// recordRollout records in m the operator's rollout settings op and
// opMin beside the temporary ones tmp and tmpMin a run sets.
func recordRollout(m *metav1.ObjectMeta, op any, opMin int32, tmp any, tmpMin int32) {
	a, _ := json.Marshal(op)
	b, _ := json.Marshal(tmp)
	rec, _ := json.Marshal(rolloutRecord{Strategy: a, MinReadySeconds: opMin, Temporary: b, TemporaryMinReadySeconds: tmpMin})
	if m.Annotations == nil {
		m.Annotations = map[string]string{}
	}
	m.Annotations[StrategyAnnotation] = string(rec)
}

// onePerNode reports whether w's pods require a node each: a required pod
// anti-affinity on the node's hostname that selects w's own pods.
func onePerNode(w workload) bool {
	a := w.template().Spec.Affinity
	if a == nil || a.PodAntiAffinity == nil {
		return false
	}
	for _, term := range a.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution {
		sel, err := metav1.LabelSelectorAsSelector(term.LabelSelector)
		if err == nil && term.TopologyKey == corev1.LabelHostname && !sel.Empty() && sel.Matches(labels.Set(w.template().Labels)) {
			return true
		}
	}
	return false
}

// spareNodes counts the Ready, schedulable nodes that match d's
// nodeSelector and required node affinity, and whose NoSchedule and
// NoExecute taints its pods tolerate, beyond its replicas: where its pods need a node each,
// the nodes a surge pod can go to.
func spareNodes(ctx context.Context, c kubernetes.Interface, w workload) (int, error) {
	spec := &w.template().Spec
	nodes, err := c.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: labels.SelectorFromSet(spec.NodeSelector).String()})
	if err != nil {
		return 0, err
	}
	n := 0
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
	return n - int(w.replicas()), nil
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
