package k8s_event

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestEvictionKeepsAHostsEventOfManyLinesBeforeAClientsFreshNames: in a
// full cache, within one plugin and shape, a client's fresh names of one
// line each are noise; a host's event of 20 timeouts is not. Noise evicts
// its own lines, even when it shares a plugin with a failing host.
func TestEvictionKeepsAHostsEventOfManyLinesBeforeAClientsFreshNames(t *testing.T) {
	const size = 4
	h, _, clk := newTestHarness(t, testConfig(all, 1.0/300, 1, size))
	const client = "2 n%d.client.example. A: read udp 10.0.0.9:30000->192.0.2.53:53: i/o timeout"
	const host = "2 db.corp.example. A: read udp 10.0.0.5:40001->10.0.0.2:53: i/o timeout"
	before := readLedger()
	h.observe(ln(levelError, "errors", fmt.Sprintf(client, 0), clk.Now()))
	drain(h) // the client's first line takes the one token
	for range 20 {
		h.advance(time.Second)
		h.observe(ln(levelError, "errors", host, clk.Now()))
	}
	drain(h)
	for i := 1; i <= size; i++ { // fresh names of one line each fill the cache
		h.advance(time.Second)
		h.observe(ln(levelError, "errors", fmt.Sprintf(client, i), clk.Now()))
		drain(h)
	}
	key := eventKey{level: levelError, plugin: "plugin/errors: ", message: "plugin/errors: " + host}
	if h.entry(key) == nil {
		var left []string
		for _, e := range h.s.corr.cache.values() {
			left = append(left, fmt.Sprintf("%d line(s): %s", e.seen, e.message))
		}
		t.Errorf("the host's event of 20 lines was evicted (%v lines dropped as evicted); "+
			"the cache keeps the client's names: %q",
			readLedger().since(before).dropped[dropEvicted], left)
	}
}

// TestOneLineAfterAStormsEndMakesNoSecondEnd: a storm rises once and ends;
// the cache then lets its event go for other plugins' lines, as it lets a
// written event go first. One more line of the storm's shape is no rise:
// no second end may follow it.
func TestOneLineAfterAStormsEndMakesNoSecondEnd(t *testing.T) {
	const quiet = time.Minute
	cfg := withQuiet(100, 100, quiet)
	cfg.cacheSize = 16
	h, api, clk := newTestHarness(t, cfg)
	logStorm(h, levelError, 0, 200, clk.Now())
	h.advance(2 * quiet)
	if n := len(endsIn(api)); n != 1 {
		t.Fatalf("%d ends after the storm's quiet, want 1", n)
	}
	for i := range cfg.cacheSize { // other plugins' lines, one each
		h.observe(ln(levelError, fmt.Sprint("p", i), "upstream down", clk.Now()))
	}
	h.advance(time.Second)
	logStorm(h, levelError, 1000, 1, clk.Now())
	h.advance(10 * quiet)
	if ends := endsIn(api); len(ends) != 1 {
		var msgs []string
		for _, e := range ends {
			msgs = append(msgs, e.Message)
		}
		t.Errorf("%d ends of one rise and one line since its end: %q", len(ends), msgs)
	}
}

// TestShorterQuietDoesNotEndAStormThatGoesOn: a storm goes on at a line every
// 6 s, 50 lines in its quiet of 5 minutes. A reload makes quiet a minute:
// the storm still holds 10 lines in each minute, far above its threshold of
// max(2, 1 % of its peak), so no end may be said while its lines come.
func TestShorterQuietDoesNotEndAStormThatGoesOn(t *testing.T) {
	h, api, clk := newTestHarness(t, withQuiet(100, 100, 5*time.Minute))
	logStorm(h, levelError, 0, 200, clk.Now())
	n := 1000
	for range 100 { // ten minutes of a line every 6 s
		h.advance(6 * time.Second)
		logStorm(h, levelError, n, 1, clk.Now())
		n++
	}
	h.advance(3 * time.Second)
	h.apply(withQuiet(100, 100, time.Minute))
	for range 50 { // five more minutes
		h.advance(3 * time.Second)
		logStorm(h, levelError, n, 1, clk.Now())
		n++
		h.advance(3 * time.Second)
	}
	if ends := endsIn(api); len(ends) != 0 {
		t.Errorf("%d end(s) of a storm of 10 lines a minute, a line every 6 s to the last: %q",
			len(ends), ends[0].Message)
	}
}

// TestNamesOfOneLineEachSharingALongFirstLabelAreNotPromoted: ten names of
// one timeout each, all with the same first label of 63 bytes, are ten
// names of one line: none may become an event of its own, whatever the
// noise.
func TestNamesOfOneLineEachSharingALongFirstLabelAreNotPromoted(t *testing.T) {
	c := newCorrelator(defaultCacheSize, func(*entry) {})
	for i := range ownEvents {
		c.observe(ln(levelError, "errors", "upstream "+word(i)+" unhealthy", epoch))
	}
	label := strings.Repeat("x", 63)
	const timeout = "2 %s.n%d.client.example. A: read udp 10.0.0.9:30000->192.0.2.53:53: i/o timeout"
	for i := range 2 * promoteAt {
		c.observe(ln(levelError, "errors", fmt.Sprintf(timeout, label, i),
			epoch.Add(time.Duration(i)*time.Second)))
	}
	for _, e := range c.cache.values() {
		if e.key.member != "" {
			t.Errorf("%d names of one line each made an event of its own, of member %q: %s",
				2*promoteAt, e.key.member, e.message)
		}
	}
}

