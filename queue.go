package k8s_event

import (
	"container/heap"
	"container/list"
	"strings"
	"time"
)

// The order in which a bucket's entries take its tokens, new information first: entries settling
// (evicted, their latest write unanswered; in the flush, events whose patch found them gone too);
// then the plugins, least recently served first, so that each plugin waiting puts at most one event
// before one served after it; within a plugin, its shapes the same way, so that one shape of many
// events does not hold back a new one; within a shape, new events (a re-create among them) and
// updates of written ones take turns, new first; each in the order it began to wait. Entries
// waiting for a time (backoff, Retry-After, quiet) are in the timers. Every choice is a heap
// operation. Owned by the scheduler's goroutine.

// slot is where an entry waits: one heap at a time, or none.
type slot struct {
	in       *entryHeap
	index    int
	owner    *turnQueue    // of in, when in is a shape's
	served   uint64        // the turn it was last served
	stamp    uint64        // when it began to wait for a write that lands: oldest first
	at       time.Time     // in the timers: when to look at it again
	recreate bool          // its patch found the event gone
	never    *list.Element // in its bucket's unwritten, while it waits and was never written
}

// entryHeap is a heap of entries that know their place in it.
type entryHeap struct {
	es   []*entry
	less func(a, b *entry) bool
}

func (h *entryHeap) Len() int           { return len(h.es) }
func (h *entryHeap) Less(i, j int) bool { return h.less(h.es[i], h.es[j]) }
func (h *entryHeap) Swap(i, j int) {
	h.es[i], h.es[j] = h.es[j], h.es[i]
	h.es[i].slot.index, h.es[j].slot.index = i, j
}
func (h *entryHeap) Push(x any) {
	e := x.(*entry)
	e.slot.in, e.slot.index = h, len(h.es)
	h.es = append(h.es, e)
}
func (h *entryHeap) Pop() any {
	n := len(h.es) - 1
	e := h.es[n]
	h.es[n], h.es = nil, h.es[:n]
	e.slot.in, e.slot.owner = nil, nil
	return e
}

func byStamp(a, b *entry) bool { return a.slot.stamp < b.slot.stamp }
func byTime(a, b *entry) bool  { return a.slot.at.Before(b.slot.at) }

// turnQueue is what one plugin, or one shape of a plugin, has waiting in
// one bucket: a plugin's shapes take turns, and a shape's entries.
type turnQueue struct {
	fresh, updates entryHeap // of a shape
	updateNext     bool
	shapes         map[uint64]*turnQueue // of a plugin: those waiting
	turns          turns                 // of a plugin: its shapes waiting
	plugin         *turnQueue            // of a shape
	shape          uint64                // of a shape: its key in its plugin's shapes
	served, since  uint64                // the turn it was last served; the stamp it began to wait
	index          int                   // in the turns; -1 when nothing of it waits
}

// next is the heap whose oldest entry the shape sends next.
func (p *turnQueue) next() *entryHeap {
	if p.updates.Len() > 0 && (p.updateNext || p.fresh.Len() == 0) {
		return &p.updates
	}
	return &p.fresh
}

// turns is a heap of plugins or shapes, least recently served first.
type turns []*turnQueue

func (t turns) Len() int { return len(t) }
func (t turns) Less(i, j int) bool {
	return t[i].served < t[j].served || t[i].served == t[j].served && t[i].since < t[j].since
}
func (t turns) Swap(i, j int) { t[i], t[j] = t[j], t[i]; t[i].index, t[j].index = i, j }
func (t *turns) Push(x any)   { p := x.(*turnQueue); p.index = len(*t); *t = append(*t, p) }
func (t *turns) Pop() any {
	n := len(*t) - 1
	p := (*t)[n]
	(*t)[n], *t = nil, (*t)[:n]
	p.index = -1
	return p
}

// tokenQueue is the order of one bucket's entries.
type tokenQueue struct {
	settling  entryHeap
	plugins   map[string]*turnQueue
	turns     turns
	turn      uint64
	unwritten list.List      // of the entries never written that wait, oldest first
	flying    map[string]int // requests in flight, by plugin
}

func newTokenQueue() *tokenQueue {
	return &tokenQueue{settling: entryHeap{less: byStamp}, plugins: map[string]*turnQueue{},
		flying: map[string]int{}}
}

// head is the entry that takes the bucket's next token; nil when none waits.
func (q *tokenQueue) head() *entry {
	if q.settling.Len() > 0 {
		return q.settling.es[0]
	}
	if len(q.turns) == 0 {
		return nil
	}
	return q.turns[0].turns[0].next().es[0]
}

// push queues e, settling or not, behind those that began to wait before it.
// A shape that waits again takes the place of its entry served last.
func (q *tokenQueue) push(e *entry, settling bool) {
	if settling {
		heap.Push(&q.settling, e)
		return
	}
	p := q.plugins[e.key.plugin]
	if p == nil {
		p = &turnQueue{shapes: map[uint64]*turnQueue{}, index: -1}
		q.plugins[e.key.plugin] = p
	}
	k := e.key.shape
	if !e.key.combined() {
		k = shapeHash(strings.TrimPrefix(e.key.message, e.key.plugin))
	}
	sh := p.shapes[k]
	if sh == nil {
		sh = &turnQueue{fresh: entryHeap{less: byStamp}, updates: entryHeap{less: byStamp},
			plugin: p, shape: k, served: e.slot.served, index: -1}
		p.shapes[k] = sh
	}
	h := &sh.updates
	if e.carried == 0 || e.slot.recreate {
		h = &sh.fresh
	}
	heap.Push(h, e)
	e.slot.owner = sh
	if sh.index < 0 {
		sh.since = e.slot.stamp
		heap.Push(&p.turns, sh)
	}
	if p.index < 0 {
		p.since = e.slot.stamp
		heap.Push(&q.turns, p)
	}
}

func (q *tokenQueue) remove(e *entry) {
	sh := e.slot.owner
	heap.Remove(e.slot.in, e.slot.index)
	if sh == nil || sh.fresh.Len()+sh.updates.Len() > 0 {
		return
	}
	p := sh.plugin
	heap.Remove(&p.turns, sh.index)
	delete(p.shapes, sh.shape)
	if len(p.turns) == 0 {
		heap.Remove(&q.turns, p.index) // it stays in plugins, which are few, with its turn
	}
}

// served takes e, which got a token, out of the queue: its shape's turn comes again after every
// other shape of its plugin waiting, and its plugin's after every other plugin waiting.
func (q *tokenQueue) served(e *entry) {
	sh := e.slot.owner
	if sh != nil {
		q.turn++
		sh.served, sh.plugin.served, e.slot.served = q.turn, q.turn, q.turn
		sh.updateNext = e.slot.in == &sh.fresh
	}
	q.remove(e)
	if sh != nil && sh.index >= 0 {
		heap.Fix(&sh.plugin.turns, sh.index)
	}
	if sh != nil && sh.plugin.index >= 0 {
		heap.Fix(&q.turns, sh.plugin.index)
	}
	e.slot.recreate = false
}
