package install

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// crashAfter makes the k8s_event pods' container exit after after, once:
// it restarts, and is not Ready, as the kubelet reports a program that
// passed readiness and then exited 1.
func crashAfter(c *fake.Clientset, after time.Duration) {
	var first atomic.Int64
	c.PrependReactor("list", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		list, err := c.Tracker().List(podsResource, corev1.SchemeGroupVersion.WithKind("Pod"), a.GetNamespace())
		if err != nil {
			return false, nil, nil
		}
		for _, p := range list.(*corev1.PodList).Items {
			if p.Spec.Containers[0].Image != image {
				continue
			}
			first.CompareAndSwap(0, time.Now().UnixNano())
			if time.Since(time.Unix(0, first.Load())) < after || p.Status.ContainerStatuses[0].RestartCount > 0 {
				continue
			}
			p.Status.ContainerStatuses[0].RestartCount = 1
			p.Status.ContainerStatuses[0].LastTerminationState.Terminated = &corev1.ContainerStateTerminated{Reason: "Error", ExitCode: 1}
			_ = c.Tracker().Update(podsResource, &p, p.Namespace)
		}
		return false, nil, nil
	})
}

// An image whose program passes readiness and exits seconds later (or
// whose readiness probe another pod on the node's network answered) is a
// failed rollout: put back, never "rolled out". The settle time here is
// the product's own 20 s.
func TestARolloutThatRestartsWithinTheSettleTimeIsPutBack(t *testing.T) {
	ctx := context.Background()
	d := chartDefaults()
	c := newClient(d.DeepCopy(), configMap())
	controller(c, nil, func(*appsv1.Deployment) appsv1.DeploymentStatus { return rolled(1) })
	crashAfter(c, 2*time.Second)
	var out bytes.Buffer
	err := Install(ctx, c, Options{Image: image, Wait: time.Minute, Settle: 20 * time.Second, Out: &out})
	if err == nil || !strings.Contains(err.Error(), "restarted within the settle time") || !strings.Contains(err.Error(), "is back as it was") {
		t.Fatalf("install: %v, want a failed rollout, put back\n%s", err, out.String())
	}
	if strings.Contains(out.String(), "rolled out") {
		t.Errorf("the run says it rolled out:\n%s", out.String())
	}
	got := get(t, c)
	if !equalJSON(got.Spec.Template, d.Spec.Template) || !equalJSON(got.Spec.Strategy, d.Spec.Strategy) {
		t.Errorf("after the failed rollout the Deployment is not the operator's:\n%s", Diff(specJSON(d), specJSON(got)))
	}
}

// The settle time is 20 s, or the Deployment's minReadySeconds when that
// is longer, or what the run is told.
func TestSettleTimeIsTheLongerOfItsOwnAndMinReadySeconds(t *testing.T) {
	d := deployment()
	if got := settleFor(deploymentOf(d), &Options{Settle: 20 * time.Second}); got != 20*time.Second {
		t.Errorf("settle %v, want 20s", got)
	}
	d.Spec.MinReadySeconds = 45
	if got := settleFor(deploymentOf(d), &Options{Settle: 20 * time.Second}); got != 45*time.Second {
		t.Errorf("settle with minReadySeconds 45: %v, want 45s", got)
	}
}

// Where one of three replicas could not become available even before the
// install, neither the install's rollout nor the put-back's can finish:
// the template is the operator's again, and the advice says so, never
// `kubectl rollout undo`, which would roll to the failed revision.
func TestAdviceAfterAPutBackThatCannotFinishMatchesTheCluster(t *testing.T) {
	ctx := context.Background()
	d := deployment()
	d.Status = appsv1.DeploymentStatus{Replicas: 3, UpdatedReplicas: 3, ReadyReplicas: 2, AvailableReplicas: 2}
	c := newClient(d.DeepCopy(), configMap())
	controller(c, nil, func(now *appsv1.Deployment) appsv1.DeploymentStatus {
		if now.Spec.Template.Spec.Containers[0].Image == image {
			return appsv1.DeploymentStatus{Replicas: 4, UpdatedReplicas: 1, ReadyReplicas: 2, AvailableReplicas: 2}
		}
		return appsv1.DeploymentStatus{Replicas: 3, UpdatedReplicas: 3, ReadyReplicas: 2, AvailableReplicas: 2}
	})
	var out bytes.Buffer
	err := Install(ctx, c, Options{Image: image, Wait: time.Second, JSON: true, Out: &out})
	var res Result
	_ = json.Unmarshal(out.Bytes(), &res)
	if err == nil || strings.Contains(err.Error(), "rollout undo") || strings.Contains(res.Undo, "rollout undo") || !strings.Contains(err.Error(), "is back as it was (template and strategy), with 2 of 3 available as before the install") {
		t.Errorf("install: %v\nundo: %q; want the template said back, and no rollout undo", err, res.Undo)
	}
	if got := get(t, c); !equalJSON(got.Spec.Template, d.Spec.Template) {
		t.Errorf("the template is not the operator's:\n%s", Diff(specJSON(d), specJSON(got)))
	}
}

// A pod that can be asked is asked a DNS question on its own address: one
// that answers passes, one where nothing listens fails; one that shares
// the node's network is not asked, and the report says so.
func TestSettledPodsAreAskedDNSOnTheirOwnAddress(t *testing.T) {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg)
		m.SetRcode(r, dns.RcodeRefused)
		_ = w.WriteMsg(m)
	})}
	go func() { _ = srv.ActivateAndServe() }()
	defer func() { _ = srv.Shutdown() }()
	answering := pc.LocalAddr().(*net.UDPAddr).Port
	free, _ := net.ListenPacket("udp", "127.0.0.1:0")
	silent := free.LocalAddr().(*net.UDPAddr).Port
	_ = free.Close()
	pod := func(port int, host bool) corev1.Pod {
		return corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "coredns-" + strconv.Itoa(port)},
			Spec: corev1.PodSpec{HostNetwork: host, Containers: []corev1.Container{{Name: "coredns",
				Ports: []corev1.ContainerPort{{Name: "dns", ContainerPort: int32(port), Protocol: corev1.ProtocolUDP}}}}},
			Status: corev1.PodStatus{PodIP: "127.0.0.1"}}
	}
	tg := &target{}
	ctx := context.Background()
	if note, err := askPods(ctx, []corev1.Pod{pod(answering, false)}, tg); err != nil || note != "" {
		t.Errorf("a pod that answers: %q, %v", note, err)
	}
	if _, err := askPods(ctx, []corev1.Pod{pod(silent, false)}, tg); err == nil {
		t.Errorf("a pod where nothing listens passed")
	}
	if note, err := askPods(ctx, []corev1.Pod{pod(silent, true)}, tg); err != nil || !strings.Contains(note, "node's network") {
		t.Errorf("a pod on the node's network: %q, %v", note, err)
	}
}
