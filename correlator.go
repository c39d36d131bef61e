package k8s_event

import (
	"strings"
	"time"
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

// entry is what the correlator knows of one event. Its fields are guarded
// by the pipeline's mutex.
type entry struct {
	key eventKey
	tally
	message     string // latest line; a combined event adds combinedPrefix when written
	first, last time.Time

	name  string // the Event object's name once created
	tried string // the name of a create that reached the API and got no answer

	// doubt is the count of the latest write that reached the API and got
	// no answer; zero once a later answer settled it.
	doubt    int64
	failures int       // consecutive failed writes, for the backoff
	retryAt  time.Time // no attempt before this, but at shutdown
	asked    time.Time // no attempt before this, even at shutdown: the latest Retry-After

	// base is the lines carried by earlier objects of this event, each
	// full at a count of 2^31-1: the count of the current one is seen-base.
	base int64

	queued   bool // handed to the work queue, due now or later
	inflight bool
	evicted  bool

	end *endSpec // set: this entry is the end of a storm, not in the cache (end.go)
}

type windowKey struct {
	level  level
	plugin string
}

// window counts the distinct lines of one plugin and level. As client-go's
// aggregator does, it lasts as long as each new line comes within
// combineWindow of the one before: a storm that goes on at one line a
// minute stays combined.
type window struct {
	last     time.Time // of the latest distinct line
	distinct int
	shapes   map[uint64]struct{} // of its combined events, at most maxShapes
}

// combinedShape is the shape whose combined event a line joins: its own,
// or otherShapes once the window has maxShapes. Called with p.mu held.
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

func (p *pipeline) correlate() {
	defer close(p.correlatorDone)
	var last time.Time
	for ln := range p.lines {
		p.observe(ln)
		for len(p.lines) > 0 {
			p.observe(<-p.lines)
		}
		// Lines that come more often than stormGap are taken in batches:
		// a correlator parked on an empty queue costs the listener a
		// wake-up of another thread per line, one asleep for batchPause
		// costs one per batch. Real time: this is about threads, not
		// about what the lines say.
		now := time.Now()
		if now.Sub(last) < stormGap {
			time.Sleep(batchPause)
		}
		last = now
	}
}

// observe folds one line into its entry and, unless it is queued already,
// queues the entry for writing.
func (p *pipeline) observe(ln line) {
	msg := eventMessage(ln.text)
	key := eventKey{level: ln.level, plugin: ln.plugin, message: msg}

	p.mu.Lock()
	e, ok := p.cache.Get(key)
	if !ok {
		if w := p.window(ln); w.distinct > combineAfter {
			aggregated[ln.level].Inc()
			// The window is of one plugin: its prefix is no part of the shape.
			key.message, key.shape = "", w.combinedShape(strings.TrimPrefix(msg, ln.plugin))
			e, ok = p.cache.Get(key)
		}
	}
	if !ok {
		e = &entry{key: key, first: ln.at}
		p.cache.Add(key, e)
	}
	e.see()
	e.message = msg
	if e.first.IsZero() { // a storm that came back after its end
		e.first = ln.at
	}
	if ln.at.After(e.last) {
		e.last = ln.at
	}
	if ln.at.After(p.observed) {
		p.observed = ln.at
	}
	add := !e.queued
	e.queued = true
	p.mu.Unlock()

	if add {
		p.queue.Add(e)
	}
}

// combinedPrefix marks the message of a combined event, as client-go does.
const combinedPrefix = "(combined from similar events): "

// window counts a new distinct line in the window of its plugin and level.
// Called with p.mu held.
func (p *pipeline) window(ln line) *window {
	wk := windowKey{ln.level, ln.plugin}
	w, ok := p.windows[wk]
	if !ok {
		if len(p.windows) >= maxWindows {
			clear(p.windows)
		}
		w = &window{last: ln.at}
		p.windows[wk] = w
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

// evicted is the LRU's eviction callback, called with p.mu held.
func (p *pipeline) evicted(_ eventKey, e *entry) {
	e.evicted = true
	p.retire(e)
}

// retire decides the fate of an evicted entry once no write of it is in
// flight: its pending lines are dropped, unless its latest write got no
// answer; then it stays, for as long as there is room, until one more
// write settles what the API holds. Called with p.mu held.
func (p *pipeline) retire(e *entry) {
	if !e.evicted || e.inflight {
		return
	}
	if e.doubt > 0 && e.pending() > 0 {
		// A reload that shrank the cache left an entry in flight settling
		// beyond the new size: it goes once its write is back.
		if _, ok := p.settling[e]; ok && len(p.settling) <= p.cacheSize || !ok && len(p.settling) < p.cacheSize {
			p.settling[e] = struct{}{}
			return
		}
	}
	delete(p.settling, e)
	p.drop(e, dropEvicted)
}

// drop gives up the pending lines of e. Called with p.mu held.
func (p *pipeline) drop(e *entry, reason dropReason) {
	if e.doubt > 0 && e.pending() > 0 {
		p.doubtful += min(e.doubt-e.carried, e.pending())
	}
	e.tally.drop(reason)
}