// TestSingleLabelNamesOfAClientMakeOneShape: a client's queries for names
// of one label (a top-level name, "q1.", "q2.", ...) that time out are one
// shape: the name is a token the client chooses, whatever its labels.
func TestSingleLabelNamesOfAClientMakeOneShape(t *testing.T) {
	const timeout = "2 %s A: read udp 10.0.0.5:41234->10.0.0.2:53: i/o timeout"
	shapes := map[string]bool{}
	for i := range 100 {
		shapes[lineShape(fmt.Sprintf(timeout, fmt.Sprintf("q%d.", i)))] = true
	}
	if len(shapes) != 1 {
		t.Errorf("100 queries for names of one label make %d shapes, such as %q",
			len(shapes), lineShape(fmt.Sprintf(timeout, "q7.")))
	}
}

// TestClientsOwnPromotionsDoNotKeepAHostFromItsEvent: at the default rate,
// a client spends the room of promotions with names of its own: each hour,
// as the room frees, 11 fresh names of 11 timeouts each, just over the
// threshold. A host that times out once a minute, 60 lines in any hour,
// has more lines than any of them: a place of the room goes to the member
// with the most lines first, so the host must become an event of its own
// within the 3 hours, its name in an event of its own.
func TestClientsOwnPromotionsDoNotKeepAHostFromItsEvent(t *testing.T) {
	h, _, clk := newTestHarness(t, testConfig(defaultLevels, defaultQPS, defaultBurst,
		defaultCacheSize))
	start := clk.Now()
	for i := range ownEvents {
		h.observe(ln(levelError, "errors", "upstream "+word(i)+" unhealthy", start))
	}
	const host = "db.corp.example"
	const client = "2 n%d.client.example. A: read udp 10.0.0.9:%d->192.0.2.53:53: i/o timeout"
	const timeout = "2 %s. A: read udp 10.0.0.5:%d->10.0.0.2:53: i/o timeout"
	name, hostLines := 0, 0
	promotedAt := time.Duration(-1)
	for at := time.Duration(0); at < 3*time.Hour && promotedAt < 0; at += time.Minute {
		if at%budgetWindow == 0 { // the room freed: fresh names just over the threshold
			for range maxPromoted + 1 {
				name++
				for k := range promoteAt + 1 {
					h.observe(ln(levelError, "errors", fmt.Sprintf(client, name, 30000+k),
						clk.Now()))
				}
			}
		}
		h.advance(30 * time.Second)
		hostLines++
		h.observe(ln(levelError, "errors", fmt.Sprintf(timeout, host, 1024+hostLines),
			clk.Now()))
		for _, e := range h.s.corr.cache.values() {
			if e.key.member == host && strings.Contains(e.message, host) {
				promotedAt = at
			}
		}
		h.advance(30 * time.Second)
	}
	if promotedAt < 0 {
		others := 0
		for _, e := range h.s.corr.cache.values() {
			if e.key.member != "" {
				others++
			}
		}
		t.Errorf("a host of one timeout a minute (%d lines in 3 h) is no event of its own; "+
			"%d names of the client are, of %d queries", hostLines, others,
			name*(promoteAt+1))
	}
}

// TestAPlaceOfTheRoomGoesToTheMemberOfTheMostLines: the room of promotions
// is spent by a client's names; a host of 30 timeouts waits. When one place
// frees, a client's name that just reached the threshold does not take it:
// the host, of more lines, is elected, and its next line is an event of
// its own.
func TestAPlaceOfTheRoomGoesToTheMemberOfTheMostLines(t *testing.T) {
	c := newCorrelator(defaultCacheSize, func(*entry) {})
	for i := range ownEvents {
		c.observe(ln(levelError, "errors", "upstream "+word(i)+" unhealthy", epoch))
	}
	const line = "2 %s. A: read udp 10.0.0.9:%d->192.0.2.53:53: i/o timeout"
	name := func(i int) string { return fmt.Sprintf("n%d.client.example", i) }
	logN := func(member string, n int, at time.Duration) {
		for k := range n {
			c.observe(ln(levelError, "errors", fmt.Sprintf(line, member, 30000+k), epoch.Add(at)))
		}
	}
	logN(name(0), promoteAt, 0) // the room: one place at 0, nine a minute later
	for i := 1; i < maxPromoted; i++ {
		logN(name(i), promoteAt, time.Minute)
	}
	const host = "db.corp.example"
	logN("late.client.example", promoteAt-1, 90*time.Second) // counted before the host
	for k := range 30 {
		logN(host, 1, 2*time.Minute+time.Duration(k)*time.Minute)
	}
	logN("late.client.example", 1, 55*time.Minute)
	for i := range ownEvents { // the events of their own came back with the hour
		c.observe(ln(levelError, "errors", "upstream "+word(ownEvents+i)+" unhealthy",
			epoch.Add(budgetWindow)))
	}
	logN("late.client.example", 1, budgetWindow+time.Second) // one place is free
	logN(host, 1, budgetWindow+2*time.Second)
	own := map[string]bool{}
	for _, e := range c.cache.values() {
		own[e.key.member] = true
	}
	if !own[host] || own["late.client.example"] {
		t.Errorf("one place freed: the host of 31 lines has an event of its own: %v, "+
			"a name of 11 lines has one: %v", own[host], own["late.client.example"])
	}
}
