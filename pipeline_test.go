package k8s_event

import (
	"context"
	"fmt"
	"io"
	"log"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/utils/clock"
	clocktesting "k8s.io/utils/clock/testing"
)

// sendNow has the scheduler decide what to send now and returns it
// unsent: the requests are in flight until the test answers them.
func sendNow(h *harness) []request {
	h.take()
	reqs, _ := h.s.dispatch(h.clk.Now())
	return reqs
}

// answer makes r meet fault f at the API, and hands its result to the
// scheduler now.
func answer(h *harness, r request, f fault) {
	h.api.setFault(func(apiRequest) fault { return f })
	defer h.api.setFault(nil)
	ctx, cancel := context.WithTimeout(context.Background(), h.writeTimeout)
	res := do(ctx, h.client, r)
	cancel()
	h.s.outcome(res, h.clk.Now())
}

// firstFaults is f for the first n requests, and no fault after.
func firstFaults(n int, f fault) func(apiRequest) fault {
	return func(apiRequest) fault {
		if n > 0 {
			n--
			return f
		}
		return fault{}
	}
}

// messages maps the message of each event the API holds to its count.
func messages(api *fakeAPI) map[string]int32 {
	m := map[string]int32{}
	for _, ev := range api.list() {
		m[ev.Message] = ev.Count
	}
	return m
}

// eventRequests lists the event requests that reached the API, in order.
func eventRequests(api *fakeAPI) []apiRequest {
	api.mu.Lock()
	defer api.mu.Unlock()
	var out []apiRequest
	for _, r := range api.requests {
		if r.resource == "events" {
			out = append(out, r)
		}
	}
	return out
}

// TestStopFlushesPending: at shutdown every pending event is written as
// far as its bucket's tokens allow: an event in backoff is tried at once,
// and the least recently seen go first; what is left is dropped with
// cause shutdown.
func TestStopFlushesPending(t *testing.T) {
	h, api, clk := newTestHarness(t, testConfig(all, 1.0/300, 3, 64))
	before := readLedger()
	// A warning that failed once and backs off.
	api.setFault(func(r apiRequest) fault { return fault{code: http.StatusServiceUnavailable} })
	h.observe(ln(levelWarning, "health", "backing off", clk.Now()))
	drain(h)
	api.setFault(nil)
	// Five distinct errors, never sent: 3 tokens.
	for i := range 5 {
		for range i + 1 {
			h.observe(ln(levelError, "errors", fmt.Sprint("pending ", i), clk.Now()))
		}
	}
	h.stop(time.Minute)
	byMessage := messages(api)
	if byMessage["plugin/health: backing off"] != 1 {
		t.Errorf("the warning in backoff was not flushed: %v", byMessage)
	}
	for i := range 5 {
		n, ok := byMessage[fmt.Sprint("plugin/errors: pending ", i)]
		switch {
		case i < 3 && n != int32(i+1):
			t.Errorf("count of pending %d is %d, want %d", i, n, i+1)
		case i >= 3 && ok:
			t.Errorf("pending %d was written, want the 3 least recently seen only: %v", i, byMessage)
		}
	}
	d := checkLedger(t, api, before, 16)
	if d.pending != 0 || d.dropped[dropShutdown] != 4+5 {
		t.Errorf("after stop: pending %v, dropped{shutdown} %v, want 0 and 9", d.pending, d.dropped[dropShutdown])
	}
}

// TestFlushWaitsForRefillsBeforeDeadline: an event that finds its bucket
// empty at shutdown is written with a refill that comes before the
// deadline, and dropped when none does.
func TestFlushWaitsForRefillsBeforeDeadline(t *testing.T) {
	for _, tt := range []struct {
		flush   time.Duration
		written int
	}{{500 * time.Millisecond, 1}, {2500 * time.Millisecond, 3}} {
		h, api, clk := newTestHarness(t, testConfig(all, 1, 1, 64))
		before := readLedger()
		for i := range 3 {
			h.observe(ln(levelError, "errors", fmt.Sprint("line ", i), clk.Now()))
		}
		h.stop(tt.flush)
		if n := len(api.list()); n != tt.written {
			t.Errorf("flush of %v at 1 QPS: %d events, want %d", tt.flush, n, tt.written)
		}
		if d := checkLedger(t, api, before, 3); d.dropped[dropShutdown] != float64(3-tt.written) {
			t.Errorf("flush of %v: dropped{shutdown} %v, want %d", tt.flush, d.dropped[dropShutdown], 3-tt.written)
		}
	}
}

