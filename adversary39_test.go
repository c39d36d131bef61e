package k8s_event

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestClientsOwnPromotionsDoNotKeepAHostFromItsEvent: a client whose names
// each time out 10 times an hour spends the room of promotions with names
// of its own (10 names, 100 queries an hour). A host that times out once a
// minute, 60 lines in any hour, must still become an event of its own: the
// README promises it once it had 10 lines within the last hour.
func TestClientsOwnPromotionsDoNotKeepAHostFromItsEvent(t *testing.T) {
	c := newCorrelator(defaultCacheSize, func(*entry) {})
	start := epoch
	for i := range ownEvents {
		c.observe(ln(levelError, "errors", "upstream "+word(i)+" unhealthy", start))
	}
	const host = "db.corp.example"
	const client = "2 n%d.client.example. A: read udp 10.0.0.9:%d->192.0.2.53:53: i/o timeout"
	const timeout = "2 %s. A: read udp 10.0.0.5:%d->10.0.0.2:53: i/o timeout"
	name, hostLines := 0, 0
	promotedAt := time.Duration(-1)
	for at := time.Duration(0); at < 3*time.Hour; at += time.Minute {
		if at%budgetWindow == 0 { // the room freed: fresh names of 10 timeouts each, the first
			// taking the events of their own that came back with the hour
			for range maxPromoted + 1 {
				name++
				for k := range promoteAt {
					c.observe(ln(levelError, "errors", fmt.Sprintf(client, name, 30000+k),
						start.Add(at)))
				}
			}
		}
		hostLines++
		c.observe(ln(levelError, "errors", fmt.Sprintf(timeout, host, 1024+hostLines),
			start.Add(at+30*time.Second)))
		for _, e := range c.cache.values() {
			if e.key.member == host && promotedAt < 0 {
				promotedAt = at
			}
		}
	}
	if promotedAt < 0 {
		others := 0
		for _, e := range c.cache.values() {
			if e.key.member != "" {
				others++
			}
		}
		t.Errorf("a host of one timeout a minute (%d lines in 3 h) is no event of its own; "+
			"%d names of the client are, of %d queries", hostLines, others, name*promoteAt)
	}
}

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

// TestQuietPluginsLineWhoseEventExpiredIsWrittenWithinTheBound: a plugin
// with nothing pending logs a line of an event the API server's TTL
// removed. Its patch finds the event gone and it is created anew: the line
// is written, at most (1 + the other plugins waiting) refills plus its
// write's time after it was logged, as the README bounds a quiet plugin's
// line.
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
	bound := (1+2)*refill + writeTimeout
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
