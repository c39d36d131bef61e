package k8s_event

import (
	"cmp"
	"fmt"
	"hash/maphash"
	"runtime"
	"strings"
	"testing"
	"time"
)

// cachedEntry is an entry of plugin with lines pending, or all written.
func cachedEntry(plugin, msg string, lines int64, written bool) *entry {
	e := newEntry(eventKey{level: levelError, plugin: "plugin/" + plugin + ": ", message: msg}, time.Time{})
	e.seen = lines
	if written {
		e.carried, e.stormWritten = lines, true
	}
	return e
}

// TestEvictionGoesByInformation: a full cache lets go first a written
// event that is no storm, then a storm waiting for its end, then, among
// the events with lines to write, the oldest of the plugin and level with
// the most of them: noise never evicts another plugin's first line.
func TestEvictionGoesByInformation(t *testing.T) {
	var gone []string
	c := newCache(5, func(e *entry) { gone = append(gone, e.key.message) })
	c.add(cachedEntry("forward", "storm", stormLines, true))
	c.add(cachedEntry("forward", "written", 1, true))
	c.add(cachedEntry("noise", "n0", 1, false))
	c.add(cachedEntry("reload", "reload failed", 1, false))
	c.add(cachedEntry("noise", "n1", 1, false))
	for i := 2; i < 100; i++ {
		c.add(cachedEntry("noise", fmt.Sprint("n", i), 1, false))
	}
	want := []string{"written", "storm", "n0", "n1", "n2"}
	for i, w := range want {
		if i >= len(gone) || gone[i] != w {
			t.Fatalf("evicted %q, want %q first", gone, want)
		}
	}
	if _, ok := c.get(eventKey{level: levelError, plugin: "plugin/reload: ", message: "reload failed"}); !ok {
		t.Error("the one line of another plugin was evicted by noise")
	}
	if len(c.entries) != 5 || len(gone) != 98 {
		t.Errorf("%d cached, %d evicted, want 5 and 98", len(c.entries), len(gone))
	}
}

// TestEvictionSeesWritesLanded: an event whose lines were written after it
// was placed as pending is let go as written, before any pending one,
// whether the cache was told or finds it out, and leaves the count of its
// plugin's pending events.
func TestEvictionSeesWritesLanded(t *testing.T) {
	var gone []string
	c := newCache(4, func(e *entry) { gone = append(gone, e.key.message) })
	a, b := cachedEntry("noise", "a", 1, false), cachedEntry("noise", "b", 1, false)
	c.add(a)
	c.add(b)
	c.add(cachedEntry("noise", "c", 1, false))
	c.add(cachedEntry("reload", "r", 1, false))
	a.carried = 1 // written; the cache is not told
	b.carried = 1
	c.place(b, false) // told
	if g := c.most[0]; g.key.plugin != "plugin/noise: " || g.n != 2 || len(c.most) != 2 {
		t.Errorf("the plugin with the most pending is %v with %d, want noise with 2", g.key, g.Len())
	}
	c.add(cachedEntry("other", "x", 1, false))
	c.add(cachedEntry("other", "y", 1, false))
	if len(gone) != 2 || gone[0] != "b" || gone[1] != "a" {
		t.Errorf("evicted %q, want the written b, then a", gone)
	}
	c.resize(1)
	if len(c.entries) != 1 || len(c.most) != 1 || c.most[0].n != 1 {
		t.Errorf("after a resize to 1: %d cached, %d groups", len(c.entries), len(c.most))
	}
}

