package install

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

var deploymentsResource = appsv1.SchemeGroupVersion.WithResource("deployments")

// controller stands in for the Deployment controller and the kubelet: on
// every read of the Deployment it sets the status that rollout would
// have, which status(d) decides, after edit changed the object, and keeps
// the pods of its template as that status counts them (syncPods).
func controller(c *fake.Clientset, edit func(d *appsv1.Deployment), status func(d *appsv1.Deployment) appsv1.DeploymentStatus) {
	var mu sync.Mutex
	c.PrependReactor("get", "deployments", func(a k8stesting.Action) (bool, runtime.Object, error) {
		mu.Lock()
		defer mu.Unlock()
		obj, err := c.Tracker().Get(deploymentsResource, a.GetNamespace(), a.(k8stesting.GetAction).GetName())
		if err != nil {
			return false, nil, nil
		}
		d := obj.(*appsv1.Deployment).DeepCopy()
		if edit != nil {
			edit(d)
		}
		d.Status = status(d)
		_ = c.Tracker().Update(deploymentsResource, d, d.Namespace)
		syncPods(c, d)
		return false, nil, nil
	})
}

// rolloutNeverReady makes c's controller roll out every template but one
// of build img: its surge pod never gets Ready, and the old pod stays.
func rolloutNeverReady(c *fake.Clientset, img string) {
	controller(c, nil, func(now *appsv1.Deployment) appsv1.DeploymentStatus {
		if now.Spec.Template.Spec.Containers[0].Image == img {
			return appsv1.DeploymentStatus{Replicas: 2, UpdatedReplicas: 1, ReadyReplicas: 1, AvailableReplicas: 1}
		}
		return rolled(1)
	})
}

var podsResource = corev1.SchemeGroupVersion.WithResource("pods")

// syncPods keeps the pods of d's template as its status counts them: the
// updated replicas, the first of them Ready as far as the available
// replicas go beyond the old ones. Pods of other templates go; a pod's
// restarts stay what they are.
func syncPods(c *fake.Clientset, d *appsv1.Deployment) {
	b, _ := json.Marshal(d.Spec.Template)
	h := sha256.Sum256(b)
	prefix := fmt.Sprintf("%s-%x-", d.Name, h[:4])
	ready := int(max(0, d.Status.AvailableReplicas-(d.Status.Replicas-d.Status.UpdatedReplicas)))
	list, _ := c.Tracker().List(podsResource, corev1.SchemeGroupVersion.WithKind("Pod"), d.Namespace)
	have := map[string]*corev1.Pod{}
	for _, p := range list.(*corev1.PodList).Items {
		if !strings.HasPrefix(p.Name, prefix) {
			_ = c.Tracker().Delete(podsResource, d.Namespace, p.Name)
			continue
		}
		have[p.Name] = p.DeepCopy()
	}
	for i := range int(d.Status.UpdatedReplicas) {
		name := fmt.Sprintf("%s%d", prefix, i)
		p, ok := have[name]
		if !ok {
			p = &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: d.Namespace, Labels: d.Spec.Template.Labels, Annotations: d.Spec.Template.Annotations}, Spec: *d.Spec.Template.Spec.DeepCopy()}
			p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: p.Spec.Containers[0].Name}}
		}
		st := corev1.ConditionFalse
		if i < ready {
			st = corev1.ConditionTrue
		}
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: st}}
		p.Status.ContainerStatuses[0].Ready = st == corev1.ConditionTrue
		if ok {
			_ = c.Tracker().Update(podsResource, p, d.Namespace)
		} else {
			_ = c.Tracker().Add(p)
		}
	}
}

func rolled(n int32) appsv1.DeploymentStatus {
	return appsv1.DeploymentStatus{Replicas: n, UpdatedReplicas: n, ReadyReplicas: n, AvailableReplicas: n}
}

// Install fails when, during the wait, something put back its own image
// and volume (a GitOps controller) and that rolled out: it must not say
// it rolled out.
func TestInstallFailsWhenTheTemplateIsPutBackDuringTheWait(t *testing.T) {
	ctx := context.Background()
	stock := deployment()
	c := newClient(stock.DeepCopy(), configMap())
	controller(c, func(d *appsv1.Deployment) {
		if d.Spec.Template.Spec.Containers[0].Image == image {
			d.Spec.Template.Spec.Containers[0].Image = stock.Spec.Template.Spec.Containers[0].Image
			d.Spec.Template.Spec.Volumes = stock.Spec.Template.Spec.Volumes
		}
	}, func(*appsv1.Deployment) appsv1.DeploymentStatus { return rolled(3) })
	var out bytes.Buffer
	err := Install(ctx, c, Options{Image: image, Wait: 3 * time.Second, Out: &out})
	if err == nil || !strings.Contains(err.Error(), "changed during the rollout") {
		t.Errorf("install: %v, want it to say the Deployment changed\n%s", err, out.String())
	}
}

