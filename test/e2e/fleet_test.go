//go:build e2e

package e2e

import (
	"fmt"
	"slices"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
)

// fleetCorefile is faultsCorefile with a fleet bound of QPS 4 and BURST 4.
const fleetCorefile = `.:{{.DNS}} {
    kubeapi {
        kubeconfig {{.Kubeconfig}}
    }
    k8s_event {
        rate 100 200
        fleet 4 4
    }
    errors
    logline {{.Logline}}
    prometheus {{.Metrics}}
    whoami
}
`

// ownedByDeployment makes pod a pod of a Deployment of 3 replicas and maxSurge 1, through a
// ReplicaSet, as the controllers would (the test cluster runs none): N is 4.
func ownedByDeployment(t *testing.T, pod *corev1.Pod) {
	t.Helper()
	ctx, ns := t.Context(), pod.Namespace
	labels := map[string]string{"k8s-app": "coredns"}
	template := corev1.PodTemplateSpec{
		ObjectMeta: metav1.ObjectMeta{Labels: labels},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "coredns", Image: "example.com/coredns-k8s-event:latest"}}},
	}
	selector := &metav1.LabelSelector{MatchLabels: labels}
	dep, err := kube.Clientset.AppsV1().Deployments(ns).Create(ctx, &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "coredns"},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](3),
			Selector: selector,
			Template: template,
			Strategy: appsv1.DeploymentStrategy{
				Type: appsv1.RollingUpdateDeploymentStrategyType,
				RollingUpdate: &appsv1.RollingUpdateDeployment{
					MaxSurge:       ptr.To(intstr.FromInt32(1)),
					MaxUnavailable: ptr.To(intstr.FromInt32(0)),
				},
			},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rs, err := kube.Clientset.AppsV1().ReplicaSets(ns).Create(ctx, &appsv1.ReplicaSet{
		ObjectMeta: metav1.ObjectMeta{
			Name:            "coredns-6b8f7c9d5",
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(dep, appsv1.SchemeGroupVersion.WithKind("Deployment"))},
		},
		Spec: appsv1.ReplicaSetSpec{Replicas: ptr.To[int32](3), Selector: selector, Template: template},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p, err := kube.Clientset.CoreV1().Pods(ns).Get(ctx, pod.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p.OwnerReferences = []metav1.OwnerReference{*metav1.NewControllerRef(rs, appsv1.SchemeGroupVersion.WithKind("ReplicaSet"))}
	if _, err := kube.Clientset.CoreV1().Pods(ns).Update(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// TestFleetSharesItsBound: with `fleet 4 4` and a Deployment of 3 replicas and maxSurge 1 on the
// real kube-apiserver, the replica counts N = 4 through its ReplicaSet, and writes its share:
// BURST/N + 1 = 2 events at once, then QPS/N + 1/3600 a second, after the herd's spread.
func TestFleetSharesItsBound(t *testing.T) {
	pod := testPod(t)
	ownedByDeployment(t, pod)
	c := startFaults(t, pod, fleetCorefile)
	const lines = 8
	for i := range lines {
		c.logLine("error", 1, fmt.Sprintf("upstream %d unreachable", i))
	}
	// Until N is read the herd's window is its most, 30 s: the first write waits a random part
	// of it, then the share writes 2 at once and 1 a second.
	evs := waitEventsFor(t, pod, 30*time.Second+lines*time.Second+15*time.Second, "every event", func(evs []corev1.Event) bool {
		return len(withReason(evs, "CoreDNSError")) == lines
	})
	var created []time.Time
	for _, ev := range withReason(evs, "CoreDNSError") {
		created = append(created, ev.CreationTimestamp.Time)
	}
	slices.SortFunc(created, time.Time.Compare)
	// Creation times are in whole seconds: a second more on every interval.
	for i := range created {
		for j := i; j < len(created); j++ {
			bound := 2 + (1+1/3600.0)*(created[j].Sub(created[i]).Seconds()+1)
			if float64(j-i+1) > bound {
				t.Errorf("%d events created from %v to %v, bound %.2f", j-i+1, created[i], created[j], bound)
			}
		}
	}
	if span := created[len(created)-1].Sub(created[0]); span < 4*time.Second {
		t.Errorf("%d events created within %v: the share (2, then 1 a second) did not hold", lines, span)
	}
	if n := c.metric("coredns_k8s_event_fleet_replicas"); n != 4 {
		t.Errorf("fleet_replicas %v, want 4: replicas 3 and maxSurge 1", n)
	}
}