// TestFullCacheOfNoiseKeepsAnotherPluginsLine: a client's bursts of new
// names fill a small cache with events waiting for scarce tokens; a line of
// another plugin that comes then is never evicted and is written, while the
// noise's own events make room, each of their lines counted.
func TestFullCacheOfNoiseKeepsAnotherPluginsLine(t *testing.T) {
	h, api, clk := newTestHarness(t, testConfig(all, 1.0/300, 1, 10))
	before := readLedger()
	observed := 0
	const genuine = "Corefile changed but reload failed"
	for burst := range 30 { // 5 hours
		if burst == 12 {
			h.observe(ln(levelError, "reload", genuine, clk.Now()))
			observed++
		}
		for _, l := range noiseBurst(burst, clk.Now()) {
			h.observe(l)
			observed++
		}
		h.advance(10*time.Minute + time.Second)
	}
	d := checkLedger(t, api, before, float64(observed))
	if d.dropped[dropEvicted] == 0 {
		t.Fatal("nothing evicted: the cache never filled")
	}
	for _, ev := range api.list() {
		if ev.Message == "plugin/reload: "+genuine {
			return
		}
	}
	t.Errorf("the reload line was never written; %v lines evicted", d.dropped[dropEvicted])
}

// BenchmarkCacheBytes fills every structure that grows with CACHESIZE to its cap, with messages
// at the 1 KiB cap, and reports what each holds: a cached event of its own shape and member, in
// its plugin's queue (B/event); a summary of 32 members of the longest kept, 3 of them named,
// counted for every event though only combined events carry one (B/summary); an evicted event
// settling, its summary's names kept in its text (B/settling); an end waiting to be written
// (B/end); the 16 promoters, full (KiB/promoters); the budgets, groups and queues of one plugin
// and level (B/plugin-level); and the 256 shapes the other shapes' event of a plugin and level
// counts, the one summary that counts shapes (B/other-shapes); and the members of the 10 ended
// storms a plugin and level keeps past eviction (B/rested), each counted for 1024 plugins and
// levels. One pipeline serves the process whatever its server blocks, and the cached events, the
// settling ones and the ends share CACHESIZE, so the process takes at most
// CACHESIZE x max(event + summary, settling, end) + 1024 x (plugin-level + other-shapes +
// rested) + promoters (MiB/bound). It fails if that is over the bound the README states. The run at the
// maximum CACHESIZE takes minutes:
//
//	go test -run '^$' -bench 'CacheBytes/4096' -benchtime 1x .
func BenchmarkCacheBytes(b *testing.B) {
	for _, n := range []int{defaultCacheSize, maxCacheSize} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			for range b.N {
				measureCacheBytes(b, n, b.ReportMetric)
			}
		})
	}
}

// The memory bound the README and docs/design.md state: CACHESIZE x statedEntryBytes +
// statedFixedBytes.
const (
	statedEntryBytes = 6.7 * (1 << 10)
	statedFixedBytes = 5.0 * (1 << 20)
)

// benchPlugins is how many plugins the events of BenchmarkCacheBytes share.
const benchPlugins = 64

// fillCache observes n lines past the 1 KiB cap, each an event of its own shape and member, of
// benchPlugins plugins, an hour apart every budget of them so that none is combined, from at on.
func fillCache(s *scheduler, n int, tag string, at time.Time) time.Time {
	pad := strings.Repeat("x", maxMessageBytes)
	for i := range n {
		if i%(benchPlugins*ownEvents) == 0 {
			at = at.Add(budgetWindow)
		}
		plugin := fmt.Sprintf("plugin/p%d: ", i%benchPlugins)
		word := []byte(tag)
		for k := i; k > 0; k /= 26 {
			word = append(word, byte('a'+k%26))
		}
		text := plugin + fmt.Sprintf("2 q%07d.%s.example.org. A: %s ", i, tag, word) + pad
		// past the cap: the message is cut, as CoreDNS's lines are, to a string of its own
		s.observe(line{level: levelError, plugin: plugin, at: at, text: text})
	}
	return at
}

// fillSummaries gives each entry a summary of hitterSlots members at the length cap, the first
// three of 10 lines (named in its note).
func fillSummaries(entries []*entry, first int) {
	for i, e := range entries {
		e.hitters = &hitters{}
		for j := range hitterSlots {
			m := cutMember(fmt.Sprintf("%0*d", maxMemberLen, (first+i)*hitterSlots+j))
			for range cmp.Or(10*min(1, max(0, 3-j)), 1) {
				e.hitters.add(m, 0, 0)
			}
		}
	}
}

