package install

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	applyapps "k8s.io/client-go/applyconfigurations/apps/v1"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// killAfterPatch makes c answer nothing once the Deployment has been
// patched for real, as when the process that runs the tool is killed
// (SIGKILL) then: none of its later requests reaches the API server. It
// returns the function that ends that.
func killAfterPatch(c *fake.Clientset) func() {
	var dead, on atomic.Bool
	on.Store(true)
	c.PrependReactor("*", "*", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if !on.Load() {
			return false, nil, nil
		}
		if dead.Load() {
			return true, nil, errors.New("connection refused: the process is gone")
		}
		if a.GetVerb() == "patch" && a.GetResource().Resource == "deployments" && !isDryRun(a) {
			_, obj, err := k8stesting.ObjectReaction(c.Tracker())(a)
			dead.Store(true)
			return true, obj, err
		}
		return false, nil, nil
	})
	return func() { on.Store(false) }
}

// stuckThenRolled is a controller whose rollout of the k8s_event image
// does not finish until rolled is set.
func stuckThenRolled(c *fake.Clientset) *atomic.Bool {
	var rolledOut atomic.Bool
	controller(c, nil, func(now *appsv1.Deployment) appsv1.DeploymentStatus {
		if now.Spec.Template.Spec.Containers[0].Image == image && !rolledOut.Load() {
			return appsv1.DeploymentStatus{Replicas: 2, UpdatedReplicas: 1, ReadyReplicas: 1, AvailableReplicas: 1}
		}
		return rolled(1)
	})
	return &rolledOut
}

// A run killed during its wait leaves the temporary strategy, with the
// operator's recorded beside it: status says so, and the next install
// finishes the rollout and puts the operator's strategy back.
func TestInstallFinishesTheRolloutOfAKilledRun(t *testing.T) {
	ctx := context.Background()
	d := chartDefaults()
	c := newClient(d.DeepCopy(), configMap())
	rolledOut := stuckThenRolled(c)
	revive := killAfterPatch(c)
	if err := Install(ctx, c, Options{Image: image, Wait: time.Second}); err == nil {
		t.Fatal("the killed install: no error")
	}
	revive()
	left := get(t, c)
	if s := left.Spec.Strategy.RollingUpdate; s == nil || s.MaxUnavailable.IntValue() != 0 || left.Annotations[StrategyAnnotation] == "" {
		t.Fatalf("the killed run left strategy %+v, annotations %v: want its temporary one, recorded", left.Spec.Strategy, left.Annotations)
	}
	if s, _ := statusText(t, c); !strings.Contains(s, "cut off during its rollout") {
		t.Errorf("status does not say a run was cut off:\n%s", s)
	}
	rolledOut.Store(true)
	var dry bytes.Buffer
	if err := Install(ctx, c, Options{Image: image, Wait: 10 * time.Second, DryRun: true, Out: &dry}); err != nil || !strings.Contains(dry.String(), "strategy back to RollingUpdate, maxSurge 25%, maxUnavailable 1") {
		t.Errorf("the dry run of the next install: %v, want it to say the strategy goes back\n%s", err, dry.String())
	}
	if err := Install(ctx, c, Options{Image: image, Wait: 10 * time.Second}); err != nil {
		t.Fatalf("the next install: %v", err)
	}
	got := get(t, c)
	if !equalJSON(got.Spec.Strategy, d.Spec.Strategy) || got.Annotations[StrategyAnnotation] != "" {
		t.Errorf("after the next install: strategy %+v, annotations %v; want the operator's, no record", got.Spec.Strategy, got.Annotations)
	}
	if s, healthy := statusText(t, c); !healthy {
		t.Errorf("status after the next install:\n%s", s)
	}
}

