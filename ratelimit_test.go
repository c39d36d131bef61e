package k8s_event

import (
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
)

var all = levelSet(1<<numLevels - 1)

func ln(l level, plugin, msg string, at time.Time) line {
	return line{level: l, plugin: "plugin/" + plugin + ": ", text: "plugin/" + plugin + ": " + msg, at: at}
}

func only(t *testing.T, evs []corev1.Event) corev1.Event {
	t.Helper()
	if len(evs) != 1 {
		t.Fatalf("got %d events, want 1: %+v", len(evs), evs)
	}
	return evs[0]
}

// ledger is a reading of the metrics the accounting contract is stated in.
type ledger struct {
	lines, pending float64
	dropped        [numDropReasons]float64
}

func readLedger() ledger {
	var l ledger
	for lv := range numLevels {
		l.lines += testutil.ToFloat64(linesTotal[lv])
	}
	l.pending = testutil.ToFloat64(pendingLines)
	for r := range numDropReasons {
		l.dropped[r] = testutil.ToFloat64(droppedTotal[r])
	}
	return l
}

func (l ledger) since(before ledger) ledger {
	d := ledger{lines: l.lines - before.lines, pending: l.pending - before.pending}
	for r := range d.dropped {
		d.dropped[r] = l.dropped[r] - before.dropped[r]
	}
	return d
}

func (l ledger) droppedAll() float64 {
	var n float64
	for _, d := range l.dropped {
		n += d
	}
	return n
}

// countsIn adds up the counts of the events the API holds.
func countsIn(api *fakeAPI) float64 {
	var n float64
	for _, ev := range api.list() {
		if strings.HasSuffix(ev.Reason, "Ended") {
			continue // an end carries no lines: it is no part of the ledger
		}
		n += float64(ev.Count)
	}
	return n
}

// checkLedger checks the contract at a quiet moment: the counts in the API
// plus the lines pending plus the lines dropped are the lines taken, with
// lines fed to observe by hand counted in extra.
func checkLedger(t *testing.T, api *fakeAPI, before ledger, extra float64) ledger {
	t.Helper()
	d := readLedger().since(before)
	if got, want := countsIn(api)+d.pending+d.droppedAll(), d.lines+extra; got != want {
		t.Errorf("counts %v + pending %v + dropped %v = %v, want lines %v", countsIn(api), d.pending, d.dropped, got, want)
	}
	return d
}

// due runs every entry whose time has come, as the work queue would after
// the fake clock moved: the delaying queue moves keys in a goroutine of its
// own, so tests that step the clock call sync directly.
func due(p *pipeline) {
	drain(p)
	p.mu.Lock()
	es := p.pendingEntries()
	p.mu.Unlock()
	for _, e := range es {
		p.sync(e)
	}
	drain(p)
}

func TestRepeatsAreOneEventWithExactCount(t *testing.T) {
	p, api, clk := newTestPipeline(t, testConfig(all, 1, 25, 64))
	before := readLedger()
	for range 50 {
		p.observe(ln(levelError, "errors", "2 example.org. A: i/o timeout", clk.Now()))
	}
	drain(p)
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
	clk.Step(time.Minute)
	for range 3 {
		p.observe(ln(levelError, "errors", "2 example.org. A: i/o timeout", clk.Now()))
	}
	drain(p)
	ev = only(t, events(t, api))
	if ev.Count != 53 || !ev.LastTimestamp.Time.Equal(clk.Now()) || !ev.FirstTimestamp.Time.Equal(epoch) {
		t.Errorf("count %d first %v last %v, want 53 from %v to %v", ev.Count, ev.FirstTimestamp, ev.LastTimestamp, epoch, clk.Now())
	}
	if c, pt := api.writes(); c != 1 || pt != 1 {
		t.Errorf("%d creates %d patches, want 1 and 1", c, pt)
	}
	checkLedger(t, api, before, 53)
}

func TestThrottledRepeatsAreCounted(t *testing.T) {
	p, api, clk := newTestPipeline(t, testConfig(all, 1.0/300, 1, 64))
	p.observe(ln(levelWarning, "forward", "no healthy upstream", clk.Now()))
	drain(p)
	before := testutil.ToFloat64(throttled[levelWarning])
	for range 7 {
		p.observe(ln(levelWarning, "forward", "no healthy upstream", clk.Now()))
	}
	drain(p) // the bucket is empty: nothing written, the entry waits
	if n := only(t, events(t, api)).Count; n != 1 {
		t.Fatalf("count %d before the bucket refills, want 1", n)
	}
	if testutil.ToFloat64(throttled[levelWarning]) <= before {
		t.Error("throttled_total did not rise")
	}
	clk.Step(300 * time.Second)
	due(p)
	if n := only(t, events(t, api)).Count; n != 8 {
		t.Errorf("count %d after the bucket refilled, want 8", n)
	}
}