// TestMemoryAtTheDefaultWithinStatedBound: every structure that grows with CACHESIZE, filled to
// its cap at the default, takes no more than the README states.
func TestMemoryAtTheDefaultWithinStatedBound(t *testing.T) {
	if testing.Short() {
		t.Skip("fills the cache, the settling entries and the ends to their caps")
	}
	measureCacheBytes(t, defaultCacheSize, func(v float64, unit string) {
		t.Logf("%.1f %s", v, unit)
	})
}

// measureCacheBytes measures what BenchmarkCacheBytes says at CACHESIZE n, reports each figure,
// and fails if the bound is over the stated one.
func measureCacheBytes(b testing.TB, n int, report func(float64, string)) {
	// The cached events, the settling ones and the ends share CACHESIZE: each kind is measured at
	// n of its own, in room for all three, and the bound is n of the largest.
	cfg := testConfig(levelsOf(levelError), defaultQPS, defaultBurst, 3*n)
	cfg.quiet = defaultQuiet // storms' flows counted
	s := newScheduler(cfg, testPod(), epoch)
	var ms [8]runtime.MemStats
	mark := func(i int) {
		runtime.GC()
		runtime.ReadMemStats(&ms[i])
	}
	heap := func(i, j int) float64 { return float64(int64(ms[j].HeapAlloc) - int64(ms[i].HeapAlloc)) }
	mark(0)
	at := fillCache(s, n, "a", epoch)
	mark(1)
	fillSummaries(s.corr.cache.values(), 0)
	mark(2)
	for _, e := range s.corr.cache.values() { // each evicted, its latest write unanswered
		e.doubt = e.seen
	}
	for s.corr.cache.evictOne() {
	}
	if len(s.settling) != n {
		b.Fatalf("%d settling, want %d", len(s.settling), n)
	}
	for e := range s.settling { // as a combined event's: its text is its note alone
		e.key.message = ""
	}
	mark(3)
	fillCache(s, n, "b", at)
	fillSummaries(s.corr.cache.values(), n)
	mark(4)
	for _, e := range s.corr.cache.values() {
		end := endOf(e, at)
		s.ends.add(end, n)
		s.place(&end.job)
	}
	if len(s.ends.list) != n {
		b.Fatalf("%d ends, want %d", len(s.ends.list), n)
	}
	mark(5)
	for i := range maxPromoters { // every promoter full, of members at the length cap
		p := s.corr.promoterOf(&window{})
		for j := range promoterSlots {
			m := fmt.Sprintf("%0*d", maxMemberLen, i*promoterSlots+j)
			p.add(m, maphash.String(shapeSeed, m), budgetWindow)
		}
	}
	mark(6)
	others := make([]*hitters, maxWindows) // the other shapes' events' shapes, full
	for i := range others {
		others[i] = &hitters{}
		for j := range maxCountedShapes {
			others[i].countShape(uint64(i*maxCountedShapes + j + 2))
		}
	}
	mark(7)
	perEvent, perSummary := heap(0, 1)/float64(n), heap(1, 2)/float64(n)
	perSettling := heap(0, 3) / float64(n)
	perEnd := heap(4, 5) / float64(n)
	promoters := heap(5, 6)
	perPluginLevel := benchPluginLevelBytes(b)
	perOthers := heap(6, 7) / maxWindows
	report(perEvent, "B/event")
	report(perSummary, "B/summary")
	report(perSettling, "B/settling")
	report(perEnd, "B/end")
	report(promoters/(1<<10), "KiB/promoters")
	report(perPluginLevel, "B/plugin-level")
	report(perOthers, "B/other-shapes")
	// the members of the ended storms a plugin and level keeps past eviction, by their size
	// (their 40 B are in its budget)
	rested := float64(maxEnds * maxMemberLen)
	report(rested, "B/rested")
	bound := float64(n)*max(perEvent+perSummary, perSettling, perEnd) +
		maxWindows*(perPluginLevel+perOthers+rested) + promoters
	report(bound/(1<<20), "MiB/bound")
	report(heap(0, 7)/(1<<20), "MiB/measured")
	if stated := float64(n)*statedEntryBytes + statedFixedBytes; bound > stated {
		b.Errorf("%.1f MiB measured at CACHESIZE %d, over the stated %.0f B x %d + %.1f MiB = %.1f MiB",
			bound/(1<<20), n, statedEntryBytes, n, statedFixedBytes/(1<<20), stated/(1<<20))
	}
	runtime.KeepAlive(s)
	runtime.KeepAlive(others)
}

