package k8s_event

import (
	"context"
	"fmt"
	"math"
	"sync/atomic"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
)

// A request that never reached the server gives its token back, but never
// more than the bucket would hold had the request never been made. A
// reload that raises BURST while requests are out must not turn refills
// the old cap took into tokens.
func TestGiveBackAfterBurstRaisedIsNoMoreThanWithoutTheRequests(t *testing.T) {
	t0 := epoch
	with := newBucket(0.1, 2, t0)    // two requests go out and never reach the server
	without := newBucket(0.1, 2, t0) // the same bucket, the requests never made
	if !with.take(1, t0) || !with.take(2, t0) {
		t.Fatal("a full bucket of 2 refused a token")
	}
	// 10 s at 0.1/s: one token comes back into the bucket with the
	// requests out; the one without them was full and lost it to its cap.
	t1 := t0.Add(10 * time.Second)
	with.set(0.1, 10, t1) // a reload raises BURST
	without.set(0.1, 10, t1)
	with.settle(1, false, t1)
	with.settle(2, false, t1)
	got, want := with.tokens, without.tokens
	if math.Abs(got-want) > 1e-9 {
		t.Errorf("after two requests that never reached the server: %v tokens, want %v, as without them", got, want)
	}
}

// The same through the scheduler: requests refused before they reach the
// server while a reload raises BURST leave the bucket no fuller than it
// would be had they never been made, so the API server sees no more than
// the twin scheduler would let through.
func TestRefusedRequestsAcrossBurstReloadCostNothingAndGiveNothing(t *testing.T) {
	cfg := testConfig(all, 0.1, 2, 16)
	s := newScheduler(cfg, testPod(), epoch)
	twin := newScheduler(cfg, testPod(), epoch)
	s.observe(ln(levelError, "errors", "a", epoch))
	s.observe(ln(levelError, "errors", "b", epoch))
	reqs, _ := s.dispatch(epoch)
	if len(reqs) != 2 {
		t.Fatalf("%d requests, want 2", len(reqs))
	}
	t1 := epoch.Add(10 * time.Second)
	raised := testConfig(all, 0.1, 10, 16)
	s.apply(raised, t1)
	twin.apply(raised, t1)
	for _, r := range reqs {
		s.outcome(result{id: r.id, outcome: writeFailed, reached: false, err: errRefused}, t1)
	}
	b, tb := s.buckets[levelError], twin.buckets[levelError]
	b.advance(t1)
	tb.advance(t1)
	if b.tokens > tb.tokens+1e-9 {
		t.Errorf("error bucket holds %v tokens after two refused requests, the same scheduler without them %v", b.tokens, tb.tokens)
	}
}

// A bucket's wait is how long until it has a token: never negative, for
// any rate the Corefile accepts ((0, 1000]).
func TestWaitIsNeverNegativeForAnAcceptedRate(t *testing.T) {
	cfg, err := parse(newController("k8s_event {\n rate 1e-12 1\n}"))
	if err != nil {
		t.Fatalf("rate 1e-12 refused: %v", err)
	}
	b := newBucket(cfg.qps, cfg.burst, epoch)
	if !b.take(1, epoch) {
		t.Fatal("a full bucket refused a token")
	}
	if w := b.wait(epoch); w <= 0 {
		t.Errorf("an empty bucket at QPS %g says a token comes in %v", cfg.qps, w)
	}
}

// The scheduler's next wake is never before now: an event that waits for
// a token at the slowest accepted rate is looked at again when it may
// have one, not at once, over and over.
func TestEventWaitingForTokenAtSlowRateWakesNoSoonerThanNow(t *testing.T) {
	s := newScheduler(testConfig(all, 1e-12, 1, 16), testPod(), epoch)
	s.observe(ln(levelError, "errors", "a", epoch))
	s.observe(ln(levelError, "errors", "b", epoch))
	reqs, wake := s.dispatch(epoch)
	if len(reqs) != 1 {
		t.Fatalf("%d requests, want 1", len(reqs))
	}
	if !wake.IsZero() && !wake.After(epoch) {
		t.Errorf("the scheduler asks to be woken at %v, %v before now", wake, epoch.Sub(wake))
	}
}

// Requests that never reached the server give back no more than the
// bucket would hold without them, also when other requests took tokens
// while they were out: the requests that reach the server stay within
// BURST + QPS x T over any T, here BURST at one instant.
func TestGiveBackWhileOthersTookTokensKeepsTheBound(t *testing.T) {
	const burst = 4
	b := newBucket(1, burst, epoch)
	for id := uint64(1); id <= burst; id++ { // out, and never reach the server
		if !b.take(id, epoch) {
			t.Fatalf("token %d refused", id)
		}
	}
	t1 := epoch.Add(3500 * time.Millisecond) // 3.5 tokens came back in
	reached := 0
	for id := uint64(5); id <= 7; id++ {
		if !b.take(id, t1) {
			t.Fatalf("token %d refused at t1", id)
		}
		b.settle(id, true, t1)
		reached++
	}
	for id := uint64(1); id <= burst; id++ {
		b.settle(id, false, t1)
	}
	for id := uint64(8); b.take(id, t1); id++ {
		b.settle(id, true, t1)
		reached++
	}
	if reached > burst {
		t.Errorf("%d requests reached the server at one instant through a bucket of BURST %d", reached, burst)
	}
}

// The same through the scheduler and the API server: four creates whose
// connections take 3.5 s to be refused are out while others are written;
// once they are refused, the API server has seen more requests of the
// reason at one instant than BURST.
func TestRefusedAfterOthersWroteKeepsRequestsWithinBurst(t *testing.T) {
	const burst = 4
	clk := clocktesting.NewFakeClock(epoch)
	api := newFakeAPI(t, clk)
	var refuse atomic.Bool
	api.setFault(func(apiRequest) fault { return fault{unsent: refuse.Load()} })
	s := newScheduler(testConfig(all, 1, burst, 64), testPod(), epoch)
	send := func(r request) result {
		ctx, cancel := context.WithTimeout(context.Background(), writeTimeout)
		defer cancel()
		return do(ctx, api.client, r)
	}
	for i := range burst {
		s.observe(ln(levelError, "errors", fmt.Sprint("slow to refuse ", i), clk.Now()))
	}
	out, _ := s.dispatch(clk.Now()) // their connections are being tried
	if len(out) != burst {
		t.Fatalf("%d requests, want %d", len(out), burst)
	}
	clk.Step(3500 * time.Millisecond)
	t1 := clk.Now()
	for i := range 6 {
		s.observe(ln(levelError, "errors", fmt.Sprint("written ", i), t1))
	}
	reqs, _ := s.dispatch(t1)
	for _, r := range reqs {
		s.outcome(send(r), t1)
	}
	refuse.Store(true)
	for _, r := range out {
		s.outcome(send(r), t1) // refused: never reached the server
	}
	refuse.Store(false)
	reqs, _ = s.dispatch(t1)
	for _, r := range reqs {
		s.outcome(send(r), t1)
	}
	api.mu.Lock()
	n := 0
	for _, r := range api.requests {
		if r.at.Equal(t1) && r.reason == levelError.reason() {
			n++
		}
	}
	api.mu.Unlock()
	if n > burst {
		t.Errorf("%d requests of %s reached the API server at one instant, BURST is %d", n, levelError.reason(), burst)
	}
}
