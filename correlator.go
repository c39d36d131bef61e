package k8s_event

import (
	"cmp"
	"hash/maphash"
	"slices"
	"strings"
	"time"

	"github.com/hashicorp/golang-lru/v2/simplelru"
)

const (
	// A plugin and level make at most ownEvents events of their own lines, then maxShapes combined
	// events, one per shape, then one more for the lines of every other shape (otherShapes), in any
	// budgetWindow: further new lines join the combined events, so that per-query errors cannot
	// create an object each, and noise that pauses cannot start the budget over.
	ownEvents = 10
	maxShapes = 10
	budget    = ownEvents + maxShapes + 1
	// maxPromoted is the room for events of one member's lines (hitters.go) beside the budget, in
	// any budgetWindow: new shapes cannot spend it, nor promotions the budget.
	maxPromoted  = 10
	budgetWindow = time.Hour
	maxWindows   = 1024
	otherShapes  = 1 // a shapeHash is never 1 in practice
)

// eventKey identifies one event: a log line, or, with an empty message, the
// combined event of a plugin, level and shape.
type eventKey struct {
	shape   uint64 // of a combined event: shapeHash of its lines
	level   level  // beside shape: the two hash as one run of bytes
	plugin  string
	message string
	member  string // of a combined event of one member's lines (hitters.go)
}

func (k eventKey) combined() bool { return k.message == "" }

// entry is what the scheduler knows of one event. Entries belong to the scheduler's goroutine:
// writers get a request made from one, never the entry itself.
type entry struct {
	job // its key, and what the scheduler keeps to write it (scheduler.go)
	tally
	message     string // latest line; a combined event adds combinedPrefix when written
	first, last time.Time
	// stamped is the latest wall time of its lines, the lastTimestamp written. Line times keep
	// their monotonic reading, so that quiet and the budgets measure time that passed across a step
	// of the wall clock; but Go compares two such times on it alone, and after a step back the
	// latest line has the earlier wall time: lastTimestamp would move back.
	stamped time.Time
	seq     uint64 // of its latest line: the least recently seen goes first

	objectState // what the scheduler keeps of the object it wrote (scheduler.go)

	// base is the lines carried by earlier objects of this event, each
	// full at a count of 2^31-1: the count of the current one is seen-base.
	base int64
	// storm is the lines of the event before its current storm began; stormWritten, that a write of
	// that storm landed: an end speaks of seen-storm lines, and only of a storm the API has seen.
	storm        int64
	stormWritten bool

	evicted bool

	links            // its place in the cache (cache.go)
	hitters *hitters // of a combined event: its members (hitters.go)
	whole   uint64   // of a member's event: the foldHash of its member's whole name
	flow    *flow    // of a warning or an error: its lines over time (end.go)
}

type windowKey struct {
	level  level
	plugin string
}

// window is the budget of one plugin and level: a ring of the times of its latest new events. Times
// are the correlator's elapsed: a step of the wall clock is no time that passed.
type window struct {
	made     ring[[budget]time.Duration]
	promoted ring[[maxPromoted]time.Duration]
	promoter *promoter // of its members, once it has lines past its events of their own
	ends     endBudget // the ends of its storms
	rested   [maxEnds]rested
	nextRest int
}

// rested is a storm that ended and did not rise since, whose event the cache let go: its next
// event of the same key keeps the hysteresis, so that one line after an end makes no second end.
type rested struct {
	shape   uint64
	member  string
	message string // of an event of one line: its key's
	peak    int64
}

// rest keeps the hysteresis of e, leaving the cache, if its storm ended and did not rise since.
func (c *correlator) rest(e *entry) {
	if e.flow == nil || !e.flow.rest {
		return
	}
	w := c.window(windowKey{e.key.level, e.key.plugin})
	w.rested[w.nextRest] = rested{e.key.shape, e.key.member, e.key.message, e.flow.peak}
	w.nextRest = (w.nextRest + 1) % maxEnds
}

// resume gives a new event's flow the hysteresis its key kept, if any.
func (w *window) resume(key eventKey, p *flow) {
	for i, r := range w.rested {
		if r.peak > 0 && r.shape == key.shape && r.member == key.member &&
			r.message == key.message {
			p.rest, p.peak = true, r.peak
			w.rested[i] = rested{}
			return
		}
	}
}

// ring is the times of the latest events of a budget.
type ring[T [budget]time.Duration | [maxPromoted]time.Duration] struct {
	times T
	next  int
}

