package k8s_event

import (
	"fmt"
	"math"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	clocktesting "k8s.io/utils/clock/testing"
)

func errorKey(msg string) eventKey {
	return eventKey{level: levelError, plugin: "plugin/errors: ", message: "plugin/errors: " + msg}
}

// firstOnly returns a fault function that gives f to the first request
// and none to the others.
func firstOnly(f fault) func(apiRequest) fault {
	var n atomic.Int32
	return func(apiRequest) fault {
		if n.Add(1) == 1 {
			return f
		}
		return fault{}
	}
}

// reachedAt lists the times the event writes of reason reached the API.
func reachedAt(api *fakeAPI, reason string) []time.Time {
	api.mu.Lock()
	defer api.mu.Unlock()
	var out []time.Time
	for _, r := range api.requests {
		if r.resource == "events" && r.reason == reason {
			out = append(out, r.at)
		}
	}
	return out
}

// checkBound checks that requests at the times given stay within burst +
// qps x T over every interval T.
func checkBound(t *testing.T, at []time.Time, qps float64, burst int) {
	t.Helper()
	for i := range at {
		for j := i; j < len(at); j++ {
			span := at[j].Sub(at[i]).Seconds()
			if n := float64(j - i + 1); n > float64(burst)+qps*span+1e-9 {
				t.Fatalf("%v requests reached the API in %.1fs, bound %.2f", n, span, float64(burst)+qps*span)
			}
		}
	}
}

func TestRepeatsAreOneEventWithExactCount(t *testing.T) {
	h, api, clk := newTestHarness(t, testConfig(all, 1, 25, 64))
	before := readLedger()
	for range 50 {
		h.observe(ln(levelError, "errors", "2 example.org. A: i/o timeout", clk.Now()))
	}
	drain(h)
	ev := only(t, events(t, api))
	if ev.Count != 50 {
		t.Errorf("count %d, want 50", ev.Count)
	}
	if ev.Message != "plugin/errors: 2 example.org. A: i/o timeout" {
		t.Errorf("message %q", ev.Message)
	}
	if ev.Reason != "CoreDNSError" || ev.Type != "Warning" || ev.Action != "Logged" {
		t.Errorf("reason %s type %s action %s", ev.Reason, ev.Type, ev.Action)
	}
	if ev.InvolvedObject != testRef || ev.Namespace != "kube-system" {
		t.Errorf("involved object %+v in %s", ev.InvolvedObject, ev.Namespace)
	}
	if ev.Source.Component != "CoreDNS" || ev.Source.Host != testNode || ev.ReportingController != "CoreDNS" || ev.ReportingInstance != "coredns-0" {
		t.Errorf("source %+v reporting %s/%s", ev.Source, ev.ReportingController, ev.ReportingInstance)
	}
	if !ev.FirstTimestamp.Time.Equal(epoch) || !ev.LastTimestamp.Time.Equal(epoch) {
		t.Errorf("timestamps %v %v, want %v", ev.FirstTimestamp, ev.LastTimestamp, epoch)
	}
	if c, pt := api.writes(); c != 1 || pt != 0 {
		t.Errorf("%d creates %d patches, want 1 create", c, pt)
	}

	// Later repeats patch the same event with the running total, the last
	// time and the latest message.
	h.advance(time.Minute)
	for range 3 {
		h.observe(ln(levelError, "errors", "2 example.org. A: i/o timeout", clk.Now()))
	}
	drain(h)
	ev = only(t, events(t, api))
	if ev.Count != 53 || !ev.LastTimestamp.Time.Equal(clk.Now()) || !ev.FirstTimestamp.Time.Equal(epoch) {
		t.Errorf("count %d first %v last %v, want 53 from %v to %v", ev.Count, ev.FirstTimestamp, ev.LastTimestamp, epoch, clk.Now())
	}
	if c, pt := api.writes(); c != 1 || pt != 1 {
		t.Errorf("%d creates %d patches, want 1 and 1", c, pt)
	}
	checkLedger(t, api, before, 53)
}

// TestClockSteppedBack: a wall clock stepped back gives later lines earlier
// times; lastTimestamp never moves back, nor before firstTimestamp.
func TestClockSteppedBack(t *testing.T) {
	h, api, clk := newTestHarness(t, testConfig(all, 100, 100, 64))
	at := clk.Now()
	h.observe(ln(levelError, "errors", "stepped", at))
	drain(h)
	h.observe(ln(levelError, "errors", "stepped", at.Add(-time.Hour)))
	drain(h)
	ev := only(t, events(t, api))
	if ev.Count != 2 || ev.LastTimestamp.Time.Before(ev.FirstTimestamp.Time) || !ev.LastTimestamp.Time.Equal(at) {
		t.Errorf("count %d, first %v, last %v; want 2 and both at %v", ev.Count, ev.FirstTimestamp, ev.LastTimestamp, at)
	}
}

func TestThrottledRepeatsAreCounted(t *testing.T) {
	h, api, clk := newTestHarness(t, testConfig(all, 1.0/300, 1, 64))
	h.observe(ln(levelWarning, "forward", "no healthy upstream", clk.Now()))
	drain(h)
	before := testutil.ToFloat64(throttled[levelWarning])
	for range 7 {
		h.observe(ln(levelWarning, "forward", "no healthy upstream", clk.Now()))
	}
	drain(h) // the bucket is empty: nothing written, the entry waits
	if n := only(t, events(t, api)).Count; n != 1 {
		t.Fatalf("count %d before the bucket refills, want 1", n)
	}
	if got := testutil.ToFloat64(throttled[levelWarning]) - before; got != 1 {
		t.Errorf("throttled_total rose by %v, want 1: an event that waits is counted once", got)
	}
	h.advance(299 * time.Second)
	if n := only(t, events(t, api)).Count; n != 1 {
		t.Fatalf("count %d before the refill, want 1", n)
	}
	h.advance(time.Second)
	if n := only(t, events(t, api)).Count; n != 8 {
		t.Errorf("count %d once the bucket refilled, want 8", n)
	}
}

func TestBucketsAreIndependent(t *testing.T) {
	h, api, clk := newTestHarness(t, testConfig(all, 1.0/300, 2, 64))
	for i := range 20 {
		h.observe(ln(levelError, fmt.Sprint("p", i), "storm", clk.Now()))
	}
	drain(h)
	h.observe(ln(levelWarning, "reload", "warn", clk.Now()))
	h.observe(ln(levelInfo, "reload", "info", clk.Now()))
	drain(h)
	byReason := map[string]int{}
	for _, ev := range events(t, api) {
		byReason[ev.Reason]++
	}
	if byReason["CoreDNSError"] != 2 || byReason["CoreDNSWarning"] != 1 || byReason["CoreDNSInfo"] != 1 {
		t.Errorf("events by reason %v, want 2 errors (the burst), 1 warning, 1 info", byReason)
	}
}

// TestWritesStayWithinBound runs a storm of distinct and repeated lines for
// two simulated minutes and checks the bucket's bound, burst + qps x T,
// over every interval, and that the budget is used.
func TestWritesStayWithinBound(t *testing.T) {
	const qps, burst = 0.5, 5
	h, api, clk := newTestHarness(t, testConfig(all, qps, burst, 4096))
	// A third of the requests never reach the API, a third get no answer.
	var n atomic.Int32
	api.setFault(func(apiRequest) fault {
		switch n.Add(1) % 3 {
		case 0:
			return fault{unsent: true}
		case 1:
			return fault{lost: true}
		}
		return fault{}
	})
	h.lostAfter = 3 * time.Second
	start := clk.Now()
	for s := range 120 {
		for i := range 20 {
			h.observe(ln(levelError, fmt.Sprint("p", i%15), fmt.Sprint("line ", i, s%3), clk.Now()))
		}
		h.advance(time.Second)
	}
	elapsed := clk.Since(start).Seconds()
	at := reachedAt(api, "CoreDNSError")
	checkBound(t, at, qps, burst)
	if want := int(qps * elapsed); len(at) < want {
		t.Errorf("only %d writes in %.0fs, want %d: the budget is not used", len(at), elapsed, want)
	}
}

