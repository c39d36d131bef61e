package k8s_event

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// holds tells whether the API holds an event whose message ends with msg.
func holds(api *fakeAPI, msg string) bool {
	for _, ev := range api.list() {
		if strings.HasSuffix(ev.Message, msg) {
			return true
		}
	}
	return false
}

// TestNewEventsOfAShapeTakeTurnsByMember: within a shape, new events take
// turns by member, the name their line is about. A client whose timeouts
// make many new events of one shape, all of its own name, puts one of them
// before a host's event of that shape, not all.
func TestNewEventsOfAShapeTakeTurnsByMember(t *testing.T) {
	const refill = 300 * time.Second
	h, api, clk := newTestHarness(t, testConfig(all, 1/refill.Seconds(), 1, 4096))
	const timeout = "2 kw.client.example. A: read udp 10.0.0.9:%d->192.0.2.53:53: i/o timeout"
	for i := range ownEvents - 2 {
		h.observe(ln(levelError, "errors", fmt.Sprintf(timeout, 30000+i), clk.Now()))
	}
	drain(h) // the client's first takes the token there is
	h.advance(time.Second)
	host := "2 db.corp.example. A: read udp 10.0.0.5:40001->10.0.0.2:53: i/o timeout"
	h.observe(ln(levelError, "errors", host, clk.Now()))
	h.advance(refill + writeTimeout)
	if !holds(api, host) {
		t.Errorf("the host's line is not written at the shape's next new event; the %d events "+
			"written are the client's, of one member", len(api.list()))
	}
}

// TestSettlingEntriesTakeTheirPluginsTurn: entries settling (evicted, their
// latest write unanswered) go first within their plugin, not before
// another plugin's line: a quiet plugin's line waits at most (1 + the other
// plugins waiting) refills plus its write's time, whatever the creates in
// doubt of a loud plugin.
func TestSettlingEntriesTakeTheirPluginsTurn(t *testing.T) {
	const refill = 300 * time.Second
	h, api, clk := newTestHarness(t, testConfig(all, 1/refill.Seconds(), 4, 4))
	api.setFault(func(apiRequest) fault { return fault{lost: true} })
	for i := range 4 {
		h.observe(ln(levelError, "forward", fmt.Sprint("upstream ", i, " down"), clk.Now()))
	}
	drain(h) // four creates unanswered: the bucket is empty
	api.setFault(nil)
	for i := 4; i < 8; i++ { // evict the four, which settle
		h.observe(ln(levelError, "forward", fmt.Sprint("upstream ", i, " down"), clk.Now()))
	}
	if len(h.s.settling) == 0 {
		t.Fatal("no entry settling")
	}
	h.observe(ln(levelError, "reload", "Corefile changed but reload failed", clk.Now()))
	bound := 2*refill + writeTimeout
	h.advance(bound)
	if !holds(api, "reload failed") {
		t.Errorf("reload's line is not written within %v, behind %d settling of forward",
			bound, len(h.s.settling))
	}
}

// TestBoundCountsThePodReads: a line's bound as shown counts the reads of
// the pod its create waits for, each a token: with get alone allowed, a
// list refused and a get.
func TestBoundCountsThePodReads(t *testing.T) {
	const refill = 300 * time.Second
	h, api, clk := newPodHarness(t, testConfig(all, 1/refill.Seconds(), 1, 64))
	api.setFault(func(r apiRequest) fault {
		if r.resource == "pods" && r.verb == "list" {
			return fault{code: http.StatusForbidden}
		}
		return fault{}
	})
	logged := clk.Now()
	h.observe(ln(levelError, "errors", "upstream down", logged))
	drain(h)
	bound := time.Duration(delays[levelError].bound.Load())
	for !holds(api, "upstream down") && clk.Since(logged) < time.Hour {
		h.advance(time.Second)
	}
	if wait := clk.Since(logged); wait > bound {
		t.Errorf("the line is written %v after it was logged, past the bound shown, %v", wait, bound)
	}
}