// TestFlushTakesTokensInOrder: in the flush, as in service, events take
// tokens in order: settling first, then the one that began to wait first.
// Two tokens are left at stop: the settling event and B, waiting since
// before D, are written; D is dropped.
func TestFlushTakesTokensInOrder(t *testing.T) {
	h, api, clk := newTestHarness(t, testConfig(all, 1.0/3600, 3, 3))
	before := readLedger()
	api.setFault(firstFaults(1, fault{lost: true})) // A's create reaches the API and gets no answer
	h.observe(ln(levelError, "errors", "upstream A down", clk.Now()))
	drain(h)
	down := true // the API server is away: nothing more reaches it, at no cost in tokens
	apiDown(api, &down)
	h.observe(ln(levelError, "errors", "upstream A down", clk.Now()))
	h.observe(ln(levelError, "errors", "upstream B down", clk.Now()))
	h.s.corr.cache.evictOne() // A, unsettled: it keeps its unit of CACHESIZE
	h.observe(ln(levelError, "errors", "upstream C down", clk.Now()))
	drain(h)
	if len(h.s.settling) != 1 {
		t.Fatalf("%d settling, want A", len(h.s.settling))
	}
	h.observe(ln(levelError, "errors", "upstream B down", clk.Now()))
	h.observe(ln(levelError, "errors", "upstream D down", clk.Now())) // evicts C
	h.observe(ln(levelError, "errors", "upstream B down", clk.Now())) // B is the most recently seen
	drain(h)
	down = false
	h.stop(time.Second)
	got := messages(api)
	if got["plugin/errors: upstream A down"] != 2 || got["plugin/errors: upstream B down"] != 3 || len(got) != 2 {
		t.Errorf("events %v after a flush with 2 tokens, want A (settling) and B (waiting before D)", got)
	}
	if d := checkLedger(t, api, before, 7); d.dropped[dropShutdown] != 1 || d.dropped[dropEvicted] != 1 {
		t.Errorf("dropped %v, want D's line as shutdown and C's as evicted", d.dropped)
	}
}

// TestFlushRecreatesGoneEventInTurn: an event whose patch is answered 404
// (it expired) is created anew with the next token, before an event that
// began to wait after it takes one: the bucket's last token waits for the
// patch, whether its answer comes at once or late, and whether one token
// or two are left.
func TestFlushRecreatesGoneEventInTurn(t *testing.T) {
	for _, tt := range []struct {
		burst int
		held  time.Duration
	}{{1, 0}, {2, 0}, {1, 1500 * time.Millisecond}, {2, 1500 * time.Millisecond}} {
		t.Run(fmt.Sprintf("burst %d, answer after %v", tt.burst, tt.held), func(t *testing.T) {
			h, api, clk := newTestHarness(t, testConfig(all, 1, tt.burst, 64))
			h.observe(ln(levelError, "errors", "upstream X down", clk.Now()))
			drain(h)
			api.expire() // X's event is gone; Y's is created after
			h.observe(ln(levelError, "errors", "upstream Y down", clk.Now()))
			h.advance(10 * time.Second) // Y is written, and the bucket is full again
			h.hold = func(r request) time.Duration {
				if r.verb == verbPatch {
					return tt.held
				}
				return 0
			}
			h.observe(ln(levelError, "errors", "upstream X down", clk.Now()))
			h.observe(ln(levelError, "errors", "upstream Y down", clk.Now()))
			h.stop(4 * time.Second)
			got := messages(api)
			if got["plugin/errors: upstream X down"] != 2 || got["plugin/errors: upstream Y down"] != 2 {
				t.Errorf("events %v after the flush, want X and Y with 2 lines each", got)
			}
			var order []string
			for _, r := range eventRequests(api)[2:] {
				order = append(order, fmt.Sprintf("%s at +%v", r.verb, r.at.Sub(epoch)))
			}
			if len(order) != 3 || !strings.HasPrefix(order[0], "patch") || !strings.HasPrefix(order[1], "create") || !strings.HasPrefix(order[2], "patch") {
				t.Errorf("requests in the flush %v, want X's patch, X's create anew, then Y's patch", order)
			}
		})
	}
}

// TestFlushHungCreateHoldsOnlyItsEvent: "A write already in flight then
// (one that hangs, say) holds up only its own event": with `rate 100 1`
// and a 2 s flush, a second event of the reason is sent once the bucket
// refills, while the first one's create hangs; the first is dropped with
// cause shutdown when the flush ends.
func TestFlushHungCreateHoldsOnlyItsEvent(t *testing.T) {
	h, api, clk := newTestHarness(t, testConfig(all, 100, 1, 64))
	h.lostAfter = writeTimeout // longer than the flush
	before := readLedger()
	api.setFault(firstFaults(1, fault{lost: true}))
	h.observe(ln(levelError, "errors", "upstream A down", clk.Now()))
	h.observe(ln(levelError, "errors", "upstream B down", clk.Now()))
	h.stop(2 * time.Second)
	got := messages(api)
	if got["plugin/errors: upstream B down"] != 1 || len(got) != 1 {
		t.Errorf("events %v, want B's written while A's create hung", got)
	}
	reqs := eventRequests(api)
	if len(reqs) != 2 || reqs[1].at.Sub(reqs[0].at) > 20*time.Millisecond {
		t.Errorf("requests %+v: want B's create within a refill (10ms) of A's", reqs)
	}
	if d := checkLedger(t, api, before, 2); d.dropped[dropShutdown] != 1 {
		t.Errorf("dropped %v, want A's line as shutdown", d.dropped)
	}
}

