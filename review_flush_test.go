package k8s_event

import (
	"testing"
	"time"
)

// flushWaiting tells whether a flusher waits for a request in flight to end.
func flushWaiting(p *pipeline) func() bool {
	return func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.requestEnded != nil
	}
}

// TestReviewFlushHonoursRetryAfterOfWriteInHand: "A Retry-After is
// honoured in the flush too ...: a failed write or read is tried again no
// sooner than it asks, and when it asks for longer than the flush has left,
// the event is not tried again and its lines are dropped at the end". A
// writer's create is in flight when stop comes; the flush takes the event
// once that write is back. The write is answered 429 with Retry-After 60 s,
// far past the 2 s flush: the event must not be written again in the flush.
func TestReviewFlushHonoursRetryAfterOfWriteInHand(t *testing.T) {
	p, api, clk := newTestPipeline(t, testConfig(all, 100, 100, 64))
	entered, release := holdFirstCreateThen(api, fault{code: 429, retryAfter: 60})
	before := readLedger()
	p.observe(ln(levelError, "errors", "upstream down", clk.Now()))
	worker := make(chan struct{})
	go func() { defer close(worker); p.processNext() }()
	<-entered // the writer's create is in flight

	done := make(chan struct{})
	go func() { defer close(done); p.stop(2 * time.Second) }()
	waitUntil(t, "the flush to wait for the write in hand", flushWaiting(p))
	close(release) // answered 429, Retry-After: 60
	<-worker
	<-done

	d := checkLedger(t, api, before, 1)
	if creates, _ := api.writes(); creates != 1 || len(events(t, api)) != 0 {
		t.Errorf("the write in hand was answered Retry-After 60 s, the flush had 2 s: %d creates, %d events, dropped{shutdown} %v; "+
			"the flush wrote the event again at once, not honouring the Retry-After",
			creates, len(events(t, api)), d.dropped[dropShutdown])
	}
}

// TestReviewEndDecidedDuringFlushIsWritten: "Ends still unwritten at
// shutdown are written in the flush if their bucket has a token." A
// storm's create is in flight when stop comes, and the storm has been quiet
// for longer than QUIET when it is back: the writer that had it in hand
// decides its end, during the flush. The end bucket is full and the API
// answers: the end must be written in the flush, not dropped unsaid.
func TestReviewEndDecidedDuringFlushIsWritten(t *testing.T) {
	p, api, clk := newTestPipeline(t, quietConfig(100, 100, time.Minute))
	entered, release := holdFirstCreateThen(api, fault{})
	before := readLedger()
	for range 12 {
		p.observe(ln(levelError, "errors", "upstream unhealthy", clk.Now()))
	}
	worker := make(chan struct{})
	go func() { defer close(worker); p.processNext() }()
	<-entered // the storm's create is in flight
	clk.Step(2 * time.Minute)

	done := make(chan struct{})
	go func() { defer close(done); p.stop(2 * time.Second) }()
	waitUntil(t, "the flush to wait for the write in hand", flushWaiting(p))
	close(release) // the storm is written; its quiet is long past
	<-worker
	<-done

	checkLedger(t, api, before, 12)
	var ends int
	for _, ev := range events(t, api) {
		if ev.Reason == "CoreDNSErrorEnded" {
			ends++
		}
	}
	if ends != 1 {
		t.Errorf("%d events, %d ends, %.2f tokens in the end bucket after the flush: the end decided while the flush ran was never written",
			len(events(t, api)), ends, p.buckets[endBucket].TokensAt(clk.Now()))
	}
}