// Uninstall after a run killed during its wait gives back the operator's
// strategy, not the temporary one it finds.
func TestUninstallGivesBackTheStrategyAKilledRunRecorded(t *testing.T) {
	ctx := context.Background()
	d := chartDefaults()
	c := newClient(d.DeepCopy(), configMap())
	stuckThenRolled(c)
	revive := killAfterPatch(c)
	_ = Install(ctx, c, Options{Image: image, Wait: time.Second})
	revive()
	if err := Uninstall(ctx, c, Options{Wait: 10 * time.Second}); err != nil {
		t.Fatalf("uninstall: %v", err)
	}
	got := get(t, c)
	if !equalJSON(got.Spec.Strategy, d.Spec.Strategy) || got.Annotations[StrategyAnnotation] != "" || !equalJSON(got.Spec.Template, d.Spec.Template) {
		t.Errorf("after uninstall: strategy %+v, annotations %v; want the operator's Deployment\n%s", got.Spec.Strategy, got.Annotations, Diff(specJSON(d), specJSON(got)))
	}
}

// The patch that starts a surge rollout records the operator's strategy
// in the same write: there is no moment a kill could leave one without
// the other.
func TestTheTemporaryStrategyIsRecordedInTheSamePatch(t *testing.T) {
	ctx := context.Background()
	c := newClient(chartDefaults(), configMap())
	controller(c, nil, func(*appsv1.Deployment) appsv1.DeploymentStatus { return rolled(1) })
	var bodies []string
	c.PrependReactor("patch", "deployments", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if !isDryRun(a) {
			bodies = append(bodies, string(a.(k8stesting.PatchAction).GetPatch()))
		}
		return false, nil, nil
	})
	if err := Install(ctx, c, Options{Image: image, Wait: 5 * time.Second}); err != nil {
		t.Fatal(err)
	}
	if len(bodies) == 0 || !strings.Contains(bodies[0], `"maxUnavailable":0`) || !strings.Contains(bodies[0], StrategyAnnotation) {
		t.Errorf("the first patch does not set the temporary strategy and its record together: %v", bodies)
	}
	if _, err := c.AppsV1().Deployments("kube-system").Get(ctx, "coredns", metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	}
}

// onePerNodeDeployment is the chart's layout whose pods require a node
// each, on a cluster of n Ready nodes.
func onePerNodeCluster(n int) (*appsv1.Deployment, []runtime.Object) {
	d := chartDefaults()
	d.Spec.Template.Spec.Affinity = &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{
		RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{{
			LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"k8s-app": "kube-dns"}},
			TopologyKey:   corev1.LabelHostname,
		}},
	}}
	objs := []runtime.Object{d.DeepCopy(), configMap()}
	for i := range n {
		objs = append(objs, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("node-%d", i)},
			Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}}})
	}
	return d, objs
}

// Where the pods need a node each and no node is spare, a surge rollout
// could never finish: install refuses and says why; with --force it
// rolls with the operator's strategy. With a spare node it surges.
func TestInstallRefusesASurgeWithNoSpareNodeForIt(t *testing.T) {
	ctx := context.Background()
	d, objs := onePerNodeCluster(1)
	c := newClient(objs...)
	controller(c, nil, func(*appsv1.Deployment) appsv1.DeploymentStatus { return rolled(1) })
	if err := Install(ctx, c, Options{Image: image, Wait: 5 * time.Second}); !IsRefused(err) || !strings.Contains(err.Error(), "need a node each") {
		t.Errorf("install with no spare node: %v, want it refused", err)
	}
	if err := Install(ctx, c, Options{Image: image, Wait: 5 * time.Second, Force: true}); err != nil {
		t.Fatalf("install --force: %v", err)
	}
	if got := get(t, c); !equalJSON(got.Spec.Strategy, d.Spec.Strategy) {
		t.Errorf("strategy after install --force: %+v", got.Spec.Strategy)
	}
	_, objs = onePerNodeCluster(2)
	c = newClient(objs...)
	controller(c, nil, func(*appsv1.Deployment) appsv1.DeploymentStatus { return rolled(1) })
	var out bytes.Buffer
	if err := Install(ctx, c, Options{Image: image, Wait: 5 * time.Second, Out: &out}); err != nil || !strings.Contains(out.String(), "maxUnavailable 0") {
		t.Errorf("install with a spare node: %v\n%s", err, out.String())
	}
}