// chartDefaults is the helm chart's layout: one replica, maxUnavailable 1.
func chartDefaults() *appsv1.Deployment {
	d := deployment()
	d.Spec.Replicas = ptrTo(int32(1))
	d.Spec.Strategy = appsv1.DeploymentStrategy{Type: appsv1.RollingUpdateDeploymentStrategyType, RollingUpdate: &appsv1.RollingUpdateDeployment{
		MaxUnavailable: ptrTo(intstr.FromInt32(1)), MaxSurge: ptrTo(intstr.FromString("25%")),
	}}
	d.Status = rolled(1)
	return d
}

// With one replica and maxUnavailable 1, the rollout runs with a
// temporary surge (no pod goes before its replacement is Ready), shown
// in the dry run, and the operator's strategy is put back after.
func TestInstallSurgesWhereTheStrategyCouldDropReadyPods(t *testing.T) {
	ctx := context.Background()
	d := chartDefaults()
	c := newClient(d.DeepCopy(), configMap())
	var sawSurge bool
	controller(c, nil, func(now *appsv1.Deployment) appsv1.DeploymentStatus {
		if ru := now.Spec.Strategy.RollingUpdate; ru != nil && ru.MaxUnavailable != nil && ru.MaxUnavailable.IntValue() == 0 && now.Spec.Template.Spec.Containers[0].Image == image {
			sawSurge = true
		}
		return rolled(1)
	})
	var out bytes.Buffer
	if err := Install(ctx, c, Options{Image: image, DryRun: true, Wait: time.Minute, Out: &out}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "maxUnavailable 0") || !strings.Contains(out.String(), "strategy back to RollingUpdate, maxSurge 25%, maxUnavailable 1") {
		t.Errorf("the dry run does not say the surge and its undoing:\n%s", out.String())
	}
	if err := Install(ctx, c, Options{Image: image}); !IsRefused(err) {
		t.Errorf("install without waiting: %v, want it refused", err)
	}
	out.Reset()
	if err := Install(ctx, c, Options{Image: image, Wait: 5 * time.Second, Out: &out}); err != nil {
		t.Fatalf("install: %v\n%s", err, out.String())
	}
	if !sawSurge {
		t.Errorf("the rollout did not run with maxUnavailable 0")
	}
	if got := get(t, c).Spec.Strategy; !equalJSON(got, d.Spec.Strategy) {
		t.Errorf("strategy after install %+v, want the operator's %+v", got, d.Spec.Strategy)
	}
}

// A rollout that never becomes Ready (an image that does not start) is
// put back: the template and the strategy are the operator's again, and
// the error says so.
func TestInstallPutsBackARolloutThatFails(t *testing.T) {
	ctx := context.Background()
	d := chartDefaults()
	c := newClient(d.DeepCopy(), configMap())
	rolloutNeverReady(c, image)
	var out bytes.Buffer
	err := Install(ctx, c, Options{Image: image, Wait: 2 * time.Second, Out: &out})
	if err == nil || !strings.Contains(err.Error(), "did not roll out") || !strings.Contains(err.Error(), "is back as it was") {
		t.Fatalf("install: %v\n%s", err, out.String())
	}
	if _, err := c.RbacV1().Roles("kube-system").Get(ctx, "coredns-k8s-event", metav1.GetOptions{}); err == nil {
		t.Errorf("the role the failed install made is still there")
	}
	got := get(t, c)
	if !equalJSON(got.Spec.Template, d.Spec.Template) || !equalJSON(got.Spec.Strategy, d.Spec.Strategy) {
		t.Errorf("after the failed install the Deployment is not the operator's:\n%s", Diff(specJSON(d), specJSON(got)))
	}
}

// An install interrupted during the wait (Ctrl-C) puts back the
// Deployment as it was, and gives back its lease.
func TestInstallInterruptedDuringTheWaitIsPutBack(t *testing.T) {
	d := chartDefaults()
	c := newClient(d.DeepCopy(), configMap())
	rolloutNeverReady(c, image)
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	err := Install(ctx, c, Options{Image: image, Wait: time.Minute})
	if err == nil || !strings.Contains(err.Error(), "is back as it was") {
		t.Fatalf("install: %v", err)
	}
	got := get(t, c)
	if !equalJSON(got.Spec.Template, d.Spec.Template) || !equalJSON(got.Spec.Strategy, d.Spec.Strategy) {
		t.Errorf("after the interrupted install the Deployment is not the operator's:\n%s", Diff(specJSON(d), specJSON(got)))
	}
	if _, err := c.CoordinationV1().Leases("kube-system").Get(context.Background(), "coredns-k8s-event", metav1.GetOptions{}); err == nil {
		t.Errorf("the lease is still there")
	}
}

