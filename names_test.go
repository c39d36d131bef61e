package k8s_event

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestNamesWithASchemeInsideALabelMakeOneShape: design.md, "The promises
// in full": "Every token a DNS client chooses is a placeholder of the shape
// (the name, whatever bytes its labels hold, ...), so a client's queries make
// one shape". A label may hold "://" (CoreDNS prints ':' and '/' as they
// are): a client that asks c0://x.example., c1://x.example., ... gets one
// shape for all of them, not a shape a query.
func TestNamesWithASchemeInsideALabelMakeOneShape(t *testing.T) {
	h, _, clk := newTestHarness(t, testConfig(all, 1000, 1000, 4096))
	for i := range ownEvents {
		h.observe(ln(levelError, "errors", "upstream "+word(i)+" unhealthy", clk.Now()))
	}
	for i := range 40 {
		h.observe(ln(levelError, "errors", fmt.Sprintf(
			"2 c%d://x.example. A: read udp 10.0.0.5:40000->10.0.0.2:53: i/o timeout", i), clk.Now()))
	}
	drain(h)
	shapes := map[string]bool{}
	for _, e := range h.s.corr.cache.values() {
		if e.key.combined() {
			shapes[lineShape(strings.TrimPrefix(e.message, e.key.plugin))] = true
		}
	}
	if len(shapes) != 1 {
		var some []string
		for s := range shapes {
			some = append(some, s)
		}
		slices.Sort(some)
		t.Errorf("%d shapes of one error for a client's names, want 1: %q ...", len(shapes),
			some[:min(len(some), 3)])
	}
}

// TestNamesCutAlikeStayApartOnceOneIsPromoted: design.md, "Combining": "a
// member is counted by the hash of its whole name (its text, cut to 64
// bytes, is for display only, so names cut alike stay apart)", and a host
// "becomes an event of its own ... by an exact count of its own lines". Once
// a host of a long name is an event of its own, a client's name whose first
// 64 bytes are the host's does not join that event: its lines do not count
// as the host's, nor does its line become the host's event's message.
func TestNamesCutAlikeStayApartOnceOneIsPromoted(t *testing.T) {
	c := newCorrelator(defaultCacheSize, func(*entry) {})
	at := epoch
	for i := range ownEvents {
		c.observe(ln(levelError, "errors", "upstream "+word(i)+" unhealthy", at))
	}
	prefix := strings.Repeat("s", 60) + ".svc"
	host, client := prefix+"-primary.corp.example", prefix+"-x.client.example"
	const timeout = "2 %s. A: read udp 10.0.0.5:%d->10.0.0.2:53: i/o timeout"
	for i := range promoteAt + 2 {
		at = at.Add(time.Minute)
		c.observe(ln(levelError, "errors", fmt.Sprintf(timeout, "c"+word(i)+".client.example", 3000+i), at))
		c.observe(ln(levelError, "errors", fmt.Sprintf(timeout, host, 4000+i), at))
	}
	var own *entry
	for _, e := range c.cache.values() {
		if e.key.member != "" {
			own = e
		}
	}
	if own == nil {
		t.Fatalf("the host of %d timeouts is no event of its own", promoteAt+2)
	}
	seen := own.seen
	for i := range 3 {
		at = at.Add(time.Second)
		c.observe(ln(levelError, "errors", fmt.Sprintf(timeout, client, 5000+i), at))
	}
	if own.seen != seen || strings.Contains(own.message, "client.example") {
		t.Errorf("the host's own event (member %q) took a client's lines of a name cut alike: "+
			"%d lines where the host had %d, its message %q", own.key.member, own.seen, seen,
			own.message)
	}
}

