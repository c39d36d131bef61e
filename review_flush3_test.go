package k8s_event

import (
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// lookupPipeline is a test pipeline whose pod has no UID from the downward
// API: writers read the pod before the first create. The fake API holds it.
func lookupPipeline(t *testing.T, cfg config) (*pipeline, *fakeAPI) {
	p, api, _ := newTestPipeline(t, cfg)
	ref := testRef
	ref.UID = ""
	p.pod.ref.Store(&ref)
	p.pod.lookup.Store(true)
	api.addPod(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: testRef.Name, Namespace: testRef.Namespace, UID: testRef.UID}})
	return p, api
}

// TestReviewFlushHungPodReadHoldsOnlyItsEvent: at shutdown "A write already
// in flight then (one that hangs, say) holds up only its own event", and
// "every pending event whose bucket has a token is written"; buckets are
// per reason "so that a flood of one level cannot starve another". Without
// COREDNS_POD_UID, an error and a warning are pending at stop; the flush's
// read of the pod, made for the error with a token of the errors' bucket,
// gets no answer. The warnings' bucket is full, the API answers everything
// else at once and the flush has its 2 s: the warning must be written (its
// own read of the pod, then its create), not dropped as shutdown behind
// the error's hung read.
func TestReviewFlushHungPodReadHoldsOnlyItsEvent(t *testing.T) {
	p, api := lookupPipeline(t, testConfig(all, 100, 100, 64))
	hung := make(chan struct{})
	var first atomic.Bool
	client := gatedClient(t, api, func(n int, r *http.Request) bool {
		if strings.Contains(r.URL.Path, "/pods/") && first.CompareAndSwap(false, true) {
			close(hung) // the first read of the pod: no answer until the client gives up
			<-r.Context().Done()
		}
		return true
	})
	p.client.Store(&client)
	clk := p.clock
	before := readLedger()
	p.observe(ln(levelError, "errors", "upstream down", clk.Now()))
	p.observe(ln(levelWarning, "health", "slow answers", clk.Now()))
	start := time.Now()
	p.stop(2 * time.Second)
	took := time.Since(start)
	<-hung

	d := checkLedger(t, api, before, 2)
	warnings := len(withReasonIn(events(t, api), "CoreDNSWarning"))
	if warnings != 1 {
		t.Errorf("stop took %v of its 2 s; %d warning events, dropped{shutdown} %v, %.2f tokens in the warnings' bucket: "+
			"the pending warning was not written while the error's read of the pod hung",
			took.Round(time.Millisecond), warnings, d.dropped[dropShutdown], p.buckets[levelWarning].TokensAt(clk.Now()))
	}
}