// A paused Deployment would never roll: install refuses.
func TestInstallRefusesAPausedDeployment(t *testing.T) {
	d := deployment()
	d.Spec.Paused = true
	c := newClient(d, configMap())
	if err := Install(context.Background(), c, Options{Image: image}); !IsRefused(err) || !strings.Contains(err.Error(), "rollout resume") {
		t.Errorf("install: %v", err)
	}
}

// What the rollout does to availability, strategy by strategy: a surge
// only where the Deployment's own strategy could go below the Ready pods
// found (never above its replicas).
func TestSafeRollout(t *testing.T) {
	for _, tc := range []struct {
		name            string
		replicas, ready int32
		strategy        appsv1.DeploymentStrategy
		surge           int // 0: the Deployment's own strategy
	}{
		{"chart defaults", 1, 1, appsv1.DeploymentStrategy{RollingUpdate: &appsv1.RollingUpdateDeployment{MaxUnavailable: ptrTo(intstr.FromInt32(1))}}, 1},
		{"kubeadm", 2, 2, appsv1.DeploymentStrategy{Type: appsv1.RollingUpdateDeploymentStrategyType, RollingUpdate: &appsv1.RollingUpdateDeployment{MaxUnavailable: ptrTo(intstr.FromInt32(1))}}, 1},
		{"defaults, 3 replicas", 3, 3, appsv1.DeploymentStrategy{}, 0},
		{"defaults, 8 replicas", 8, 8, appsv1.DeploymentStrategy{}, 2},
		{"recreate", 2, 2, appsv1.DeploymentStrategy{Type: appsv1.RecreateDeploymentStrategyType}, 1},
		{"one not ready", 2, 1, appsv1.DeploymentStrategy{RollingUpdate: &appsv1.RollingUpdateDeployment{MaxUnavailable: ptrTo(intstr.FromInt32(1))}}, 0},
		{"mid-rollout, more ready than replicas", 3, 4, appsv1.DeploymentStrategy{}, 0},
		{"none ready", 1, 0, appsv1.DeploymentStrategy{Type: appsv1.RecreateDeploymentStrategyType}, 0},
	} {
		d := deployment()
		d.Spec.Replicas = &tc.replicas
		d.Status.ReadyReplicas = tc.ready
		d.Spec.Strategy = tc.strategy
		tmp, why := safeRollout(d)
		switch {
		case tc.surge == 0 && tmp != nil:
			t.Errorf("%s: a temporary strategy, want none: %s", tc.name, why)
		case tc.surge != 0 && (tmp == nil || tmp.RollingUpdate.MaxUnavailable.IntValue() != 0 || tmp.RollingUpdate.MaxSurge.IntValue() != tc.surge):
			t.Errorf("%s: %+v, want maxUnavailable 0, maxSurge %d: %s", tc.name, tmp, tc.surge, why)
		}
	}
}

// While the install waits (minutes, by default up to 5), the operator
// raises CoreDNS's memory limit (kubectl set resources: it was OOMing).
// The rollout then fails and is put back; putBack (rollout.go) sets the
// whole pod template to the one found before the install, so the
// operator's new limit goes too, with no word of it. Promise: what the
// tool touches keeps the operator's own settings; a put-back takes back
// what the install set (image, variables, config volume, record), not
// what others set meanwhile.
func TestPutBackKeepsWhatTheOperatorChangedDuringTheWait(t *testing.T) {
	ctx := context.Background()
	d := chartDefaults()
	c := newClient(d.DeepCopy(), configMap())
	controller(c, func(now *appsv1.Deployment) {
		ctr := &now.Spec.Template.Spec.Containers[0]
		if ctr.Image == image && ctr.Resources.Limits.Memory().String() == "512Mi" {
			ctr.Resources.Limits[corev1.ResourceMemory] = resource.MustParse("1Gi")
		}
	}, func(now *appsv1.Deployment) appsv1.DeploymentStatus {
		if now.Spec.Template.Spec.Containers[0].Image == image {
			return appsv1.DeploymentStatus{Replicas: 2, UpdatedReplicas: 1, ReadyReplicas: 1, AvailableReplicas: 1}
		}
		return rolled(1)
	})
	var out bytes.Buffer
	err := Install(ctx, c, Options{Image: image, Wait: 2 * time.Second, Out: &out})
	if err == nil || !strings.Contains(err.Error(), "is back as it was") {
		t.Fatalf("install: %v\n%s", err, out.String())
	}
	got := get(t, c).Spec.Template.Spec.Containers[0]
	if got.Image != d.Spec.Template.Spec.Containers[0].Image {
		t.Fatalf("image %s: the install's image was not put back", got.Image)
	}
	if m := got.Resources.Limits.Memory().String(); m != "1Gi" {
		t.Errorf("after the put-back the memory limit is %s: the operator's 1Gi, set during the wait, was reverted", m)
	}
}