// TestPluginWithNoneOutIsNotHeldBehindAHungPluginServedBeforeIt: with a
// bucket's requests in flight at their cap, all of one plugin's, a plugin
// with none out sends its line, even when the hung plugin was served
// before it and so has the next turn.
func TestPluginWithNoneOutIsNotHeldBehindAHungPluginServedBeforeIt(t *testing.T) {
	h, api, clk := newTestHarness(t, testConfig(all, 100, 100, 64))
	h.hold = func(r request) time.Duration {
		if r.event != nil && strings.HasPrefix(r.event.Message, "plugin/a: ") {
			return 9 * time.Second
		}
		return 0
	}
	for i := range maxInFlight {
		h.observe(ln(levelError, "a", fmt.Sprint("upstream ", i, " down"), clk.Now()))
	}
	drain(h) // a's writes hang
	h.observe(ln(levelError, "b", "upstream B down", clk.Now()))
	drain(h) // b, with none out, sends its line: served after a
	h.observe(ln(levelError, "a", "upstream 9 down", clk.Now()))
	h.observe(ln(levelError, "b", "reload failed", clk.Now()))
	h.advance(time.Second)
	if !holds(api, "reload failed") {
		t.Errorf("b's line, b with none out, is not written a second later: held behind a's turn, " +
			"its requests hung at the cap")
	}
}

// TestFlushKeepsARecreateAheadOfLinesSeenAfterIt: an event whose patch
// found it gone before the flush takes the flush's token before a line
// seen after the patch, even one of a plugin served less recently.
func TestFlushKeepsARecreateAheadOfLinesSeenAfterIt(t *testing.T) {
	h, api, clk := newTestHarness(t, testConfig(all, 0.25, 1, 64))
	h.observe(ln(levelError, "a", "upstream X down", clk.Now()))
	drain(h) // a's event is written: a is served
	api.expire()
	h.advance(4 * time.Second)
	h.observe(ln(levelError, "a", "upstream X down", clk.Now()))
	drain(h) // its patch takes the token and finds it gone
	h.observe(ln(levelError, "b", "reload failed", clk.Now()))
	h.stop(5 * time.Second) // one token comes in the flush
	if !holds(api, "upstream X down") {
		t.Errorf("the re-create is not written in the flush; events: %d, b's line written: %v",
			len(api.list()), holds(api, "reload failed"))
	}
}

// TestUnwrittenAgeIsShownByPlugin: the age of the oldest event never
// written is shown by plugin too, so that the alert names the plugin whose
// line waits; a plugin with none waiting shows 0.
func TestUnwrittenAgeIsShownByPlugin(t *testing.T) {
	h, _, clk := newTestHarness(t, testConfig(all, 1.0/300, 1, 64))
	h.observe(ln(levelError, "errors", "upstream A down", clk.Now()))
	drain(h) // A takes the one token
	clk.Step(10 * time.Second)
	first := clk.Now()
	h.observe(ln(levelError, "forward", "upstream B down", first))
	clk.Step(10 * time.Second)
	drain(h)
	if since := pluginAge(levelError, "plugin/forward: ").Load(); since != first.UnixNano() {
		t.Errorf("forward's oldest unwritten since %v, want B's first line at %v",
			time.Unix(0, since), first)
	}
	if since := pluginAge(levelError, "plugin/errors: ").Load(); since != 0 {
		t.Errorf("errors' oldest unwritten since %v, want none: A is written", time.Unix(0, since))
	}
	shown := map[string]float64{}
	families, err := prometheus.DefaultGatherer.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != "coredns_k8s_event_unwritten_plugin_age_seconds" {
			continue
		}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["reason"] == "CoreDNSError" {
				shown[labels["plugin"]] = m.GetGauge().GetValue()
			}
		}
	}
	if age, ok := shown["forward"]; !ok || age <= 0 {
		t.Errorf("forward's unwritten age shown %v (%v), want its wait", age, ok)
	}
	if age, ok := shown["errors"]; !ok || age != 0 {
		t.Errorf("errors' unwritten age shown %v (%v), want 0", age, ok)
	}
}