func TestEvictedUnwrittenLinesAreCounted(t *testing.T) {
	h, _, clk := newTestHarness(t, testConfig(all, 1, 25, 2))
	before := readLedger()
	h.observe(ln(levelError, "a", "one", clk.Now()))
	h.observe(ln(levelError, "a", "one", clk.Now()))
	h.observe(ln(levelError, "b", "two", clk.Now()))
	h.observe(ln(levelError, "c", "three", clk.Now())) // evicts a/one with 2 unwritten lines
	d := readLedger().since(before)
	if d.dropped[dropEvicted] != 2 || d.pending != 2 {
		t.Errorf("dropped{evicted} rose by %v and pending by %v, want 2 and 2", d.dropped[dropEvicted], d.pending)
	}
}

// TestUnsentWriteCostsNoToken: an API that refuses connections for ten
// minutes, at the default rate, leaves the buckets full; when it comes
// back every pending event lands within one maximal backoff, with its
// true count.
func TestUnsentWriteCostsNoToken(t *testing.T) {
	h, api, clk := newTestHarness(t, testConfig(defaultLevels, defaultQPS, defaultBurst, defaultCacheSize))
	before := readLedger()
	api.setFault(func(apiRequest) fault { return fault{unsent: true} })
	outageEnd := clk.Now().Add(10 * time.Minute)
	lines := 0
	for clk.Now().Before(outageEnd) {
		h.observe(ln(levelError, "errors", "upstream timeout", clk.Now()))
		h.observe(ln(levelWarning, "forward", fmt.Sprint("upstream ", lines%5, " down"), clk.Now()))
		lines += 2
		h.advance(7 * time.Second)
	}
	if c, pt := api.writes(); c+pt != 0 || api.refused == 0 {
		t.Fatalf("%d writes reached the API during the outage, %d refused", c+pt, api.refused)
	}
	for _, l := range []level{levelError, levelWarning} {
		b := h.s.buckets[l]
		if b.advance(clk.Now()); b.tokens < defaultBurst {
			t.Errorf("%s: %.1f tokens left after an outage that no request reached, want %d", l, b.tokens, defaultBurst)
		}
	}
	api.setFault(nil)
	back := clk.Now()
	for clk.Since(back) <= retryMax+retryMax/5 && countsIn(api) < float64(lines) {
		h.advance(time.Second)
	}
	if got := countsIn(api); got != float64(lines) {
		t.Fatalf("counts %v %d s after the API came back, want %d", got, int(clk.Since(back).Seconds()), lines)
	}
	if n := len(events(t, api)); n != 6 {
		t.Errorf("%d events, want 6", n)
	}
	checkLedger(t, api, before, float64(lines))
}

// TestTransientAnswersAreRetried: 401 (a token being rotated), 408, 429,
// 500, 503, a reset connection and no answer are retried with backoff.
func TestTransientAnswersAreRetried(t *testing.T) {
	for _, f := range []fault{{code: 401}, {code: 408}, {code: 429}, {code: 429, retryAfter: 3}, {code: 500}, {code: 503}, {reset: true}, {lost: true}} {
		t.Run(fmt.Sprintf("%+v", f), func(t *testing.T) {
			h, api, clk := newTestHarness(t, testConfig(all, 100, 100, 64))
			var refusals atomic.Int32
			api.setFault(func(r apiRequest) fault {
				if refusals.Add(1) > 2 {
					return fault{}
				}
				return f
			})
			for range 5 {
				h.observe(ln(levelWarning, "forward", "busy", clk.Now()))
			}
			drain(h)
			// A transient failure backs off from a second, not the minute of
			// a refusal (or the Retry-After asked for).
			e := h.pendingEntries()[0]
			wait := e.retryAt.Sub(clk.Now())
			if limit := max(retryBase+retryBase/5, time.Duration(f.retryAfter)*time.Second); wait <= 0 || wait > limit {
				t.Errorf("first retry in %v, want at most %v", wait, limit)
			}
			if len(h.reports) != 1 {
				t.Errorf("%d failures reported, want 1", len(h.reports))
			}
			h.advance(2 * (retryMax + retryMax/5))
			if ev := only(t, events(t, api)); ev.Count != 5 {
				t.Errorf("count %d, want 5", ev.Count)
			}
		})
	}
}

// TestBackoffGrowsAndIsForgotten: failed writes back off exponentially;
// the state lives in the entry, so an evicted event leaves nothing behind
// and a new one starts from the base.
func TestBackoffGrowsAndIsForgotten(t *testing.T) {
	h, api, clk := newTestHarness(t, testConfig(all, 100, 100, 2))
	api.setFault(func(apiRequest) fault { return fault{code: 500} })
	h.observe(ln(levelError, "errors", "failing", clk.Now()))
	var waits []time.Duration
	for range 9 {
		drain(h)
		e := h.entry(errorKey("failing"))
		waits = append(waits, e.retryAt.Sub(clk.Now()))
		clk.SetTime(e.retryAt)
	}
	for i, w := range waits {
		base := min(retryBase<<i, retryMax)
		if w < base || w > base+base/5 {
			t.Errorf("wait %d is %v, want %v plus up to 20%%", i+1, w, base)
		}
	}
	if c, _ := api.writes(); c != 9 {
		t.Errorf("%d creates, want 9: one at the end of each backoff", c)
	}
	h.observe(ln(levelError, "errors", "b", clk.Now()))
	h.observe(ln(levelError, "errors", "c", clk.Now())) // evicts "failing"
	h.observe(ln(levelError, "errors", "failing", clk.Now()))
	if e := h.entry(errorKey("failing")); e.failures != 0 || !e.retryAt.IsZero() {
		t.Errorf("a new entry inherits failures %d, retry at %v", e.failures, e.retryAt)
	}
}

// TestRetryAfterIsHonoured: a write is not retried before the API's
// Retry-After, even when that is longer than the backoff.
func TestRetryAfterIsHonoured(t *testing.T) {
	h, api, clk := newTestHarness(t, testConfig(all, 100, 100, 64))
	api.setFault(firstOnly(fault{code: http.StatusTooManyRequests, retryAfter: 90}))
	h.observe(ln(levelError, "errors", "busy", clk.Now()))
	drain(h)
	if wait := h.entry(errorKey("busy")).retryAt.Sub(clk.Now()); wait < 90*time.Second {
		t.Errorf("retry in %v, want at least the 90 s the API asked for", wait)
	}
	h.advance(90*time.Second - time.Millisecond)
	if c, _ := api.writes(); c != 1 {
		t.Errorf("%d creates before the Retry-After ended, want 1", c)
	}
	h.advance(90*time.Second/5 + time.Second)
	if ev := only(t, events(t, api)); ev.Count != 1 {
		t.Errorf("count %d, want 1", ev.Count)
	}
}

