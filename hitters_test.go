package k8s_event

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestMemberIsFirstNameElseAddress(t *testing.T) {
	for msg, want := range map[string]string{
		"2 db.corp.example. A: read udp 10.0.0.5:41234->10.0.0.2:53: i/o timeout": "db.corp.example",
		"read udp 10.0.0.5:41234->10.0.0.2:53: i/o timeout":                       "10.0.0.5",
		"dial tcp [2001:db8::1]:53: connection refused":                           "2001:db8::1",
		"no upstream (\"a.example\" unreachable)":                                 "a.example",
		"Corefile changed but reload failed":                                      "",
		"port 53 closed":                                                          "",
		"2 " + strings.Repeat("a", 200) + ".example. A: i/o timeout":              strings.Repeat("a", maxMemberLen),
		"connect to ::1 refused":                                                  "::1",
		"upstream=dns.corp.example took 1.5s":                                     "dns.corp.example",
		"after 2.5s: lookup a\\ b.example. failed":                                "a\\ b.example",
		"via [2001:db8::53]:53 then b.example":                                    "b.example",
		"a.example. CNAME b.example.: loop":                                       "a.example",
		"10.0.0.5:53 answered bad.example.: SERVFAIL":                             "bad.example",
		"2 " + strings.Repeat("a", 56) + ".example A: i/o timeout":                strings.Repeat("a", 56) + ".example",
	} {
		var f found
		appendShape(nil, msg, &f)
		if got := f.member(); got != want {
			t.Errorf("member of %q = %q, want %q", msg, got, want)
		}
	}
	if got, want := cutMember(strings.Repeat("a", maxMemberLen-1)+"é.example"), strings.Repeat("a", maxMemberLen-1); got != want {
		t.Errorf("cut at a rune's second byte: %q, want %q", got, want)
	}
}

// TestHittersNameHeavyMembers: among a thousand members of one line each,
// a member of 60 lines is named with a lower bound no more than its lines;
// members of one line are not, and the names fit maxHitters.
func TestHittersNameHeavyMembers(t *testing.T) {
	var h hitters
	for i := range 1000 {
		h.add(fmt.Sprintf("c%d.client.example", i))
		if i%16 == 0 {
			h.add("db.corp.example")
		}
	}
	top := h.top(false)
	if len(top) != 1 || h.member(top[0]) != "db.corp.example" {
		t.Fatalf("top %+v, want db.corp.example alone", top)
	}
	if lb := top[0].count - top[0].err; lb > 63 || lb < 1 {
		t.Errorf("lower bound %d of 63 lines", lb)
	}
	if s := h.names(false); !strings.HasPrefix(s, "most: db.corp.example ≥") {
		t.Errorf("hitters say %q", s)
	}
	var many hitters
	for i := range 40 * hitterSlots {
		many.add(fmt.Sprintf("h%d.%s.example", i%(hitterSlots/2), strings.Repeat("x", 50)))
	}
	if s := many.names(false); len(s) > maxHitters || strings.Count(s, "≥") < 2 {
		t.Errorf("%d bytes naming %d members, want at most %d", len(s), strings.Count(s, "≥"), maxHitters)
	}
}

// TestFailingHostAmongClientNamesIsNamed: ten timeouts for one host, one
// every 12 minutes, among a client's distinct names of the same shape:
// within 2 hours an event names that host, though the latest line of the
// combined event is always the client's.
func TestFailingHostAmongClientNamesIsNamed(t *testing.T) {
	cfg := testConfig(all, defaultQPS, defaultBurst, defaultCacheSize)
	cfg.quiet = defaultQuiet
	h, api, clk := newTestHarness(t, cfg)
	before := readLedger()
	observed, hostLines := 0, 0
	start := clk.Now()
	for i := 0; clk.Since(start) < 2*time.Hour; i++ {
		if i%12 == 6 && hostLines < 10 {
			h.observe(ln(levelError, "errors", fmt.Sprintf("2 db.corp.example. A: read udp 10.0.0.5:%d->10.0.0.2:53: i/o timeout", 40000+i), clk.Now()))
			hostLines++
			// A client's line right after it: the latest line is never the host's.
			h.observe(ln(levelError, "errors", fmt.Sprintf("2 c%d.client.example. A: read udp 10.0.0.9:30000->192.0.2.53:53: i/o timeout", i), clk.Now()))
			observed += 2
		}
		if i%10 == 0 {
			for j := range 20 {
				h.observe(ln(levelError, "errors", fmt.Sprintf("2 c%d-%d.client.example. A: read udp 10.0.0.9:%d->192.0.2.53:53: i/o timeout", i, j, 30000+j), clk.Now()))
				observed++
			}
		}
		h.advance(time.Minute)
	}
	checkLedger(t, api, before, float64(observed))
	for _, ev := range api.list() {
		if strings.Contains(ev.Message, "db.corp.example") {
			return
		}
	}
	t.Errorf("no event names the host of %d timeouts among %d lines", hostLines, observed)
}