func TestDistinctLinesAreCombined(t *testing.T) {
	p, api, clk := newTestPipeline(t, testConfig(all, 100, 100, 1024))
	before := testutil.ToFloat64(aggregated[levelError])
	const n = 500
	for i := range n {
		p.observe(ln(levelError, "errors", fmt.Sprintf("2 q%d.example.org. A: i/o timeout", i), clk.Now()))
	}
	drain(p)
	evs := events(t, api)
	if len(evs) != combineAfter+1 {
		t.Fatalf("%d events, want %d distinct and one combined", len(evs), combineAfter)
	}
	var total int32
	var combined *corev1.Event
	for i := range evs {
		total += evs[i].Count
		if strings.HasPrefix(evs[i].Message, "plugin/errors: "+combinedPrefix) {
			combined = &evs[i]
		}
	}
	if total != n {
		t.Errorf("counts add up to %d, want %d", total, n)
	}
	if combined == nil || combined.Count != n-combineAfter || !strings.HasSuffix(combined.Message, fmt.Sprintf("q%d.example.org. A: i/o timeout", n-1)) {
		t.Fatalf("combined event %+v", combined)
	}
	if got := testutil.ToFloat64(aggregated[levelError]) - before; got != n-combineAfter {
		t.Errorf("aggregated_total rose by %v, want %d", got, n-combineAfter)
	}

	// Another plugin has a window of its own, and the window ends.
	p.observe(ln(levelError, "forward", "boom", clk.Now()))
	clk.Step(combineWindow + time.Second)
	p.observe(ln(levelError, "errors", "fresh line", clk.Now()))
	drain(p)
	if got := len(events(t, api)); got != combineAfter+3 {
		t.Errorf("%d events, want %d", got, combineAfter+3)
	}
}

func TestBucketsAreIndependent(t *testing.T) {
	p, api, clk := newTestPipeline(t, testConfig(all, 1.0/300, 2, 64))
	for i := range 20 {
		p.observe(ln(levelError, fmt.Sprint("p", i), "storm", clk.Now()))
	}
	drain(p)
	p.observe(ln(levelWarning, "reload", "warn", clk.Now()))
	p.observe(ln(levelInfo, "reload", "info", clk.Now()))
	drain(p)
	byReason := map[string]int{}
	for _, ev := range events(t, api) {
		byReason[ev.Reason]++
	}
	if byReason["CoreDNSError"] != 2 || byReason["CoreDNSWarning"] != 1 || byReason["CoreDNSInfo"] != 1 {
		t.Errorf("events by reason %v, want 2 errors (the burst), 1 warning, 1 info", byReason)
	}
}

// TestWritesStayWithinBound runs a storm of distinct and repeated lines for
// two simulated minutes, offering every pending entry to the writers each
// second, and checks the bucket's bound: burst + qps x T.
func TestWritesStayWithinBound(t *testing.T) {
	const qps, burst = 0.5, 5
	p, api, clk := newTestPipeline(t, testConfig(all, qps, burst, 4096))
	start := clk.Now()
	for s := range 120 {
		for i := range 20 {
			p.observe(ln(levelError, fmt.Sprint("p", i%15), fmt.Sprint("line ", i, s%3), clk.Now()))
		}
		clk.Step(time.Second)
		due(p)
	}
	elapsed := clk.Since(start).Seconds()
	c, pt := api.writes()
	if bound := burst + qps*elapsed; float64(c+pt) > bound {
		t.Errorf("%d writes in %.0fs, bound %.0f", c+pt, elapsed, bound)
	}
	if want := int(qps * elapsed); c+pt < want {
		t.Errorf("only %d writes in %.0fs, want %d: the budget is not used", c+pt, elapsed, want)
	}
}

func TestEvictedUnwrittenLinesAreCounted(t *testing.T) {
	p, _, clk := newTestPipeline(t, testConfig(all, 1, 25, 2))
	before := readLedger()
	p.observe(ln(levelError, "a", "one", clk.Now()))
	p.observe(ln(levelError, "a", "one", clk.Now()))
	p.observe(ln(levelError, "b", "two", clk.Now()))
	p.observe(ln(levelError, "c", "three", clk.Now())) // evicts a/one with 2 unwritten lines
	d := readLedger().since(before)
	if d.dropped[dropEvicted] != 2 || d.pending != 2 {
		t.Errorf("dropped{evicted} rose by %v and pending by %v, want 2 and 2", d.dropped[dropEvicted], d.pending)
	}
	drain(p)
}