// TestFlushHungWritesStallNoOtherBucket: requests that hang, in flight at
// stop or made by the flush, hold up only their own events: a warning,
// its bucket full, is written while the errors' creates hang.
func TestFlushHungWritesStallNoOtherBucket(t *testing.T) {
	for _, inFlightAtStop := range []bool{true, false} {
		t.Run(fmt.Sprint("in flight at stop ", inFlightAtStop), func(t *testing.T) {
			h, api, clk := newTestHarness(t, testConfig(all, 1.0/300, 2, 64))
			h.lostAfter = writeTimeout
			before := readLedger()
			api.setFault(firstFaults(2, fault{lost: true}))
			h.observe(ln(levelError, "errors", "upstream A down", clk.Now()))
			h.observe(ln(levelError, "errors", "upstream B down", clk.Now()))
			if inFlightAtStop {
				drain(h) // both errors' creates hang, with the bucket's two tokens
				h.observe(ln(levelError, "errors", "upstream C down", clk.Now()))
				h.observe(ln(levelError, "errors", "upstream D down", clk.Now()))
			}
			h.observe(ln(levelWarning, "health", "slow answers", clk.Now()))
			h.stop(2 * time.Second)
			if n := len(ofReason(events(t, api), "CoreDNSWarning")); n != 1 {
				t.Errorf("%d warning events, want the warning written while the errors' creates hung", n)
			}
			lines := 3.0
			if inFlightAtStop {
				lines = 5
			}
			if d := checkLedger(t, api, before, lines); d.dropped[dropShutdown] != lines-1 {
				t.Errorf("dropped %v, want every error line as shutdown", d.dropped)
			}
		})
	}
}

// TestFlushWaitsForTokenOfWriteInHand: a request in flight at stop that
// never reaches the server gives its token back, and an event that waits
// for one in the flush is written with it. While it waits, it is not
// tried again and again.
func TestFlushWaitsForTokenOfWriteInHand(t *testing.T) {
	h, api, clk := newTestHarness(t, testConfig(all, 1.0/300, 1, 1))
	before := readLedger()
	h.observe(ln(levelError, "errors", "upstream X down", clk.Now()))
	x := sendNow(h) // X's create is in flight with the bucket's one token
	if len(x) != 1 {
		t.Fatalf("%d requests, want X's create", len(x))
	}
	h.observe(ln(levelError, "errors", "upstream Y down", clk.Now())) // evicts X, in flight
	h.s.stop(clk.Now(), 5*time.Second)
	throttledBefore := testutil.ToFloat64(throttled[levelError])
	for range 3 { // Y waits for the token X holds
		if reqs := sendNow(h); len(reqs) != 0 {
			t.Fatalf("%d requests sent while the only token is out", len(reqs))
		}
	}
	if n := testutil.ToFloat64(throttled[levelError]) - throttledBefore; n > 1 {
		t.Errorf("Y counted throttled %v times while it waited, want once", n)
	}
	answer(h, x[0], fault{unsent: true}) // X's create never reached the server: its token is back
	h.stop(5 * time.Second)
	if got := messages(api); got["plugin/errors: upstream Y down"] != 1 || len(got) != 1 {
		t.Errorf("events %v after X's create handed its token back in the flush, want Y's", got)
	}
	if d := checkLedger(t, api, before, 2); d.dropped[dropEvicted] != 1 {
		t.Errorf("dropped %v, want X's line as evicted", d.dropped)
	}
}

// TestHandedBackTokenGoesToAnEventThatUsesIt: a token given back by a
// request that never reached the server goes to an event that can be
// sent now, not to one that waits out a Retry-After.
func TestHandedBackTokenGoesToAnEventThatUsesIt(t *testing.T) {
	h, api, clk := newTestHarness(t, testConfig(all, 1.0/300, 2, 64))
	h.observe(ln(levelError, "errors", "upstream X down", clk.Now()))
	h.observe(ln(levelError, "errors", "upstream Y down", clk.Now()))
	xy := sendNow(h) // both tokens out
	if len(xy) != 2 {
		t.Fatalf("%d requests, want X's and Y's creates", len(xy))
	}
	h.observe(ln(levelError, "errors", "upstream A down", clk.Now()))
	if reqs := sendNow(h); len(reqs) != 0 {
		t.Fatalf("A sent with no token")
	}
	answer(h, xy[1], fault{}) // Y reached the server
	clk.Step(300 * time.Second)
	api.setFault(func(apiRequest) fault { return fault{code: http.StatusServiceUnavailable, retryAfter: 600} })
	drain(h) // A, with the refill: 503, Retry-After 600 s (a 429 would hold B too)
	api.setFault(nil)
	h.observe(ln(levelError, "errors", "upstream B down", clk.Now()))
	if reqs := sendNow(h); len(reqs) != 0 {
		t.Fatalf("B sent with no token")
	}
	answer(h, xy[0], fault{unsent: true}) // X never reached the server: its token is back
	drain(h)
	if got := messages(api); got["plugin/errors: upstream B down"] != 1 {
		t.Errorf("events %v: X's token came back, B can be sent, A waits for its Retry-After: want B written", got)
	}
}