// benchPluginLevelBytes is the heap that a plugin and level of their own add to an event of one
// line: its budget, its groups in the cache, its queue.
func benchPluginLevelBytes(b testing.TB) float64 {
	const n = 1024
	measure := func(plugins int) float64 {
		s := newScheduler(testConfig(levelsOf(levelError), defaultQPS, defaultBurst, n),
			testPod(), epoch)
		lines := make([]line, n)
		for i := range lines {
			plugin := fmt.Sprintf("plugin/p%d: ", i%plugins)
			text := plugin + fmt.Sprintf("2 q%07d.example.org. A: i/o timeout", i)
			lines[i] = line{level: levelError, plugin: plugin, text: text,
				at: epoch.Add(time.Duration(i/(plugins*ownEvents)) * budgetWindow)}
		}
		var m0, m1 runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&m0)
		for _, ln := range lines {
			s.observe(ln)
		}
		runtime.GC()
		runtime.ReadMemStats(&m1)
		runtime.KeepAlive(s)
		return float64(int64(m1.HeapAlloc)-int64(m0.HeapAlloc)) / n
	}
	return measure(n) - measure(1)
}

// TestCacheCountsEntriesOfOneMember: the cache knows how many of its entries
// are of one member's lines, as they come and go, so that the correlator
// looks for a member's own event only when there can be one.
func TestCacheCountsEntriesOfOneMember(t *testing.T) {
	c := newCache(2, func(*entry) {})
	count := func() int {
		n := 0
		for _, e := range c.entries {
			if e.key.member != "" {
				n++
			}
		}
		return n
	}
	for i, member := range []string{"a.example.", "", "b.example.", "", ""} {
		c.add(newEntry(eventKey{level: levelError, plugin: "plugin/errors: ", shape: uint64(i), member: member}, time.Time{}))
		if c.members != count() {
			t.Fatalf("after %d adds: members %d, want %d", i+1, c.members, count())
		}
	}
}

// TestWrittenStormWithNewLinesIsEvictedAsPending: a written storm that
// gets new lines leaves the storms for its plugin's pending entries, so a
// full cache evicts from the plugin with the most pending first.
func TestWrittenStormWithNewLinesIsEvictedAsPending(t *testing.T) {
	var gone []*entry
	c := newCache(3, func(e *entry) { gone = append(gone, e) })
	storm := newEntry(eventKey{level: levelError, plugin: "plugin/errors: ", shape: 1}, time.Time{})
	storm.stormWritten = true
	storm.seen, storm.carried = 5, 5
	c.add(storm)
	storm.seen++ // a new line: pending again
	c.place(storm, true)
	var loud []*entry
	for i := range 3 {
		e := newEntry(eventKey{level: levelError, plugin: "plugin/forward: ", message: fmt.Sprint("down ", i)}, time.Time{})
		e.seen = 1
		loud = append(loud, e)
		c.add(e)
	}
	if len(gone) != 1 || gone[0] != loud[0] {
		t.Errorf("evicted %v, want the oldest of the plugin with the most pending", gone)
	}
}

