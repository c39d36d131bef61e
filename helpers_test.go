package k8s_event

import (
	"github.com/coredns/caddy"
	"io"
	"log"
	"os"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	clocktesting "k8s.io/utils/clock/testing"
)

// testPod is the pod that test events are about.
var testPod = podRef{
	ref:  corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Name: "coredns-0", Namespace: "kube-system", UID: types.UID("uid-0")},
	node: "node-0",
}

var epoch = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func testConfig(levels levelSet, qps float64, burst, cache int) config {
	return config{levels: levels, qps: qps, burst: burst, cacheSize: cache}
}

// newTestPipeline returns a pipeline on a fake clientset and a fake clock,
// not started: tests drive observe and sync themselves, or call start.
func newTestPipeline(t testing.TB, cfg config) (*pipeline, *fake.Clientset, *clocktesting.FakeClock) {
	t.Helper()
	client := fake.NewClientset()
	clk := clocktesting.NewFakeClock(epoch)
	p := newPipeline(cfg, client, testPod, clk)
	t.Cleanup(func() { p.queue.ShutDown(); p.cancel() })
	return p, client, clk
}

// events lists the events in the test pod's namespace.
func events(t testing.TB, client *fake.Clientset) []corev1.Event {
	t.Helper()
	list, err := client.CoreV1().Events(testPod.eventNamespace()).List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return list.Items
}

// drain runs the writers' work that is due now, without goroutines.
func drain(p *pipeline) {
	for p.queue.Len() > 0 {
		p.processNext()
	}
}

var corev1Pod = corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "coredns-1", Namespace: "kube-system", UID: "uid-1"}}

func newController(stanza string) *caddy.Controller { return caddy.NewTestController("dns", stanza) }

func TestMain(m *testing.M) {
	log.SetOutput(io.Discard) // CoreDNS's loggers write through the standard logger
	os.Exit(m.Run())
}