// TestFlushTakesEvictedWriteInHandOnceBack: an evicted event whose write
// was in flight at stop and came back unanswered settles: the flush writes
// it once more, under the same name.
func TestFlushTakesEvictedWriteInHandOnceBack(t *testing.T) {
	h, api, clk := newTestHarness(t, testConfig(all, 100, 100, 2))
	before := readLedger()
	h.observe(ln(levelError, "errors", "upstream A down", clk.Now()))
	h.observe(ln(levelWarning, "health", "slow answers", clk.Now()))
	inHand := sendNow(h) // A's and C's creates
	if len(inHand) != 2 {
		t.Fatalf("%d requests, want 2", len(inHand))
	}
	h.observe(ln(levelError, "errors", "upstream B down", clk.Now())) // evicts A
	h.s.stop(clk.Now(), 2*time.Second)
	drain(h) // the flush writes B
	if n := len(api.list()); n != 1 {
		t.Fatalf("%d events, want B's", n)
	}
	var a, c request
	for _, r := range inHand {
		if r.event.Reason == "CoreDNSError" {
			a = r
		} else {
			c = r
		}
	}
	answer(h, a, fault{lost: true}) // A's create: no answer
	if len(h.s.settling) != 1 {
		t.Errorf("%d settling, want A", len(h.s.settling))
	}
	drain(h)
	answer(h, c, fault{})
	h.stop(2 * time.Second)
	if got := messages(api); got["plugin/errors: upstream A down"] != 1 || len(got) != 3 {
		t.Errorf("events %v: the flush never took the evicted event whose write came back unanswered", got)
	}
	checkLedger(t, api, before, 3)
}

// TestFlushCreatesWaitForNoPodRead: at shutdown creates no longer wait
// for the pod's UID: with a read of the pod in flight and hung, an error
// and a warning are written without it.
func TestFlushCreatesWaitForNoPodRead(t *testing.T) {
	clk := clocktesting.NewFakeClock(epoch)
	api := newFakeAPI(t, clk)
	h := newHarnessOn(t, testConfig(all, 100, 100, 64), api, clk, testPodWithoutUID())
	h.lostAfter = writeTimeout
	before := readLedger()
	api.setFault(func(r apiRequest) fault { return fault{lost: r.resource == "pods"} })
	h.observe(ln(levelError, "errors", "upstream down", clk.Now()))
	drain(h) // the read of the pod goes out, and hangs
	h.observe(ln(levelWarning, "health", "slow answers", clk.Now()))
	h.stop(2 * time.Second)
	evs := events(t, api)
	if len(evs) != 2 {
		t.Fatalf("%d events, want the error and the warning written while the read hung", len(evs))
	}
	for _, ev := range evs {
		if ev.InvolvedObject.UID != "" {
			t.Errorf("event with UID %q, want none", ev.InvolvedObject.UID)
		}
	}
	checkLedger(t, api, before, 2)
}

// TestFlushHonoursRetryAfter: a Retry-After is honoured in the flush: the
// write is tried again no sooner than it asks, and when it asks for
// longer than the flush has left, the event is not tried again and its
// lines are dropped with cause shutdown; so too for a write in flight at
// stop.
func TestFlushHonoursRetryAfter(t *testing.T) {
	t.Run("within the flush", func(t *testing.T) {
		h, api, clk := newTestHarness(t, testConfig(all, 100, 100, 64))
		api.setFault(firstFaults(1, fault{code: http.StatusTooManyRequests, retryAfter: 1}))
		h.observe(ln(levelError, "errors", "upstream down", clk.Now()))
		h.stop(3 * time.Second)
		reqs := eventRequests(api)
		if len(reqs) != 2 || reqs[1].at.Sub(reqs[0].at) < time.Second {
			t.Errorf("requests %+v: want a retry a second after the 429", reqs)
		}
		if n := len(api.list()); n != 1 {
			t.Errorf("%d events, want 1", n)
		}
	})
	t.Run("beyond the deadline", func(t *testing.T) {
		h, api, clk := newTestHarness(t, testConfig(all, 100, 100, 64))
		before := readLedger()
		api.setFault(func(apiRequest) fault { return fault{code: http.StatusTooManyRequests, retryAfter: 60} })
		h.observe(ln(levelError, "errors", "upstream down", clk.Now()))
		h.stop(2 * time.Second)
		if creates, _ := api.writes(); creates != 1 {
			t.Errorf("%d creates, want 1: the Retry-After is beyond the flush", creates)
		}
		if d := checkLedger(t, api, before, 1); d.dropped[dropShutdown] != 1 {
			t.Errorf("dropped %v, want the line as shutdown", d.dropped)
		}
	})
	t.Run("write in flight at stop", func(t *testing.T) {
		h, api, clk := newTestHarness(t, testConfig(all, 100, 100, 64))
		before := readLedger()
		h.observe(ln(levelError, "errors", "upstream down", clk.Now()))
		inHand := sendNow(h)
		h.s.stop(clk.Now(), 2*time.Second)
		answer(h, inHand[0], fault{code: http.StatusTooManyRequests, retryAfter: 60})
		h.stop(2 * time.Second)
		if creates, _ := api.writes(); creates != 1 || len(api.list()) != 0 {
			t.Errorf("%d creates, %d events: the write in hand was asked to wait 60 s, the flush had 2 s", creates, len(api.list()))
		}
		if d := checkLedger(t, api, before, 1); d.dropped[dropShutdown] != 1 {
			t.Errorf("dropped %v, want the line as shutdown", d.dropped)
		}
	})
}