// Uninstall, too, refuses a surge with no spare node for it.
func TestUninstallRefusesASurgeWithNoSpareNodeForIt(t *testing.T) {
	ctx := context.Background()
	_, objs := onePerNodeCluster(1)
	c := newClient(objs...)
	controller(c, nil, func(*appsv1.Deployment) appsv1.DeploymentStatus { return rolled(1) })
	if err := Install(ctx, c, Options{Image: image, Wait: 5 * time.Second, Force: true}); err != nil {
		t.Fatal(err)
	}
	if err := Uninstall(ctx, c, Options{Wait: 5 * time.Second}); !IsRefused(err) || !strings.Contains(err.Error(), "need a node each") {
		t.Errorf("uninstall with no spare node: %v, want it refused", err)
	}
	if err := Uninstall(ctx, c, Options{Wait: 5 * time.Second, Force: true}); err != nil {
		t.Errorf("uninstall --force: %v", err)
	}
}

// After a run killed during its wait, status says the Deployment rolls
// with the run's strategy "in place of yours". An operator who then sets
// the strategy by hand (kubectl patch of .spec, which leaves the
// annotation alone) has made a new setting of their own; the next
// install must not overwrite it with the stale record: the record does
// not say what the temporary strategy was, so operatorView takes any
// strategy found beside it for the temporary one and puts back the old.
func TestInstallKeepsAStrategyTheOperatorSetAfterAKilledRun(t *testing.T) {
	ctx := context.Background()
	d := chartDefaults()
	c := newClient(d.DeepCopy(), configMap())
	rolledOut := stuckThenRolled(c)
	revive := killAfterPatch(c)
	_ = Install(ctx, c, Options{Image: image, Wait: time.Second})
	revive()
	// The operator's new choice: two pods of surge, none down, and pods
	// counted available after 10 s.
	mine := appsv1.DeploymentStrategy{Type: appsv1.RollingUpdateDeploymentStrategyType, RollingUpdate: &appsv1.RollingUpdateDeployment{
		MaxUnavailable: ptrTo(intstr.FromInt32(0)), MaxSurge: ptrTo(intstr.FromInt32(2)),
	}}
	now := get(t, c)
	now.Spec.Strategy, now.Spec.MinReadySeconds = mine, 10
	if _, err := c.AppsV1().Deployments("kube-system").Update(ctx, now, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	rolledOut.Store(true)
	var out bytes.Buffer
	if err := Install(ctx, c, Options{Image: image, Wait: 10 * time.Second, Settle: time.Second, Out: &out}); err != nil {
		t.Fatalf("the next install: %v\n%s", err, out.String())
	}
	got := get(t, c)
	if !equalJSON(got.Spec.Strategy, mine) || got.Spec.MinReadySeconds != 10 {
		t.Errorf("after the next install: strategy %s, minReadySeconds %d; want the operator's own, set after the killed run: %s, 10\n%s",
			strategyString(got.Spec.Strategy), got.Spec.MinReadySeconds, strategyString(mine), out.String())
	}
}

// A node the pods cannot go to is not spare: here the second Ready node
// has a NoSchedule taint the CoreDNS pods do not tolerate (a GPU pool, a
// dedicated pool). The surge pod the temporary strategy adds needs a node
// without a CoreDNS pod that it may be scheduled on, and there is none:
// the rollout stays Pending until --timeout, then is put back. Install
// must refuse it as it refuses with no spare node at all (the dry run
// included), or roll with --force as the operator's strategy does.
func TestInstallRefusesASurgeWhoseOnlySpareNodeIsTainted(t *testing.T) {
	ctx := context.Background()
	_, objs := onePerNodeCluster(1)
	objs = append(objs, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-0"},
		Spec:   corev1.NodeSpec{Taints: []corev1.Taint{{Key: "nvidia.com/gpu", Value: "present", Effect: corev1.TaintEffectNoSchedule}}},
		Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}}})
	c := newClient(objs...)
	var out bytes.Buffer
	if err := Install(ctx, c, Options{Image: image, DryRun: true, Wait: 5 * time.Second, Out: &out}); !IsRefused(err) || !strings.Contains(err.Error(), "need a node each") {
		t.Errorf("install --dry-run with the only other node tainted against the pods: %v, want it refused as with no spare node\n%s", err, out.String())
	}
}

