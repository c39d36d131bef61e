package k8s_event

import (
	"io"
	"log"
	"os"
	"testing"
	"time"

	"github.com/coredns/caddy"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"
)

// testRef is the pod that test events are about.
var testRef = corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Name: "coredns-0", Namespace: "kube-system", UID: types.UID("uid-0")}

const testNode = "node-0"

// testPod returns a fresh identity of the test pod.
func testPod() *podIdentity {
	id := &podIdentity{node: testNode}
	ref := testRef
	id.ref.Store(&ref)
	return id
}

var epoch = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func testConfig(levels levelSet, qps float64, burst, cache int) config {
	return config{levels: levels, qps: qps, burst: burst, cacheSize: cache}
}

// newTestPipeline returns a pipeline on a fake API server and a fake clock,
// not started: tests drive observe and sync themselves, or call start.
func newTestPipeline(t testing.TB, cfg config) (*pipeline, *fakeAPI, *clocktesting.FakeClock) {
	t.Helper()
	clk := clocktesting.NewFakeClock(epoch)
	api := newFakeAPI(t, clk)
	p := newPipeline(cfg, api.client, testPod(), clk)
	t.Cleanup(func() { p.queue.ShutDown(); p.cancel() })
	return p, api, clk
}

// events lists the events the fake API holds.
func events(t testing.TB, api *fakeAPI) []corev1.Event {
	t.Helper()
	return api.list()
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