// TestFlushPausesBetweenTries: in the flush, failed writes are tried again
// every flushPause: an API server that answers 503, with no Retry-After,
// for the whole of a 1 s flush gets a try every 200 ms, not a stream.
func TestFlushPausesBetweenTries(t *testing.T) {
	h, api, clk := newTestHarness(t, testConfig(all, 100, 100, 64))
	api.setFault(func(apiRequest) fault { return fault{code: http.StatusServiceUnavailable} })
	h.observe(ln(levelError, "errors", "upstream down", clk.Now()))
	h.stop(time.Second)
	reqs := eventRequests(api)
	if len(reqs) < 5 || len(reqs) > 6 {
		t.Errorf("%d creates in a 1 s flush answered 503, want one every 200 ms", len(reqs))
	}
	for i := 1; i < len(reqs); i++ {
		if d := reqs[i].at.Sub(reqs[i-1].at); d < flushPause {
			t.Errorf("try %d came %v after the one before, want at least %v", i, d, flushPause)
		}
	}
}

// TestFlushSaysWhyWritesFail: a refusal met during the flush at shutdown
// is said, as during the run.
func TestFlushSaysWhyWritesFail(t *testing.T) {
	h, api, clk := newTestHarness(t, testConfig(all, 100, 100, 64))
	var said rejectionLog
	h.s.report = func(now time.Time, err error) {
		if f := said.report(now, err, h.s.pod.namespace()); f != nil {
			f()
		}
	}
	logged := captureLog(t)
	api.setFault(func(apiRequest) fault { return fault{code: http.StatusForbidden} })
	h.observe(ln(levelError, "errors", "refused at shutdown", clk.Now()))
	h.stop(time.Second)
	if !strings.Contains(logged.String(), "grant create and patch on events") {
		t.Errorf("the flush did not say why its write failed:\n%s", logged.String())
	}
}

// TestStopIsBounded: with an API that never answers, stop returns when
// the flush's time is up (real time), and drops what is pending.
func TestStopIsBounded(t *testing.T) {
	p, api, _ := newTestPipeline(t, testConfig(all, 10, 10, 64))
	before := readLedger()
	api.setFault(func(apiRequest) fault { return fault{hang: true} })
	p.start()
	for i := range 20 {
		p.listener.Errorf("plugin/errors: ", "line %d", i)
	}
	start := time.Now()
	p.stop(300 * time.Millisecond)
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("stop took %v with a flush time of 300ms", took)
	}
	d := readLedger().since(before)
	if d.pending != 0 || d.dropped[dropShutdown] != 20 {
		t.Errorf("pending %v dropped{shutdown} %v, want 0 and 20", d.pending, d.dropped[dropShutdown])
	}
}

// TestStopHungCreateHoldsOnlyItsEvent is TestFlushHungCreateHoldsOnlyItsEvent
// as CoreDNS runs it, in real time: a second event of the reason is
// written while the first one's create hangs, and stop returns with the
// flush's time.
func TestStopHungCreateHoldsOnlyItsEvent(t *testing.T) {
	clk := clock.RealClock{}
	api := newFakeAPI(t, clk)
	p := newPipeline(testConfig(all, 100, 1, 64), api.client, testPod(), clk)
	t.Cleanup(p.cancel)
	before := readLedger()
	api.setFault(firstFaults(1, fault{hang: true}))
	p.start()
	p.listener.Errorf("plugin/errors: ", "upstream A down")
	deadline := time.Now().Add(10 * time.Second)
	for len(eventRequests(api)) == 0 { // A's create reached the API, and hangs
		if time.Now().After(deadline) {
			t.Fatal("A's create never reached the API")
		}
		time.Sleep(time.Millisecond)
	}
	p.listener.Errorf("plugin/errors: ", "upstream B down")
	start := time.Now()
	p.stop(time.Second)
	if took := time.Since(start); took > 3*time.Second {
		t.Errorf("stop took %v with a flush time of 1s", took)
	}
	if got := messages(api); got["plugin/errors: upstream B down"] != 1 || len(got) != 1 {
		t.Errorf("events %v, want B's written while A's create hung", got)
	}
	if d := checkLedger(t, api, before, 0); d.dropped[dropShutdown] != 1 {
		t.Errorf("dropped %v, want A's line as shutdown", d.dropped)
	}
}