// TestRefusedLinesStayPending: lines the API refuses (403) are not
// dropped: they stay pending, the event pauses, and once RBAC is fixed one
// write carries all of them. Each line is counted once.
func TestRefusedLinesStayPending(t *testing.T) {
	h, api, clk := newTestHarness(t, testConfig(all, 100, 100, 64))
	before := readLedger()
	api.setFault(func(r apiRequest) fault { return fault{code: http.StatusForbidden} })
	for range 3 {
		h.observe(ln(levelError, "errors", "denied", clk.Now()))
	}
	drain(h)
	h.observe(ln(levelError, "errors", "denied", clk.Now()))
	h.advance(rejectPause - time.Second)
	if c, _ := api.writes(); c != 1 {
		t.Fatalf("%d create attempts within a minute of a 403, want 1: the event must pause", c)
	}
	d := checkLedger(t, api, before, 4)
	if d.pending != 4 || d.droppedAll() != 0 {
		t.Errorf("pending %v dropped %v, want 4 pending", d.pending, d.dropped)
	}
	if len(h.reports) != 1 {
		t.Errorf("%d refusals reported, want 1", len(h.reports))
	}
	api.setFault(nil) // RBAC fixed
	h.advance(time.Second)
	if ev := only(t, events(t, api)); ev.Count != 4 {
		t.Errorf("count %d after RBAC was fixed, want 4 (every line ever seen)", ev.Count)
	}
	checkLedger(t, api, before, 4)
}

// TestCreateUnansweredButApplied: the API server applied a create whose
// answer never came; the retry must find that event, not make a second one.
func TestCreateUnansweredButApplied(t *testing.T) {
	h, api, clk := newTestHarness(t, testConfig(all, 100, 100, 64))
	h.lostAfter = writeTimeout
	before := readLedger()
	exists := testutil.ToFloat64(apiExpected.WithLabelValues("409", "exists"))
	api.setFault(firstOnly(fault{lost: true, apply: true}))
	h.observe(ln(levelError, "errors", "slow", clk.Now()))
	drain(h)
	h.observe(ln(levelError, "errors", "slow", clk.Now()))
	h.advance(writeTimeout + 2*retryBase)
	if ev := only(t, events(t, api)); ev.Count != 2 {
		t.Errorf("count %d, want 2", ev.Count)
	}
	if got := testutil.ToFloat64(apiExpected.WithLabelValues("409", "exists")) - exists; got != 1 {
		t.Error("the create that found its own event is not counted as expected")
	}
	checkLedger(t, api, before, 2)
}

// TestCreateAnswered5xxButCommitted: kube-apiserver answers 500 when etcd
// times out, and etcd may have committed. The retry must find the event,
// not make a second one.
func TestCreateAnswered5xxButCommitted(t *testing.T) {
	for _, code := range []int{500, 503, 504} {
		t.Run(http.StatusText(code), func(t *testing.T) {
			h, api, clk := newTestHarness(t, testConfig(all, 100, 100, 64))
			before := readLedger()
			api.setFault(firstOnly(fault{code: code, apply: true}))
			h.observe(ln(levelError, "errors", "committed", clk.Now()))
			drain(h)
			h.advance(2 * retryBase)
			if ev := only(t, events(t, api)); ev.Count != 1 {
				t.Errorf("count %d, want 1", ev.Count)
			}
			checkLedger(t, api, before, 1)
		})
	}
}

// TestNameTakenIsNotOurs: a first create that meets an event of the same
// name made by someone else takes a new name; it never patches the other.
func TestNameTakenIsNotOurs(t *testing.T) {
	h, api, clk := newTestHarness(t, testConfig(all, 100, 100, 64))
	h.s.names.tag = "" // so that the name is known in advance
	name := h.s.names.next(testRef.Name, clk.Now())
	h.s.names.last--
	api.mu.Lock()
	api.events["kube-system/"+name] = &corev1.Event{Message: "someone else's", Count: 7}
	api.mu.Unlock()
	h.observe(ln(levelError, "errors", "mine", clk.Now()))
	h.observe(ln(levelError, "errors", "mine", clk.Now()))
	drain(h)
	for _, ev := range events(t, api) {
		switch ev.Message {
		case "someone else's":
			if ev.Count != 7 {
				t.Errorf("the other event was changed: count %d", ev.Count)
			}
		case "plugin/errors: mine":
			if ev.Count != 2 || ev.Name == name {
				t.Errorf("our event %s count %d", ev.Name, ev.Count)
			}
		default:
			t.Errorf("unexpected event %+v", ev)
		}
	}
	if n := len(events(t, api)); n != 2 {
		t.Errorf("%d events, want 2", n)
	}
}

// TestPatchOfGoneEventCreatesAnew: an event that expired takes a 404 on
// patch; the next write creates it again, with every line seen.
func TestPatchOfGoneEventCreatesAnew(t *testing.T) {
	h, api, clk := newTestHarness(t, testConfig(all, 100, 100, 64))
	h.observe(ln(levelError, "errors", "again", clk.Now()))
	drain(h)
	api.expire()
	h.observe(ln(levelError, "errors", "again", clk.Now()))
	drain(h)
	if ev := only(t, events(t, api)); ev.Count != 2 {
		t.Errorf("count %d, want 2", ev.Count)
	}
	if c, pt := api.writes(); c != 2 || pt != 1 {
		t.Errorf("%d creates %d patches, want 2 and 1", c, pt)
	}
	if len(h.reports) != 0 {
		t.Errorf("a gone event reported as a failure: %v", h.reports)
	}
}

// TestHungRequestHoldsUpOnlyItsEvent: with rate 10 1, a create that hangs
// does not hold up another event of its level: that one is written as soon
// as the bucket refills, 0.1 s later, while the first waits for its
// time-out.
func TestHungRequestHoldsUpOnlyItsEvent(t *testing.T) {
	h, api, clk := newTestHarness(t, testConfig(all, 10, 1, 64))
	h.lostAfter = writeTimeout
	before := readLedger()
	api.setFault(firstOnly(fault{lost: true}))
	h.observe(ln(levelError, "errors", "upstream A down", clk.Now()))
	drain(h) // A's create hangs
	h.observe(ln(levelError, "errors", "upstream B down", clk.Now()))
	h.advance(200 * time.Millisecond)
	ev := only(t, events(t, api))
	if !strings.Contains(ev.Message, "upstream B down") {
		t.Fatalf("written: %q, want B", ev.Message)
	}
	at := reachedAt(api, "CoreDNSError")
	if len(at) != 2 || at[1].Sub(epoch) > 100*time.Millisecond+time.Millisecond {
		t.Errorf("requests reached the API at %v, want B's 0.1 s after A's", at)
	}
	if e := h.entry(errorKey("upstream A down")); e.inflight == 0 {
		t.Error("A's request is not in flight any more")
	}
	h.advance(writeTimeout + 2*retryBase)
	if n := len(events(t, api)); n != 2 {
		t.Errorf("%d events once A's request timed out and was retried, want 2", n)
	}
	checkLedger(t, api, before, 2)
}

// TestTokenHandedBackWakesWaiting: an event that finds its bucket's one
// token held by a request in flight waits; when the request never reached
// the server, the token is back, and the waiting event is sent at once,
// not after the 300 s refill.
func TestTokenHandedBackWakesWaiting(t *testing.T) {
	s := newScheduler(testConfig(all, defaultQPS, 1, 1), testPod(), epoch)
	s.observe(ln(levelError, "errors", "upstream A down", epoch))
	reqs, _ := s.dispatch(epoch)
	if len(reqs) != 1 {
		t.Fatalf("%d requests, want A's", len(reqs))
	}
	s.observe(ln(levelError, "errors", "upstream B down", epoch)) // evicts A, in flight
	if more, wake := s.dispatch(epoch); len(more) != 0 || wake.Sub(epoch) < 299*time.Second {
		t.Fatalf("%d requests and a wake in %v with the token out, want none and 300 s", len(more), wake.Sub(epoch))
	}
	s.outcome(result{id: reqs[0].id, outcome: writeFailed, err: errRefused}, epoch) // A never reached the API
	more, _ := s.dispatch(epoch)
	if len(more) != 1 || !strings.Contains(more[0].event.Message, "upstream B down") {
		t.Fatalf("%d requests once A's token was handed back, want B's create", len(more))
	}
}