// TestNoiseEvictsItsOwnLinesWithinAPlugin: when a client's lines and a host's share a plugin and
// level, a full cache evicts from the shape with the most lines to write, then from the member
// with the most: the host's line of another shape stays, and so does its line of the client's
// shape, though both are the oldest of their plugin.
func TestNoiseEvictsItsOwnLinesWithinAPlugin(t *testing.T) {
	var gone []string
	c := newCache(4, func(e *entry) { gone = append(gone, e.key.message) })
	refused := "2 db.corp.example. A: read udp 10.0.0.5:40000->10.0.0.2:53: read: connection refused"
	timeout := "2 db.corp.example. A: read udp 10.0.0.5:40001->10.0.0.2:53: i/o timeout"
	c.add(cachedEntry("errors", refused, 1, false))
	c.add(cachedEntry("errors", timeout, 1, false))
	for i := range 100 {
		c.add(cachedEntry("errors", fmt.Sprintf(
			"2 c.client.example. A: read udp 10.0.0.9:%d->10.0.0.2:53: i/o timeout", 30000+i), 1, false))
	}
	for _, msg := range []string{refused, timeout} {
		if _, ok := c.get(eventKey{level: levelError, plugin: "plugin/errors: ", message: msg}); !ok {
			t.Errorf("the host's line %q was evicted by a client's lines of its plugin", msg)
		}
	}
	if len(gone) != 98 {
		t.Errorf("%d evicted, want 98", len(gone))
	}
}

// TestCachedSettlingAndEndsShareCacheSize: the cached events, the settling ones and the ends
// waiting take at most CACHESIZE units together, so that the memory bound is CACHESIZE of the
// largest, not their sum: a new event makes room by eviction, settling events keep their units,
// and every line stays in an event's count, pending, or dropped as evicted.
func TestCachedSettlingAndEndsShareCacheSize(t *testing.T) {
	const size, quiet = 4, time.Minute
	cfg := withQuiet(100, 100, quiet)
	cfg.cacheSize = size
	h, api, clk := newTestHarness(t, cfg)
	before := readLedger()
	units := func() int { return len(h.s.corr.cache.entries) + len(h.s.settling) + len(h.s.ends.list) }
	api.setFault(func(apiRequest) fault { return fault{lost: true} })
	for _, m := range []string{"a", "b"} {
		h.observe(ln(levelError, "errors", m, clk.Now()))
	}
	drain(h)    // both creates unanswered
	evictAll(h) // a and b, settling
	if len(h.s.settling) != 2 {
		t.Fatalf("%d settling, want 2", len(h.s.settling))
	}
	down := true
	apiDown(api, &down)
	observed := 2
	for i := range 6 {
		h.observe(ln(levelError, "forward", fmt.Sprint("upstream ", i, " down"), clk.Now()))
		observed++
		if n := units(); n > size {
			t.Fatalf("%d cached, %d settling, %d ends: %d units, over CACHESIZE %d",
				len(h.s.corr.cache.entries), len(h.s.settling), len(h.s.ends.list), n, size)
		}
	}
	if len(h.s.settling) != 2 {
		t.Errorf("%d settling, want a and b kept: the cache evicts its own", len(h.s.settling))
	}
	d := checkLedger(t, api, before, float64(observed))
	if d.dropped[dropEvicted] != 4 {
		t.Errorf("%v lines dropped as evicted, want the 4 events that did not fit", d.dropped[dropEvicted])
	}
}

// An entry found last is not found once it left: a line of its key after it is evicted finds
// none, and then the entry made again.
func TestEntryFoundLastIsNotFoundOnceEvicted(t *testing.T) {
	c := newCache(1, func(*entry) {})
	first := cachedEntry("errors", "", 1, true)
	c.add(first)
	if e, ok := c.get(first.key); !ok || e != first {
		t.Fatalf("get = %p, %v, want the entry added", e, ok)
	}
	c.add(cachedEntry("errors", "another", 1, false)) // evicts first
	if e, ok := c.get(first.key); ok {
		t.Fatalf("get = %p after its eviction, want none", e)
	}
	again := cachedEntry("errors", "", 1, false)
	c.add(again)
	if e, ok := c.get(first.key); !ok || e != again {
		t.Fatalf("get = %p, %v, want the entry made again", e, ok)
	}
}
