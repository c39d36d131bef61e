package install

import (
	"encoding/json"
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
)

// StrategyAnnotation, on the Deployment, records the operator's own
// rollout strategy while a run rolls the pods with a temporary one: the
// patch that sets the temporary strategy writes it, and the patch that
// puts the operator's back takes it out. Found on a Deployment no run
// holds, it is the mark of a run that was killed during its wait: the
// next install finishes that rollout and puts the operator's strategy
// back, uninstall gives it back too, and status says so.
const StrategyAnnotation = "k8s-event.coredns.io/strategy"

// recordedStrategy is the operator's strategy a run recorded on d, or nil
// when none did.
func recordedStrategy(d *appsv1.Deployment) (*appsv1.DeploymentStrategy, error) {
	v, ok := d.Annotations[StrategyAnnotation]
	if !ok {
		return nil, nil
	}
	var s appsv1.DeploymentStrategy
	if err := json.Unmarshal([]byte(v), &s); err != nil {
		return nil, fmt.Errorf("deployment %s/%s: annotation %s: %w", d.Namespace, d.Name, StrategyAnnotation, err)
	}
	return &s, nil
}

// operatorView is d as its operator set it: the strategy a run recorded
// in place of the temporary one that run left, and no record. A record
// that does not parse is left as it is.
func operatorView(d *appsv1.Deployment) *appsv1.Deployment {
	s, err := recordedStrategy(d)
	if s == nil || err != nil {
		return d
	}
	v := d.DeepCopy()
	v.Spec.Strategy = *s
	delete(v.Annotations, StrategyAnnotation)
	return v
}

// setRolloutStrategy gives want the strategy its pods roll with: tmp,
// recording the operator's beside it, or, when tmp is nil, the
// operator's, with no record.
func setRolloutStrategy(want *appsv1.Deployment, operator appsv1.DeploymentStrategy, tmp *appsv1.DeploymentStrategy) {
	if tmp == nil {
		want.Spec.Strategy = operator
		delete(want.Annotations, StrategyAnnotation)
		return
	}
	b, _ := json.Marshal(operator)
	if want.Annotations == nil {
		want.Annotations = map[string]string{}
	}
	want.Annotations[StrategyAnnotation] = string(b)
	want.Spec.Strategy = *tmp
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
	}
	return fmt.Sprintf("a run was cut off during its rollout: the Deployment rolls with the strategy it set (%s) in place of yours (%s), recorded in annotation %s; run install again to finish that rollout and put yours back, or uninstall", strategyString(d.Spec.Strategy), strategyString(*s), StrategyAnnotation)
}