// TestFailingHostAmongManyClientNamesBecomesItsOwnEvent: ten timeouts for
// one host, each among 41 distinct names of a client, all of one shape
// (the host's share, 1/42, is under 1/32 of the lines):
// the host has 10 lines in the hour, so it becomes an event of its own
// (within the budget, which the client's names of one shape leave
// untouched past the first 10).
func TestFailingHostAmongManyClientNamesBecomesItsOwnEvent(t *testing.T) {
	cfg := testConfig(all, 100, 100, defaultCacheSize)
	cfg.quiet = defaultQuiet
	h, api, clk := newTestHarness(t, cfg)
	before := readLedger()
	observed := 0
	for i := range 10 {
		for j := range 40 {
			h.observe(ln(levelError, "errors", fmt.Sprintf("2 c%d-%d.client.example. A: read udp 10.0.0.9:%d->192.0.2.53:53: i/o timeout", i, j, 30000+j), clk.Now()))
			observed++
		}
		h.observe(ln(levelError, "errors", fmt.Sprintf("2 db.corp.example. A: read udp 10.0.0.5:%d->10.0.0.2:53: i/o timeout", 40000+i), clk.Now()))
		// A client's line right after it: the latest line is never the host's.
		h.observe(ln(levelError, "errors", fmt.Sprintf("2 c%d.client.example. A: read udp 10.0.0.9:30000->192.0.2.53:53: i/o timeout", i), clk.Now()))
		observed += 2
		h.advance(time.Minute)
	}
	h.advance(time.Minute)
	checkLedger(t, api, before, float64(observed))
	if h.entry(eventKey{level: levelError, plugin: "plugin/errors: ", shape: shapeHash("2 db.corp.example. A: read udp 10.0.0.5:40000->10.0.0.2:53: i/o timeout"), member: "db.corp.example"}) == nil {
		var msgs []string
		for _, ev := range combinedOf(api.list()) {
			msgs = append(msgs, fmt.Sprintf("%d %s", ev.Count, ev.Message))
		}
		t.Errorf("the host of 10 timeouts in 10 minutes is no event of its own, among %d lines; combined events:\n%s", observed, strings.Join(msgs, "\n"))
	}
}

// TestHittersCountLinesAndKeepTheirBounds: the summary counts every line,
// a member new to a full summary takes the least counter with its count as
// the error.
func TestHittersCountLinesAndKeepTheirBounds(t *testing.T) {
	var h hitters
	for i := range hitterSlots {
		h.add(fmt.Sprintf("c%d.example", i))
	}
	h.add("new.example")
	h.add("") // a line with no member counts too
	if h.lines != hitterSlots+2 {
		t.Errorf("%d lines counted, want %d", h.lines, hitterSlots+2)
	}
	for _, s := range h.slots {
		if h.member(s) == "new.example" && (s.count != 2 || s.err != 1) {
			t.Errorf("new member counts %d with error %d, want 2 and 1", s.count, s.err)
		}
	}
}

// TestTopMembersHaveMoreThanTheirShareAndTwoLines: a member is named when
// it has more than lines/hitterSlots of the lines and two or more, most
// first.
func TestTopMembersHaveMoreThanTheirShareAndTwoLines(t *testing.T) {
	var h hitters
	h.add("two.example")
	h.add("two.example")
	if top := h.top(false); len(top) != 1 {
		t.Fatalf("a member of two lines out of two is not named: %+v", top)
	}
	for range 2*hitterSlots - 2 {
		h.add("")
	}
	if top := h.top(false); len(top) != 0 {
		t.Errorf("a member of exactly its share is named: %+v", top)
	}
	for range 5 {
		h.add("five.example")
	}
	for range 10 {
		h.add("ten.example")
	}
	if got := h.names(false); !strings.HasPrefix(got, "most: ten.example ≥10, five.example ≥5") {
		t.Errorf("names %q, want the most first", got)
	}
	var g hitters // the other way round
	for range 10 {
		g.add("ten.example")
	}
	for range 5 {
		g.add("five.example")
	}
	if got := g.names(false); got != "most: ten.example ≥10, five.example ≥5" {
		t.Errorf("names %q, want the most first", got)
	}
}

// TestNamesFillExactlyTheirRoom: names that come to exactly maxHitters
// bytes are all said.
func TestNamesFillExactlyTheirRoom(t *testing.T) {
	var h hitters
	for i, m := range []string{strings.Repeat("a", 64), strings.Repeat("b", 64), strings.Repeat("c", 64), strings.Repeat("d", 32)} {
		for range 5 - i {
			h.add(m)
		}
	}
	if got := h.names(false); len(got) != maxHitters || strings.Count(got, "≥") != 4 {
		t.Errorf("%d bytes naming %d members, want all 4 in %d", len(got), strings.Count(got, "≥"), maxHitters)
	}
}

