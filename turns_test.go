package k8s_event

import (
	"fmt"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
)

// TestUpdateWaitsOneRefillMoreForANewEventOfItsShapeAfterIt: README and
// design.md, "The promises in full": a line of a plugin that has nothing
// pending waits at most "(1 + the number of other plugins with lines of its
// reason waiting before it is written, new or not: each goes ahead of it
// once at most, ...; and one more when a new event of its own plugin comes
// after it, of its shape or another, as new events go first within a plugin)
// refills (1 / QPS) plus its write's own time". An update of a quiet plugin's event, two busy
// plugins waiting and a new event of its plugin and shape logged after it:
// (1 + 2 + 1) refills and a write, and within the largest bound shown.
func TestUpdateWaitsOneRefillMoreForANewEventOfItsShapeAfterIt(t *testing.T) {
	const refill = 300 * time.Second
	const timeout = "2 %s. A: read udp 10.0.0.9:40001->192.0.2.53:53: i/o timeout"
	h, api, clk, logged := updateBehindTwoBusyPlugins(t, refill, fmt.Sprintf(timeout, "db.corp.example"))
	h.advance(time.Second)
	h.observe(ln(levelError, "errors", fmt.Sprintf(timeout, "web.corp.example"), clk.Now()))
	drain(h) // a new event of its shape, after it
	wait, shown := untilWritten(h, clk, logged, 4*time.Hour, patched(api), nil)
	stated := (1+2+1)*refill + writeTimeout
	if wait > stated {
		t.Errorf("the update is written %v after its line, past the stated bound %v "+
			"((1 + 2 + 1) refills and a write)", wait, stated)
	}
	if wait > shown {
		t.Errorf("the update is written %v after its line, past the largest bound shown, %v",
			wait, shown)
	}
}

// TestBoundShownCountsPluginsThatComeWhileALineWaits: monitoring.md,
// "CoreDNSEventsDelayed": "An event never written has waited longer than a
// new line may: unwritten_plugin_age_seconds ... passed
// unwritten_bound_seconds ... by more than the 82 s of recovery". Plugins
// served before a quiet plugin's line began to wait each go ahead of it once
// (README: "each goes ahead of it once at most"), also those whose line
// comes while it waits; so the bound shown must count them before the wait
// passes it: four plugins, each logging its line after the one before it is
// written, keep the line within the largest bound shown plus 82 s.
func TestBoundShownCountsPluginsThatComeWhileALineWaits(t *testing.T) {
	const refill = 300 * time.Second
	h, api, clk := newTestHarness(t, testConfig(all, 1/refill.Seconds(), 1, 64))
	others := []string{"forward", "kubernetes", "cache", "hosts"}
	for _, p := range others { // each served once, before reload
		h.observe(ln(levelError, p, p+" broke", clk.Now()))
	}
	h.observe(ln(levelError, "reload", "Corefile changed", clk.Now()))
	h.advance(time.Duration(len(others)) * refill)
	if !holds(api, "Corefile changed") {
		t.Fatal("reload's first line is not written after the others'")
	}
	h.advance(time.Second) // the bucket is empty
	logged := clk.Now()
	h.observe(ln(levelError, "reload", "reload failed", logged))
	drain(h)
	next := 0
	wait, shown := untilWritten(h, clk, logged, 4*time.Hour, func() bool { return holds(api, "reload failed") }, func() {
		// the next plugin logs a line once the one before it is written
		if next < len(others) && (next == 0 || holds(api, others[next-1]+" broke again")) {
			h.observe(ln(levelError, others[next], others[next]+" broke again", clk.Now()))
			next++
		}
	})
	if wait > shown+82*time.Second {
		t.Errorf("reload's line is written %v after it was logged, past the largest bound shown "+
			"plus 82 s, %v: CoreDNSEventsDelayed fires on a line within the README's bound",
			wait, shown+82*time.Second)
	}
}