func TestFatalIsWrittenBeforeReturning(t *testing.T) {
	p, api, _ := newTestPipeline(t, testConfig(levelSet(1<<levelFatal), 1, 25, 64))
	p.start()
	t.Cleanup(func() { p.stop(time.Second) })
	before := readLedger()
	writes := eventWrites.WithLabelValues(levelFatal.reason(), "create")
	writesBefore := testutil.ToFloat64(writes)
	p.listener.Fatalf("plugin/reload: ", "cannot %s", "go on")
	ev := only(t, events(t, api))
	if ev.Reason != "CoreDNSFatal" || ev.Type != "Warning" || ev.Message != "plugin/reload: cannot go on" || ev.Count != 1 {
		t.Errorf("fatal event %+v", ev)
	}
	checkLedger(t, api, before, 0)
	// The scheduler books the answer once the line is out: soon after.
	deadline := time.Now().Add(10 * time.Second)
	for testutil.ToFloat64(writes)-writesBefore != 1 {
		if time.Now().After(deadline) {
			t.Fatalf(`writes_total{reason="CoreDNSFatal",verb="create"} rose by %v, want 1`, testutil.ToFloat64(writes)-writesBefore)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestFatalWaitsForNoLookup: with no UID from the downward API and an API
// that never answers a pod read, the fatal line goes at once, without the
// UID: it never waits on the read in flight.
func TestFatalWaitsForNoLookup(t *testing.T) {
	clk := clocktesting.NewFakeClock(epoch)
	api := newFakeAPI(t, clk)
	p := newPipeline(testConfig(all, 1, 25, 64), api.client, testPodWithoutUID(), clk)
	t.Cleanup(p.cancel)
	api.setFault(func(r apiRequest) fault { return fault{hang: r.resource == "pods"} })
	p.start()
	t.Cleanup(func() { p.stop(100 * time.Millisecond) })
	p.listener.Errorf("plugin/errors: ", "the UID is read first")
	deadline := time.Now().Add(10 * time.Second)
	for testutil.ToFloat64(requestsInFlight) == 0 { // the read hangs
		if time.Now().After(deadline) {
			t.Fatal("the pod is never read")
		}
		time.Sleep(time.Millisecond)
	}
	start := time.Now()
	p.listener.Fatal("plugin/errors: ", "bye")
	if took := time.Since(start); took > time.Second {
		t.Errorf("the fatal line took %v", took)
	}
	if evs := ofReason(events(t, api), "CoreDNSFatal"); len(evs) != 1 || evs[0].InvolvedObject.UID != "" {
		t.Errorf("fatal events %+v, want one without the UID", evs)
	}
}

// TestFatalGivesUp: with every writer hung, a fatal line goes out at once
// and is given up within the fatal time, dropped with cause failed; one
// that finds its bucket empty is dropped with cause throttled. Neither is
// left pending.
func TestFatalGivesUp(t *testing.T) {
	p, api, _ := newTestPipeline(t, testConfig(all, 1.0/300, 1, 64))
	p.fatalTimeout = 200 * time.Millisecond
	api.setFault(func(apiRequest) fault { return fault{hang: true} })
	p.start()
	t.Cleanup(func() { p.stop(100 * time.Millisecond) })
	before := readLedger()
	for i := range 20 { // the writers hang
		p.listener.Errorf("plugin/errors: ", "line %d", i)
	}
	deadline := time.Now().Add(10 * time.Second)
	for readLedger().since(before).pending != 20 { // the lines are taken
		if time.Now().After(deadline) {
			t.Fatal("the lines are never taken")
		}
		time.Sleep(time.Millisecond)
	}
	start := time.Now()
	p.listener.Fatal("plugin/errors: ", "first")
	if took := time.Since(start); took > time.Second {
		t.Errorf("a fatal line to a silent API took %v, fatal time 200ms", took)
	}
	p.listener.Fatal("plugin/errors: ", "second") // the token went with the first
	d := readLedger().since(before)
	if d.dropped[dropFailed] != 1 || d.dropped[dropThrottled] != 1 || d.dropped[dropShutdown] != 0 || d.pending != 20 {
		t.Errorf("dropped %v pending %v, want one failed and one throttled, and only the 20 error lines pending", d.dropped, d.pending)
	}
}

// TestRunWritesWhatIsLogged: the pipeline as CoreDNS runs it: lines logged
// through the listener are written by run's writers, repeats as one event
// with their count; a reload takes new levels and rate without losing
// what is pending; stop writes the rest, and the ledger holds.
func TestRunWritesWhatIsLogged(t *testing.T) {
	p, api, _ := newTestPipeline(t, testConfig(levelsOf(levelError), 100, 100, 64))
	before := readLedger()
	p.start()
	for range 3 {
		p.listener.Errorf("plugin/errors: ", "upstream %s down", "A")
	}
	p.listener.Errorf("plugin/errors: ", "upstream B down")
	p.listener.Infof("plugin/errors: ", "not enabled")
	deadline := time.Now().Add(10 * time.Second)
	for got := messages(api); got["plugin/errors: upstream A down"] != 3 || got["plugin/errors: upstream B down"] != 1; got = messages(api) {
		if time.Now().After(deadline) {
			t.Fatalf("events %v, want A with 3 lines and B", got)
		}
		time.Sleep(time.Millisecond)
	}
	p.apply(testConfig(levelsOf(levelError, levelInfo), 100, 100, 64), api.client)
	p.listener.Infof("plugin/errors: ", "enabled now")
	p.stop(time.Second)
	if got := messages(api); got["plugin/errors: enabled now"] != 1 || len(got) != 3 {
		t.Errorf("events %v after stop, want the info line logged after the reload too", got)
	}
	if d := checkLedger(t, api, before, 0); d.pending != 0 || d.droppedAll() != 0 {
		t.Errorf("pending %v, dropped %v, want none", d.pending, d.dropped)
	}
}

// reachedOf counts the requests for events of reason that reached the
// server: with every request hanging, those still out.
func (api *fakeAPI) reachedOf(reason string) int {
	api.mu.Lock()
	defer api.mu.Unlock()
	n := 0
	for _, r := range api.requests {
		if r.reason == reason {
			n++
		}
	}
	return n
}

// Requests in flight per bucket are capped at maxInFlight, whatever BURST
// is: fatal lines logged at once from many goroutines, against an API
// server that answers nothing, must not have more than maxInFlight
// requests of the fatal bucket out at once.
func TestFatalRequestsInFlightAreCapped(t *testing.T) {
	const n = 3 * maxInFlight
	p, api, _ := newTestPipeline(t, testConfig(all, 1, n, 64))
	p.fatalTimeout = time.Second
	api.setFault(func(apiRequest) fault { return fault{hang: true} })
	p.start()
	defer p.stop(time.Second)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.listener.Fatalf("plugin/reload: ", "cannot go on %d", i)
		}()
	}
	// Every fatal line's create is out, hanging, until fatalTimeout.
	deadline := time.Now().Add(800 * time.Millisecond)
	peak := 0
	for time.Now().Before(deadline) {
		peak = max(peak, api.reachedOf(levelFatal.reason()))
		time.Sleep(5 * time.Millisecond)
	}
	wg.Wait()
	if peak > maxInFlight {
		t.Errorf("%d requests of the fatal bucket out at once against a silent API server, want at most maxInFlight = %d", peak, maxInFlight)
	}
}

// countingClock is the real clock, counting the timers armed on it.
type countingClock struct {
	clock.RealClock
	timers atomic.Int64
}

func (c *countingClock) NewTimer(d time.Duration) clock.Timer {
	c.timers.Add(1)
	return c.RealClock.NewTimer(d)
}

// The scheduler's goroutine sleeps while an event waits for a token: at
// the slowest rate the Corefile accepts, an event that found its bucket
// empty arms a timer for when a token comes, not one that fires at once,
// again and again, with the goroutine spinning.
func TestGoroutineSleepsWhileEventWaitsAtSlowRate(t *testing.T) {
	clk := &countingClock{}
	api := newFakeAPI(t, clk)
	p := newPipeline(testConfig(all, 1e-12, 1, 64), api.client, testPod(), clk)
	t.Cleanup(p.cancel)
	p.start()
	defer p.stop(100 * time.Millisecond)
	p.listener.Errorf("plugin/errors: ", "first")
	p.listener.Errorf("plugin/errors: ", "second, waits for a token")
	time.Sleep(200 * time.Millisecond)
	if n := clk.timers.Load(); n > 10 {
		t.Errorf("%d timers armed in 200 ms while one event waits for a token at QPS 1e-12: the goroutine spins", n)
	}
}

// The scheduler's goroutine serves its other messages while lines keep
// coming: with senders always waiting on a full hand-off, a reload still
// takes effect, and the fatal line that follows is written within
// fatalTimeout. run takes at most a queue's worth of lines before it looks
// at its other messages.
func TestMessagesAreServedWhileLinesNeverStop(t *testing.T) {
	p, api, clk := newTestPipeline(t, testConfig(all, 1, 25, 64))
	p.fatalTimeout = 2 * time.Second
	p.start()
	flooding := make(chan struct{})
	var wg sync.WaitGroup
	ln := line{level: levelError, plugin: "plugin/errors: ", text: "plugin/errors: upstream down", at: clk.Now()}
	for range 32 { // blocked senders refill the hand-off as each line is taken
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case p.listener.lines <- ln:
				case <-flooding:
					return
				}
			}
		}()
	}
	defer func() {
		close(flooding)
		wg.Wait()
		p.stop(time.Second)
	}()
	for len(p.listener.lines) < queueSize {
		time.Sleep(time.Millisecond)
	}
	applied := make(chan struct{})
	go func() {
		p.apply(testConfig(all, 1, 25, 64), api.client)
		p.listener.Fatalf("plugin/reload: ", "cannot go on")
		close(applied)
	}()
	select {
	case <-applied:
	case <-time.After(10 * time.Second):
		t.Fatal("a reload and a fatal line waited 10 s for the scheduler, busy taking lines")
	}
	if _, ok := messages(api)["plugin/reload: cannot go on"]; !ok {
		t.Error("the fatal line logged while lines never stopped was not written")
	}
}