// A node counts for the pods only where it matches their required node
// affinity and they tolerate its NoSchedule and NoExecute taints.
func TestNodeFitsThePodsAffinityAndTolerations(t *testing.T) {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: map[string]string{"pool": "system"}},
		Spec: corev1.NodeSpec{Taints: []corev1.Taint{{Key: "dedicated", Value: "dns", Effect: corev1.TaintEffectNoExecute}, {Key: "soft", Effect: corev1.TaintEffectPreferNoSchedule}}}}
	aff := func(op corev1.NodeSelectorOperator, v ...string) *corev1.Affinity {
		return &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
			NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "pool", Operator: op, Values: v}}}}}}}
	}
	if !affinityMatches(nil, node) || !affinityMatches(aff(corev1.NodeSelectorOpIn, "system"), node) || affinityMatches(aff(corev1.NodeSelectorOpNotIn, "system"), node) || affinityMatches(aff(corev1.NodeSelectorOpDoesNotExist), node) {
		t.Error("required node affinity read wrong")
	}
	if toleratesNode(nil, node) {
		t.Error("a NoExecute taint not tolerated: node counted")
	}
	if !toleratesNode([]corev1.Toleration{{Key: "dedicated", Operator: corev1.TolerationOpEqual, Value: "dns", Effect: corev1.TaintEffectNoExecute}}, node) {
		t.Error("a tolerated taint: node not counted")
	}
}

// killAfterStrategyBack makes c answer nothing once the patch that puts
// the operator's strategy back has gone through: the run is killed before
// it gives up its fields. It returns the function that ends that.
func killAfterStrategyBack(c *fake.Clientset) func() {
	var dead, on atomic.Bool
	on.Store(true)
	c.PrependReactor("*", "*", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if !on.Load() {
			return false, nil, nil
		}
		if dead.Load() {
			return true, nil, errors.New("connection refused: the process is gone")
		}
		if p, ok := a.(k8stesting.PatchAction); ok && p.GetResource().Resource == "deployments" && !isDryRun(a) && p.GetPatchType() == types.MergePatchType && strings.Contains(string(p.GetPatch()), `"strategy"`) {
			_, obj, err := k8stesting.ObjectReaction(c.Tracker())(a)
			dead.Store(true)
			return true, obj, err
		}
		return false, nil, nil
	})
	return func() { on.Store(false) }
}