// TestEndOfAMembersEventNamesItsMember: the end of a promoted member's
// event names the member, so that it is not the same event as the end of
// its shape's combined event over the same seconds.
func TestEndOfAMembersEventNamesItsMember(t *testing.T) {
	at := epoch
	key := eventKey{level: levelError, plugin: "plugin/errors: ", shape: otherShapes}
	shape := newEntry(key, at)
	shape.hitters, shape.stamped = &hitters{}, at
	shape.message = "plugin/errors: 2 q1.example.org. A: i/o timeout"
	shape.seen = 1
	key.member = "db1.corp.example"
	member := newEntry(key, at)
	member.hitters, member.stamped = &hitters{}, at
	member.message = "plugin/errors: 2 db1.corp.example. A: i/o timeout"
	member.seen = 1
	a, b := endOf(shape, at.Add(time.Minute)), endOf(member, at.Add(time.Minute))
	if a.message == b.message || !strings.Contains(b.message, key.member) {
		t.Errorf("the end of the member's event says %q, of its shape's %q: want the member named",
			b.message, a.message)
	}
}

// TestStormEndedBeforeItsFlowWasCountedEndsOnceARise: a storm logged while
// quiet was off has no flow; once quiet is on it ends after its quiet. A
// line after that end is no rise: no second end.
func TestStormEndedBeforeItsFlowWasCountedEndsOnceARise(t *testing.T) {
	h, api, clk := newTestHarness(t, testConfig(all, 100, 100, 64))
	for i := range ownEvents + 1 { // the last joins the combined event of its shape
		h.observe(ln(levelError, "forward", fmt.Sprint("upstream ", i, " unhealthy"), clk.Now()))
	}
	drain(h)
	cfg := testConfig(all, 100, 100, 64)
	cfg.quiet = 30 * time.Second
	h.apply(cfg)
	h.advance(time.Minute)
	if n := len(endsIn(api)); n != 1 {
		t.Fatalf("%d ends once quiet is on and up, want 1", n)
	}
	h.observe(ln(levelError, "forward", "upstream 99 unhealthy", clk.Now()))
	h.advance(time.Minute)
	if n := len(endsIn(api)); n != 1 {
		t.Errorf("%d ends after one more line, want still 1: the storm did not rise again", n)
	}
}

// TestReloadThatChangesQuietKeepsTheLinesOfTheLastQuiet: a reload that
// changes quiet counts the storm's flow in slots of the new quiet; the
// lines of the last quiet still count, as of the reload, so that the storm
// does not end while its last quiet holds more lines than its threshold.
func TestReloadThatChangesQuietKeepsTheLinesOfTheLastQuiet(t *testing.T) {
	cfg := testConfig(all, 100, 100, 64)
	cfg.quiet = time.Minute
	h, api, clk := newTestHarness(t, cfg)
	for i := range ownEvents + 5 { // the last 5 join the combined event of their shape
		h.observe(ln(levelError, "forward", fmt.Sprint("upstream ", i, " unhealthy"), clk.Now()))
	}
	h.advance(10 * time.Second)
	cfg.quiet = 2 * time.Minute
	h.apply(cfg)
	h.observe(ln(levelError, "forward", "upstream 99 unhealthy", clk.Now()))
	h.advance(45 * time.Second)
	if n := len(endsIn(api)); n != 0 {
		t.Errorf("%d ends 45 s after a reload to quiet 2m, with 6 lines in the last quiet", n)
	}
	h.advance(3 * time.Minute)
	if n := len(endsIn(api)); n != 1 {
		t.Errorf("%d ends once the storm calmed, want 1", n)
	}
}