// spent is the number of new events made within budgetWindow before at.
func (r *ring[T]) spent(at time.Duration) int {
	n := 0
	for i := range len(r.times) {
		if at-r.times[i] < budgetWindow {
			n++
		}
	}
	return n
}

func (r *ring[T]) spend(at time.Duration) {
	r.times[r.next] = at
	r.next = (r.next + 1) % len(r.times)
}

func (w *window) spent(at time.Duration) int { return w.made.spent(at) }
func (w *window) spend(at time.Duration)     { w.made.spend(at) }

// correlator folds lines into entries: repeats counted, storms combined by shape, those whose loss
// costs the least evicted beyond the cache size (cache.go). Owned by the scheduler's goroutine.
type correlator struct {
	cache *cache
	// windows are the budgets of at most maxWindows plugins and levels: the least recently used
	// goes first, which is never one whose lines keep coming.
	windows *simplelru.LRU[windowKey, *window]
	lastKey windowKey // of last, the window used last
	last    *window
	origin  time.Time // a budgetWindow before the first line: no window's zero is within one
	seq     uint64
	quiet   time.Duration // the scheduler's: storms' paces count lines in slots of it
	// paced is the quiet flows count in: the latest that was on, so that a storm's flow goes on
	// while quiet is off, and is true once it is on again.
	paced  time.Duration
	shaped []byte // room for a line's shape: shapeHash's, in place
	// memberHash is the foldHash of the member budgeted found last, as cut; whole, of its whole
	// name, which identifies a member's event
	memberHash, whole uint64
	// promoters are those of the budgets, at most maxPromoters: the least recently used goes to
	// another budget that needs one.
	promoters []*promoter
}

// newCorrelator keeps size entries; evicted is told of each that leaves.
func newCorrelator(size int, evicted func(*entry)) *correlator {
	windows, err := simplelru.NewLRU[windowKey, *window](maxWindows, nil)
	if err != nil {
		panic(err) // maxWindows is positive
	}
	c := &correlator{windows: windows}
	c.cache = newCache(size, func(e *entry) {
		c.rest(e)
		evicted(e)
	})
	return c
}

func (c *correlator) observe(ln line) *entry {
	if c.origin.IsZero() {
		c.origin = ln.at.Add(-budgetWindow)
	}
	el := ln.at.Sub(c.origin) // on the monotonic clock
	msg := eventMessage(ln.text)
	key := eventKey{level: ln.level, plugin: ln.plugin, message: msg}
	e, ok := c.cache.get(key)
	m := ""
	if !ok {
		key, e, ok, m = c.budgeted(key, el)
	}
	if !ok {
		e = newEntry(key, ln.at)
		if key.member != "" {
			e.whole = c.whole
		}
		c.cache.add(e)
	}
	if c.quiet > 0 {
		c.paced = c.quiet
	}
	top, recent := false, int64(0)
	if key.combined() {
		if e.hitters == nil {
			e.hitters = &hitters{}
		}
		top, recent = e.hitters.count(m, c.memberHash, el, c.paced)
		if key.shape == otherShapes {
			e.hitters.countShape(shapeHash(strings.TrimPrefix(msg, ln.plugin)))
		}
	}
	if c.paced > 0 && (key.level == levelWarning || key.level == levelError) {
		if e.flow == nil { // a storm that ended before its flow was counted rests until it rises
			w := c.window(windowKey{key.level, key.plugin})
			e.flow = &flow{ends: &w.ends, rest: e.storm > 0}
			w.resume(key, e.flow) // a storm of one line rests as a combined one does
		}
		// A top member holds its storm open only with more lines of its own than the threshold.
		e.flow.add(ln.at, el, c.paced, top && recent > e.flow.threshold())
	}
	e.see()
	c.cache.place(e, true)
	c.seq++
	e.seq = c.seq
	e.message = msg
	if !key.combined() { // the same text as its key: kept once
		e.message = e.key.message
	}
	if ln.at.After(e.last) {
		e.last = ln.at
	}
	if at := ln.at.Round(0); at.After(e.stamped) { // on the wall clock
		e.stamped = at
	}
	return e
}

// note is what a write of e says: a combined event names its top members before its latest line.
func (e *entry) note() string {
	if e.hitters == nil {
		return e.message
	}
	top := e.hitters.names(false)
	if top == "" {
		return e.message
	}
	return e.key.plugin + top + "; latest: " + strings.TrimPrefix(e.message, e.key.plugin)
}