// TestTokenHandedBackWakesOne: one token handed back is one request: of
// 50 events waiting for the bucket's one token, one is sent.
func TestTokenHandedBackWakesOne(t *testing.T) {
	s := newScheduler(testConfig(all, defaultQPS, 1, 64), testPod(), epoch)
	for i := range 50 {
		s.observe(ln(levelError, "errors", fmt.Sprint("upstream ", i, " down"), epoch))
	}
	reqs, _ := s.dispatch(epoch)
	if len(reqs) != 1 {
		t.Fatalf("%d requests from a bucket of one token", len(reqs))
	}
	s.outcome(result{id: reqs[0].id, outcome: writeFailed, err: errRefused}, epoch)
	if more, _ := s.dispatch(epoch); len(more) != 1 {
		t.Errorf("%d requests on one token handed back, want 1", len(more))
	}
}

// TestTokenHandedBackAfterAnotherSpent: with two requests in flight, one
// spending its token and the other handing it back, the event that found
// both held is sent on the one handed back, and only then.
func TestTokenHandedBackAfterAnotherSpent(t *testing.T) {
	s := newScheduler(testConfig(all, defaultQPS, 2, 64), testPod(), epoch)
	for _, m := range []string{"A", "B", "C"} {
		s.observe(ln(levelError, "errors", "upstream "+m+" down", epoch))
	}
	reqs, _ := s.dispatch(epoch)
	if len(reqs) != 2 {
		t.Fatalf("%d requests from a bucket of two", len(reqs))
	}
	s.outcome(result{id: reqs[0].id, outcome: writeOK, reached: true}, epoch) // spent
	if more, _ := s.dispatch(epoch); len(more) != 0 {
		t.Fatalf("%d requests with one token spent and one out", len(more))
	}
	s.outcome(result{id: reqs[1].id, outcome: writeFailed, err: errRefused}, epoch) // handed back
	more, _ := s.dispatch(epoch)
	if len(more) != 1 || !strings.Contains(more[0].event.Message, "upstream C down") {
		t.Errorf("%d requests on the token handed back, want C's create", len(more))
	}
}

// TestLoweredBurstHandBackWakes: a reload lowers BURST from 2 to 1 while
// A's and B's creates are out. A's reaches the server; C waits. B's never
// reaches it and B is gone: the bucket is as if B had never been sent, one
// token left after A's, so C is sent at once, not after a refill.
func TestLoweredBurstHandBackWakes(t *testing.T) {
	const refill = 300 * time.Second
	s := newScheduler(testConfig(all, 1/refill.Seconds(), 2, 1), testPod(), epoch)
	s.observe(ln(levelError, "errors", "upstream A down", epoch))
	a, _ := s.dispatch(epoch)
	s.observe(ln(levelError, "errors", "upstream B down", epoch)) // evicts A, in flight
	b, _ := s.dispatch(epoch)
	if len(a) != 1 || len(b) != 1 {
		t.Fatalf("%d and %d requests, want A's and B's", len(a), len(b))
	}
	s.apply(testConfig(all, 1/refill.Seconds(), 1, 1), epoch)
	s.outcome(result{id: a[0].id, outcome: writeOK, reached: true}, epoch)
	s.observe(ln(levelError, "errors", "upstream C down", epoch)) // evicts B, in flight
	if reqs, _ := s.dispatch(epoch); len(reqs) != 0 {
		t.Fatalf("%d requests with the bucket empty", len(reqs))
	}
	s.outcome(result{id: b[0].id, outcome: writeFailed, err: errRefused}, epoch)
	reqs, wake := s.dispatch(epoch)
	if len(reqs) != 1 || !strings.Contains(reqs[0].event.Message, "upstream C down") {
		t.Errorf("%d requests (next wake in %v) once B's token was handed back, want C's create at once", len(reqs), wake.Sub(epoch))
	}
}

// TestSettlingGoFirst: evicted events whose latest write got no answer take
// tokens before the events in the cache, oldest first; those in the cache
// go in the order they began to wait.
func TestSettlingGoFirst(t *testing.T) {
	h, api, clk := newTestHarness(t, testConfig(all, 1.0/300, 2, 4))
	api.setFault(func(apiRequest) fault { return fault{lost: true} })
	h.observe(ln(levelError, "errors", "a", clk.Now()))
	clk.Step(time.Second)
	h.observe(ln(levelError, "errors", "b", clk.Now()))
	drain(h) // both creates unanswered: the bucket is empty
	api.setFault(nil)
	evictAll(h) // a and b, settling
	for _, m := range []string{"c", "d", "c"} {
		h.observe(ln(levelError, "errors", m, clk.Now()))
	}
	if got := strings.Join(writeOrder(h, api, 4), " "); got != "a b c d" {
		t.Errorf("order of tokens %q, want the settling a b, then c d", got)
	}
}

// evictAll lets every cached event go, as a full cache does: those whose latest write got no
// answer settle, each in a unit of CACHESIZE.
func evictAll(h *harness) {
	for h.s.corr.cache.evictOne() {
	}
}

// writeOrder lets n refills come one at a time and lists the message of
// the event each one wrote.
func writeOrder(h *harness, api *fakeAPI, n int) []string {
	var order []string
	seen := map[string]bool{}
	for range n {
		h.advance(time.Duration(float64(time.Second)/h.s.set.qps) + time.Second)
		for _, ev := range api.list() {
			if m := ev.Message[strings.LastIndex(ev.Message, ": ")+2:]; !seen[m] {
				seen[m] = true
				order = append(order, m)
			}
		}
	}
	return order
}

// TestEvictedUnansweredIsSettled: an event whose latest write got no
// answer is not dropped when evicted: one more write tells the API its
// final count, so no line is both in the API and dropped.
func TestEvictedUnansweredIsSettled(t *testing.T) {
	h, api, clk := newTestHarness(t, testConfig(all, 100, 100, 2))
	before := readLedger()
	api.setFault(firstOnly(fault{lost: true, apply: true}))
	h.observe(ln(levelError, "errors", "unanswered", clk.Now()))
	h.observe(ln(levelError, "errors", "unanswered", clk.Now()))
	drain(h)
	evictAll(h)
	h.observe(ln(levelError, "errors", "comes after", clk.Now()))
	if len(h.s.settling) != 1 {
		t.Fatalf("%d entries settling, want 1", len(h.s.settling))
	}
	h.advance(2 * retryMax)
	if len(h.s.settling) != 0 {
		t.Errorf("%d entries still settling", len(h.s.settling))
	}
	d := checkLedger(t, api, before, 3)
	if d.pending != 0 || d.droppedAll() != 0 {
		t.Errorf("pending %v dropped %v", d.pending, d.dropped)
	}
}

// TestSettlingStaysWithinRoom: an evicted event whose write got no answer
// again stays settling while the settling ones and the cached events fit in
// the cache size, its own place included.
func TestSettlingStaysWithinRoom(t *testing.T) {
	h, api, clk := newTestHarness(t, testConfig(all, 100, 100, 4))
	api.setFault(func(apiRequest) fault { return fault{lost: true} })
	for _, m := range []string{"a", "b"} {
		h.observe(ln(levelError, "errors", m, clk.Now()))
	}
	drain(h)    // both creates unanswered
	evictAll(h) // a and b, settling
	h.observe(ln(levelError, "errors", "c", clk.Now()))
	h.observe(ln(levelError, "errors", "d", clk.Now()))
	if len(h.s.settling) != 2 {
		t.Fatalf("%d settling, want 2", len(h.s.settling))
	}
	before := readLedger()
	h.advance(2 * retryMax) // no answer again: they still may have landed
	if len(h.s.settling) != 2 {
		t.Errorf("%d settling after their writes went unanswered again, want 2", len(h.s.settling))
	}
	if d := readLedger().since(before); d.dropped[dropEvicted] != 0 {
		t.Errorf("%v lines of settling events dropped, with 4 units in a cache of 4", d.dropped[dropEvicted])
	}
}