// stuckWriter is a stderr whose reader has stalled: a write blocks until
// release is closed.
type stuckWriter struct {
	entered chan struct{}
	release chan struct{}
	once    sync.Once
}

func (w *stuckWriter) Write(b []byte) (int, error) {
	w.once.Do(func() { close(w.entered) })
	<-w.release
	return len(b), nil
}

// The scheduler's goroutine never waits on stderr: with the log's reader
// stalled in the middle of saying why a write was refused, a fatal line
// logged next is still written within fatalTimeout.
func TestRunNeverWaitsOnTheLog(t *testing.T) {
	w := &stuckWriter{entered: make(chan struct{}), release: make(chan struct{})}
	log.SetOutput(w)
	p, api, _ := newTestPipeline(t, testConfig(all, 100, 100, 64))
	p.fatalTimeout = time.Second
	api.setFault(firstFaults(1, fault{code: http.StatusForbidden})) // the error line's create
	p.start()
	t.Cleanup(func() {
		close(w.release)
		log.SetOutput(io.Discard)
		p.stop(time.Second)
	})
	before := readLedger()
	p.listener.Errorf("plugin/errors: ", "upstream down") // refused: run says why
	select {
	case <-w.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the refusal was never said")
	}
	p.listener.Fatalf("plugin/reload: ", "cannot go on")
	if evs := ofReason(events(t, api), "CoreDNSFatal"); len(evs) != 1 {
		t.Errorf("fatal line not written while stderr is stalled (dropped %v)", readLedger().since(before).dropped)
	}
}