// TestNewMemberTakesOverTheSlotOfLeastCount: with every slot taken, a new member takes over a
// slot whose count is least, wherever it is and however often that happens, and inherits its
// count as its error; members of more lines keep their slots.
func TestNewMemberTakesOverTheSlotOfLeastCount(t *testing.T) {
	var h hitters
	for i := range hitterSlots { // m0 has 33 lines, m1 32, ..., m31 2
		for range hitterSlots + 1 - i {
			h.add(fmt.Sprintf("m%d.example", i))
		}
	}
	for round := range 3 * hitterSlots {
		least := slices.MinFunc(h.slots, func(a, b hitter) int { return cmp.Compare(a.count, b.count) }).count
		most := slices.MaxFunc(h.slots, func(a, b hitter) int { return cmp.Compare(a.count, b.count) })
		name := fmt.Sprintf("new%d.example", round)
		h.add(name)
		kept := map[string]hitter{}
		for _, s := range h.slots {
			kept[h.member(s)] = s
		}
		if s, ok := kept[name]; !ok || s.count != least+1 || s.err != least {
			t.Fatalf("%s counts %+v (kept: %t), want count %d and error %d", name, s, ok, least+1, least)
		}
		if s := kept[h.member(most)]; s.count != most.count {
			t.Fatalf("round %d: the member of most lines lost its slot", round)
		}
	}
}

// promotionRun drives a correlator with noise of fresh names of one shape, one every noiseEvery
// from noiseFrom, and a host's timeouts, one every hostEvery when hostAt allows, for d, on a fake
// clock; it returns whether the host was promoted and how many other members were.
func promotionRun(noiseFrom, noiseEvery, hostEvery, d time.Duration,
	hostAt func(time.Duration) bool) (bool, int) {
	c := newCorrelator(defaultCacheSize, func(*entry) {})
	start := epoch
	for i := range ownEvents {
		c.observe(ln(levelError, "errors", "upstream "+word(i)+" unhealthy", start))
	}
	const host = "db.corp.example"
	n, next := 0, time.Duration(0)
	for at := time.Duration(0); at < d; at += noiseEvery {
		if at >= noiseFrom {
			n++
			c.observe(ln(levelError, "errors", fmt.Sprintf(
				"2 c%d.client.example. A: read udp 10.0.0.9:30000->192.0.2.53:53: i/o timeout", n), start.Add(at)))
		}
		for next <= at {
			if hostAt == nil || hostAt(next) {
				c.observe(ln(levelError, "errors", fmt.Sprintf(
					"2 %s. A: read udp 10.0.0.5:%d->10.0.0.2:53: i/o timeout", host, 1024+next/time.Second), start.Add(next)))
			}
			next += hostEvery
		}
	}
	promoted, others := false, 0
	for _, e := range c.cache.values() {
		switch {
		case e.key.member == host:
			promoted = true
		case e.key.member != "":
			others++
		}
	}
	return promoted, others
}

// TestOneLineNamesAreNeverPromoted: a client's fresh names, one line each, at one a second for an
// hour, make no event of their own: a promotion needs promoteAt lines of the member by an exact
// lower bound, which noise cannot raise.
func TestOneLineNamesAreNeverPromoted(t *testing.T) {
	if _, others := promotionRun(0, time.Second, time.Hour, time.Hour, func(time.Duration) bool { return false }); others != 0 {
		t.Errorf("%d names of one line each became events of their own", others)
	}
}

// TestLinesAcrossTheHourArePromoted: 10 timeouts of a host within 10 minutes, 5 before and 5 after
// the hour since its combined event's first line, among a client's fresh names, one every 10 s,
// make it an event of its own: its lines count over a sliding hour, not one that starts over.
func TestLinesAcrossTheHourArePromoted(t *testing.T) {
	around := func(at time.Duration) bool { return at >= 85*time.Minute && at < 95*time.Minute }
	if promoted, _ := promotionRun(30*time.Minute, 10*time.Second, time.Minute, 100*time.Minute,
		around); !promoted {
		t.Errorf("a host of 10 lines within 10 minutes, across the hour, is no event of its own")
	}
}

// TestPromotionUnderNoiseOfFreshNames measures the promise of promotion under noise: with 100
// fresh names a second for an hour (360,000 lines of one shape), a host of one timeout every 2 s
// (1,800 in the hour: more than 1/promoterSlots of the lines of the window, and promoteAt more)
// becomes an event of its own, and no name of the noise does; with 1 fresh name a second, a host
// of one timeout a minute does (24 lines: promoteAt + 3,600/promoterSlots).
func TestPromotionUnderNoiseOfFreshNames(t *testing.T) {
	if testing.Short() {
		t.Skip("360,000 lines")
	}
	if promoted, others := promotionRun(0, 10*time.Millisecond, 2*time.Second, time.Hour, nil); !promoted || others != 0 {
		t.Errorf("under 100 names a second: host promoted %t, %d names of the noise promoted", promoted, others)
	}
	early := func(at time.Duration) bool { return at < 24*time.Minute }
	if promoted, others := promotionRun(0, time.Second, time.Minute, time.Hour, early); !promoted || others != 0 {
		t.Errorf("under 1 name a second: host of 24 lines promoted %t, %d names of the noise promoted", promoted, others)
	}
}