// TestShrinkTrimsSettlingToTheNewSize: a reload that shrinks the cache
// drops settling events until they fit the new size, and no more.
func TestShrinkTrimsSettlingToTheNewSize(t *testing.T) {
	h, api, clk := newTestHarness(t, testConfig(all, 100, 100, 3))
	api.setFault(func(apiRequest) fault { return fault{lost: true} })
	for _, m := range []string{"a", "b", "c"} {
		h.observe(ln(levelError, "errors", m, clk.Now()))
	}
	drain(h) // three creates unanswered
	api.setFault(nil)
	evictAll(h) // a, b and c, settling
	if len(h.s.settling) != 3 {
		t.Fatalf("%d settling, want 3", len(h.s.settling))
	}
	h.apply(testConfig(all, 100, 100, 2))
	if len(h.s.settling) != 2 {
		t.Errorf("%d settling after a reload to a cache of 2, want 2", len(h.s.settling))
	}
}

// TestShrinkKeepsSettlingInFlight: a reload that shrinks the cache must not
// drop the lines of a settling event whose write is in flight: the write
// lands with them.
func TestShrinkKeepsSettlingInFlight(t *testing.T) {
	h, api, clk := newTestHarness(t, testConfig(all, 100, 100, 4))
	before := readLedger()
	api.setFault(func(apiRequest) fault { return fault{lost: true} })
	for _, m := range []string{"a", "b"} {
		for range 4 {
			h.observe(ln(levelError, "errors", m, clk.Now()))
		}
	}
	drain(h) // both creates unanswered
	api.setFault(nil)
	evictAll(h) // a and b, settling
	h.observe(ln(levelError, "errors", "c", clk.Now()))
	h.observe(ln(levelError, "errors", "d", clk.Now()))
	drain(h)
	if len(h.s.settling) != 2 {
		t.Fatalf("%d settling, want 2", len(h.s.settling))
	}
	clk.Step(2 * retryMax)
	reqs, _ := h.s.dispatch(clk.Now())
	if len(reqs) != 2 {
		t.Fatalf("%d requests, want the settling events' two", len(reqs))
	}
	h.apply(testConfig(all, 100, 100, 1)) // both writes in flight
	for _, r := range reqs {
		h.send(r)
	}
	drain(h)
	d := checkLedger(t, api, before, 10)
	if d.droppedAll() != 0 || d.pending != 0 {
		t.Errorf("dropped %v pending %v: lines of a settling event dropped although its write landed with them", d.dropped, d.pending)
	}
	if len(h.s.settling) != 0 {
		t.Errorf("%d still settling", len(h.s.settling))
	}
}

// TestDoubtOfDroppedLines: lines dropped while the latest write of their
// event got no answer may be in the API: doubtful counts those the write
// carried beyond what an answered write did, no more and no fewer.
func TestDoubtOfDroppedLines(t *testing.T) {
	h := newHarness(t, testConfig(all, 100, 100, 4))
	for _, tt := range []struct {
		seen, carried, doubt, want int64
	}{
		{seen: 6, carried: 1, doubt: 4, want: 3}, // the unanswered write carried lines 2 to 4
		{seen: 6, carried: 2, doubt: 0, want: 0}, // every write answered
		{seen: 3, carried: 1, doubt: 6, want: 2}, // no more than were pending
	} {
		e := newEntry(eventKey{}, time.Time{})
		e.tally, e.doubt = tally{seen: tt.seen, carried: tt.carried}, tt.doubt
		pendingLines.Add(float64(e.pending()))
		before := h.s.doubtful
		h.s.drop(e, dropEvicted)
		if got := h.s.doubtful - before; got != tt.want {
			t.Errorf("seen %d, carried %d, doubt %d: doubtful rose by %d, want %d", tt.seen, tt.carried, tt.doubt, got, tt.want)
		}
	}
}

// seeUnlogged books n more lines of every cached event as seen and
// pending, without logging each; the pending ones are taken back when the
// test ends.
func seeUnlogged(t *testing.T, h *harness, before ledger, n int64) {
	t.Helper()
	for _, e := range h.s.corr.cache.values() {
		e.seen += n
	}
	pendingLines.Add(float64(n))
	t.Cleanup(func() { pendingLines.Sub(readLedger().since(before).pending) })
}

// TestCountPastInt32: an event's count is an int32. Lines past it go to a
// new event; none is booked as carried that no count holds.
func TestCountPastInt32(t *testing.T) {
	h, api, clk := newTestHarness(t, testConfig(all, 100, 100, 64))
	before := readLedger()
	h.observe(ln(levelError, "errors", "long-lived", clk.Now()))
	const more = math.MaxInt32 + 4
	seeUnlogged(t, h, before, more)
	h.advance(time.Second)
	d := checkLedger(t, api, before, more+1)
	if d.pending != 0 {
		t.Errorf("pending %v, want 0", d.pending)
	}
	evs := events(t, api)
	if len(evs) != 2 {
		t.Fatalf("%d events, want 2: one full at 2^31-1, one with the rest", len(evs))
	}
	for _, ev := range evs {
		if ev.Count != math.MaxInt32 && ev.Count != 5 {
			t.Errorf("count %d, want 2^31-1 and 5", ev.Count)
		}
	}
}

// TestCountOfExactlyInt32: an event whose count reaches 2^31-1 exactly is
// full: the next line goes to a new object at once, and the full one is not
// patched again for nothing.
func TestCountOfExactlyInt32(t *testing.T) {
	h, api, clk := newTestHarness(t, testConfig(all, 100, 100, 64))
	before := readLedger()
	h.observe(ln(levelError, "errors", "long-lived", clk.Now()))
	const more = math.MaxInt32 - 1
	seeUnlogged(t, h, before, more)
	drain(h)
	h.observe(ln(levelError, "errors", "long-lived", clk.Now()))
	drain(h)
	checkLedger(t, api, before, more+2)
	creates, patches := api.writes()
	if creates != 2 || patches != 0 {
		t.Errorf("%d creates and %d patches, want 2 creates: one full at 2^31-1, one for the next line", creates, patches)
	}
}

// TestReloadLooksAgainAtThrottled: a reload that raises the rate lets
// throttled events go as soon as the new rate has a token, not when the
// old one would have had; one that shrinks the cache evicts.
func TestReloadLooksAgainAtThrottled(t *testing.T) {
	h, api, clk := newTestHarness(t, testConfig(all, 1.0/300, 1, 64))
	for i := range 3 {
		h.observe(ln(levelError, "errors", fmt.Sprint("line ", i), clk.Now()))
	}
	drain(h) // one written, two wait
	if n := len(events(t, api)); n != 1 {
		t.Fatalf("%d events with a burst of 1", n)
	}
	h.apply(testConfig(all, 10, 10, 64))
	h.advance(time.Second)
	if n := len(events(t, api)); n != 3 {
		t.Errorf("%d events a second after the rate was raised, want 3", n)
	}
	before := readLedger()
	h.observe(ln(levelError, "errors", "x", clk.Now()))
	h.observe(ln(levelError, "errors", "y", clk.Now()))
	h.apply(testConfig(all, 10, 10, 1))
	if n := len(h.s.corr.cache.entries); n != 1 {
		t.Errorf("cache holds %d after a resize to 1", n)
	}
	if d := readLedger().since(before); d.dropped[dropEvicted] != 1 {
		t.Errorf("dropped{evicted} rose by %v, want 1", d.dropped[dropEvicted])
	}
}

