package k8s_event

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
)

// quietConfig is testConfig with the given quiet.
func quietConfig(qps float64, burst int, quiet time.Duration) config {
	c := testConfig(all, qps, burst, 64)
	c.quiet = quiet
	return c
}

// wake does what the work queue's timers do when their time comes: it
// hands every cached entry and every end to a writer.
func wake(p *pipeline) {
	drain(p)
	p.mu.Lock()
	es := append(p.cache.Values(), p.endEntries()...)
	p.mu.Unlock()
	for _, e := range es {
		p.sync(e)
	}
	drain(p)
}

func withReasonIn(evs []corev1.Event, reason string) []corev1.Event {
	var out []corev1.Event
	for _, e := range evs {
		if e.Reason == reason {
			out = append(out, e)
		}
	}
	return out
}

// stormLines logs n distinct lines of one shape, numbered from from.
func logStorm(p *pipeline, l level, from, n int, at time.Time) {
	for i := from; i < from+n; i++ {
		p.observe(ln(l, "errors", fmt.Sprintf("2 q%d.example.net. A: read udp 10.0.0.5:%d->10.0.0.2:53: i/o timeout", i, 40000+i), at))
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

// TestStormEndIsSaid: a storm that has had no new line for quiet gets one
// Normal end event with its labels, total and times; the lines it stands
// for stay out of the ledger; a storm that comes back is a new object and
// ends again. Events that are no storm get no end.
func TestStormEndIsSaid(t *testing.T) {
	const quiet = time.Minute
	p, api, clk := newTestPipeline(t, quietConfig(100, 100, quiet))
	before := readLedger()
	endedBefore := testutil.ToFloat64(ended[levelError])

	start := clk.Now()
	logStorm(p, levelError, 0, 20, start)
	clk.Step(10 * time.Second)
	logStorm(p, levelError, 20, 20, clk.Now())
	p.observe(ln(levelError, "forward", "one line, no storm", clk.Now()))
	for range 20 { // a storm of info lines: no end is said of it
		p.observe(ln(levelInfo, "forward", "info storm", clk.Now()))
	}
	last := clk.Now()
	drain(p)

	clk.Step(quiet - time.Second)
	wake(p)
	if n := len(withReasonIn(events(t, api), "CoreDNSErrorEnded")); n != 0 {
		t.Fatalf("%d end events before the storm was quiet for %v", n, quiet)
	}
	clk.Step(time.Second + handOffGrace)
	wake(p)
	evs := events(t, api)
	ends := withReasonIn(evs, "CoreDNSErrorEnded")
	storm := only(t, combinedOf(evs))
	end := only(t, ends)
	if end.Type != corev1.EventTypeNormal || end.Labels[labelPlugin] != "errors" || end.Labels[labelLevel] != "error" {
		t.Errorf("end event type %s labels %v", end.Type, end.Labels)
	}
	if storm.Count != 30 {
		t.Errorf("combined count %d, want 30", storm.Count)
	}
	want := fmt.Sprintf(`plugin/errors: 30 lines like "2 q39.example.net. A: read udp 10.0.0.5:40039->10.0.0.2:53: i/o timeout" from %s to %s, none since`,
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
	clk.Step(3 * quiet)
	wake(p)
	if n := len(withReasonIn(events(t, api), "CoreDNSErrorEnded")); n != 1 {
		t.Fatalf("%d end events after a longer quiet, want 1", n)
	}

	// The storm comes back: a new object, and a new end.
	again := clk.Now()
	logStorm(p, levelError, 1000, 5, again)
	drain(p)
	clk.Step(quiet + handOffGrace)
	wake(p)
	evs = events(t, api)
	combined := combinedOf(evs)
	if len(combined) != 2 {
		t.Fatalf("%d combined events, want the ended one and a new one", len(combined))
	}
	for _, e := range combined {
		if e.Name == storm.Name && (e.Count != 30 || !e.LastTimestamp.Equal(&storm.LastTimestamp)) {
			t.Errorf("the ended storm's event was patched: %+v", e)
		}
		if e.Name != storm.Name && (e.Count != 5 || !e.FirstTimestamp.Time.Equal(again.Truncate(time.Second))) {
			t.Errorf("the new storm's event: count %d first %v, want 5 from %v", e.Count, e.FirstTimestamp, again)
		}
	}
	if ends := withReasonIn(evs, "CoreDNSErrorEnded"); len(ends) != 2 || !strings.Contains(ends[0].Message+ends[1].Message, ": 5 lines like \"2 q1004.") {
		t.Errorf("end events after the storm came back:\n%v", ends)
	}
	checkLedger(t, api, before, 40+1+20+5)
}

// TestQuietOffSaysNoEnd: with quiet off, a storm's end is not said.
func TestQuietOffSaysNoEnd(t *testing.T) {
	p, api, clk := newTestPipeline(t, quietConfig(100, 100, 0))
	logStorm(p, levelWarning, 0, 40, clk.Now())
	drain(p)
	clk.Step(24 * time.Hour)
	wake(p)
	for _, e := range events(t, api) {
		if strings.HasSuffix(e.Reason, "Ended") {
			t.Fatalf("end event with quiet off: %+v", e)
		}
	}
}

// TestEndCreateUnansweredIsWrittenOnce: an end whose create reached the
// API and got no answer is retried under the same name; it is one event.
func TestEndCreateUnansweredIsWrittenOnce(t *testing.T) {
	p, api, clk := newTestPipeline(t, quietConfig(100, 100, time.Minute))
	p.writeTimeout = 100 * time.Millisecond
	endedBefore := testutil.ToFloat64(ended[levelWarning])
	logStorm(p, levelWarning, 0, 12, clk.Now())
	drain(p)
	var once sync.Once // the next request is the end's first create
	api.setFault(func(r apiRequest) (f fault) {
		once.Do(func() { f = fault{hang: true, apply: true} })
		return f
	})
	clk.Step(time.Minute + handOffGrace)
	wake(p)
	if n := testutil.ToFloat64(ended[levelWarning]) - endedBefore; n != 0 {
		t.Errorf("ended_total rose by %v after an unanswered create, want 0", n)
	}
	clk.Step(retryMax * 2)
	wake(p)
	if ends := withReasonIn(events(t, api), "CoreDNSWarningEnded"); len(ends) != 1 {
		t.Fatalf("%d end events, want 1", len(ends))
	}
	if n := testutil.ToFloat64(ended[levelWarning]) - endedBefore; n != 1 {
		t.Errorf("ended_total rose by %v, want 1", n)
	}
	creates := 0
	api.mu.Lock()
	defer api.mu.Unlock()
	for _, r := range api.requests {
		if r.reason == "CoreDNSWarningEnded" {
			creates++
		}
	}
	if creates != 2 {
		t.Errorf("%d requests of the end, want 2 (the unanswered one, the retry)", creates)
	}
}

// TestEndsHaveTheirOwnBucket: a storm that empties its level's bucket
// leaves its end the tokens of the end bucket, and the end takes none of
// the level's.
func TestEndsHaveTheirOwnBucket(t *testing.T) {
	p, api, clk := newTestPipeline(t, quietConfig(1.0/3600, 1, time.Minute))
	for range 15 { // one line repeated: one create, the bucket's only token
		p.observe(ln(levelError, "errors", "upstream unhealthy", clk.Now()))
	}
	drain(p)
	clk.Step(time.Minute + handOffGrace)
	wake(p)
	if n := len(withReasonIn(events(t, api), "CoreDNSErrorEnded")); n != 1 {
		t.Errorf("%d end events with the error bucket empty, want 1", n)
	}
	if tokens := p.buckets[levelError].TokensAt(clk.Now()); tokens >= 1 {
		t.Errorf("%.2f error tokens after the storm and its end, want the bucket empty", tokens)
	}
	// The next end finds the end bucket empty: it waits, and is counted
	// as throttled under its reason.
	p.observe(ln(levelWarning, "errors", "upstream slow", clk.Now()))
	throttledBefore := testutil.ToFloat64(throttledEnd[levelWarning])
	for range 14 {
		p.observe(ln(levelWarning, "errors", "upstream slow", clk.Now()))
	}
	drain(p)
	clk.Step(time.Minute + handOffGrace)
	wake(p)
	if n := len(withReasonIn(events(t, api), "CoreDNSWarningEnded")); n != 0 {
		t.Errorf("%d warning end events with the end bucket empty, want 0", n)
	}
	if n := testutil.ToFloat64(throttledEnd[levelWarning]) - throttledBefore; n < 1 {
		t.Errorf("throttled_total of the end rose by %v, want at least 1", n)
	}
}
