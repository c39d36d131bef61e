package install

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/strategicpatch"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"
)

// workload is what runs CoreDNS: a Deployment (deployment.go) or a
// DaemonSet (daemonset.go). Discovery, the plan, the writes, the
// rollout, the settling, status and uninstall see it only through this
// interface; only the files of the two kinds name their API types.
type workload interface {
	// kind is kindDeployment or kindDaemonSet.
	kind() string
	meta() *metav1.ObjectMeta
	template() *corev1.PodTemplateSpec
	selector() *metav1.LabelSelector
	minReadySeconds() int32
	// object is the API object, for patches and JSON.
	object() runtime.Object
	// copyOf is a deep copy.
	copyOf() workload

	// replicas is how many pods the workload wants (a DaemonSet: the
	// nodes it is scheduled on); ready and available how many are.
	replicas() int32
	ready() int32
	available() int32
	// rolledOut reports whether every pod runs the current template and
	// is available, as `kubectl rollout status` tells.
	rolledOut() bool
	// progress says, for an error, where the rollout stands.
	progress() string
	// paused is a Deployment paused: its pods do not roll.
	paused() bool
	// stalled says why the controller cannot make progress, from the
	// workload's conditions.
	stalled() []string

	// get reads the workload again.
	get(ctx context.Context, c kubernetes.Interface) (workload, error)
	// patch patches it.
	patch(ctx context.Context, c kubernetes.Interface, pt types.PatchType, body []byte, o metav1.PatchOptions) error
	// resource is the API resource (deployments, daemonsets); revision
	// the resource of the revisions the controller keeps.
	resource() string
	revisionResource() string
	// revisions are the pod templates of the revisions the controller
	// keeps of the workload: `kubectl rollout undo` goes back to them.
	revisions(ctx context.Context, c kubernetes.Interface) ([]corev1.PodTemplateSpec, error)

	// operatorView is the workload as its operator set it: the rollout
	// settings a run recorded in place of the temporary ones it left
	// (see StrategyAnnotation). It is the workload itself when there is
	// no record.
	operatorView() workload
	// interruptedRollout says what a run killed during its rollout left;
	// "" when nothing.
	interruptedRollout() string
	// rolloutString says the workload's rollout settings.
	rolloutString() string
	// planRollout sets in want how the pods roll, the workload being the
	// operator's view: its own settings, or temporary ones recorded
	// beside the operator's. It returns whether it set temporary ones,
	// and why the run must not start.
	planRollout(ctx context.Context, c kubernetes.Interface, pl *planner, want workload, settle time.Duration) (bool, []string)
	// strategyPatch is the merge patch that puts back the rollout
	// settings of the workload (an operator's view).
	strategyPatch() []byte
	// rollStages runs what the rollout of the template patched does
	// before its controller rolls the rest: a DaemonSet's canary, then its
	// batches. The workload is the operator's view.
	rollStages(ctx context.Context, c kubernetes.Interface, r *run, t *target, settle time.Duration) error
	// staleSteps are the deletes of the pods that no controller replaces
	// after the template was put back (a DaemonSet's OnDelete).
	staleSteps(ctx context.Context, c kubernetes.Interface, t *target) ([]step, error)
}

// ref is how messages name w: "deployment kube-system/coredns".
func ref(w workload) string {
	m := w.meta()
	return strings.ToLower(w.kind()) + " " + m.Namespace + "/" + m.Name
}

// kubectlRef is w as kubectl names it: deployment/coredns.
func kubectlRef(w workload) string {
	return strings.ToLower(w.kind()) + "/" + w.meta().Name
}

// setStrategy puts back the operator's rollout settings of op.
func setStrategy(ctx context.Context, c kubernetes.Interface, op workload) error {
	return op.patch(ctx, c, types.MergePatchType, op.strategyPatch(), metav1.PatchOptions{FieldManager: FieldManager})
}

// strategyCommand is the command that puts back op's rollout settings.
func strategyCommand(op workload) string {
	m := op.meta()
	return fmt.Sprintf("kubectl -n %s patch %s %s --type=merge -p '%s'", m.Namespace, strings.ToLower(op.kind()), m.Name, op.strategyPatch())
}

// workloadPatch is the strategic merge patch from have to want, or nil
// when they are the same. It carries have's resourceVersion, so that it
// applies only to the object it was made from.
func workloadPatch(have, want workload) (*patch, error) {
	a, err := json.Marshal(have.object())
	if err != nil {
		return nil, err
	}
	b, err := json.Marshal(want.object())
	if err != nil {
		return nil, err
	}
	p, err := strategicpatch.CreateTwoWayMergePatch(a, b, have.object())
	if err != nil {
		return nil, err
	}
	if string(p) == "{}" {
		return nil, nil
	}
	display, err := yaml.JSONToYAML(p)
	if err != nil {
		return nil, err
	}
	var m map[string]any
	if err := json.Unmarshal(p, &m); err != nil {
		return nil, err
	}
	meta, _ := m["metadata"].(map[string]any)
	if meta == nil {
		meta = map[string]any{}
		m["metadata"] = meta
	}
	meta["resourceVersion"] = have.meta().ResourceVersion
	body, err := json.Marshal(m)
	if err != nil {
		return nil, err
	}
	return &patch{body: body, display: display}, nil
}

// pods are the pods of w that are not going.
func pods(ctx context.Context, c kubernetes.Interface, w workload) ([]corev1.Pod, error) {
	sel, err := metav1.LabelSelectorAsSelector(w.selector())
	if err != nil {
		return nil, err
	}
	list, err := c.CoreV1().Pods(w.meta().Namespace).List(ctx, metav1.ListOptions{LabelSelector: sel.String()})
	if err != nil {
		return nil, err
	}
	return list.Items, nil
}

// lastAppliedTemplate is the pod template of the last-applied
// configuration raw, of any kind.
func lastAppliedTemplate(raw string) (*corev1.PodTemplateSpec, bool) {
	var applied struct {
		Spec struct {
			Template corev1.PodTemplateSpec `json:"template"`
		} `json:"spec"`
	}
	if json.Unmarshal([]byte(raw), &applied) != nil {
		return nil, false
	}
	return &applied.Spec.Template, true
}
