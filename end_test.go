package k8s_event

import (
	"fmt"
	"math"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// withQuiet is testConfig with every level and the given quiet.
func withQuiet(qps float64, burst int, quiet time.Duration) config {
	c := testConfig(all, qps, burst, 64)
	c.quiet = quiet
	return c
}

// ofReason lists the events of reason.
func ofReason(evs []corev1.Event, reason string) []corev1.Event {
	var out []corev1.Event
	for _, e := range evs {
		if e.Reason == reason {
			out = append(out, e)
		}
	}
	return out
}

// endsIn lists the end events the fake API holds.
func endsIn(api *fakeAPI) []corev1.Event {
	var out []corev1.Event
	for _, e := range api.list() {
		if strings.HasSuffix(e.Reason, "Ended") {
			out = append(out, e)
		}
	}
	return out
}

// logStorm hands over n distinct lines of one shape, numbered from from.
func logStorm(h *harness, l level, from, n int, at time.Time) {
	for i := from; i < from+n; i++ {
		h.observe(ln(l, "errors", fmt.Sprintf("2 q%d.example.net. A: read udp 10.0.0.5:%d->10.0.0.2:53: i/o timeout", i, 40000+i), at))
	}
}

// repeatLine hands over one line n times.
func repeatLine(h *harness, l level, plugin, msg string, n int) {
	for range n {
		h.observe(ln(l, plugin, msg, h.clk.Now()))
	}
}

func combinedOf(evs []corev1.Event) []corev1.Event {
	var out []corev1.Event
	for _, e := range evs {
		if strings.Contains(e.Message, combinedPrefix) {
			out = append(out, e)
		}
	}
	return out
}

// onceFault is f for the first request of verb, and no fault else.
func onceFault(verb string, f fault) func(apiRequest) fault {
	done := false
	return func(r apiRequest) fault {
		if r.verb != verb || done {
			return fault{}
		}
		done = true
		return f
	}
}

// apiDown makes every request fail to connect while *down holds.
func apiDown(api *fakeAPI, down *bool) {
	api.setFault(func(apiRequest) fault { return fault{unsent: *down} })
}

// TestStormEndIsSaid: a storm that has had no new line for quiet gets one
// Normal end event with its labels, total and times; the lines it stands
// for stay out of the ledger; a storm that comes back is a new object and
// ends again. Events that are no storm get no end.
func TestStormEndIsSaid(t *testing.T) {
	const quiet = time.Minute
	h, api, clk := newTestHarness(t, withQuiet(100, 100, quiet))
	before := readLedger()
	endedBefore := testutil.ToFloat64(ended[levelError])

	start := clk.Now()
	logStorm(h, levelError, 0, 20, start)
	h.advance(10 * time.Second)
	logStorm(h, levelError, 20, 20, clk.Now())
	h.observe(ln(levelError, "forward", "one line, no storm", clk.Now()))
	repeatLine(h, levelInfo, "forward", "info storm", 20) // no end is said of it
	last := clk.Now()
	drain(h)

	h.advance(quiet + handOffGrace - time.Millisecond)
	if n := len(endsIn(api)); n != 0 {
		t.Fatalf("%d end events before the storm was quiet for %v", n, quiet)
	}
	h.advance(time.Millisecond)
	evs := events(t, api)
	ends := ofReason(evs, "CoreDNSErrorEnded")
	storm := only(t, combinedOf(evs))
	end := only(t, ends)
	if end.Type != corev1.EventTypeNormal || end.Labels[labelPlugin] != "errors" || end.Labels[labelLevel] != "error" {
		t.Errorf("end event type %s labels %v", end.Type, end.Labels)
	}
	if storm.Count != 30 {
		t.Errorf("combined count %d, want 30", storm.Count)
	}
	want := fmt.Sprintf(`plugin/errors: 30 lines like "<n> <name>. <type>: read udp <ip>-><ip>: i/o timeout" from %s to %s, none since`,
		start.Format(time.TimeOnly), last.Format(time.TimeOnly))
	if end.Message != want {
		t.Errorf("end message\n%s\nwant\n%s", end.Message, want)
	}
	if end.InvolvedObject != testRef || end.Count != 1 {
		t.Errorf("end about %+v count %d", end.InvolvedObject, end.Count)
	}
	if n := testutil.ToFloat64(ended[levelError]) - endedBefore; n != 1 {
		t.Errorf("ended_total rose by %v, want 1", n)
	}
	if len(evs) != 10+1+1+1+1 { // ten lines of their own, the storm, the forward line, the info storm, the end
		t.Errorf("%d events, want 14:\n%v", len(evs), evs)
	}
	checkLedger(t, api, before, 40+1+20)

	// Quiet stays quiet: no second end.
	h.advance(3 * quiet)
	if n := len(endsIn(api)); n != 1 {
		t.Fatalf("%d end events after a longer quiet, want 1", n)
	}

	// The storm comes back: its lines count on the same object, and a new end follows.
	again := clk.Now()
	logStorm(h, levelError, 1000, 5, again)
	h.advance(quiet + handOffGrace)
	evs = events(t, api)
	combined := only(t, combinedOf(evs))
	if combined.Name != storm.Name || combined.Count != 35 {
		t.Errorf("the storm that came back: %s count %d, want %s with 35", combined.Name, combined.Count, storm.Name)
	}
	if ends := ofReason(evs, "CoreDNSErrorEnded"); len(ends) != 2 || !strings.Contains(ends[0].Message+ends[1].Message, ": 5 lines like \"<n> <name>.") {
		t.Errorf("end events after the storm came back:\n%v", ends)
	}
	checkLedger(t, api, before, 40+1+20+5)
}

// TestQuietOffSaysNoEnd: with quiet off, a storm's end is not said.
func TestQuietOffSaysNoEnd(t *testing.T) {
	h, api, clk := newTestHarness(t, withQuiet(100, 100, 0))
	logStorm(h, levelWarning, 0, 40, clk.Now())
	h.advance(24 * time.Hour)
	for _, e := range endsIn(api) {
		t.Fatalf("end event with quiet off: %+v", e)
	}
	if n := len(h.s.ends.list); n != 0 {
		t.Errorf("%d ends wait with quiet off", n)
	}
	// Written, with no end to watch for: the scheduler looks at them no
	// more.
	if n := h.s.timers.Len(); n != 0 {
		t.Errorf("%d entries still looked at once written with quiet off", n)
	}
}

// TestEndCreateUnansweredIsWrittenOnce: an end whose create reached the
// API and got no answer is retried under the same name; it is one event.
func TestEndCreateUnansweredIsWrittenOnce(t *testing.T) {
	h, api, _ := newTestHarness(t, withQuiet(100, 100, time.Minute))
	h.lostAfter = writeTimeout
	endedBefore := testutil.ToFloat64(ended[levelWarning])
	existsBefore := testutil.ToFloat64(apiExpected.WithLabelValues("409", "exists"))
	repeatLine(h, levelWarning, "errors", "upstream slow", 12)
	drain(h)
	api.setFault(onceFault("create", fault{lost: true, apply: true})) // the end's first create: applied, unanswered
	h.advance(time.Minute + handOffGrace)
	if n := testutil.ToFloat64(ended[levelWarning]) - endedBefore; n != 0 {
		t.Errorf("ended_total rose by %v before the unanswered create came back, want 0", n)
	}
	api.setFault(nil)
	h.advance(retryMax * 2)
	if ends := ofReason(events(t, api), "CoreDNSWarningEnded"); len(ends) != 1 {
		t.Fatalf("%d end events, want 1", len(ends))
	}
	if n := testutil.ToFloat64(ended[levelWarning]) - endedBefore; n != 1 {
		t.Errorf("ended_total rose by %v, want 1", n)
	}
	creates := 0
	api.mu.Lock()
	for _, r := range api.requests {
		if r.reason == "CoreDNSWarningEnded" {
			creates++
		}
	}
	api.mu.Unlock()
	if creates != 2 {
		t.Errorf("%d requests of the end, want 2 (the unanswered one, the retry)", creates)
	}
	if n := len(h.s.ends.list); n != 0 {
		t.Errorf("%d ends still wait once written", n)
	}
	// The retry's 409 is the end written by the first try: expected.
	if n := testutil.ToFloat64(apiExpected.WithLabelValues("409", "exists")) - existsBefore; n != 1 {
		t.Errorf(`api_expected_total{code="409",outcome="exists"} rose by %v, want 1`, n)
	}
}

// TestEndsHaveTheirOwnBucket: a storm that empties its level's bucket
// leaves its end the tokens of the end bucket, and the end takes none of
// the level's; an end that finds the end bucket empty waits, counted as
// throttled under its reason.
func TestEndsHaveTheirOwnBucket(t *testing.T) {
	h, api, clk := newTestHarness(t, withQuiet(1.0/3600, 1, time.Minute))
	repeatLine(h, levelError, "errors", "upstream unhealthy", 15) // one create: the bucket's only token
	h.advance(time.Minute + handOffGrace)
	if n := len(ofReason(events(t, api), "CoreDNSErrorEnded")); n != 1 {
		t.Errorf("%d end events with the error bucket empty, want 1", n)
	}
	if w := h.s.buckets[levelError].wait(clk.Now()); w == 0 {
		t.Errorf("the error bucket has a token after the storm and its end, want it empty")
	}
	throttledBefore := testutil.ToFloat64(throttledEnd[levelWarning])
	repeatLine(h, levelWarning, "errors", "upstream slow", 15)
	h.advance(time.Minute + handOffGrace)
	if n := len(ofReason(events(t, api), "CoreDNSWarningEnded")); n != 0 {
		t.Errorf("%d warning end events with the end bucket empty, want 0", n)
	}
	if n := testutil.ToFloat64(throttledEnd[levelWarning]) - throttledBefore; n != 1 {
		t.Errorf("throttled_total of the end rose by %v, want 1", n)
	}
	if n := len(h.s.ends.list); n != 1 {
		t.Errorf("%d ends wait for a token, want 1", n)
	}
}

// TestEndsWithinCacheSize: the ends waiting to be written share CACHESIZE
// with the cached events and the settling ones: a reload that shrinks it
// keeps the oldest ends that fit, and a new event takes the unit of an end
// when no event is left to evict.
func TestEndsWithinCacheSize(t *testing.T) {
	const quiet = time.Minute
	cfg := withQuiet(100, 100, quiet)
	cfg.cacheSize = 8 // four storms and their four ends
	h, api, _ := newTestHarness(t, cfg)
	forgottenBefore := testutil.ToFloat64(forgotten[levelWarning])
	for i := range 4 { // four storms of their own, each one event of 12 lines
		repeatLine(h, levelWarning, fmt.Sprintf("p%d", i), "upstream unhealthy", 12)
	}
	drain(h)
	down := true // the API server is unreachable: the ends wait
	apiDown(api, &down)
	h.advance(quiet + handOffGrace)
	if n := len(h.s.ends.list); n != 4 {
		t.Fatalf("%d ends waiting before the reload, want 4", n)
	}
	oldest := h.s.ends.list[0]

	small := cfg
	small.cacheSize = 1
	h.apply(small)
	if n := len(h.s.ends.list); n != 1 || h.s.ends.list[0] != oldest {
		t.Errorf("%d ends waiting after a reload to CACHESIZE 1, want the oldest one", n)
	}
	// One more storm: its event takes the unit of the end waiting, and its own end waits.
	repeatLine(h, levelWarning, "p9", "upstream unhealthy", 12)
	down = false
	drain(h)
	down = true
	h.advance(quiet + handOffGrace)
	if n := len(h.s.ends.list); n != 1 {
		t.Errorf("%d ends waiting with CACHESIZE 1, want 1", n)
	}
	down = false
	h.advance(2 * retryMax)
	if n := len(endsIn(api)); n != 1 {
		t.Errorf("%d ends written after the API came back, want the %d that may wait", n, small.cacheSize)
	}
	// Five ends were decided: one written, the four others counted as forgotten.
	if got := testutil.ToFloat64(forgotten[levelWarning]) - forgottenBefore; got != 4 {
		t.Errorf("%v ends counted as forgotten, want the 4 of 5 never written", got)
	}
}

// TestEndsShrinkWhileEndInFlight: a reload that shrinks CACHESIZE keeps
// the oldest ends and leaves one in flight to its write; if that write
// fails, the end is held to the new size once it is back.
func TestEndsShrinkWhileEndInFlight(t *testing.T) {
	const quiet = time.Minute
	cfg := withQuiet(100, 100, quiet)
	cfg.cacheSize = 4
	h, api, _ := newTestHarness(t, cfg)
	h.lostAfter = writeTimeout
	repeatLine(h, levelWarning, "p0", "upstream unhealthy", 12)
	drain(h)
	api.setFault(func(r apiRequest) fault {
		if r.verb == "create" {
			return fault{code: http.StatusServiceUnavailable, retryAfter: 3600} // a 429 would hold every write
		}
		return fault{}
	})
	h.advance(quiet + handOffGrace) // the first storm's end: asked to wait an hour
	if n := len(h.s.ends.list); n != 1 {
		t.Fatalf("%d ends waiting, want 1", n)
	}
	api.setFault(nil)

	// A second storm, whose end's create gets no answer for writeTimeout.
	repeatLine(h, levelWarning, "p1", "upstream unhealthy", 12)
	drain(h)
	api.setFault(onceFault("create", fault{lost: true})) // the end's create
	h.advance(quiet + handOffGrace)
	if n := len(h.s.ends.list); n != 2 || h.s.ends.list[1].inflight == 0 {
		t.Fatalf("%d ends waiting, want 2, the second in flight", n)
	}
	small := cfg
	small.cacheSize = 1
	h.apply(small)
	api.setFault(nil)
	h.advance(writeTimeout) // the second end's create comes back unanswered
	if n := len(h.s.ends.list); n > small.cacheSize {
		t.Errorf("%d ends waiting after a reload to CACHESIZE %d (one was in flight at the reload and failed), want at most %d", n, small.cacheSize, small.cacheSize)
	}
	h.advance(2 * time.Hour)
	if n := len(endsIn(api)); n != small.cacheSize {
		t.Errorf("%d ends written after the API came back, want the %d kept", n, small.cacheSize)
	}
}

// TestEndsReloadRateWakesThrottledEnds: "events that waited for a token
// are looked at again at once under the new rate". An end that waits for
// a token of its bucket is an event too.
func TestEndsReloadRateWakesThrottledEnds(t *testing.T) {
	const quiet = time.Minute
	h, api, _ := newTestHarness(t, withQuiet(1.0/3600, 1, quiet))
	for range 12 { // two storms, one per level: each takes its level's only token
		h.observe(ln(levelWarning, "errors", "upstream slow", h.clk.Now()))
		h.observe(ln(levelError, "errors", "upstream unhealthy", h.clk.Now()))
	}
	h.advance(quiet + handOffGrace) // both end; the first takes the end bucket's token, the second waits an hour
	if n := len(endsIn(api)); n != 1 {
		t.Fatalf("%d ends written with one token, want 1", n)
	}
	// A line event that waits for a token too: the warning bucket is empty.
	h.observe(ln(levelWarning, "forward", "a lone line", h.clk.Now()))
	drain(h)
	if n := len(api.list()); n != 3 {
		t.Fatalf("%d events before the reload, want 3", n)
	}

	h.apply(withQuiet(1000, 1, quiet))
	h.advance(10 * time.Millisecond)
	lineWritten := false
	for _, e := range api.list() {
		lineWritten = lineWritten || strings.Contains(e.Message, "a lone line")
	}
	if !lineWritten {
		t.Errorf("the line event that waited for a token was not written within 10ms of a reload to 1000 QPS")
	}
	if n := len(endsIn(api)); n != 2 {
		t.Errorf("%d ends written within 10ms of a reload to 1000 QPS, want 2: the end that waited still waits for the old rate's refill", n)
	}
}

// TestEndsQuietOffSaysNoMoreEnds: "A reload takes the new value at once:
// `off` says no more ends". An end decided before a reload to `quiet off`
// and not yet written is not written after it.
func TestEndsQuietOffSaysNoMoreEnds(t *testing.T) {
	const quiet = time.Minute
	h, api, _ := newTestHarness(t, withQuiet(100, 100, quiet))
	repeatLine(h, levelError, "errors", "upstream unhealthy", 12)
	drain(h)
	down := true
	apiDown(api, &down)
	h.advance(quiet + handOffGrace) // the end is decided; its create cannot reach the API
	if n := len(h.s.ends.list); n != 1 {
		t.Fatalf("%d ends waiting while the API was unreachable, want 1", n)
	}
	h.apply(withQuiet(100, 100, 0)) // quiet off
	down = false
	h.advance(2 * retryMax)
	if ends := endsIn(api); len(ends) != 0 {
		t.Errorf("%d ends written after a reload to quiet off: %q", len(ends), ends[0].Message)
	}
}

// TestEndsQuietOffWhileEndInFlight: an end whose create is in flight when
// the reload to `quiet off` comes, and which then fails without being
// applied, is not tried again.
func TestEndsQuietOffWhileEndInFlight(t *testing.T) {
	const quiet = time.Minute
	h, api, _ := newTestHarness(t, withQuiet(100, 100, quiet))
	h.lostAfter = writeTimeout
	repeatLine(h, levelError, "errors", "upstream unhealthy", 12)
	drain(h)
	api.setFault(onceFault("create", fault{lost: true})) // the end's create
	h.advance(quiet + handOffGrace)                      // the end is decided, its create goes out
	if n := len(h.s.ends.list); n != 1 || h.s.ends.list[0].inflight == 0 {
		t.Fatalf("%d ends waiting, want 1 in flight", n)
	}
	h.apply(withQuiet(100, 100, 0)) // quiet off while the end's create is in flight
	api.setFault(nil)
	h.advance(2 * retryMax)
	if ends := endsIn(api); len(ends) != 0 {
		t.Errorf("%d ends written after a reload to quiet off (the end's create was in flight at the reload and failed): %q", len(ends), ends[0].Message)
	}
	if n := len(h.s.ends.list); n != 0 {
		t.Errorf("%d ends wait with quiet off", n)
	}
}

// checkStormGoesOn fails the test if an end was said for the storm of
// CoreDNSError lines, or if its lines went into more than one object.
func checkStormGoesOn(t *testing.T, api *fakeAPI) {
	t.Helper()
	for _, e := range endsIn(api) {
		t.Errorf("end said although a line came just before the quiet was up: %q", e.Message)
	}
	var objects []string
	for _, e := range api.list() {
		if e.Reason == "CoreDNSError" {
			objects = append(objects, fmt.Sprintf("%s count %d", e.Name, e.Count))
		}
	}
	if len(objects) != 1 {
		t.Errorf("the storm's lines are in %d objects, want 1: %v", len(objects), objects)
	}
}

// TestEndWaitsForLineInHandOff: a storm ends after QUIET "without a new
// line". A line logged 1 ms before the quiet was up and still waiting in
// the listener's hand-off when the quiet is up keeps the storm going: no
// end is decided while it waits there.
func TestEndWaitsForLineInHandOff(t *testing.T) {
	const quiet = time.Minute
	h, api, clk := newTestHarness(t, withQuiet(100, 100, quiet))
	repeatLine(h, levelError, "errors", "upstream unhealthy", 12)
	drain(h)
	last := clk.Now()
	h.lines <- ln(levelError, "errors", "upstream unhealthy", last.Add(quiet-time.Millisecond)) // the listener's hand-off
	clk.SetTime(last.Add(quiet + 2*handOffGrace))
	if _, wake := h.s.dispatch(clk.Now()); len(h.s.ends.list) != 0 || wake.IsZero() {
		t.Fatalf("an end was decided while a line of before the quiet waited in the hand-off")
	}
	drain(h) // the line is taken
	checkStormGoesOn(t, api)
	if e := h.entry(eventKey{level: levelError, plugin: "plugin/errors: ", message: "plugin/errors: upstream unhealthy"}); e == nil || e.seen != 13 {
		t.Errorf("the storm's entry %+v, want 13 lines", e)
	}
}

// TestEndWaitsForLineOnItsWay: a line logged just before the quiet was up
// and handed over within handOffGrace after it keeps the storm going, even
// when a later line of another plugin was handed over first.
func TestEndWaitsForLineOnItsWay(t *testing.T) {
	const quiet = time.Minute
	h, api, clk := newTestHarness(t, withQuiet(100, 100, quiet))
	repeatLine(h, levelError, "errors", "upstream unhealthy", 12)
	drain(h)
	last := clk.Now()
	h.advance(quiet)
	h.observe(ln(levelWarning, "forward", "a line of another plugin", clk.Now())) // handed over first
	h.advance(handOffGrace - time.Millisecond)
	h.observe(ln(levelError, "errors", "upstream unhealthy", last.Add(quiet-time.Millisecond))) // the storm's, on its way
	drain(h)
	checkStormGoesOn(t, api)
}

// TestSteadyStormIsNotSaidToEnd: a storm of one distinct line a minute,
// one shape, never stops, and with the default quiet no end is said of it
// while its lines come; from its 11th line on each joins the combined
// event.
func TestSteadyStormIsNotSaidToEnd(t *testing.T) {
	h, api, clk := newTestHarness(t, withQuiet(100, 100, defaultQuiet))
	for i := range 40 {
		logStorm(h, levelError, i, 1, clk.Now())
		h.advance(time.Minute)
		if ends := endsIn(api); len(ends) > 0 {
			t.Fatalf("minute %d: an end is said while a line of the storm's shape comes every minute: %q", i, ends[0].Message)
		}
	}
	own := 0
	for _, e := range api.list() {
		if e.Reason == "CoreDNSError" && !strings.Contains(e.Message, combinedPrefix) {
			own++
		}
	}
	if own > ownEvents {
		t.Errorf("%d lines of the storm are events of their own, want the first %d only", own, ownEvents)
	}
}

// stormOf adds n lines to the storm of one message, as if seen: one line
// through observe, the rest to its tally.
func stormOf(h *harness, n int64) *entry {
	h.observe(ln(levelError, "errors", "upstream unhealthy", h.clk.Now()))
	e := h.entry(eventKey{level: levelError, plugin: "plugin/errors: ", message: "plugin/errors: upstream unhealthy"})
	e.seen += n - 1
	pendingLines.Add(float64(n - 1))
	return e
}

// TestFullStormGetsItsEnd: an event's count is an int32; a storm of
// exactly 2^31-1 lines fills one object, and one of 5 more goes on in a
// second: each is said to end once quiet, with its total, whether the
// object filled up in its create or in a patch.
func TestFullStormGetsItsEnd(t *testing.T) {
	for _, tt := range []struct {
		first, lines int64 // lines in a first write, and in all
		objects      int
	}{
		{0, math.MaxInt32, 1}, {0, math.MaxInt32 + 5, 2},
		{12, math.MaxInt32, 1}, {12, math.MaxInt32 + 5, 2},
		{math.MaxInt32, math.MaxInt32 + 5, 2},
	} {
		t.Run(fmt.Sprint(tt.first, "+", tt.lines-tt.first), func(t *testing.T) {
			h, api, _ := newTestHarness(t, withQuiet(100, 100, time.Minute))
			before := readLedger()
			if tt.first > 0 {
				stormOf(h, tt.first)
				h.advance(time.Second)
			}
			stormOf(h, tt.lines-tt.first)
			h.advance(time.Minute + handOffGrace)
			var counts []int32
			for _, e := range ofReason(events(t, api), "CoreDNSError") {
				counts = append(counts, e.Count)
			}
			if len(counts) != tt.objects {
				t.Errorf("the storm is in objects of counts %v, want %d objects", counts, tt.objects)
			}
			ends := endsIn(api)
			if len(ends) != 1 || !strings.Contains(ends[0].Message, fmt.Sprintf(": %d lines like", tt.lines)) {
				t.Fatalf("ends %v, want one of %d lines", ends, tt.lines)
			}
			checkLedger(t, api, before, float64(tt.lines))
			if d := readLedger().since(before); d.pending != 0 {
				t.Errorf("%v lines pending, want none", d.pending)
			}
		})
	}
}

// TestClientLimiterDoesNotHoldTheFlush: "Ends still unwritten at shutdown
// are written in the flush if their bucket has a token". The client
// CoreDNS's kubeapi plugin builds gets client-go's default limiter, 5
// requests a second with a burst of 10, shared by every bucket; it is not
// used: the buckets are the limit. 40 ends, the end bucket full, are all
// written in a 2 s flush, in much less real time than the limiter allows.
func TestClientLimiterDoesNotHoldTheFlush(t *testing.T) {
	const quiet, storms = time.Minute, 40
	h, api, _ := newTestHarness(t, withQuiet(100, 100, quiet))
	for i := range storms {
		repeatLine(h, levelWarning, fmt.Sprintf("p%d", i), "upstream unhealthy", 12)
	}
	drain(h)
	down := true // the ends are decided while the API server is away
	apiDown(api, &down)
	h.advance(quiet + handOffGrace)
	if n := len(endsIn(api)); n != 0 {
		t.Fatalf("%d ends written while the API server was away", n)
	}
	// The API server is back, and CoreDNS shuts down: the flush writes the
	// ends with the client kubeapi gives, client-go's defaults.
	cs, err := kubernetes.NewForConfig(&rest.Config{Host: api.srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	h.client = cs
	start := time.Now()
	h.stop(2 * time.Second)
	took := time.Since(start)
	if n := len(endsIn(api)); n != storms {
		t.Errorf("%d of %d ends written in the flush with the end bucket full", n, storms)
	}
	if limited := time.Duration(float64(storms-rest.DefaultBurst) / float64(rest.DefaultQPS) * float64(time.Second)); took >= limited {
		t.Errorf("the flush's %d creates took %v, as long as client-go's default limiter (%v QPS, burst %d) makes them",
			storms, took, rest.DefaultQPS, rest.DefaultBurst)
	}
}

// TestFlushStormGetsItsEndOnceQuiet: a storm written during the flush at
// shutdown gets its end by the same rule as in service: once it has had
// no new line for quiet, if that comes before the deadline; then the end
// is written in the flush if its bucket has a token, held up neither by
// another event's hung create nor by another's Retry-After.
func TestFlushStormGetsItsEndOnceQuiet(t *testing.T) {
	for _, tt := range []struct {
		name    string
		since   time.Duration // from the storm's last line to stop
		other   fault         // the warning's first create at stop
		wantEnd bool
	}{
		{"quiet long past", 2 * time.Minute, fault{}, true},
		{"quiet up in the flush", time.Minute - time.Second, fault{}, true},
		{"quiet not up by the deadline", 10 * time.Second, fault{}, false},
		{"another's create hangs", 2 * time.Minute, fault{lost: true}, true},
		{"another waits a Retry-After", 2 * time.Minute, fault{code: http.StatusServiceUnavailable, retryAfter: 1}, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			h, api, clk := newTestHarness(t, withQuiet(100, 100, time.Minute))
			h.lostAfter = writeTimeout
			before := readLedger()
			down := true // the storm is not written before the flush
			apiDown(api, &down)
			repeatLine(h, levelError, "errors", "upstream unhealthy", 12)
			drain(h)
			h.advance(tt.since)
			h.observe(ln(levelWarning, "health", "slow answers", clk.Now()))
			down = false
			creates := 0
			api.setFault(func(r apiRequest) fault {
				if r.verb != "create" {
					return fault{}
				}
				creates++
				if creates == 2 { // the first is the storm's, the second the warning's
					return tt.other
				}
				return fault{}
			})
			h.stop(5 * time.Second)
			ends := ofReason(events(t, api), "CoreDNSErrorEnded")
			if tt.wantEnd != (len(ends) == 1) || len(ends) > 1 {
				t.Errorf("%d ends after the flush, want an end %v", len(ends), tt.wantEnd)
			}
			if n := len(ofReason(events(t, api), "CoreDNSError")); n != 1 {
				t.Errorf("%d storm events, want 1", n)
			}
			if tt.other.retryAfter > 0 {
				var endAt, retryAt time.Time
				for _, r := range eventRequests(api) {
					switch {
					case r.reason == "CoreDNSErrorEnded":
						endAt = r.at
					case r.reason == "CoreDNSWarning" && r.code == 0 || r.reason == "CoreDNSWarning" && r.code < 300:
						retryAt = r.at
					}
				}
				if endAt.IsZero() || !retryAt.IsZero() && retryAt.Before(endAt) {
					t.Errorf("the end at %v, the warning's retry at %v: the end waited behind the other's Retry-After", endAt, retryAt)
				}
			}
			checkLedger(t, api, before, 13)
		})
	}
}

// TestFlushEndNotHeldByHungEvictedWrite: an evicted event whose create
// hangs through the flush holds up only itself: a storm written in the
// flush, its quiet long past, gets its end written.
func TestFlushEndNotHeldByHungEvictedWrite(t *testing.T) {
	cfg := withQuiet(100, 100, time.Minute)
	cfg.cacheSize = 2
	h, api, clk := newTestHarness(t, cfg)
	h.lostAfter = 5 * time.Minute // beyond the flush
	before := readLedger()
	api.setFault(firstFaults(1, fault{lost: true}))
	h.observe(ln(levelWarning, "health", "slow answers", clk.Now()))
	drain(h) // the warning's create hangs
	down := true
	apiDown(api, &down)
	repeatLine(h, levelError, "errors", "upstream unhealthy", 12)
	h.observe(ln(levelError, "errors", "upstream K down", clk.Now())) // evicts the warning
	h.advance(2 * time.Minute)
	down = false
	h.stop(2 * time.Second)
	if n := len(ofReason(events(t, api), "CoreDNSErrorEnded")); n != 1 {
		t.Errorf("%d ends, want the storm's written while the evicted warning's create hung", n)
	}
	if d := checkLedger(t, api, before, 14); d.dropped[dropShutdown]+d.dropped[dropEvicted] != 1 {
		t.Errorf("dropped %v, want only the warning's line", d.dropped)
	}
}

// TestQuietAtCountsTheHandOffGrace: a written storm may end handOffGrace
// after its quiet, no sooner; an entry that is no storm, or still has
// lines to write, is not watched.
func TestQuietAtCountsTheHandOffGrace(t *testing.T) {
	storm := newEntry(eventKey{level: levelError, plugin: "plugin/errors: ", message: "x"}, time.Time{})
	storm.last, storm.stormWritten = epoch, true
	storm.seen, storm.carried = stormLines, stormLines
	if at, ok := quietAt(storm, time.Minute); !ok || !at.Equal(epoch.Add(time.Minute+handOffGrace)) {
		t.Errorf("quietAt = %v, %v; want %v", at, ok, epoch.Add(time.Minute+handOffGrace))
	}
	if _, ok := quietAt(storm, 0); ok {
		t.Error("watched with quiet off")
	}
	storm.seen++ // a line to write
	if _, ok := quietAt(storm, time.Minute); ok {
		t.Error("watched with a line pending")
	}
	short := newEntry(storm.key, time.Time{})
	short.last, short.stormWritten = epoch, true
	short.seen, short.carried = stormLines-1, stormLines-1
	if _, ok := quietAt(short, time.Minute); ok {
		t.Errorf("an event of %d lines watched as a storm", stormLines-1)
	}
	// After an end, only the lines since count.
	again := newEntry(storm.key, time.Time{})
	again.last, again.stormWritten, again.storm = epoch, true, 2*stormLines
	again.seen, again.carried = 2*stormLines+1, 2*stormLines+1
	if _, ok := quietAt(again, time.Minute); ok {
		t.Error("a storm that came back with one line watched as a storm")
	}
}

// TestEndsKeepAtMostTheLimit: ends beyond the limit are not kept, and a
// trim keeps the oldest, and those in flight.
func TestEndsKeepAtMostTheLimit(t *testing.T) {
	var q ends
	es := make([]*stormEnd, 4)
	for i := range es {
		es[i] = &stormEnd{message: fmt.Sprint(i)}
		q.add(es[i], 3)
	}
	if len(q.list) != 3 || q.list[2] != es[2] {
		t.Fatalf("kept %d ends, want the first 3", len(q.list))
	}
	q.trim(3)
	if len(q.list) != 3 {
		t.Errorf("a trim to the size kept %d", len(q.list))
	}
	es[2].inflight = 7
	q.trim(1)
	if len(q.list) != 2 || q.list[0] != es[0] || q.list[1] != es[2] {
		t.Errorf("trim to 1 kept %d ends, want the oldest and the one in flight", len(q.list))
	}
	q.remove(es[0])
	if len(q.list) != 1 || q.list[0] != es[2] {
		t.Errorf("after remove: %d ends", len(q.list))
	}
}

// TestStormEndsDespiteATrickle: a storm of a client's distinct names, then
// one such line every 4 minutes, at the default rate and quiet: the storm
// is said to end, once its last quiet held fewer than max(2, 1 % of its
// peak) lines, and the end names its shape, never the client's names.
func TestStormEndsDespiteATrickle(t *testing.T) {
	cfg := testConfig(all, defaultQPS, defaultBurst, defaultCacheSize)
	cfg.quiet = defaultQuiet
	h, api, clk := newTestHarness(t, cfg)
	query := func(i int) line {
		return ln(levelError, "errors", fmt.Sprintf("2 c%d.client.example. A: read udp 10.0.0.9:%d->192.0.2.53:53: i/o timeout", i, 30000+i%1000), clk.Now())
	}
	for i := range 300 {
		h.observe(query(i))
	}
	h.advance(time.Minute)
	for i := 300; len(endsIn(api)) == 0 && i < 330; i++ { // 2 hours
		h.observe(query(i))
		h.advance(4 * time.Minute)
	}
	ends := endsIn(api)
	if len(ends) == 0 {
		t.Fatal("no end said in 2 hours of one line every 4 minutes")
	}
	if strings.Contains(ends[0].Message, "client.example") {
		t.Errorf("the end quotes a client's name: %q", ends[0].Message)
	}
	// The trickle goes on: it never rises above the threshold again, so no second end.
	for i := 400; i < 430; i++ {
		h.observe(query(i))
		h.advance(4 * time.Minute)
	}
	if n := len(endsIn(api)); n != 1 {
		t.Errorf("%d ends of one storm whose trickle stayed below its threshold, want 1", n)
	}
}

// topMemberRun makes a host of 100 lines among a client's 200 distinct names an event of its own,
// then sends one line of the host every every for an hour, and returns the ends said meanwhile.
func topMemberRun(t *testing.T, every time.Duration) (*harness, *fakeAPI, []corev1.Event) {
	cfg := testConfig(all, defaultQPS, defaultBurst, defaultCacheSize)
	cfg.quiet = defaultQuiet
	h, api, clk := newTestHarness(t, cfg)
	query := func(name string, i int) line {
		return ln(levelError, "errors", fmt.Sprintf(
			"2 %s. A: read udp 10.0.0.9:%d->192.0.2.53:53: i/o timeout", name, 30000+i), clk.Now())
	}
	for i := range 300 {
		name := fmt.Sprintf("c%d.client.example", i)
		if i%3 == 0 {
			name = "db.corp.example"
		}
		h.observe(query(name, i))
	}
	h.advance(time.Minute)
	for i := 0; time.Duration(i)*every < time.Hour; i++ {
		h.observe(query("db.corp.example", 1000+i))
		h.advance(every)
	}
	return h, api, endsIn(api)
}

// TestStormOfTopMemberGoesOn: a host of 100 lines among a client's 200 distinct names becomes an
// event of its own; while it still comes, one line a minute (5 in a quiet, above its threshold
// of 2), its storm has not ended (the client's may); once it stops, its end names it.
func TestStormOfTopMemberGoesOn(t *testing.T) {
	h, api, ends := topMemberRun(t, time.Minute)
	if len(ends) > 1 {
		t.Fatalf("%d ends while the host still comes: %q, %q", len(ends), ends[0].Message, ends[1].Message)
	}
	h.advance(defaultQuiet + handOffGrace)
	ends = endsIn(api)
	if len(ends) != 2 || !strings.Contains(ends[1].Message, "most: db.corp.example ≥") {
		t.Errorf("ends %v, want the client's and then one naming db.corp.example", ends)
	}
}

// TestTopMemberOfATrickleHoldsNoStormOpen: a top member holds its storm open only with more lines
// of its own in the last quiet than max(2, 1 % of the peak): one line every 4 min 50 s is a
// trickle, and the storm's end is said within the hour.
func TestTopMemberOfATrickleHoldsNoStormOpen(t *testing.T) {
	if _, _, ends := topMemberRun(t, 4*time.Minute+50*time.Second); len(ends) < 2 {
		t.Errorf("%d ends within an hour of one line of a top member every 4 min 50 s, want its storm's too", len(ends))
	}
}

// TestStormEndsWhileOneQueryArrivesEveryFourMinutes: a storm of 1000
// client names, then one new client name every 4 minutes. Each quiet of
// 5 minutes then holds at most 2 lines, and some hold 1, fewer than
// max(2, 1% of its peak of 1000) = 10, none from its top members: the
// storm has ended, and its end is said within an hour.
func TestStormEndsWhileOneQueryArrivesEveryFourMinutes(t *testing.T) {
	h, api, clk := newTestHarness(t, withQuiet(100, 100, defaultQuiet))
	logStorm(h, levelError, 0, 1000, clk.Now())
	h.advance(time.Second)
	for i := range 15 {
		h.advance(4 * time.Minute)
		logStorm(h, levelError, 5000+i, 1, clk.Now())
	}
	h.advance(time.Second)
	if n := len(endsIn(api)); n == 0 {
		t.Errorf("no end said after an hour of one line every 4 minutes, after a storm of 1000 lines (quiet %v)", defaultQuiet)
	}
}

// TestEndOfAStormThatCameBackNamesItsOwnMembers: a storm that ends and
// comes back is a new storm, a new object and a new count: its end says
// what it was about, its own members, not those of the storm before it.
func TestEndOfAStormThatCameBackNamesItsOwnMembers(t *testing.T) {
	h, api, clk := newTestHarness(t, withQuiet(100, 100, time.Minute))
	for i := range ownEvents {
		h.observe(ln(levelError, "errors", "upstream "+word(i)+" unhealthy", clk.Now()))
	}
	timeout := func(name string, port int) {
		h.observe(ln(levelError, "errors", fmt.Sprintf("2 %s A: read udp 10.0.0.5:%d->10.0.0.2:53: i/o timeout", name, port), clk.Now()))
	}
	for i := range 5 {
		timeout("old.attacker.example.", 41000+i)
	}
	for i := range 3 {
		timeout(word(i)+".client.example.", 42000+i)
	}
	h.advance(3 * time.Minute)
	if n := len(endsIn(api)); n != 1 {
		t.Fatalf("%d ends after the first storm, want 1", n)
	}
	for i := range 4 {
		timeout("db.corp.example.", 43000+i)
	}
	h.advance(3 * time.Minute)
	ends := endsIn(api)
	if len(ends) != 2 {
		t.Fatalf("%d ends after the second storm, want 2", len(ends))
	}
	for _, end := range ends {
		if strings.Contains(end.Message, " 4 lines ") && strings.Contains(end.Message, "old.attacker.example") {
			t.Errorf("the end of the second storm, of 4 lines of db.corp.example, names the first storm's member:\n%s", end.Message)
		}
	}
}

// TestEndDoesNotQuoteAClientsNameWithAPlus: CoreDNS prints a query name's
// '+', '~', '!' or '/' as it is (only . ( ) ; space @ " \ and bytes
// outside printable ASCII are escaped). A client's names such as
// "please+delete+<word>.example." are names all the same: the end of the
// storm they make names what it was about, never the latest line's name.
func TestEndDoesNotQuoteAClientsNameWithAPlus(t *testing.T) {
	h, api, clk := newTestHarness(t, withQuiet(100, 100, time.Minute))
	last := ""
	for i := range 60 {
		last = "please+delete+" + word(i)
		h.observe(ln(levelError, "errors", "2 "+last+".example. A: read udp 10.0.0.5:40000->10.0.0.2:53: i/o timeout", clk.Now()))
	}
	h.advance(2 * time.Minute)
	ends := endsIn(api)
	if len(ends) == 0 {
		t.Fatal("no end said")
	}
	for _, end := range ends {
		if strings.Contains(end.Message, last) {
			t.Errorf("an end quotes the client's latest name %q:\n%s", last, end.Message)
		}
	}
}

// TestEndOfOtherShapesCountsItsShapes: the lines of other shapes have no
// shape of their own to quote: their end says how many shapes they had,
// and never quotes one of its lines.
func TestEndOfOtherShapesCountsItsShapes(t *testing.T) {
	h, api, clk := newTestHarness(t, withQuiet(100, 100, time.Minute))
	for i := range ownEvents + maxShapes {
		h.observe(ln(levelError, "errors", "upstream "+word(i)+" unhealthy", clk.Now()))
	}
	for i := range 30 {
		h.observe(ln(levelError, "errors", "backend "+word(i%3)+" gone", clk.Now()))
	}
	h.advance(3 * time.Minute)
	for _, end := range endsIn(api) {
		if strings.Contains(end.Message, "other shapes") {
			if !strings.Contains(end.Message, "30 lines of 3 other shapes from") || strings.Contains(end.Message, "gone") {
				t.Errorf("the end of the other shapes says %q, want 30 lines of 3 other shapes and no line", end.Message)
			}
			return
		}
	}
	t.Errorf("no end of the lines of other shapes among %d ends", len(endsIn(api)))
}

// TestFlowHoldsTheLinesOfItsQuietOnly: a quiet holds the lines of its
// slots, those of a slot before included, and none of a slot a quiet ago
// whose place in the ring a new line takes.
func TestFlowHoldsTheLinesOfItsQuietOnly(t *testing.T) {
	quiet := defaultQuiet
	slot := quiet / flowSlots
	var p flow
	at := epoch.Truncate(slot)
	p.add(at, at.Sub(epoch.Truncate(slot)), quiet, false)
	p.add(at.Add(slot), at.Add(slot).Sub(epoch.Truncate(slot)), quiet, false)
	if got := p.held(p.at); got != 2 {
		t.Errorf("a quiet holds %d lines of two slots in a row, want 2", got)
	}
	p.add(at.Add(flowSlots*slot), at.Add(flowSlots*slot).Sub(epoch.Truncate(slot)), quiet, false) // the place of the first slot in the ring
	if got := p.held(p.at); got != 2 {
		t.Errorf("a quiet holds %d lines once the first slot is a quiet ago, want 2", got)
	}
	p.add(at.Add(5*flowSlots*slot), at.Add(5*flowSlots*slot).Sub(epoch.Truncate(slot)), quiet, false) // quiets later: every slot of the ring afresh
	if got := p.held(p.at); got != 1 {
		t.Errorf("a quiet holds %d lines after quiets without one, want 1", got)
	}
	p.add(at.Add(4*flowSlots*slot), at.Add(4*flowSlots*slot).Sub(epoch.Truncate(slot)), quiet, false) // a quiet late: no slot of it is left
	if got := p.held(p.at); got != 1 {
		t.Errorf("a quiet holds %d lines with one a quiet late, want 1", got)
	}
}

// TestFlowIsCalmOnlyBelowItsThreshold: a storm is calm at the end of the
// first slot whose quiet held fewer lines than its threshold, not as many.
func TestFlowIsCalmOnlyBelowItsThreshold(t *testing.T) {
	quiet := defaultQuiet
	slot := quiet / flowSlots
	var p flow
	at := epoch.Truncate(slot)
	p.add(at, at.Sub(epoch.Truncate(slot)), quiet, false)
	p.add(at, at.Sub(epoch.Truncate(slot)), quiet, false) // two lines: as many as the threshold
	// The quiets ending with this slot and the next seven hold both lines.
	if got, want := time.Duration(p.calmAt()-p.latest), (flowSlots+1)*slot; got != want {
		t.Errorf("calm %v after the lines, want %v", got, want)
	}
}

// TestReloadOfQuietKeepsTheHysteresis: a storm that ended gets no second end for one line since,
// though a reload changed quiet after it: it must rise above its threshold again.
func TestReloadOfQuietKeepsTheHysteresis(t *testing.T) {
	h, api, clk := newTestHarness(t, withQuiet(100, 100, time.Minute))
	logStorm(h, levelError, 0, 200, clk.Now())
	h.advance(2 * time.Minute)
	if n := len(endsIn(api)); n != 1 {
		t.Fatalf("%d ends after the storm's quiet, want 1", n)
	}
	logStorm(h, levelError, 1000, 1, clk.Now())
	h.advance(time.Second)
	h.apply(withQuiet(100, 100, 2*time.Minute))
	h.advance(10 * time.Minute)
	if n := len(endsIn(api)); n != 1 {
		t.Errorf("%d ends after one line since the end and a reload of quiet, want 1", n)
	}
}

// TestQuietOffThenOnSeesTheStormGoOn: a storm of a line a second goes on while quiet is off; once
// it is on again, the storm is not said to end while its lines still come.
func TestQuietOffThenOnSeesTheStormGoOn(t *testing.T) {
	h, api, clk := newTestHarness(t, withQuiet(100, 100, time.Minute))
	logStorm(h, levelError, 0, 200, clk.Now())
	h.advance(time.Second)
	h.apply(withQuiet(100, 100, 0))
	for i := range 600 { // 10 minutes of a line a second
		logStorm(h, levelError, 1000+i, 1, clk.Now())
		h.advance(time.Second)
	}
	h.apply(withQuiet(100, 100, time.Minute))
	for i := range 30 {
		logStorm(h, levelError, 2000+i, 1, clk.Now())
		h.advance(time.Second)
	}
	if n := len(endsIn(api)); n != 0 {
		t.Errorf("%d ends of a storm of a line a second once quiet is on again: %q", n, endsIn(api)[0].Message)
	}
}

// TestStormFlowIsOnTheMonotonicClock: a step of the wall clock is no time that passed: after a
// step back of an hour, a storm's lines still count in its flow, and after a step forward its
// lines of before still do.
func TestStormFlowIsOnTheMonotonicClock(t *testing.T) {
	for _, step := range []time.Duration{-time.Hour, time.Hour} {
		c := newCorrelator(64, func(*entry) {})
		c.quiet = time.Minute
		now := time.Now()
		var e *entry
		for i := range 100 { // 20 lines a second for 5 s, the wall clock stepped after 2 s
			at := afterStep(now, time.Duration(i)*50*time.Millisecond, 0)
			if i >= 40 {
				at = afterStep(now, time.Duration(i)*50*time.Millisecond, step)
			}
			e = c.observe(ln(levelError, "errors", "upstream down", at))
		}
		if got := e.flow.held(e.flow.at); got != 100 {
			t.Errorf("after a step of %v: the last quiet holds %d of the storm's 100 lines of 5 s", step, got)
		}
	}
}

// TestEndsHaveABudgetOfTheirOwn: a plugin and level whose storms rise and fall makes at most
// maxEnds ends in any hour, beside its budget of events; the ends past them wait for room and
// are said after the hour, not dropped.
func TestEndsHaveABudgetOfTheirOwn(t *testing.T) {
	h, api, _ := newTestHarness(t, withQuiet(1000, 1000, time.Minute))
	for i := range 2 * maxEnds {
		repeatLine(h, levelError, "errors", "upstream "+word(i)+" unhealthy", stormLines)
	}
	h.advance(time.Second)
	for range 30 {
		h.advance(time.Minute)
	}
	if n := len(endsIn(api)); n != maxEnds {
		t.Errorf("%d ends of one plugin and level within half an hour, want %d", n, maxEnds)
	}
	for range 40 {
		h.advance(time.Minute)
	}
	if n := len(endsIn(api)); n != 2*maxEnds {
		t.Errorf("%d ends after the hour, want all %d", n, 2*maxEnds)
	}
}