// TestUnsentWriteCostsNoToken: an API that refuses connections for ten
// minutes, at the default rate, leaves the buckets full; when it comes
// back every pending event lands within one maximal backoff, with its
// true count. (Before, every refused attempt spent a token and the events
// then waited for refills, 300 s each.)
func TestUnsentWriteCostsNoToken(t *testing.T) {
	p, api, clk := newTestPipeline(t, testConfig(defaultLevels, defaultQPS, defaultBurst, defaultCacheSize))
	before := readLedger()
	api.setFault(func(apiRequest) fault { return fault{unsent: true} })
	outageEnd := clk.Now().Add(10 * time.Minute)
	lines := 0
	for clk.Now().Before(outageEnd) {
		p.observe(ln(levelError, "errors", "upstream timeout", clk.Now()))
		p.observe(ln(levelWarning, "forward", fmt.Sprint("upstream ", lines%5, " down"), clk.Now()))
		lines += 2
		clk.Step(7 * time.Second)
		due(p)
	}
	if c, pt := api.writes(); c+pt != 0 || api.refused == 0 {
		t.Fatalf("%d writes reached the API during the outage, %d refused", c+pt, api.refused)
	}
	if tokens := p.buckets[levelError].TokensAt(clk.Now()); tokens < defaultBurst {
		t.Errorf("%.1f tokens left after an outage that no request reached, want %d", tokens, defaultBurst)
	}
	api.setFault(nil)
	back := clk.Now()
	for clk.Since(back) <= retryMax+retryMax/5 && countsIn(api) < float64(lines) {
		clk.Step(time.Second)
		due(p)
	}
	if got := countsIn(api); got != float64(lines) {
		t.Fatalf("counts %v %d s after the API came back, want %d", got, int(clk.Since(back).Seconds()), lines)
	}
	if n := len(events(t, api)); n != 6 {
		t.Errorf("%d events, want 6", n)
	}
	checkLedger(t, api, before, float64(lines))
}

// TestOneRequestPerToken: client-go would retry a 429 with Retry-After
// inside one call, up to ten times; every retry is a request that reaches
// the API, so each takes its own token and none is made inside a call.
func TestOneRequestPerToken(t *testing.T) {
	p, api, clk := newTestPipeline(t, testConfig(all, 1e-6, 3, 64))
	api.setFault(func(r apiRequest) fault { return fault{code: http.StatusTooManyRequests, retryAfter: 1} })
	p.observe(ln(levelError, "errors", "busy", clk.Now()))
	for range 10 {
		due(p)
		clk.Step(retryMax * 2)
	}
	if c, _ := api.writes(); c != 3 {
		t.Errorf("%d requests reached the API, want 3: the burst", c)
	}
}

// TestStopFlushesPending: lines that no writer has touched, an event
// waiting out a backoff and one waiting for its bucket are written at
// stop, as far as tokens allow; the rest is dropped as shutdown.
func TestStopFlushesPending(t *testing.T) {
	p, api, clk := newTestPipeline(t, testConfig(all, 1.0/300, 3, 64))
	before := readLedger()
	// A warning that failed once and backs off.
	api.setFault(func(r apiRequest) fault { return fault{code: http.StatusServiceUnavailable} })
	p.observe(ln(levelWarning, "health", "backing off", clk.Now()))
	drain(p)
	api.setFault(nil)
	// Five distinct errors, never offered to a writer: 3 tokens.
	for i := range 5 {
		for range i + 1 {
			p.observe(ln(levelError, "errors", fmt.Sprint("pending ", i), clk.Now()))
		}
	}
	start := time.Now()
	p.stop(time.Minute)
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("stop took %v", took)
	}
	byMessage := map[string]int32{}
	for _, ev := range events(t, api) {
		byMessage[ev.Message] = ev.Count
	}
	if byMessage["plugin/health: backing off"] != 1 {
		t.Errorf("the warning in backoff was not flushed: %v", byMessage)
	}
	errs := 0
	for i := range 5 {
		if n, ok := byMessage[fmt.Sprint("plugin/errors: pending ", i)]; ok {
			errs++
			if n != int32(i+1) {
				t.Errorf("count of pending %d is %d, want %d", i, n, i+1)
			}
		}
	}
	if errs != 3 {
		t.Errorf("%d error events flushed, want 3 (the bucket)", errs)
	}
	d := checkLedger(t, api, before, 16)
	if d.pending != 0 || d.dropped[dropShutdown] == 0 {
		t.Errorf("after stop: pending %v, dropped{shutdown} %v", d.pending, d.dropped[dropShutdown])
	}
}

