package k8s_event

import (
	"fmt"
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
	if g := c.most[0]; g.key.plugin != "plugin/noise: " || g.n != 2 || len(c.most) != 2 {
		t.Errorf("the plugin with the most pending is %v with %d, want noise with 2", g.key, g.n)
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
