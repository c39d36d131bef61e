package k8s_event

import (
	"fmt"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
)

// TestDistinctLinesAreCombined: past ownEvents distinct lines of one
// plugin and level within the window, every new line joins the combined
// event of its shape; the counts add up to the lines; another plugin has
// a window of its own, and the window ends.
func TestDistinctLinesAreCombined(t *testing.T) {
	h, api, clk := newTestHarness(t, testConfig(all, 100, 100, 1024))
	before := testutil.ToFloat64(aggregated[levelError])
	const n = 500
	for i := range n {
		h.observe(ln(levelError, "errors", fmt.Sprintf("2 q%d.example.org. A: i/o timeout", i), clk.Now()))
	}
	drain(h)
	evs := events(t, api)
	if len(evs) != ownEvents+1 {
		t.Fatalf("%d events, want %d distinct and one combined", len(evs), ownEvents)
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
	if combined == nil || combined.Count != n-ownEvents || !strings.HasSuffix(combined.Message, fmt.Sprintf("q%d.example.org. A: i/o timeout", n-1)) {
		t.Fatalf("combined event %+v", combined)
	}
	if got := testutil.ToFloat64(aggregated[levelError]) - before; got != n-ownEvents {
		t.Errorf("aggregated_total rose by %v, want %d", got, n-ownEvents)
	}

	// Another plugin has a window of its own, and the window ends.
	h.observe(ln(levelError, "forward", "boom", clk.Now()))
	clk.Step(budgetWindow + time.Second)
	h.observe(ln(levelError, "errors", "fresh line", clk.Now()))
	drain(h)
	if got := len(events(t, api)); got != ownEvents+3 {
		t.Errorf("%d events, want %d", got, ownEvents+3)
	}
}

// TestShapesPerWindowAreBounded: a window holds at most maxShapes
// combined events; lines of further shapes join one more.
func TestShapesPerWindowAreBounded(t *testing.T) {
	c := newCorrelator(1024, func(*entry) {})
	for i := range ownEvents {
		c.observe(ln(levelError, "errors", fmt.Sprint("distinct ", i), epoch))
	}
	shapes := map[uint64]bool{}
	for i := range 3 * maxShapes {
		// Each line its own shape: a different number of words.
		e := c.observe(ln(levelError, "errors", strings.Repeat("w ", i+1)+"end", epoch))
		if !e.key.combined() {
			t.Fatalf("line %d past the threshold is not combined", i)
		}
		shapes[e.key.shape] = true
	}
	if len(shapes) != maxShapes+1 || !shapes[otherShapes] {
		t.Errorf("%d combined events, want %d shapes and one of the others", len(shapes), maxShapes)
	}
}

// TestOtherShapesAreCountedUpToTheirBound: the event of the lines of other
// shapes counts their shapes up to maxCountedShapes, no more.
func TestOtherShapesAreCountedUpToTheirBound(t *testing.T) {
	c := newCorrelator(1024, func(*entry) {})
	var e *entry
	for i := range ownEvents + maxShapes + maxCountedShapes + 10 {
		e = c.observe(ln(levelError, "errors", strings.Repeat("w ", i+1)+"end", epoch))
	}
	if e.key.shape != otherShapes || len(e.hitters.shapes) != maxCountedShapes {
		t.Errorf("shape %x counts %d shapes, want the other shapes' event with %d", e.key.shape, len(e.hitters.shapes), maxCountedShapes)
	}
}

// TestLinesFlowOnlyWhileQuietIsOn: with quiet off no storm is watched, so
// no line is counted for its pace.
func TestLinesFlowOnlyWhileQuietIsOn(t *testing.T) {
	c := newCorrelator(64, func(*entry) {})
	if e := c.observe(ln(levelError, "errors", "boom", epoch)); e.flow != nil {
		t.Errorf("a line counted for a storm's pace with quiet off")
	}
	c.quiet = defaultQuiet
	if e := c.observe(ln(levelError, "errors", "boom", epoch)); e.flow == nil {
		t.Errorf("a line not counted for its storm's pace with quiet on")
	}
}

// TestFullWindowsKeepTheBudgetsInUse: when maxWindows plugins have a window,
// a new plugin's takes the place of the least recently used, never that of
// a plugin whose budget is spent and whose lines keep coming: its next new
// line is still combined, also when every other window is within its hour.
func TestFullWindowsKeepTheBudgetsInUse(t *testing.T) {
	for _, since := range []time.Duration{budgetWindow + time.Minute, time.Minute} {
		fullWindowsKeepTheBudgetsInUse(t, since)
	}
}

func fullWindowsKeepTheBudgetsInUse(t *testing.T, since time.Duration) {
	c := newCorrelator(4*maxWindows, func(*entry) {})
	for i := range maxWindows - 1 {
		c.observe(ln(levelError, fmt.Sprint("old", i), "x", epoch))
	}
	at := epoch.Add(since)
	for i := range budget {
		c.observe(ln(levelError, "errors", strings.Repeat("w ", i+1)+"end", at))
	}
	c.observe(ln(levelError, "new", "x", at))
	if e := c.observe(ln(levelError, "errors", "w end again", at)); !e.key.combined() {
		t.Errorf("%v after the others: a plugin's window was dropped while its budget was spent: %q is an event of its own", since, e.key.message)
	}
}

// TestWindowsAreBounded: at most maxWindows windows are kept; windows of
// two plugins live side by side; a line at the end of the window is still
// in it.
func TestWindowsAreBounded(t *testing.T) {
	c := newCorrelator(64, func(*entry) {})
	most := 0
	for i := range 3 * maxWindows {
		c.observe(ln(levelError, fmt.Sprint("p", i), "x", epoch))
		most = max(most, c.windows.Len())
	}
	if most != maxWindows {
		t.Errorf("at most %d windows, want %d", most, maxWindows)
	}
	c.windows.Purge()

	// Windows of two plugins live side by side: lines of both, interleaved,
	// are combined past the threshold of each.
	before := testutil.ToFloat64(aggregated[levelInfo])
	for i := range 2 * ownEvents {
		c.observe(ln(levelInfo, "a", fmt.Sprint("a line ", i), epoch))
		c.observe(ln(levelInfo, "b", fmt.Sprint("b line ", i), epoch))
	}
	if got := testutil.ToFloat64(aggregated[levelInfo]) - before; got != 2*ownEvents {
		t.Errorf("%v lines combined, want %d", got, 2*ownEvents)
	}
	c.windows.Purge()
	for i := range ownEvents {
		c.observe(ln(levelWarning, "forward", fmt.Sprint("line ", i), epoch))
	}
	at := epoch.Add(budgetWindow - time.Nanosecond) // the same window still
	before = testutil.ToFloat64(aggregated[levelWarning])
	c.observe(ln(levelWarning, "forward", "one more", at))
	if testutil.ToFloat64(aggregated[levelWarning]) != before+1 {
		t.Error("a line at the end of the window was not combined")
	}
}

// TestSteadyStormStaysCombined: a storm of one distinct line a minute
// never leaves its window: each new line comes within the budget's hour of the
// one before, so from the 11th on every line joins the combined event.
func TestSteadyStormStaysCombined(t *testing.T) {
	c := newCorrelator(1024, func(*entry) {})
	at := epoch
	for i := range 40 {
		e := c.observe(ln(levelError, "errors", fmt.Sprintf("2 q%d.example.net. A: i/o timeout", i), at))
		if i >= ownEvents && !e.key.combined() {
			t.Fatalf("minute %d: the line is an event of its own, want it combined", i)
		}
		at = at.Add(time.Minute)
	}
}

// noiseBurst is the burst of a client whose names never answer: 20 new
// names, 10 of them with a byte that CoreDNS prints as \DDD, each a
// distinct timeout line of plugin/errors.
func noiseBurst(burst int, at time.Time) []line {
	var out []line
	for j := range 20 {
		name := fmt.Sprintf("n%d-%d.noise.example", burst, j)
		if j%2 == 1 {
			name = fmt.Sprintf("n%d\\%03d%d.noise.example", burst, 128+j, j)
		}
		out = append(out, ln(levelError, "errors", fmt.Sprintf("2 %s. A: read udp 10.0.0.9:41000->192.0.2.53:53: i/o timeout", name), at))
	}
	return out
}

// TestPausesDoNotRestartTheBudget: a burst of 20 new names every 10
// minutes and 1 second makes at most ownEvents + maxShapes + 1 new events
// of its plugin and level in any hour, for hours: pausing between bursts
// does not start the budget over.
func TestPausesDoNotRestartTheBudget(t *testing.T) {
	c := newCorrelator(4096, func(*entry) {})
	seen := map[*entry]bool{}
	var made []time.Time
	at := epoch
	for burst := range 30 { // 5 hours
		for _, l := range noiseBurst(burst, at) {
			if e := c.observe(l); !seen[e] {
				seen[e] = true
				made = append(made, at)
			}
		}
		at = at.Add(10*time.Minute + time.Second)
	}
	for i := range made {
		n := 0
		for _, m := range made[i:] {
			if m.Sub(made[i]) < budgetWindow {
				n++
			}
		}
		if n > budget {
			t.Fatalf("%d new events in the hour from %v, want at most %d", n, made[i].Sub(epoch), budget)
		}
	}
	if len(made) < 2*ownEvents {
		t.Errorf("%d new events in 5 hours: the budget did not come back", len(made))
	}
}

// TestEventTimesNeverRunBackOnTheWallClock: after the wall clock steps
// back (NTP, a VM resumed), line times carry a monotonic reading that
// still moves on; the event's lastTimestamp never moves back on the wall
// clock, nor before its firstTimestamp.
func TestEventTimesNeverRunBackOnTheWallClock(t *testing.T) {
	h, api, _ := newTestHarness(t, testConfig(all, 100, 100, 64))
	now := time.Now()
	toEpoch := epoch.Sub(now.Round(0))
	for _, step := range []struct {
		elapsed, wall time.Duration // since the first line: on the monotonic clock, on the wall clock
		first, last   time.Time     // of the event written after it
	}{
		{0, 0, epoch, epoch},
		{time.Second, -time.Hour + time.Second, epoch, epoch}, // the wall clock stepped back an hour
		{2 * time.Second, time.Minute, epoch, epoch.Add(time.Minute)},
	} {
		at := afterStep(now, step.elapsed, toEpoch+step.wall-step.elapsed)
		h.observe(ln(levelError, "errors", "stepped", at))
		drain(h)
		ev := only(t, events(t, api))
		if !ev.FirstTimestamp.Time.Equal(step.first) || !ev.LastTimestamp.Time.Equal(step.last) {
			t.Errorf("after a line at %v on the wall clock: first %v, last %v; want %v, %v",
				at.Round(0), ev.FirstTimestamp.UTC(), ev.LastTimestamp.UTC(), step.first, step.last)
		}
	}
}

// afterStep is what a clock reads elapsed after base, a time.Now reading,
// when its wall clock was stepped by step in between: the monotonic reading
// moves on by elapsed, the wall time by elapsed+step.
func afterStep(base time.Time, elapsed, step time.Duration) time.Time {
	type layout struct { // time.Time's: with a monotonic reading, ext holds it
		wall uint64
		ext  int64
	}
	t, mono := base.Add(elapsed+step), base.Add(elapsed)
	(*layout)(unsafe.Pointer(&t)).ext = (*layout)(unsafe.Pointer(&mono)).ext
	if t.Sub(mono) != 0 || t.Round(0).Sub(mono.Round(0)) != step {
		panic("time.Time is laid out differently")
	}
	return t
}

// TestNewErrorIsWrittenPromptlyDespiteNoise: after an hour of bursts of new
// names every 10 minutes and 1 second, at the default rate, a genuine
// line of another plugin is written within one refill plus its write, and
// through hours more of the noise it is never evicted.
func TestNewErrorIsWrittenPromptlyDespiteNoise(t *testing.T) {
	cfg := testConfig(all, defaultQPS, defaultBurst, defaultCacheSize)
	cfg.quiet = defaultQuiet
	h, api, clk := newTestHarness(t, cfg)
	before := readLedger()
	observed := 0
	const genuine = "plugin/reload: Corefile changed but reload failed"
	var logged time.Time
	for burst := range 6 * 6 { // 6 hours
		start := clk.Now()
		for _, l := range noiseBurst(burst, start) {
			h.observe(l)
			observed++
		}
		if burst == 6 {
			h.advance(time.Minute)
			logged = clk.Now()
			h.observe(ln(levelError, "reload", "Corefile changed but reload failed", logged))
			observed++
			for clk.Since(logged) < 2*time.Duration(float64(time.Second)/defaultQPS) && !written(api, genuine) {
				h.advance(time.Second)
			}
			if !written(api, genuine) {
				t.Fatalf("the reload line is not written %v after it was logged", clk.Since(logged))
			}
			if wait := clk.Since(logged); wait > time.Duration(float64(time.Second)/defaultQPS)+writeTimeout {
				t.Errorf("the reload line waited %v, want at most one refill and its write", wait)
			}
		}
		h.advance(start.Add(10*time.Minute + time.Second).Sub(clk.Now()))
	}
	if e := h.entry(eventKey{level: levelError, plugin: "plugin/reload: ", message: genuine}); e == nil || e.evicted {
		t.Error("the reload line's event left the cache")
	}
	if d := checkLedger(t, api, before, float64(observed)); d.dropped[dropEvicted] != 0 {
		t.Errorf("%v lines evicted", d.dropped[dropEvicted])
	}
}

func written(api *fakeAPI, message string) bool {
	for _, ev := range api.list() {
		if ev.Message == message {
			return true
		}
	}
	return false
}

// word is a word of letters only, distinct for each i: no placeholder in
// the shape takes it.
func word(i int) string {
	b := []byte("kw")
	for {
		b = append(b, byte('a'+i%26))
		i /= 26
		if i == 0 {
			return string(b)
		}
	}
}

// TestBudgetHoldsAcrossAWallClockStepForward: the budget of a plugin and
// level counts the events made in the last hour that passed, on the
// monotonic clock (design.md, "the budgets measure the time that passed
// on the monotonic clock"). A wall clock stepped an hour forward (NTP, a
// VM resumed) is no hour that passed: a minute after a full budget,
// lines of 30 new shapes make no new event.
func TestBudgetHoldsAcrossAWallClockStepForward(t *testing.T) {
	clk := newSteppedClock()
	h := newHarnessOn(t, testConfig(all, 100, 100, 1024), newFakeAPI(t, clk), clk, testPod())
	api := h.api
	for i := range 30 {
		h.observe(ln(levelError, "errors", "upstream "+word(i)+" unhealthy", clk.Now()))
	}
	h.advance(time.Minute)
	made := len(api.list())
	if made != budget {
		t.Fatalf("%d events of 30 shapes, want the budget, %d", made, budget)
	}
	clk.stepWall(time.Hour)
	h.advance(time.Minute)
	for i := 30; i < 60; i++ {
		h.observe(ln(levelError, "errors", "upstream "+word(i)+" unhealthy", clk.Now()))
	}
	h.advance(time.Minute)
	if n := len(api.list()); n > budget {
		t.Errorf("%d events of one plugin and level within 3 minutes on the monotonic clock, want at most %d: a wall clock step of an hour started the budget over", n, budget)
	}
}

// TestStormsThatEndAndComeBackStayWithinTheBudget: a plugin and level make
// at most 21 new events in any sliding hour, and noise cannot reset this.
// A client that sends one line of each of 20 shapes, then waits for the
// storms' ends (quiet 1m) and sends them again, every 2 minutes, makes a
// new Event object for each combined event each time: far more than 21
// creates of the plugin's lines within the hour.
func TestStormsThatEndAndComeBackStayWithinTheBudget(t *testing.T) {
	h, api, clk := newTestHarness(t, withQuiet(100, 100, time.Minute))
	start := clk.Now()
	for clk.Since(start) < 50*time.Minute {
		for i := range 20 {
			h.observe(ln(levelError, "errors", "upstream "+word(i)+" unhealthy", clk.Now()))
		}
		h.advance(2 * time.Minute)
	}
	creates := 0
	for _, r := range eventRequests(api) {
		if r.verb == "create" && r.reason == "CoreDNSError" && r.code < 300 {
			creates++
		}
	}
	if creates > budget {
		t.Errorf("%d events of plugin errors at level error created within 50 minutes, want at most %d (ends: %d)", creates, budget, len(endsIn(api)))
	}
}

// TestPromotionsHaveRoomNewShapesCannotSpend: a client that spends the whole budget of a plugin
// and level (10 events of their own, 10 shapes, the other shapes) leaves the room of promotions
// untouched: a host of 10 timeouts still becomes an event of its own. Promotions have their own
// room, maxPromoted in any hour; past it members stay in the combined event, and a new shape
// joins the other shapes: at most budget + maxPromoted events in the hour.
func TestPromotionsHaveRoomNewShapesCannotSpend(t *testing.T) {
	h, api, clk := newTestHarness(t, testConfig(all, 100, 100, 1024))
	for i := range ownEvents {
		h.observe(ln(levelError, "errors", "upstream "+word(i)+" unhealthy", clk.Now()))
	}
	for i := range maxShapes + 1 {
		h.observe(ln(levelError, "errors", "backend "+word(i)+" refused", clk.Now()))
	}
	timeout := func(host string, port int) string {
		return fmt.Sprintf("2 %s. A: read udp 10.0.0.5:%d->10.0.0.2:53: i/o timeout", host, port)
	}
	for i := range promoteAt {
		h.observe(ln(levelError, "errors", timeout("db.corp.example", 40000+i), clk.Now()))
	}
	for j := range maxPromoted + 2 {
		for i := range promoteAt {
			h.observe(ln(levelError, "errors", timeout(fmt.Sprintf("h%d.corp.example", j), 40000+i), clk.Now()))
		}
	}
	h.observe(ln(levelError, "errors", "a new kind of failure", clk.Now()))
	h.advance(time.Minute)
	if h.entry(eventKey{level: levelError, plugin: "plugin/errors: ", shape: otherShapes, member: "db.corp.example"}) == nil {
		t.Errorf("the host of %d timeouts is no event of its own once a client spent the budget", promoteAt)
	}
	if n := len(api.list()); n > budget+maxPromoted {
		t.Errorf("%d events of one plugin and level within a minute, want at most %d", n, budget+maxPromoted)
	}
}

// TestClientNamesWithAPlusAreOneShape: a client's names with a '+'
// (printed by CoreDNS as they are) are names to the shape, as escaped
// ones are: eleven of them make no combined event each, so a genuine
// error of a new shape of the same plugin, a refusal, still gets a
// combined event of its own shape rather than joining the other shapes.
func TestClientNamesWithAPlusAreOneShape(t *testing.T) {
	h, _, clk := newTestHarness(t, testConfig(all, 100, 100, 1024))
	for i := range ownEvents {
		h.observe(ln(levelError, "errors", "upstream "+word(i)+" unhealthy", clk.Now()))
	}
	for i := range maxShapes + 1 {
		h.observe(ln(levelError, "errors", "2 a+"+word(i)+".example. A: read udp 10.0.0.5:40000->10.0.0.2:53: i/o timeout", clk.Now()))
	}
	genuine := "2 db.corp.example. A: read udp 10.0.0.5:40001->10.0.0.2:53: read: connection refused"
	h.observe(ln(levelError, "errors", genuine, clk.Now()))
	drain(h)
	if h.entry(eventKey{level: levelError, plugin: "plugin/errors: ", shape: shapeHash(genuine)}) == nil {
		var shapes []string
		for _, e := range h.s.corr.cache.values() {
			if e.key.combined() {
				shapes = append(shapes, fmt.Sprintf("%d lines %s", e.seen, lineShape(strings.TrimPrefix(e.message, e.key.plugin))))
			}
		}
		t.Errorf("the refusal joined the other shapes: eleven client names with a '+' took the %d combined shapes:\n%s", maxShapes, strings.Join(shapes, "\n"))
	}
}

// BenchmarkObserveStorm times the scheduler's work for a line of an error
// storm of distinct names, as the storm benchmark's queries make them: past
// the budget every line joins the combined event of its shape, its member
// counted, its flow paced.
func BenchmarkObserveStorm(b *testing.B) {
	cfg := testConfig(all, defaultQPS, defaultBurst, defaultCacheSize)
	cfg.quiet = defaultQuiet
	h, _, clk := newTestHarness(b, cfg)
	lines := make([]line, 4096)
	for i := range lines {
		lines[i] = ln(levelError, "errors", fmt.Sprintf("2 q%d.fail.logline. A: logline: injected failure", i), clk.Now())
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		h.observe(lines[i%len(lines)])
	}
}
