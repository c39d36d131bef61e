package k8s_event

import (
	"strings"
	"time"

	"github.com/hashicorp/golang-lru/v2/simplelru"
)

const (
	// combineAfter distinct lines of one plugin and level, each within
	// combineWindow of the one before, make every further new line of that
	// plugin and level part of a combined event, so that per-query errors
	// cannot create an object each.
	combineAfter  = 10
	combineWindow = 10 * time.Minute
	maxWindows    = 1024
	// maxShapes bounds the combined events of one plugin and level in a
	// window; lines of further shapes join one more, of shape otherShapes.
	maxShapes   = 10
	otherShapes = 1 // a shapeHash is never 1 in practice
)

// eventKey identifies one event: a log line, or, with an empty message, the
// combined event of a plugin, level and shape.
type eventKey struct {
	level   level
	plugin  string
	message string
	shape   uint64 // of a combined event: shapeHash of its lines
}

func (k eventKey) combined() bool { return k.message == "" }

// entry is what the scheduler knows of one event. Entries belong to the scheduler's goroutine:
// writers get a request made from one, never the entry itself.
type entry struct {
	key eventKey
	tally
	message     string // latest line; a combined event adds combinedPrefix when written
	first, last time.Time
	seq         uint64 // of its latest line: the least recently seen goes first

	name       string // the Event object's name once created
	tried      string // the name of a create that reached the API and got no answer
	triedCount int64  // the lines that create carried, from the event's first

	// doubt is the count of the latest write that reached the API and got
	// no answer; zero once a later answer settled it.
	doubt    int64
	failures int       // consecutive failed writes, for the backoff
	retryAt  time.Time // no attempt before this: a backoff, a pause after a refusal
	asked    time.Time // no attempt before this, even at shutdown: the latest Retry-After

	// base is the lines carried by earlier objects of this event, each
	// full at a count of 2^31-1: the count of the current one is seen-base.
	base int64
	// storm is the lines of the event before its current storm began, and
	// stormWritten tells that a write of the current storm landed: an end
	// speaks of seen-storm lines, and only of a storm the API has seen.
	storm        int64
	stormWritten bool

	inflight uint64 // the request in flight for it, 0 when none
	deferred bool   // found its bucket empty since its latest request
	evicted  bool

	end *endSpec // set: this entry is the end of a storm, not in the cache (end.go)
}

type windowKey struct {
	level  level
	plugin string
}

// window counts the distinct lines of one plugin and level. As client-go's aggregator does, it
// lasts as long as each new line comes within combineWindow of the one before: a storm that goes on
// at one line a minute stays combined.
type window struct {
	last     time.Time // of the latest distinct line
	distinct int
	shapes   map[uint64]struct{} // of its combined events, at most maxShapes
}

// combinedShape is the shape whose combined event a line joins: its own,
// or otherShapes once the window has maxShapes.
func (w *window) combinedShape(message string) uint64 {
	shape := shapeHash(message)
	if _, ok := w.shapes[shape]; ok {
		return shape
	}
	if len(w.shapes) >= maxShapes {
		return otherShapes
	}
	if w.shapes == nil {
		w.shapes = map[uint64]struct{}{}
	}
	w.shapes[shape] = struct{}{}
	return shape
}

// correlator folds lines into entries: repeats counted, storms combined by shape, the least
// recently seen evicted beyond the cache size. Owned by the scheduler's goroutine.
type correlator struct {
	cache   *simplelru.LRU[eventKey, *entry]
	windows map[windowKey]*window
	seq     uint64
}

// newCorrelator keeps size entries; evicted is told of each that leaves.
func newCorrelator(size int, evicted func(*entry)) *correlator {
	cache, _ := simplelru.NewLRU(size, func(_ eventKey, e *entry) { evicted(e) })
	return &correlator{cache: cache, windows: map[windowKey]*window{}}
}

// observe folds one line into its entry and returns the entry.
func (c *correlator) observe(ln line) *entry {
	msg := eventMessage(ln.text)
	key := eventKey{level: ln.level, plugin: ln.plugin, message: msg}
	e, ok := c.cache.Get(key)
	if !ok {
		if w := c.window(ln); w.distinct > combineAfter {
			aggregated[ln.level].Inc()
			// The window is of one plugin: its prefix is no part of the shape.
			key.message, key.shape = "", w.combinedShape(strings.TrimPrefix(msg, ln.plugin))
			e, ok = c.cache.Get(key)
		}
	}
	if !ok {
		e = &entry{key: key, first: ln.at}
		c.cache.Add(key, e)
	}
	e.see()
	c.seq++
	e.seq = c.seq
	e.message = msg
	if e.first.IsZero() { // a storm that came back after its end
		e.first = ln.at
	}
	if ln.at.After(e.last) {
		e.last = ln.at
	}
	return e
}

// combinedPrefix marks the message of a combined event, as client-go does.
const combinedPrefix = "(combined from similar events): "

// window counts a new distinct line in the window of its plugin and level.
func (c *correlator) window(ln line) *window {
	wk := windowKey{ln.level, ln.plugin}
	w, ok := c.windows[wk]
	if !ok {
		if len(c.windows) >= maxWindows {
			clear(c.windows)
		}
		w = &window{last: ln.at}
		c.windows[wk] = w
	}
	if ln.at.Sub(w.last) > combineWindow {
		w.distinct, w.shapes = 0, nil
	}
	if ln.at.After(w.last) {
		w.last = ln.at
	}
	w.distinct++
	return w
}

// resize keeps at most size entries, evicting the least recently seen.
func (c *correlator) resize(size int) { c.cache.Resize(size) }

func (c *correlator) len() int { return c.cache.Len() }