// TestUpdateIsHeldOnceByANewEventOfAnotherShapeAfterIt: README and
// design.md, "The promises in full": a line of a plugin that has nothing
// pending waits at most "(1 + the number of other plugins with lines of its
// reason waiting before it is written ...; and one more when a new event of
// its own plugin comes after it ...) refills (1 / QPS) plus its write's own
// time". New events go first within a plugin, a new shape before a shape
// served (information first), so a new event of another shape after the
// line takes its plugin's turn: no sound order keeps it out of the bound
// without holding new information behind an update. What it may not do is
// cost a second turn of every other plugin: the plugin keeps its place for
// the line. An update of a quiet plugin's event, two busy plugins waiting,
// is written within (1 + 2 + 1) refills and a write, not (1 + 2 + 1 + 2).
func TestUpdateIsHeldOnceByANewEventOfAnotherShapeAfterIt(t *testing.T) {
	const refill = 300 * time.Second
	h, api, clk, logged := updateBehindTwoBusyPlugins(t, refill,
		"2 db.corp.example. A: read udp 10.0.0.9:40001->192.0.2.53:53: i/o timeout")
	h.advance(time.Second)
	h.observe(ln(levelError, "errors", "plugin errors: zone example.org has no SOA", clk.Now()))
	drain(h) // a new event of another shape, after it
	_, patches := api.writes()
	for patches == 0 && clk.Since(logged) < 4*time.Hour {
		h.advance(time.Second)
		_, patches = api.writes()
	}
	if wait, stated := clk.Since(logged), (1+2+1)*refill+writeTimeout; wait > stated {
		t.Errorf("the update is written %v after its line, past the stated bound %v "+
			"((1 + 2 + 1) refills and a write)", wait, stated)
	}
}

// TestStormOfOneLineKeepsItsHysteresisWhenEvicted: design.md, "The end of a
// storm": "a new end comes only after the storm rose above its threshold
// again, even when the cache let its event go after its end (the latest 10
// such per plugin and level keep their shape, member and peak for the next
// event of the same key)". A storm is "a combined event, or an event of 10
// lines or more": a line repeated 1,000 times in a quiet ends once; the cache
// lets its event go; then the same line, 6 times a quiet (under 1 % of the
// peak), makes no second end.
func TestStormOfOneLineKeepsItsHysteresisWhenEvicted(t *testing.T) {
	cfg := testConfig(all, 100, 100, 8)
	cfg.quiet = time.Minute
	h, api, clk := newTestHarness(t, cfg)
	const storm = "no healthy upstream"
	for range 1000 {
		h.observe(ln(levelError, "forward", storm, clk.Now()))
	}
	h.advance(2 * time.Minute)
	if n := len(endsIn(api)); n != 1 {
		t.Fatalf("%d ends of the storm of 1,000 lines, want 1", n)
	}
	for i := range 8 { // other events fill the cache: the storm's, written and ended, goes
		h.observe(ln(levelError, "reload", fmt.Sprint("Corefile ", i, " broken"), clk.Now()))
		h.advance(time.Second)
	}
	for _, e := range h.s.corr.cache.values() {
		if e.key.message == "plugin/forward: "+storm {
			t.Fatal("the storm's event is still cached; the test wants it evicted")
		}
	}
	for range 12 { // 6 lines a quiet: under 1 % of the peak of 1,000
		h.observe(ln(levelError, "forward", storm, clk.Now()))
		h.advance(10 * time.Second)
	}
	h.advance(5 * time.Minute)
	if n := len(endsIn(api)); n != 1 {
		t.Errorf("%d ends: the storm of 1,000 lines a quiet ended again after 6 lines a quiet, "+
			"without rising above 1 %% of its peak", n)
	}
}

// updateBehindTwoBusyPlugins is a harness at a refill of refill where errors' event of first
// was written, two busy plugins never served wait, and a line of first, an update, was logged
// at logged: errors has nothing else pending.
func updateBehindTwoBusyPlugins(t *testing.T, refill time.Duration, first string) (*harness, *fakeAPI,
	*clocktesting.FakeClock, time.Time) {
	h, api, clk := newTestHarness(t, testConfig(all, 1/refill.Seconds(), 1, 64))
	h.observe(ln(levelError, "errors", first, clk.Now()))
	drain(h) // its create takes the one token: errors is served
	h.advance(time.Second)
	for i := range 5 { // two busy plugins, never served yet
		h.observe(ln(levelError, "forward", fmt.Sprint("upstream ", i, " down"), clk.Now()))
		h.observe(ln(levelError, "kubernetes", fmt.Sprint("watch ", i, " failed"), clk.Now()))
	}
	drain(h)
	h.advance(time.Second)
	logged := clk.Now()
	h.observe(ln(levelError, "errors", first, logged))
	drain(h)
	return h, api, clk, logged
}