// TestReloadsDuringWritesAndStopKeepLedger: the scheduler's goroutine,
// writers, reloads that shrink and grow the cache, and stop all run at
// once against a slow but healthy API server. No answer is lost, so the
// ledger must be exact: sum(counts) + pending + dropped == lines.
func TestReloadsDuringWritesAndStopKeepLedger(t *testing.T) {
	for round := range 5 {
		p, api, clk := newTestPipeline(t, testConfig(all, 1000, 50, 4))
		api.setFault(func(apiRequest) fault { return fault{delay: 200 * time.Microsecond} })
		before := readLedger()
		p.start()
		const n = 400
		done := make(chan struct{})
		go func() {
			defer close(done)
			for i := range n {
				p.listener.lines <- ln(levelError, "errors", fmt.Sprint("m", i%7), clk.Now())
			}
		}()
		stopReloads := make(chan struct{})
		reloaded := make(chan struct{})
		go func() {
			defer close(reloaded)
			for i := 0; ; i++ {
				select {
				case <-stopReloads:
					return
				default:
				}
				p.apply(testConfig(all, 1000, 50, 1+i%4), api.client)
				time.Sleep(100 * time.Microsecond)
			}
		}()
		<-done
		p.stop(500 * time.Millisecond)
		close(stopReloads)
		<-reloaded
		d := readLedger().since(before)
		if got := countsIn(api) + d.pending + d.droppedAll(); got != n {
			t.Fatalf("round %d: counts %v + pending %v + dropped %v = %v, want %d lines",
				round, countsIn(api), d.pending, d.dropped, got, n)
		}
	}
}

// TestRequestsInFlightAreCapped: however many tokens a bucket has, at most
// maxInFlight of its requests are out at once while their plugins have
// others out, and an event has one at most: lines that come while it is
// out wait for its answer.
func TestRequestsInFlightAreCapped(t *testing.T) {
	h, api, clk := newTestHarness(t, testConfig(all, 100, 100, 64))
	h.lostAfter = writeTimeout
	api.setFault(func(apiRequest) fault { return fault{lost: true, apply: true} })
	for i := range 2 * maxInFlight {
		h.observe(ln(levelError, fmt.Sprint("p", i%2), fmt.Sprintf("upstream kw%c down", 'a'+i/2), clk.Now()))
	}
	h.observe(ln(levelWarning, "forward", "slow", clk.Now()))
	drain(h)
	h.observe(ln(levelError, "p0", "upstream kwa down", clk.Now())) // its create is out
	h.advance(writeTimeout / 2)
	if n := len(reachedAt(api, "CoreDNSError")); n != maxInFlight {
		t.Errorf("%d error requests out at once, want %d", n, maxInFlight)
	}
	if n := len(reachedAt(api, "CoreDNSWarning")); n != 1 {
		t.Errorf("%d warning requests, want 1: another bucket is not held up", n)
	}
	api.setFault(nil)
	h.advance(writeTimeout/2 + 2*retryBase)
	if n := len(reachedAt(api, "CoreDNSError")); n < 2*maxInFlight {
		t.Errorf("%d error requests once the first came back, want the other %d sent", n, maxInFlight)
	}
	h.advance(writeTimeout + 2*retryBase)
	for _, ev := range events(t, api) {
		want := int32(1)
		if ev.Message == "plugin/p0: upstream kwa down" {
			want = 2
		}
		if ev.Count != want {
			t.Errorf("%q: count %d, want %d", ev.Message, ev.Count, want)
		}
	}
	if n := len(events(t, api)); n != 2*maxInFlight+1 {
		t.Errorf("%d events, want %d", n, 2*maxInFlight+1)
	}
}

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

// TestStormConfirmedByItsRetriedCreateEnds: a storm whose create was
// applied and got no answer, then found applied by its retry (409), is
// written: its end is said once its quiet is up.
func TestStormConfirmedByItsRetriedCreateEnds(t *testing.T) {
	h, api, _ := newTestHarness(t, withQuiet(100, 100, time.Minute))
	api.setFault(firstFaults(1, fault{lost: true, apply: true}))
	repeatLine(h, levelError, "errors", "upstream unhealthy", stormLines+2)
	drain(h)
	h.advance(2 * time.Second) // the retry finds it applied
	if c := countsIn(api); c != stormLines+2 {
		t.Fatalf("count %v in the API, want %d", c, stormLines+2)
	}
	h.advance(2 * time.Minute)
	if n := len(endsIn(api)); n != 1 {
		t.Errorf("%d ends of the storm its retried create confirmed, want 1", n)
	}
}

// BenchmarkSchedulingPass measures one pass: a dispatch that hands out
// one request, its answer, and the next line of that event, with n events
// pending, of ownEvents a plugin (no more, lest they combine), and as
// many storms waiting for their quiet.
// A pass at 65,536 pending costs at most twice the pass at 4096.
func BenchmarkSchedulingPass(b *testing.B) {
	for _, n := range []int{4096, 65536} {
		b.Run(fmt.Sprint(n, " pending"), func(b *testing.B) {
			cfg := testConfig(all, 1000, 1, 2*n+1)
			cfg.quiet = time.Hour
			s := newScheduler(cfg, testPod(), epoch)
			now := epoch
			lineOf := func(i int) line {
				return ln(levelError, fmt.Sprint("p", i/ownEvents), fmt.Sprint("upstream ", i, " down"), now)
			}
			written := func() {
				reqs, _ := s.dispatch(now)
				for _, r := range reqs {
					s.outcome(result{id: r.id, outcome: writeOK, reached: true}, now)
				}
				now = now.Add(time.Millisecond)
			}
			for i := range n { // storms, written, waiting for their quiet
				for range stormLines {
					s.observe(lineOf(n + i))
				}
				written()
			}
			for i := range n {
				s.observe(lineOf(i))
			}
			b.ResetTimer()
			cpu := cpuTime()
			defer func() { b.ReportMetric(float64(cpuTime()-cpu)/float64(b.N), "cpu-ns/op") }()
			for range b.N {
				reqs, _ := s.dispatch(now)
				if len(reqs) != 1 {
					b.Fatalf("%d requests in a pass", len(reqs))
				}
				if len(s.corr.cache.entries) != 2*n {
					b.Fatalf("%d events cached, want %d", len(s.corr.cache.entries), 2*n)
				}
				f := s.flights[reqs[0].id]
				s.outcome(result{id: reqs[0].id, outcome: writeOK, reached: true}, now)
				s.observe(line{level: levelError, plugin: f.j.key.plugin, text: f.j.lines.message, at: now})
				now = now.Add(time.Millisecond)
			}
		})
	}
}

// TestUnwrittenAgeAndBoundAreShown: the gauges show the first line of the
// oldest event never written, and the bound of a new line: a refill for
// each plugin waiting, one for a new event of its shape after it, plus the
// write.
func TestUnwrittenAgeAndBoundAreShown(t *testing.T) {
	h, _, clk := newTestHarness(t, testConfig(all, 1.0/300, 1, 64))
	h.observe(ln(levelError, "errors", "upstream A down", clk.Now()))
	drain(h) // A takes the one token
	first := clk.Now().Add(time.Second)
	clk.SetTime(first)
	h.observe(ln(levelError, "errors", "upstream B down", first))
	clk.Step(time.Second)
	h.observe(ln(levelError, "forward", "upstream C down", clk.Now()))
	drain(h)
	d := &delays[levelError]
	if got := time.Unix(0, d.since.Load()); !got.Equal(first) {
		t.Errorf("oldest unwritten since %v, want B's first line at %v", got, first)
	}
	got, want := time.Duration(d.bound.Load()), 3*300*time.Second+writeTimeout
	if (got - want).Abs() > time.Microsecond { // refills are float seconds
		t.Errorf("bound %v with two plugins waiting, want %v", got, want)
	}
	h.advance(20 * time.Minute)
	if since := d.since.Load(); since != 0 || delays[levelError].age() != 0 {
		t.Errorf("oldest unwritten since %v once all are written, want none", time.Unix(0, since))
	}
}