// combinedPrefix marks the message of a combined event, as client-go does.
const combinedPrefix = "(combined from similar events): "

// budgeted is the key of a line that has no entry, within the budget of its plugin and level, with
// the entry of that key if there is one, and the line's member if it is combined. at is the
// line's time on the correlator's elapsed.
func (c *correlator) budgeted(key eventKey, at time.Duration) (eventKey, *entry, bool, string) {
	w := c.window(windowKey{key.level, key.plugin})
	spent := w.spent(at)
	if spent < ownEvents {
		w.spend(at)
		return key, nil, false, ""
	}
	aggregated[key.level].Inc()
	// The budget is of one plugin: its prefix is no part of the shape.
	rest := strings.TrimPrefix(key.message, key.plugin)
	var f found // the member too, in the same pass
	c.shaped = appendShape(c.shaped[:0], rest, &f)
	key.message, key.shape = "", maphash.Bytes(shapeSeed, c.shaped)
	whole := f.whole()
	m := cutMember(whole) // f.member()
	low := int64(0)
	if m != "" { // counted case-folded (RFC 4343): the line keeps its own case
		x := foldHash(whole)
		c.memberHash, c.whole = x, x
		if len(m) < len(whole) { // cut: its summary counts it by the hash of what is kept
			c.memberHash = foldHash(m)
		}
		low = c.promoterOf(w).add(m, x, at)
	}
	e, ok := c.cache.get(key)
	if !ok && spent >= ownEvents+maxShapes {
		key.shape = otherShapes
		e, ok = c.cache.get(key)
	}
	if !ok { // beyond the budget only when the cache let the other shapes' event go
		w.spend(at)
		return key, nil, false, m
	}
	if m == "" {
		return key, e, true, m
	}
	p := w.promoter
	if c.cache.members > 0 { // else none to find; found by its whole name, not by m
		if o, ok := c.cache.byMember[memberID{key.level, key.plugin, key.shape, c.whole}]; ok {
			if p.last >= 0 {
				p.slots[p.last].state = promoted
			}
			return o.key, o, true, m
		}
	}
	if c.promote(w, low, at) {
		own := key
		own.member = strings.Clone(m)                // the key must not keep the line
		if _, taken := c.cache.entries[own]; taken { // by a name cut alike: this one whole
			own.member = strings.Clone(whole)
		}
		return own, nil, false, m
	}
	return key, e, true, m
}

// promote tells that the member of the line just counted in w's promoter, with low lines in its
// window, becomes an event of its own at at. A place of the room goes to the member of the most
// lines not promoted yet: while places are free and a member of more lines than low waits, it is
// elected (its place spent, its event made at its next line), so that a client's names just over
// promoteAt cannot take the room from a host of more lines.
func (c *correlator) promote(w *window, low int64, at time.Duration) bool {
	p := w.promoter
	if p.last < 0 {
		return false
	}
	switch p.slots[p.last].state {
	case elected: // its place is spent
		p.slots[p.last].state = promoted
		return true
	case promoted: // its event left the cache
		p.slots[p.last].state = notElected
	}
	for low >= promoteAt && w.promoted.spent(at) < maxPromoted {
		w.promoted.spend(at)
		i := p.elect()
		if i == p.last || i < 0 {
			p.slots[p.last].state = promoted
			return true
		}
		p.slots[i].state = elected
	}
	return false
}

// promoterOf is w's promoter: a new one while fewer than maxPromoters are, else the least
// recently used, emptied.
func (c *correlator) promoterOf(w *window) *promoter {
	if w.promoter != nil {
		return w.promoter
	}
	var p *promoter
	if len(c.promoters) < maxPromoters {
		p = newPromoter()
		c.promoters = append(c.promoters, p)
	} else {
		p = slices.MinFunc(c.promoters, func(a, b *promoter) int {
			return cmp.Compare(a.used, b.used)
		})
		p.owner.promoter = nil
		p.reset()
	}
	p.owner, w.promoter = w, p
	return p
}

// window is the budget of wk. Beyond maxWindows, the least recently used goes.
func (c *correlator) window(wk windowKey) *window {
	if c.last != nil && c.lastKey == wk { // a storm is of one plugin and level
		return c.last
	}
	w, ok := c.windows.Get(wk)
	if !ok {
		w = &window{}
		c.windows.Add(wk, w)
	}
	c.lastKey, c.last = wk, w
	return w
}