// TestStopIsBounded: with an API that never answers, stop returns when
// the flush time is up, and drops what is pending.
func TestStopIsBounded(t *testing.T) {
	p, api, clk := newTestPipeline(t, testConfig(all, 10, 10, 64))
	before := readLedger()
	api.setFault(func(apiRequest) fault { return fault{hang: true} })
	p.start()
	for i := range 20 {
		p.Errorf("plugin/errors: ", "line %d", i)
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
	_ = clk
}

func TestFatalIsWrittenBeforeReturning(t *testing.T) {
	p, api, _ := newTestPipeline(t, testConfig(levelSet(1<<levelFatal), 1, 25, 64))
	before := readLedger()
	p.Fatalf("plugin/reload: ", "cannot %s", "go on")
	ev := only(t, events(t, api))
	if ev.Reason != "CoreDNSFatal" || ev.Type != "Warning" || ev.Message != "plugin/reload: cannot go on" || ev.Count != 1 {
		t.Errorf("fatal event %+v", ev)
	}
	checkLedger(t, api, before, 0)
}

// TestFatalWaitsForNoLookup: with no UID from the downward API and an API
// that accepts connections but never answers a pod read, the fatal line
// goes at once, without the UID; it never waits on the lookup a writer is
// doing.
func TestFatalWaitsForNoLookup(t *testing.T) {
	p, api, clk := newTestPipeline(t, testConfig(all, 1, 25, 64))
	ref := testRef
	ref.UID = ""
	p.pod.ref.Store(&ref)
	p.pod.lookup.Store(true)
	api.setFault(func(r apiRequest) fault { return fault{hang: r.resource == "pods"} })
	p.start()
	p.observe(ln(levelError, "errors", "a writer looks the UID up", clk.Now()))
	time.Sleep(50 * time.Millisecond) // the writer is in its lookup
	start := time.Now()
	p.Fatal("plugin/errors: ", "bye")
	if took := time.Since(start); took > time.Second {
		t.Errorf("the fatal line took %v", took)
	}
	found := false
	for _, ev := range events(t, api) {
		found = found || ev.Reason == "CoreDNSFatal"
	}
	if !found {
		t.Error("no CoreDNSFatal event")
	}
}

// TestFatalGivesUp: a fatal line finds its bucket empty, or its write
// fails: each is dropped once, with its own cause, and the write is given
// up within the fatal time.
func TestFatalGivesUp(t *testing.T) {
	p, api, _ := newTestPipeline(t, testConfig(all, 1.0/300, 1, 64))
	p.fatalTimeout = 200 * time.Millisecond
	before := readLedger()
	api.setFault(func(apiRequest) fault { return fault{hang: true} })
	start := time.Now()
	p.Fatal("plugin/errors: ", "first")
	if took := time.Since(start); took > time.Second {
		t.Errorf("a fatal line to a silent API took %v, fatal time 200ms", took)
	}
	p.Fatal("plugin/errors: ", "second") // the token went with the first
	d := readLedger().since(before)
	if d.dropped[dropFailed] != 1 || d.dropped[dropThrottled] != 1 || d.dropped[dropShutdown] != 0 || d.pending != 0 {
		t.Errorf("dropped %v pending %v, want one failed and one throttled", d.dropped, d.pending)
	}
}

// TestCreateTimedOutButApplied: the API server applied a create whose answer
// never came; the retry must find that event, not make a second one.
func TestCreateTimedOutButApplied(t *testing.T) {
	p, api, clk := newTestPipeline(t, testConfig(all, 100, 100, 64))
	p.writeTimeout = 100 * time.Millisecond
	before := readLedger()
	once := sync.Once{}
	api.setFault(func(r apiRequest) (f fault) {
		once.Do(func() { f = fault{hang: true, apply: true} })
		return f
	})
	p.observe(ln(levelError, "errors", "slow", clk.Now()))
	drain(p)
	p.observe(ln(levelError, "errors", "slow", clk.Now()))
	clk.Step(retryMax * 2)
	due(p)
	if ev := only(t, events(t, api)); ev.Count != 2 {
		t.Errorf("count %d, want 2", ev.Count)
	}
	checkLedger(t, api, before, 2)
}

// TestNameTakenIsNotOurs: a first create that meets an event of the same
// name made by someone else takes a new name; it never patches the other.
func TestNameTakenIsNotOurs(t *testing.T) {
	p, api, clk := newTestPipeline(t, testConfig(all, 100, 100, 64))
	p.names.tag = "" // so that the name is known in advance
	name := p.names.next(testRef.Name, clk.Now())
	p.names.last--
	api.mu.Lock()
	api.events["kube-system/"+name] = &corev1.Event{Message: "someone else's", Count: 7}
	api.mu.Unlock()
	p.observe(ln(levelError, "errors", "mine", clk.Now()))
	p.observe(ln(levelError, "errors", "mine", clk.Now()))
	drain(p)
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
	p, api, clk := newTestPipeline(t, testConfig(all, 100, 100, 64))
	p.observe(ln(levelError, "errors", "again", clk.Now()))
	drain(p)
	api.expire()
	p.observe(ln(levelError, "errors", "again", clk.Now()))
	drain(p)
	if ev := only(t, events(t, api)); ev.Count != 2 {
		t.Errorf("count %d, want 2", ev.Count)
	}
	if c, pt := api.writes(); c != 2 || pt != 1 {
		t.Errorf("%d creates %d patches, want 2 and 1", c, pt)
	}
}

// TestRefusedLinesStayPending: lines the API refuses (403) are not
// dropped: they stay pending, the event pauses, and once RBAC is fixed one
// write carries all of them. Each line is counted once.
func TestRefusedLinesStayPending(t *testing.T) {
	p, api, clk := newTestPipeline(t, testConfig(all, 100, 100, 64))
	var logged strings.Builder
	log.SetOutput(&logged)
	t.Cleanup(func() { log.SetOutput(io.Discard) })
	before := readLedger()
	api.setFault(func(r apiRequest) fault { return fault{code: http.StatusForbidden} })
	for range 3 {
		p.observe(ln(levelError, "errors", "denied", clk.Now()))
	}
	drain(p)
	p.observe(ln(levelError, "errors", "denied", clk.Now()))
	drain(p)
	if c, _ := api.writes(); c != 1 {
		t.Fatalf("%d create attempts right after a 403, want 1: the event must pause", c)
	}
	d := checkLedger(t, api, before, 4)
	if d.pending != 4 || d.droppedAll() != 0 {
		t.Errorf("pending %v dropped %v, want 4 pending", d.pending, d.dropped)
	}
	if n := strings.Count(logged.String(), "grant create and patch on events"); n != 1 {
		t.Errorf("said %d times why the write failed, want once:\n%s", n, logged.String())
	}
	api.setFault(nil) // RBAC fixed
	clk.Step(rejectPause)
	due(p)
	if ev := only(t, events(t, api)); ev.Count != 4 {
		t.Errorf("count %d after RBAC was fixed, want 4 (every line ever seen)", ev.Count)
	}
	checkLedger(t, api, before, 4)
}

// TestTransientAnswersAreRetried: 401 (a token being rotated), 408, 429,
// 500, 503 and a reset connection are retried with backoff.
func TestTransientAnswersAreRetried(t *testing.T) {
	for _, f := range []fault{{code: 401}, {code: 408}, {code: 429}, {code: 429, retryAfter: 3}, {code: 500}, {code: 503}, {reset: true}} {
		t.Run(fmt.Sprintf("%+v", f), func(t *testing.T) {
			p, api, clk := newTestPipeline(t, testConfig(all, 100, 100, 64))
			refusals := 2
			api.setFault(func(r apiRequest) fault {
				if refusals == 0 {
					return fault{}
				}
				refusals--
				return f
			})
			for range 5 {
				p.observe(ln(levelWarning, "forward", "busy", clk.Now()))
			}
			drain(p)
			// A transient failure backs off from a second, not the minute of
			// a refusal (or the Retry-After asked for).
			p.mu.Lock()
			wait := p.pendingEntries()[0].retryAt.Sub(clk.Now())
			p.mu.Unlock()
			if limit := max(retryBase+retryBase/5, time.Duration(f.retryAfter)*time.Second); wait > limit {
				t.Errorf("first retry in %v, want at most %v", wait, limit)
			}
			for i := 0; len(events(t, api)) == 0 && i < 10; i++ {
				clk.Step(retryMax + retryMax/5 + time.Second) // past any backoff with its jitter
				due(p)
			}
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
	p, api, clk := newTestPipeline(t, testConfig(all, 100, 100, 2))
	api.setFault(func(apiRequest) fault { return fault{code: 500} })
	p.observe(ln(levelError, "errors", "failing", clk.Now()))
	var waits []time.Duration
	for range 8 {
		p.mu.Lock()
		e, _ := p.cache.Peek(eventKey{level: levelError, plugin: "plugin/errors: ", message: "plugin/errors: failing"})
		p.mu.Unlock()
		p.sync(e)
		waits = append(waits, e.retryAt.Sub(clk.Now()))
		clk.SetTime(e.retryAt)
	}
	for i, w := range waits {
		base := min(retryBase<<i, retryMax)
		if w < base || w > base+base/5 {
			t.Errorf("wait %d is %v, want %v plus up to 20%%", i+1, w, base)
		}
	}
	p.observe(ln(levelError, "errors", "b", clk.Now()))
	p.observe(ln(levelError, "errors", "c", clk.Now())) // evicts "failing"
	p.observe(ln(levelError, "errors", "failing", clk.Now()))
	p.mu.Lock()
	e, _ := p.cache.Peek(eventKey{level: levelError, plugin: "plugin/errors: ", message: "plugin/errors: failing"})
	p.mu.Unlock()
	if e.failures != 0 || !e.retryAt.IsZero() {
		t.Errorf("a new entry inherits failures %d, retry at %v", e.failures, e.retryAt)
	}
}

// TestReloadLooksAgainAtThrottled: a reload that raises the rate lets
// throttled events go as soon as the new rate has a token, not when the
// old one would have had; one that shrinks the cache evicts.
func TestReloadLooksAgainAtThrottled(t *testing.T) {
	p, api, clk := newTestPipeline(t, testConfig(all, 1.0/300, 1, 64))
	for i := range 3 {
		p.observe(ln(levelError, "errors", fmt.Sprint("line ", i), clk.Now()))
	}
	drain(p) // one written, two wait 300 and 600 s in the delaying queue
	if n := len(events(t, api)); n != 1 {
		t.Fatalf("%d events with a burst of 1", n)
	}
	p.apply(testConfig(all, 10, 10, 64), api.client)
	drain(p) // they are looked at again: a token in 0.1 s
	clk.Step(time.Second)
	deadline := time.Now().Add(5 * time.Second)
	for len(events(t, api)) < 3 && time.Now().Before(deadline) {
		drain(p) // the delaying queue hands them over in its own goroutine
		time.Sleep(time.Millisecond)
	}
	if n := len(events(t, api)); n != 3 {
		t.Errorf("%d events a second after the rate was raised, want 3", n)
	}
	before := readLedger()
	p.observe(ln(levelError, "errors", "x", clk.Now()))
	p.observe(ln(levelError, "errors", "y", clk.Now()))
	p.apply(testConfig(all, 10, 10, 1), api.client)
	if n := p.cache.Len(); n != 1 {
		t.Errorf("cache holds %d after a resize to 1", n)
	}
	if d := readLedger().since(before); d.dropped[dropEvicted] != 1 {
		t.Errorf("dropped{evicted} rose by %v, want 1", d.dropped[dropEvicted])
	}
}

// TestEvictedUnansweredIsSettled: an event whose latest write got no
// answer is not dropped when evicted: one more write tells the API its
// final count, so no line is both in the API and dropped.
func TestEvictedUnansweredIsSettled(t *testing.T) {
	p, api, clk := newTestPipeline(t, testConfig(all, 100, 100, 1))
	p.writeTimeout = 50 * time.Millisecond
	before := readLedger()
	hang := true
	api.setFault(func(apiRequest) fault { return fault{hang: hang, apply: true} })
	p.observe(ln(levelError, "errors", "unanswered", clk.Now()))
	p.observe(ln(levelError, "errors", "unanswered", clk.Now()))
	drain(p)
	hang = false
	p.observe(ln(levelError, "errors", "evicts it", clk.Now()))
	if len(p.settling) != 1 {
		t.Fatalf("%d entries settling, want 1", len(p.settling))
	}
	clk.Step(retryMax * 2)
	due(p)
	if len(p.settling) != 0 {
		t.Errorf("%d entries still settling", len(p.settling))
	}
	d := checkLedger(t, api, before, 3)
	if d.pending != 0 || d.droppedAll() != 0 {
		t.Errorf("pending %v dropped %v", d.pending, d.dropped)
	}
}

// TestRequestsLogNowhere: client-go logs about a request through its
// context's logger; a line it logged could come back as an event.
func TestRequestsLogNowhere(t *testing.T) {
	p, _, _ := newTestPipeline(t, testConfig(all, 1, 1, 1))
	if sink := klog.FromContext(p.ctx).GetSink(); sink != nil {
		t.Errorf("requests log through %T", sink)
	}
}

// TestTally: the one place lines move. A dropped event has nothing
// pending, and neither a later write nor a second drop counts its lines
// again.
func TestTally(t *testing.T) {
	before := readLedger()
	var tl tally
	for range 5 {
		tl.see()
	}
	tl.carry(3)
	if tl.pending() != 2 {
		t.Fatalf("pending %d after 5 seen and 3 carried", tl.pending())
	}
	tl.drop(dropEvicted)
	tl.drop(dropEvicted)
	tl.carry(5)
	if tl.pending() != 0 || tl.carried != 3 || tl.dropped != 2 {
		t.Errorf("after drops and a late carry: %+v, pending %d", tl, tl.pending())
	}
	if d := readLedger().since(before); d.pending != 0 || d.dropped[dropEvicted] != 2 || d.lines != 0 {
		t.Errorf("metrics moved by pending %v dropped %v", d.pending, d.dropped)
	}
}

// TestReserveWait: without a token, the wait is until the next one at the
// bucket's rate, counting the requests in flight.
func TestReserveWait(t *testing.T) {
	p, _, clk := newTestPipeline(t, testConfig(all, 1.0/300, 2, 64))
	p.mu.Lock()
	defer p.mu.Unlock()
	for range 2 {
		if _, ok := p.reserve(levelError, nil, clk.Now()); !ok {
			t.Fatal("no token in a full bucket")
		}
	}
	if wait, ok := p.reserve(levelError, nil, clk.Now()); ok || wait < 299*time.Second || wait > 301*time.Second {
		t.Errorf("third reservation: ok %v wait %v, want a wait of 300 s (both tokens held in flight, one more every 300 s)", ok, wait)
	}
	p.spend(levelError, clk.Now(), false) // never reached the API: the token is back
	if wait, ok := p.reserve(levelError, nil, clk.Now()); !ok || wait != 0 {
		t.Errorf("after an unsent request: ok %v wait %v, want the token back", ok, wait)
	}
	p.spend(levelError, clk.Now(), true)
	p.spend(levelError, clk.Now(), true)
	if wait, ok := p.reserve(levelError, nil, clk.Now()); ok || wait < 299*time.Second || wait > 301*time.Second {
		t.Errorf("after two sent requests: ok %v wait %v, want 300 s", ok, wait)
	}
}

// TestRetryAfterIsHonoured: a write is not retried before the API's
// Retry-After, even when that is longer than the backoff.
func TestRetryAfterIsHonoured(t *testing.T) {
	p, api, clk := newTestPipeline(t, testConfig(all, 100, 100, 64))
	api.setFault(func(apiRequest) fault { return fault{code: http.StatusTooManyRequests, retryAfter: 90} })
	p.observe(ln(levelError, "errors", "busy", clk.Now()))
	drain(p)
	p.mu.Lock()
	e := p.pendingEntries()[0]
	wait := e.retryAt.Sub(clk.Now())
	p.mu.Unlock()
	if wait < 90*time.Second {
		t.Errorf("retry in %v, want at least the 90 s the API asked for", wait)
	}
}

// TestRejectionLogOncePerMinute: why writes fail is said at most once a
// minute.
func TestRejectionLogOncePerMinute(t *testing.T) {
	var buf strings.Builder
	log.SetOutput(&buf)
	t.Cleanup(func() { log.SetOutput(io.Discard) })
	var r rejectionLog
	err := errors.New("boom")
	for i := range 10 {
		r.report(epoch.Add(time.Duration(i)*time.Second), err, "ns")
	}
	r.report(epoch.Add(time.Minute), err, "ns")
	if n := strings.Count(buf.String(), "writing event: boom"); n != 2 {
		t.Errorf("%d lines in 70 s, want 2:\n%s", n, buf.String())
	}
}

// TestWindowsAreBounded: the combining windows of ever new plugins do not
// grow without bound, and a window lasts combineWindow exactly.
func TestWindowsAreBounded(t *testing.T) {
	p, _, clk := newTestPipeline(t, testConfig(all, 100, 100, 64))
	most := 0
	for i := range 3 * maxWindows {
		p.observe(ln(levelError, fmt.Sprint("p", i), "x", clk.Now()))
		most = max(most, len(p.windows))
	}
	if most != maxWindows {
		t.Errorf("at most %d windows, want %d", most, maxWindows)
	}
	clear(p.windows)

	// Windows of two plugins live side by side: lines of both, interleaved,
	// are combined past the threshold of each.
	before := testutil.ToFloat64(aggregated[levelInfo])
	for i := range 2 * combineAfter {
		p.observe(ln(levelInfo, "a", fmt.Sprint("a line ", i), clk.Now()))
		p.observe(ln(levelInfo, "b", fmt.Sprint("b line ", i), clk.Now()))
	}
	if got := testutil.ToFloat64(aggregated[levelInfo]) - before; got != 2*combineAfter {
		t.Errorf("%v lines combined, want %d", got, 2*combineAfter)
	}
	clear(p.windows)
	for i := range combineAfter {
		p.observe(ln(levelWarning, "forward", fmt.Sprint("line ", i), clk.Now()))
	}
	clk.Step(combineWindow) // the same window still
	before = testutil.ToFloat64(aggregated[levelWarning])
	p.observe(ln(levelWarning, "forward", "one more", clk.Now()))
	if testutil.ToFloat64(aggregated[levelWarning]) != before+1 {
		t.Error("a line at the end of the window was not combined")
	}
}

// TestFlushSaysWhyWritesFail: a refusal met during the flush at shutdown
// is said, as during the run.
func TestFlushSaysWhyWritesFail(t *testing.T) {
	p, api, clk := newTestPipeline(t, testConfig(all, 100, 100, 64))
	var logged strings.Builder
	log.SetOutput(&logged)
	t.Cleanup(func() { log.SetOutput(io.Discard) })
	api.setFault(func(apiRequest) fault { return fault{code: http.StatusForbidden} })
	p.observe(ln(levelError, "errors", "refused at shutdown", clk.Now()))
	p.stop(time.Second)
	if !strings.Contains(logged.String(), "grant create and patch on events") {
		t.Errorf("the flush did not say why its write failed:\n%s", logged.String())
	}
}

// TestTokenHandedBackWakesWaiting: "a request that never reached the
// server costs nothing", and pending events land within 72 s of the API
// server's return "as far as tokens allow". An event that finds its
// bucket's one token held by a request in flight waits, as if that request
// will spend it; when the request never reaches the server and its event
// is gone meanwhile (evicted, with nothing unsure), the token is back, and
// the waiting event is written at once, not after the 300 s refill.
func TestTokenHandedBackWakesWaiting(t *testing.T) {
	p, api, clk := newTestPipeline(t, testConfig(all, defaultQPS, 1, 1))
	entered, release := holdFirstCreateThen(api, fault{unsent: true}) // the connection is refused: the token is not spent
	p.observe(ln(levelError, "errors", "upstream A down", clk.Now()))
	done := make(chan struct{})
	go func() { defer close(done); p.processNext() }() // A's create holds the token
	<-entered
	p.observe(ln(levelError, "errors", "upstream B down", clk.Now())) // evicts A, in flight
	p.processNext()                                                   // B: the token is held
	close(release)
	<-done
	written := func() bool { return len(events(t, api)) == 1 }
	if !runQueue(p, clk, time.Second, 72, written) {
		t.Fatalf("72 s after A's request was refused (A evicted, B waiting), %d events and %.2f tokens: B waits for a token its bucket has", len(events(t, api)), p.buckets[levelError].TokensAt(clk.Now()))
	}
	if got := events(t, api)[0].Message; !strings.Contains(got, "upstream B down") {
		t.Errorf("written: %q, want B", got)
	}
}

// TestTokenHandedBackWakesOne: one token handed back is one write: of 50
// events that found the bucket's token held, one is woken, so an API that
// refuses connections while the bucket runs low wakes no crowd of writers.
func TestTokenHandedBackWakesOne(t *testing.T) {
	p, _, clk := newTestPipeline(t, testConfig(all, defaultQPS, 1, 64))
	for i := range 50 {
		p.observe(ln(levelError, "errors", fmt.Sprint("upstream ", i, " down"), clk.Now()))
	}
	for p.queue.Len() > 0 { // taken, as writers would, and found throttled below
		e, _ := p.queue.Get()
		p.queue.Done(e)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.reserve(levelError, nil, clk.Now()); !ok {
		t.Fatal("no token in a full bucket")
	}
	for _, e := range p.cache.Values() {
		if _, ok := p.reserve(levelError, e, clk.Now()); ok {
			t.Fatal("a second token from a bucket of one")
		}
	}
	p.spend(levelError, clk.Now(), false)
	if n := p.queue.Len(); n != 1 {
		t.Errorf("%d events woken by one token handed back, want 1", n)
	}
}

// TestBackoffBounds: "exponential backoff from 1 s up to 1 min, plus up to
// 20% jitter, and never sooner than a Retry-After asks".
func TestBackoffBounds(t *testing.T) {
	p, _, _ := newTestPipeline(t, testConfig(all, 1, 1, 1))
	p.mu.Lock()
	defer p.mu.Unlock()
	for n := 1; n <= 12; n++ {
		base := min(retryBase<<min(n-1, 7), retryMax)
		lo, hi := base, base+base/5
		for range 200 {
			if d := p.backoffFor(n, 0); d < lo || d > hi {
				t.Fatalf("backoff after %d failures: %v, want %v to %v", n, d, lo, hi)
			}
		}
	}
	if d := p.backoffFor(1, 90*time.Second); d != 90*time.Second {
		t.Errorf("backoff with a Retry-After of 90 s: %v", d)
	}
}

// TestTokenHandedBackAfterAnotherSpent: with two requests in flight, one
// spending its token and the other handing it back, the event that found
// both held is woken by the one handed back.
func TestTokenHandedBackAfterAnotherSpent(t *testing.T) {
	p, _, clk := newTestPipeline(t, testConfig(all, defaultQPS, 2, 64))
	p.observe(ln(levelError, "errors", "upstream C down", clk.Now()))
	e, _ := p.queue.Get()
	p.queue.Done(e)
	p.mu.Lock()
	defer p.mu.Unlock()
	for range 2 {
		if _, ok := p.reserve(levelError, nil, clk.Now()); !ok {
			t.Fatal("no token in a full bucket")
		}
	}
	if _, ok := p.reserve(levelError, e, clk.Now()); ok {
		t.Fatal("a third token from a bucket of two")
	}
	p.spend(levelError, clk.Now(), true)  // reached the server: spent
	p.spend(levelError, clk.Now(), false) // never left: handed back
	if n := p.queue.Len(); n != 1 {
		t.Errorf("%d events woken by the token handed back, want 1", n)
	}
}
