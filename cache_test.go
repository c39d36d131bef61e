package k8s_event

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"
)

// cachedEntry is an entry of plugin with lines pending, or all written.
func cachedEntry(plugin, msg string, lines int64, written bool) *entry {
	e := &entry{key: eventKey{level: levelError, plugin: "plugin/" + plugin + ": ", message: msg}}
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
	if g := c.most[0]; g.key.plugin != "plugin/noise: " || g.Len() != 2 || len(c.most) != 2 {
		t.Errorf("the plugin with the most pending is %v with %d, want noise with 2", g.key, g.Len())
	}
	c.add(cachedEntry("other", "x", 1, false))
	c.add(cachedEntry("other", "y", 1, false))
	if len(gone) != 2 || gone[0] != "b" || gone[1] != "a" {
		t.Errorf("evicted %q, want the written b, then a", gone)
	}
	c.resize(1)
	if len(c.entries) != 1 || len(c.most) != 1 || c.most[0].Len() != 1 {
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

// BenchmarkCacheBytes fills a scheduler's cache of CACHESIZE events, each
// of a line at the 1 KiB cap, at the default CACHESIZE and at the maximum,
// and reports the heap that each cached event holds (B/event), that the
// summary of 32 members of the longest kept adds to a combined event
// (B/members), and that each end waiting to be written holds (B/end): the
// cache, as many settling events and the queue of ends, each at most
// CACHESIZE, take at most CACHESIZE x (2 x (B/event + B/members) + B/end).
//
//	go test -run '^$' -bench CacheBytes -benchtime 1x .
func BenchmarkCacheBytes(b *testing.B) {
	for _, n := range []int{defaultCacheSize, maxCacheSize} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			for range b.N {
				benchCacheBytes(b, n)
			}
		})
	}
}

func benchCacheBytes(b *testing.B, n int) {
	cfg := testConfig(levelsOf(levelError), defaultQPS, defaultBurst, n)
	cfg.quiet = defaultQuiet // storms' flows counted
	s := newScheduler(cfg, testPod(), epoch)
	pad := strings.Repeat("x", maxMessageBytes)
	lines := make([]line, n)
	for i := range lines {
		plugin := fmt.Sprintf("plugin/p%d: ", i) // one plugin each: no combining
		lines[i] = line{level: levelError, plugin: plugin, at: epoch, text: (plugin + fmt.Sprintf("2 q%07d.example.org. A: ", i) + pad)[:maxMessageBytes]}
	}
	var m0, m1, m2, m3 runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&m0)
	for _, ln := range lines {
		ln.text = strings.Clone(ln.text) // the listener's allocation, which the event keeps
		s.observe(ln)
	}
	runtime.GC()
	runtime.ReadMemStats(&m1)
	entries := s.corr.cache.values()
	for i, e := range entries {
		e.hitters = &hitters{}
		for j := range hitterSlots {
			e.hitters.add(cutMember(fmt.Sprintf("%0*d", maxMemberLen, i*hitterSlots+j)))
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&m2)
	ends := make([]*entry, 0, n)
	for _, e := range entries {
		e.hitters = nil
		ends = append(ends, endOf(e, epoch))
	}
	runtime.GC()
	runtime.ReadMemStats(&m3)
	perEvent := float64(m1.HeapAlloc-m0.HeapAlloc) / float64(n)
	perMembers := float64(int64(m2.HeapAlloc)-int64(m1.HeapAlloc)) / float64(n)
	perEnd := float64(int64(m3.HeapAlloc)-int64(m2.HeapAlloc)+int64(m2.HeapAlloc-m1.HeapAlloc)) / float64(n)
	b.ReportMetric(perEvent, "B/event")
	b.ReportMetric(perMembers, "B/members")
	b.ReportMetric(perEnd, "B/end")
	b.ReportMetric(float64(n)*(2*(perEvent+perMembers)+perEnd)/(1<<20), "MiB/bound")
	runtime.KeepAlive(s)
	runtime.KeepAlive(ends)
	runtime.KeepAlive(lines) // their texts are no part of the cache
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
		c.add(&entry{key: eventKey{level: levelError, plugin: "plugin/errors: ", shape: uint64(i), member: member}})
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
	storm := &entry{key: eventKey{level: levelError, plugin: "plugin/errors: ", shape: 1}, stormWritten: true}
	storm.seen, storm.carried = 5, 5
	c.add(storm)
	storm.seen++ // a new line: pending again
	c.place(storm, true)
	var loud []*entry
	for i := range 3 {
		e := &entry{key: eventKey{level: levelError, plugin: "plugin/forward: ", message: fmt.Sprint("down ", i)}}
		e.seen = 1
		loud = append(loud, e)
		c.add(e)
	}
	if len(gone) != 1 || gone[0] != loud[0] {
		t.Errorf("evicted %v, want the oldest of the plugin with the most pending", gone)
	}
}