// A run killed after it put the operator's strategy back, before it gave
// up its fields, leaves the install owning them: status says so, and the
// next install gives them up, so that the next server-side apply does not
// conflict.
func TestInstallFinishesARunKilledBeforeItGaveUpItsFields(t *testing.T) {
	ctx := context.Background()
	c := newClient(configMap())
	deps := c.AppsV1().Deployments("kube-system")
	applied := appliedDeployment()
	applied.Spec.WithReplicas(1).WithStrategy(applyapps.DeploymentStrategy().WithType(appsv1.RollingUpdateDeploymentStrategyType).
		WithRollingUpdate(applyapps.RollingUpdateDeployment().WithMaxUnavailable(intstr.FromInt32(1))))
	if _, err := deps.Apply(ctx, applied, metav1.ApplyOptions{FieldManager: "platform"}); err != nil {
		t.Fatal(err)
	}
	controller(c, nil, func(*appsv1.Deployment) appsv1.DeploymentStatus { return rolled(1) })
	revive := killAfterStrategyBack(c)
	var killed bytes.Buffer
	if err := Install(ctx, c, withForce(Options{Image: image, Deployment: "coredns", Wait: 5 * time.Second, Out: &killed})); err == nil {
		t.Fatalf("the killed install: no error\n%s", killed.String())
	}
	revive()
	if !fieldsHeld(get(t, c)) {
		t.Fatalf("the killed run gave up its fields: managedFields %+v", get(t, c).ManagedFields)
	}
	if s, healthy := statusText(t, c); healthy || !strings.Contains(s, "before it gave up the fields it set") {
		t.Errorf("status after the killed run (healthy %v):\n%s", healthy, s)
	}
	var out bytes.Buffer
	if err := Install(ctx, c, withForce(Options{Image: image, Wait: 5 * time.Second, Out: &out})); err != nil {
		t.Fatalf("the next install: %v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "giving up the install's field ownership") {
		t.Errorf("the next install does not say it gives up the fields:\n%s", out.String())
	}
	if s, healthy := statusText(t, c); !healthy {
		t.Errorf("status after the next install:\n%s", s)
	}
	if _, err := deps.Apply(ctx, applied, metav1.ApplyOptions{FieldManager: "platform"}); err != nil {
		t.Errorf("the next server-side apply: %v", err)
	}
}

// An uninstall killed after it put the operator's strategy back, before it
// gave up its fields: the next uninstall gives them up.
func TestUninstallFinishesARunKilledBeforeItGaveUpItsFields(t *testing.T) {
	ctx := context.Background()
	c := newClient(configMap())
	deps := c.AppsV1().Deployments("kube-system")
	applied := appliedDeployment()
	applied.Spec.WithReplicas(1).WithStrategy(applyapps.DeploymentStrategy().WithType(appsv1.RollingUpdateDeploymentStrategyType).
		WithRollingUpdate(applyapps.RollingUpdateDeployment().WithMaxUnavailable(intstr.FromInt32(1))))
	if _, err := deps.Apply(ctx, applied, metav1.ApplyOptions{FieldManager: "platform"}); err != nil {
		t.Fatal(err)
	}
	controller(c, nil, func(*appsv1.Deployment) appsv1.DeploymentStatus { return rolled(1) })
	o := withForce(Options{Image: image, Deployment: "coredns", Wait: 5 * time.Second})
	if err := Install(ctx, c, o); err != nil {
		t.Fatal(err)
	}
	revive := killAfterStrategyBack(c)
	if err := Uninstall(ctx, c, Options{Deployment: "coredns", Wait: 5 * time.Second}); err == nil {
		t.Fatal("the killed uninstall: no error")
	}
	revive()
	if s, healthy := statusText(t, c); healthy || !strings.Contains(s, "before it gave up the fields it set") {
		t.Errorf("status after the killed uninstall (healthy %v):\n%s", healthy, s)
	}
	var dry bytes.Buffer
	if err := Uninstall(ctx, c, Options{Deployment: "coredns", DryRun: true, Out: &dry}); err != nil || !strings.Contains(dry.String(), "giving up the install's field ownership") {
		t.Errorf("the dry run of the next uninstall: %v, want it to say the fields go\n%s", err, dry.String())
	}
	if err := Uninstall(ctx, c, Options{Deployment: "coredns", Wait: 5 * time.Second}); err != nil {
		t.Fatalf("the next uninstall: %v", err)
	}
	if fieldsHeld(get(t, c)) {
		t.Errorf("the next uninstall left the install's fields: %+v", get(t, c).ManagedFields)
	}
	if _, err := deps.Apply(ctx, applied, metav1.ApplyOptions{FieldManager: "platform"}); err != nil {
		t.Errorf("the next server-side apply: %v", err)
	}
}