// TestQuietPluginsLineWhoseEventExpiredIsWrittenWithinTheBound: a plugin
// with nothing pending logs a line of an event the API server's TTL
// removed, while two other plugins have lines waiting. Its patch finds the
// event gone and it is created anew: the re-create is the same write
// continued, so the line waits one refill and one write's time more than
// the README's bound, (1 + 2 + 1) refills and two writes' time, not a
// second turn behind the other plugins.
func TestQuietPluginsLineWhoseEventExpiredIsWrittenWithinTheBound(t *testing.T) {
	const refill = 300 * time.Second
	h, api, clk := newTestHarness(t, testConfig(all, 1/refill.Seconds(), 1, 64))
	h.observe(ln(levelError, "reload", "Corefile changed but reload failed", clk.Now()))
	drain(h) // reload's event is written with the one token
	h.advance(2 * time.Hour)
	api.expire()       // the API server's --event-ttl removed it
	for i := range 8 { // two loud plugins with new events waiting
		h.observe(ln(levelError, "forward", fmt.Sprint("upstream ", i, " down"), clk.Now()))
		h.observe(ln(levelError, "errors", fmt.Sprint("zone ", i, " broken"), clk.Now()))
	}
	drain(h) // the token there is goes to one of them
	logged := clk.Now()
	h.observe(ln(levelError, "reload", "Corefile changed but reload failed", logged))
	drain(h)
	bound := (1+2+1)*refill + 2*writeTimeout
	for clk.Since(logged) < 4*bound {
		for _, ev := range api.list() {
			if strings.HasSuffix(ev.Message, "reload failed") && ev.Count == 2 {
				if wait := clk.Since(logged); wait > bound {
					t.Errorf("reload's line is written %v after it was logged, past the bound %v",
						wait, bound)
				}
				return
			}
		}
		h.advance(time.Second)
	}
	t.Errorf("reload's line is not written within %v", 4*bound)
}

// TestBoundShownCountsARecreateWaiting: reload had a turn after forward's
// line of an expired event began to wait, so forward's re-create, its
// patch's write continued, goes before reload's next line. The bound shown
// for that line (which the alert CoreDNSEventsDelayed compares its age to)
// counts the re-create waiting: the line is written within the largest
// bound shown while it waits.
func TestBoundShownCountsARecreateWaiting(t *testing.T) {
	const refill = 300 * time.Second
	h, api, clk := newTestHarness(t, testConfig(all, 1/refill.Seconds(), 1, 64))
	h.observe(ln(levelError, "reload", "Corefile changed", clk.Now()))
	drain(h) // reload is served first
	h.advance(refill)
	h.observe(ln(levelError, "forward", "upstream X down", clk.Now()))
	drain(h) // then forward
	h.advance(2 * time.Hour)
	api.expire()
	h.observe(ln(levelError, "forward", "upstream X down", clk.Now())) // a patch: it finds it gone
	h.observe(ln(levelError, "reload", "reload failed", clk.Now()))
	drain(h) // reload's turn comes first: its line takes the one token
	logged := clk.Now()
	h.observe(ln(levelError, "reload", "Corefile broken", logged))
	drain(h)
	wait, bound := untilWritten(h, clk, logged, 2*time.Hour, func() bool { return holds(api, "Corefile broken") }, nil)
	if wait > bound {
		t.Errorf("reload's line is written %v after it was logged, past the largest bound "+
			"shown, %v", wait, bound)
	}
}

// clockLike is what untilWritten reads of a test's clock.
type clockLike interface{ Since(time.Time) time.Duration }

// untilWritten advances h a second at a time from logged until written says the line is, or
// limit passed; it returns the line's wait and the largest bound the gauge showed meanwhile.
// each, if set, runs before every step.
func untilWritten(h *harness, clk clockLike, logged time.Time, limit time.Duration, written func() bool,
	each func()) (wait, shown time.Duration) {
	for !written() && clk.Since(logged) < limit {
		if each != nil {
			each()
		}
		shown = max(shown, time.Duration(delays[levelError].bound.Load()))
		h.advance(time.Second)
	}
	return clk.Since(logged), shown
}

// patched tells whether the API was sent a patch.
func patched(api *fakeAPI) func() bool {
	return func() bool {
		_, patches := api.writes()
		return patches > 0
	}
}