// TestHostAskedInTwoCasesIsOneMember: README: "A failing host among a
// client's names becomes an event of its own once it had 10 lines within
// the last hour, by an exact count of its own lines". DNS names are
// case-insensitive (RFC 4343): a host that one application asks as
// db.corp.example and another as DB.CORP.EXAMPLE is one host, and its 12
// timeouts in 12 minutes, among a client's fresh names, make it an event of
// its own.
func TestHostAskedInTwoCasesIsOneMember(t *testing.T) {
	c := newCorrelator(defaultCacheSize, func(*entry) {})
	at := epoch
	for i := range ownEvents {
		c.observe(ln(levelError, "errors", "upstream "+word(i)+" unhealthy", at))
	}
	const timeout = "2 %s. A: read udp 10.0.0.5:%d->10.0.0.2:53: i/o timeout"
	for i := range promoteAt + 2 {
		at = at.Add(time.Minute)
		c.observe(ln(levelError, "errors", fmt.Sprintf(timeout, "c"+word(i)+".client.example", 3000+i), at))
		host := "db.corp.example"
		if i%2 == 1 {
			host = "DB.CORP.EXAMPLE"
		}
		c.observe(ln(levelError, "errors", fmt.Sprintf(timeout, host, 4000+i), at))
	}
	for _, e := range c.cache.values() {
		if strings.EqualFold(e.key.member, "db.corp.example") {
			return
		}
	}
	t.Errorf("the host of %d timeouts in %d minutes, asked in two cases, is no event of its own",
		promoteAt+2, promoteAt+2)
}

// TestNamesInCapitalsAreCountedWithoutAllocation: members are counted case-folded without a copy
// on the heap, names longer than the member's 64 bytes too: a storm of a client's names in
// capitals costs no allocation a line.
func TestNamesInCapitalsAreCountedWithoutAllocation(t *testing.T) {
	c := newCorrelator(defaultCacheSize, func(*entry) {})
	c.quiet = defaultQuiet
	for i := range ownEvents {
		c.observe(ln(levelError, "errors", "upstream "+word(i)+" unhealthy", epoch))
	}
	long := strings.Repeat("LABEL-", 15)
	lines := make([]line, 512)
	for i := range lines {
		lines[i] = ln(levelError, "errors", fmt.Sprintf(
			"2 Q%d.%sCLIENT.Example. A: read udp 10.0.0.5:40000->10.0.0.2:53: i/o timeout", i, long),
			epoch)
	}
	for _, l := range lines { // the combined event and its summary are made
		c.observe(l)
	}
	i := 0
	if n := testing.AllocsPerRun(1000, func() {
		c.observe(lines[i%len(lines)])
		i++
	}); n != 0 {
		t.Errorf("%v allocations a line of a name in capitals, want 0", n)
	}
}

// TestNamesCutAlikeBothPromotedAreTwoEvents: two hosts whose names share their first 64 bytes,
// each with its lines, become two events of their own, each counting its own lines only.
func TestNamesCutAlikeBothPromotedAreTwoEvents(t *testing.T) {
	c := newCorrelator(defaultCacheSize, func(*entry) {})
	at := epoch
	for i := range ownEvents {
		c.observe(ln(levelError, "errors", "upstream "+word(i)+" unhealthy", at))
	}
	prefix := strings.Repeat("s", 60) + ".svc"
	hosts := []string{prefix + "-primary.corp.example", prefix + "-replica.corp.example"}
	const timeout = "2 %s. A: read udp 10.0.0.5:%d->10.0.0.2:53: i/o timeout"
	for i := range promoteAt + 4 {
		at = at.Add(time.Minute)
		c.observe(ln(levelError, "errors", fmt.Sprintf(timeout, "c"+word(i)+".client.example", 3000+i), at))
		for _, h := range hosts {
			c.observe(ln(levelError, "errors", fmt.Sprintf(timeout, h, 4000+i), at))
		}
	}
	var own []*entry
	for _, e := range c.cache.values() {
		if e.key.member != "" {
			own = append(own, e)
		}
	}
	if len(own) != 2 || own[0].seen != own[1].seen {
		t.Fatalf("%d events of their own for two hosts of names cut alike, want 2 of as many lines",
			len(own))
	}
	if a, b := strings.Contains(own[0].message, hosts[0]), strings.Contains(own[1].message,
		hosts[0]); a == b {
		t.Errorf("the two events' lines are not one host's each: %q, %q", own[0].message,
			own[1].message)
	}
}
