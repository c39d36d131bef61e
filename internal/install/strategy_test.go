package install

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
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