// slowWriter is a stderr that takes delay to write each line.
type slowWriter struct {
	logCapture
	delay time.Duration
}

func (w *slowWriter) Write(b []byte) (int, error) {
	time.Sleep(w.delay)
	return w.logCapture.Write(b)
}

// CoreDNS exits as soon as stop returns: why the flush's writes failed is
// on stderr by then, as long as the flush's time allows, though the
// scheduler's goroutine does not write it itself.
func TestRefusalSaidBeforeStopReturns(t *testing.T) {
	w := &slowWriter{delay: 20 * time.Millisecond}
	log.SetOutput(w)
	t.Cleanup(func() { log.SetOutput(io.Discard) })
	p, api, _ := newTestPipeline(t, testConfig(all, 100, 100, 64))
	api.setFault(func(apiRequest) fault { return fault{code: http.StatusForbidden} })
	p.start()
	p.listener.Errorf("plugin/errors: ", "refused at shutdown")
	p.stop(time.Second)
	if !strings.Contains(w.String(), "grant create and patch on events") {
		t.Errorf("stop returned before the refusal was said; stderr: %q", w.String())
	}
}

// TestBatchPauseIsOnTheInjectedClock: lines that come more often than stormGap are taken in
// batches, batchPause apart on run's clock, not on the real one: with a fake clock, a line that
// comes during the pause waits until the clock moves by batchPause, however long that takes in
// real time; lines further apart than stormGap on that clock are taken with no pause. The
// pause ends at stop, so that the flush takes every line.
func TestBatchPauseIsOnTheInjectedClock(t *testing.T) {
	clk := clocktesting.NewFakeClock(epoch)
	api := newFakeAPI(t, clk)
	p := newPipeline(testConfig(levelsOf(levelError), 100, 100, 64), api.client, testPod(), clk)
	t.Cleanup(p.cancel)
	before := readLedger()
	p.start()
	// taken logs a line and waits until run has taken it: an inspect after it is served after it.
	taken := func(text string) {
		t.Helper()
		p.listener.Errorf("plugin/errors: ", "%s", text)
		deadline := time.Now().Add(10 * time.Second)
		for len(p.listener.lines) > 0 {
			if time.Now().After(deadline) {
				t.Fatalf("%q was never taken", text)
			}
			time.Sleep(time.Millisecond)
		}
		done := make(chan struct{})
		p.post(context.Background(), inspectMsg{look: func(*scheduler) {}, done: done})
		<-done
	}
	taken("first")
	clk.Step(2 * stormGap) // a batch of its own: no pause
	taken("apart")
	taken("close") // within stormGap of the one before on the clock: a pause begins
	p.listener.Errorf("plugin/errors: ", "during the pause")
	time.Sleep(100 * time.Millisecond) // a hundred pauses of real time
	if n := len(p.listener.lines); n != 1 {
		t.Fatalf("%d lines queued, want the one logged during the pause, still waiting", n)
	}
	clk.Step(batchPause)
	deadline := time.Now().Add(10 * time.Second)
	for len(p.listener.lines) > 0 {
		if time.Now().After(deadline) {
			t.Fatal("the pause did not end when the clock moved by batchPause")
		}
		time.Sleep(time.Millisecond)
	}
	taken("close again") // a pause again, which stop ends
	p.listener.Errorf("plugin/errors: ", "at stop")
	p.stop(time.Second)
	if d := checkLedger(t, api, before, 0); d.pending != 0 || d.droppedAll() != 0 {
		t.Errorf("pending %v, dropped %v: want every line written by the flush", d.pending, d.dropped)
	}
}
