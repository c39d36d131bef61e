package k8s_event

import (
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
)

// endsIn counts the end events the API holds.

// A storm whose lines are all written and which had no new line for quiet
// gets its end. A reload that turns quiet off and, before the storm's
// quiet is up, on again, leaves the storm a storm: its end is said once
// quiet has passed.
func TestStormEndsAfterQuietTurnedOffAndOnAgain(t *testing.T) {
	cfg := testConfig(all, 100, 100, 64)
	cfg.quiet = time.Minute
	h, api, clk := newTestHarness(t, cfg)
	for range 20 {
		h.observe(ln(levelError, "errors", "upstream timed out", clk.Now()))
	}
	drain(h)
	if c := countsIn(api); c != 20 {
		t.Fatalf("%v lines written, want 20", c)
	}
	h.advance(10 * time.Second)
	off := cfg
	off.quiet = 0
	h.apply(off)
	h.advance(time.Second)
	h.apply(cfg)
	h.advance(3 * time.Minute)
	if n := len(endsIn(api)); n != 1 {
		t.Errorf("%d ends of a storm quiet for 3 min with quiet back at 1 min, want 1", n)
	}
}

// podReads counts the reads of the pod that reached the server.
func podReadsOf(api *fakeAPI) int {
	api.mu.Lock()
	defer api.mu.Unlock()
	n := 0
	for _, r := range api.requests {
		if r.resource == "pods" {
			n++
		}
	}
	return n
}

// A Retry-After is honoured in the flush too, one answered to a read of
// the pod included: after the API server answered the read 429 asking for
// 30 s, a flush of 2 s sends it nothing more, and the line is dropped at
// the end with cause shutdown.
func TestFlushHonoursRetryAfterAnsweredToPodRead(t *testing.T) {
	clk := clocktesting.NewFakeClock(epoch)
	api := newFakeAPI(t, clk)
	h := newHarnessOn(t, testConfig(all, 100, 100, 64), api, clk, testPodWithoutUID())
	api.setFault(func(r apiRequest) fault {
		if r.resource == "pods" {
			return fault{code: http.StatusTooManyRequests, retryAfter: 30}
		}
		return fault{}
	})
	before := readLedger()
	h.observe(ln(levelError, "errors", "busy", clk.Now()))
	drain(h)
	if n := podReadsOf(api); n != 1 {
		t.Fatalf("%d pod reads, want 1", n)
	}
	h.advance(time.Second) // 29 s of the Retry-After are left
	h.stop(2 * time.Second)
	if c, p := api.writes(); c+p != 0 || podReadsOf(api) != 1 {
		t.Errorf("the flush sent %d creates, %d patches, %d more pod reads within a Retry-After of 30 s answered 1 s before", c, p, podReadsOf(api)-1)
	}
	d := checkLedger(t, api, before, 1)
	if d.dropped[dropShutdown] != 1 {
		t.Errorf("dropped %v, want 1 at shutdown", d.dropped)
	}
}

// A create that got no answer is retried under the same name, and
// "already exists" then means it was applied: its lines are in the API's
// count, settled, and no shutdown afterwards drops them. Here the
// patches after it never reach the server, and the sum must stay exact.
func TestCreateFoundAppliedByItsRetryIsSettled(t *testing.T) {
	h, api, clk := newTestHarness(t, testConfig(all, 100, 100, 64))
	var creates atomic.Int32
	api.setFault(func(r apiRequest) fault {
		switch {
		case r.verb == "create" && creates.Add(1) == 1:
			return fault{lost: true, apply: true} // applied, its answer lost
		case r.verb == "patch":
			return fault{unsent: true}
		}
		return fault{}
	})
	before := readLedger()
	h.observe(ln(levelError, "errors", "once", clk.Now()))
	drain(h)
	h.advance(2 * time.Second) // the retry finds it applied
	if n := creates.Load(); n != 2 {
		t.Fatalf("%d creates, want 2", n)
	}
	if c := countsIn(api); c != 1 {
		t.Fatalf("count %v in the API, want 1", c)
	}
	h.stop(time.Second)
	d := checkLedger(t, api, before, 1)
	if d.dropped[dropShutdown] != 0 {
		t.Errorf("dropped %v: the line in the count of the applied create was dropped at shutdown", d.dropped)
	}
}