// TestUnwrittenAgeIsTimeThatPassed: the age of the oldest event never
// written is the time that passed since its first line, not the distance
// of the wall clock, which may have stepped back meanwhile.
func TestUnwrittenAgeIsTimeThatPassed(t *testing.T) {
	clk := newSteppedClock()
	h := newHarnessOn(t, testConfig(all, 1.0/300, 1, 64), newFakeAPI(t, clk), clk, testPod())
	h.observe(ln(levelError, "errors", "upstream A down", clk.Now()))
	drain(h) // A takes the one token
	h.observe(ln(levelError, "errors", "upstream B down", clk.Now()))
	clk.Step(10 * time.Second)
	clk.stepWall(-time.Hour)
	h.observe(ln(levelError, "forward", "upstream C down", clk.Now()))
	drain(h)
	if age := time.Duration(clk.Now().UnixNano() - delays[levelError].since.Load()); age != 10*time.Second {
		t.Errorf("oldest unwritten for %v by the wall clock now, want the 10s that passed", age)
	}
}

// TestNewLineOfQuietPluginIsWrittenWithinOneRefillDespiteBacklog: one
// plugin's backlog of distinct lines holds back another plugin's first
// line by no more than the next refill.
func TestNewLineOfQuietPluginIsWrittenWithinOneRefillDespiteBacklog(t *testing.T) {
	h, api, clk := newTestHarness(t, testConfig(all, 1.0/300, 1, 4096))
	for i := range 200 {
		h.observe(ln(levelError, "errors", fmt.Sprintf("2 q%d.example.net. A: i/o timeout", i), clk.Now()))
	}
	drain(h)
	h.advance(10 * time.Minute)
	logged := clk.Now()
	h.observe(ln(levelError, "reload", "Corefile changed but reload failed", logged))
	h.advance(300 * time.Second)
	for _, ev := range api.list() {
		if strings.HasPrefix(ev.Message, "plugin/reload: ") {
			return
		}
	}
	t.Errorf("the reload line logged at %v is not written after one refill", logged)
}

// TestNewEventsAndUpdatesAlternate: within a shape, when both wait, an
// update of a written event and new events take turns, new first, so
// that neither waits for all of the other.
func TestNewEventsAndUpdatesAlternate(t *testing.T) {
	h, api, clk := newTestHarness(t, testConfig(all, 1.0/300, 1, 64))
	h.observe(ln(levelError, "errors", "upstream 1 down", clk.Now())) // W, X and Y: one shape
	h.observe(ln(levelError, "errors", "upstream 2 down", clk.Now()))
	drain(h) // W is written, X waits
	h.observe(ln(levelError, "errors", "upstream 3 down", clk.Now()))
	h.observe(ln(levelError, "errors", "upstream 1 down", clk.Now()))
	h.advance(3 * 300 * time.Second)
	var verbs []string
	for _, r := range eventRequests(api) {
		verbs = append(verbs, r.verb)
	}
	if got := strings.Join(verbs, " "); got != "create patch create create" {
		t.Errorf("requests %q, want W's create, W's update (a new event went last), then X's and Y's", got)
	}
}

// cpuTime is the CPU time the process has used: on a shared machine, what
// a pass costs, whatever else runs.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// TestPluginsTakeTurns: plugins with lines waiting take the tokens in
// turn, least recently served first: neither waits for all of the other.
func TestPluginsTakeTurns(t *testing.T) {
	h, api, clk := newTestHarness(t, testConfig(all, 1.0/300, 1, 64))
	for i := range 3 {
		h.observe(ln(levelError, "a", fmt.Sprint("upstream ", i, " down"), clk.Now()))
		h.observe(ln(levelError, "b", fmt.Sprint("upstream ", i, " down"), clk.Now()))
	}
	drain(h)
	h.advance(5*300*time.Second + time.Second)
	var plugins []string
	evs := api.list()
	slices.SortFunc(evs, func(x, y corev1.Event) int { return strings.Compare(x.Name, y.Name) }) // names grow with time
	for _, ev := range evs {
		plugins = append(plugins, ev.Labels[labelPlugin])
	}
	if got := strings.Join(plugins, " "); got != "a b a b a b" {
		t.Errorf("plugins in the order of their writes %q, want a b a b a b", got)
	}
}

// TestNewEventGoesBeforeUpdateOnceIdle: a plugin with nothing pending
// whose written event and a new one come at once writes the new one first.
func TestNewEventGoesBeforeUpdateOnceIdle(t *testing.T) {
	h, api, clk := newTestHarness(t, testConfig(all, 1.0/300, 1, 64))
	h.observe(ln(levelError, "errors", "upstream W down", clk.Now()))
	drain(h)
	h.advance(600 * time.Second)
	h.observe(ln(levelError, "errors", "upstream W down", clk.Now()))
	h.observe(ln(levelError, "errors", "upstream X down", clk.Now()))
	drain(h)
	reqs := eventRequests(api)
	if len(reqs) != 2 || reqs[1].verb != "create" {
		t.Errorf("%d requests, the second a %s; want W's create, then X's", len(reqs), reqs[len(reqs)-1].verb)
	}
}

// TestPassThatReadsThePodIsLogarithmic: a scheduling decision costs
// O(log n) in the pending events. Without COREDNS_POD_UID, while the
// pod's read fails (a 500: the API server is unwell), every try of the
// read is a pass that hands out one request; it costs about the same at
// 4096 and at 65,536 pending creates, not 16 times as much.
func TestPassThatReadsThePodIsLogarithmic(t *testing.T) {
	pass := func(n int) time.Duration {
		s := newScheduler(testConfig(all, 1000, 1, 2*n), testPodWithoutUID(), epoch)
		now := epoch
		for i := range n {
			s.observe(ln(levelError, fmt.Sprint("p", i/ownEvents), fmt.Sprint("upstream ", i, " down"), now))
		}
		best := time.Duration(math.MaxInt64)
		for range 7 {
			cpu := cpuTime()
			reqs, _ := s.dispatch(now)
			took := cpuTime() - cpu
			if len(reqs) != 1 || reqs[0].verb != verbListPod {
				t.Fatalf("%d requests in the pass, want the pod's read", len(reqs))
			}
			best = min(best, took)
			s.outcome(result{id: reqs[0].id, outcome: writeFailed, reached: true, unsure: true, err: fmt.Errorf("500")}, now)
			now = now.Add(2 * time.Minute) // past the backoff
		}
		return best
	}
	small, large := pass(4096), pass(65536)
	if large > 4*max(small, 100*time.Microsecond) { // below 100 µs, the CPU clock's grain decides
		t.Errorf("a pass that hands out the pod's read costs %v at 65,536 pending and %v at 4096: %.1f times as much, want about the same", large, small, float64(large)/float64(small))
	}
}

// TestQuietPluginsLineIsNotHeldBehindAnotherPluginsRecreate: with the API
// answering, a line of a plugin with nothing pending waits at most (1 +
// the other plugins waiting before it is written) refills (README). A
// loud plugin whose written event the API server's event TTL removed (1 h
// by default: the normal course, no outage) takes one token for the
// patch, then, its patch answered 404, the next one for the re-create:
// two events ahead of the quiet plugin's line, not one.
func TestQuietPluginsLineIsNotHeldBehindAnotherPluginsRecreate(t *testing.T) {
	const refill = 300 * time.Second
	h, api, clk := newTestHarness(t, testConfig(all, 1/refill.Seconds(), 1, 64))
	h.observe(ln(levelError, "forward", "upstream X down", clk.Now()))
	drain(h) // forward's event is written: forward served first
	h.advance(refill)
	h.observe(ln(levelError, "reload", "Corefile changed", clk.Now()))
	drain(h) // then reload's
	h.advance(time.Hour)
	// The event TTL removes forward's event.
	api.mu.Lock()
	for k, ev := range api.events {
		if strings.HasPrefix(ev.Message, "plugin/forward: ") {
			delete(api.events, k)
		}
	}
	api.mu.Unlock()
	h.observe(ln(levelError, "cache", "a line of a third plugin", clk.Now()))
	drain(h) // takes the token there is: the bucket is empty
	logged := clk.Now()
	h.observe(ln(levelError, "forward", "upstream X down", logged)) // an update: a patch, which finds it gone
	h.observe(ln(levelError, "reload", "Corefile changed but reload failed", logged))
	bound := 2 * refill // 1 + 1, counting forward as a plugin waiting, generously
	h.advance(bound + time.Second)
	for _, ev := range api.list() {
		if ev.Message == "plugin/reload: Corefile changed but reload failed" {
			return
		}
	}
	var got []string
	for _, r := range eventRequests(api) {
		if !r.at.Before(logged) {
			got = append(got, fmt.Sprintf("%v %s %d", r.at.Sub(logged), r.verb, r.code))
		}
	}
	t.Errorf("reload's line, its plugin with nothing pending, is not written %v after it was logged (bound %v); requests since: %v", bound+time.Second, bound, got)
}

// TestNewShapeOfABusyPluginIsServedBeforeMoreOfAnotherShape: tokens go to
// the plugins least recently served first, then to the shapes within a
// plugin, so that a client's timeouts, one shape, never hold back a
// genuine refusal of the same plugin, a shape never served: it takes the
// plugin's next turn, not the turn after eleven timeouts.
func TestNewShapeOfABusyPluginIsServedBeforeMoreOfAnotherShape(t *testing.T) {
	const refill = 300 * time.Second
	h, api, clk := newTestHarness(t, testConfig(all, 1/refill.Seconds(), 1, 4096))
	for i := range ownEvents + 1 {
		h.observe(ln(levelError, "errors", fmt.Sprintf("2 kw%c.client.example. A: read udp 10.0.0.9:%d->192.0.2.53:53: i/o timeout", 'a'+i, 30000+i), clk.Now()))
	}
	drain(h) // the first timeout takes the token there is
	h.advance(time.Second)
	logged := clk.Now()
	h.observe(ln(levelError, "errors", "2 db.corp.example. A: read udp 10.0.0.5:40001->10.0.0.2:53: read: connection refused", logged))
	h.advance(2 * refill)
	for _, ev := range api.list() {
		if strings.Contains(ev.Message, "connection refused") {
			return
		}
	}
	t.Errorf("the refusal logged at %v, the plugin's only line of its shape, is not written two refills later; the %d events written are all timeouts, of one shape", logged, len(api.list()))
}

// TestQuietPluginsLineIsNotHeldBySlowWritesOfALoudOne: with the API
// answering, if slowly (9 s a write, within the 10 s time-out: an API
// server whose etcd is slow), a line of a plugin with nothing pending
// waits at most (1 + the other plugins waiting) refills plus its write's
// own time, at most 10 s (README). Tokens are plenty (rate 100 100), yet
// the loud plugin's 8 writes in flight fill the bucket's cap of requests
// in flight, and the quiet plugin's create waits for one of them to end
// before its own 9 s: 17 s.
func TestQuietPluginsLineIsNotHeldBySlowWritesOfALoudOne(t *testing.T) {
	h, api, clk := newTestHarness(t, testConfig(all, 100, 100, 1024))
	const slow = 9 * time.Second
	h.hold = func(request) time.Duration { return slow }
	for i := range 20 {
		h.observe(ln(levelError, "errors", fmt.Sprintf("upstream kw%c unhealthy", 'a'+i), clk.Now()))
	}
	h.advance(time.Second)
	logged := clk.Now()
	h.observe(ln(levelError, "reload", "Corefile changed but reload failed", logged))
	key := eventKey{level: levelError, plugin: "plugin/reload: ", message: "plugin/reload: Corefile changed but reload failed"}
	bound := 2*time.Second/100 + writeTimeout // (1 + 1) refills and the write's time
	for clk.Since(logged) < bound {
		h.advance(10 * time.Millisecond)
		if e := h.entry(key); e != nil && e.carried > 0 {
			return
		}
	}
	sent := time.Duration(-1)
	for _, r := range eventRequests(api) {
		if r.verb == "create" && !r.at.Before(logged) && sent < 0 {
			sent = r.at.Sub(logged)
		}
	}
	t.Errorf("reload's line, its plugin with nothing pending, is not written %v after it was logged (bound %v), though every write answers in %v: its create was sent %v after the line", clk.Since(logged), bound, slow, sent)
}

// TestPluginWaitingOnAnUpdateGoesOnceBeforeAQuietPluginsLine: the plugins
// with lines waiting count in the bound of a quiet plugin's line whether
// they wait on a new event or on an update: one served before the quiet
// plugin was last goes ahead of its line once, and once only.
func TestPluginWaitingOnAnUpdateGoesOnceBeforeAQuietPluginsLine(t *testing.T) {
	const refill = 300 * time.Second
	h, api, clk := newTestHarness(t, testConfig(all, 1/refill.Seconds(), 1, 64))
	h.observe(ln(levelError, "p", "upstream A down", clk.Now()))
	drain(h)                                                     // p's event is written: p served first
	h.observe(ln(levelError, "p", "upstream A down", clk.Now())) // an update of p waits
	h.observe(ln(levelError, "q", "upstream B down", clk.Now()))
	h.advance(refill) // q, never served, goes before p: B is written
	logged := clk.Now()
	h.observe(ln(levelError, "q", "reload failed", logged)) // q has nothing pending
	h.advance(2*refill + writeTimeout)
	var order []string
	for _, r := range eventRequests(api) {
		order = append(order, r.verb)
	}
	if got := strings.Join(order, " "); got != "create create patch create" {
		t.Errorf("requests %q, want p's create, q's, p's update, then q's new line", got)
	}
}

// TestRepeatWaitingWithATokenIsNotThrottled: a line of an event already
// waiting for its write, while its bucket has a token, counts no throttled
// write: the event goes at the next dispatch.
func TestRepeatWaitingWithATokenIsNotThrottled(t *testing.T) {
	h, api, clk := newTestHarness(t, testConfig(all, 100, 100, 64))
	before := testutil.ToFloat64(throttled[levelError])
	h.observe(ln(levelError, "errors", "upstream down", clk.Now()))
	h.observe(ln(levelError, "errors", "upstream down", clk.Now()))
	drain(h)
	if got := testutil.ToFloat64(throttled[levelError]) - before; got != 0 {
		t.Errorf("throttled_total rose by %v with tokens to spare", got)
	}
	if ev := only(t, events(t, api)); ev.Count != 2 {
		t.Errorf("count %d, want 2", ev.Count)
	}
}

// TestPluginWhoseRequestsCameBackHasNoneOut: once a plugin's requests are
// answered it has none out, so with its bucket's maxInFlight requests of
// another plugin hanging, its next line is still sent.
func TestPluginWhoseRequestsCameBackHasNoneOut(t *testing.T) {
	h, api, clk := newTestHarness(t, testConfig(all, 100, 100, 64))
	for i := range maxInFlight {
		h.observe(ln(levelError, "a", fmt.Sprint("upstream ", i, " down"), clk.Now()))
	}
	drain(h) // answered at once
	h.lostAfter = writeTimeout
	api.setFault(func(apiRequest) fault { return fault{lost: true, apply: true} })
	for i := range maxInFlight {
		h.observe(ln(levelError, "b", fmt.Sprint("upstream ", i, " down"), clk.Now()))
	}
	drain(h)
	h.observe(ln(levelError, "a", "resolver gone", clk.Now()))
	h.advance(writeTimeout / 2)
	if n := len(reachedAt(api, "CoreDNSError")); n != 2*maxInFlight+1 {
		t.Errorf("%d error requests reached the API, want %d: the quiet plugin's line held back", n, 2*maxInFlight+1)
	}
}
