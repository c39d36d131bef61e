package k8s_event

import (
	"container/heap"
	"container/list"
	"time"
)

// The order in which a bucket's entries take its tokens, new information
// first: entries settling (evicted, their latest write unanswered); events
// whose patch found them gone; then the plugins, least recently served
// first, so that each plugin waiting puts at most one event before one
// served after it; within a plugin, new events and updates of written ones
// take turns, new first; each in the order it began to wait. Entries
// waiting for a time (backoff, Retry-After, quiet) are in the timers. Every
// choice is a heap operation. Owned by the scheduler's goroutine.

// slot is where an entry waits: one heap at a time, or none.
type slot struct {
	in       *entryHeap
	index    int
	owner    *pluginQueue  // of in, when in is a plugin's
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

// pluginQueue is what one plugin has waiting in one bucket.
type pluginQueue struct {
	fresh, updates entryHeap
	updateNext     bool
	served         uint64 // the turn it was last served
	index          int    // in the turns; -1 when nothing of it waits
}

// next is the heap whose oldest entry the plugin sends next.
func (p *pluginQueue) next() *entryHeap {
	if p.updates.Len() > 0 && (p.updateNext || p.fresh.Len() == 0) {
		return &p.updates
	}
	return &p.fresh
}

// turns is a heap of plugins, least recently served first.
type turns []*pluginQueue

func (t turns) Len() int           { return len(t) }
func (t turns) Less(i, j int) bool { return t[i].served < t[j].served }
func (t turns) Swap(i, j int)      { t[i], t[j] = t[j], t[i]; t[i].index, t[j].index = i, j }
func (t *turns) Push(x any)        { p := x.(*pluginQueue); p.index = len(*t); *t = append(*t, p) }
func (t *turns) Pop() any {
	n := len(*t) - 1
	p := (*t)[n]
	(*t)[n], *t = nil, (*t)[:n]
	p.index = -1
	return p
}

// tokenQueue is the order of one bucket's entries.
type tokenQueue struct {
	settling, recreate entryHeap
	plugins            map[string]*pluginQueue
	turns              turns
	turn               uint64
	unwritten          list.List // of the entries never written that wait, oldest first
}

func newTokenQueue() *tokenQueue {
	return &tokenQueue{settling: entryHeap{less: byStamp}, recreate: entryHeap{less: byStamp}, plugins: map[string]*pluginQueue{}}
}

// head is the entry that takes the bucket's next token; nil when none waits.
func (q *tokenQueue) head() *entry {
	for _, h := range []*entryHeap{&q.settling, &q.recreate} {
		if h.Len() > 0 {
			return h.es[0]
		}
	}
	if len(q.turns) == 0 {
		return nil
	}
	return q.turns[0].next().es[0]
}

// push queues e, settling or not, behind those that began to wait before it.
func (q *tokenQueue) push(e *entry, settling bool) {
	switch {
	case settling:
		heap.Push(&q.settling, e)
	case e.slot.recreate:
		heap.Push(&q.recreate, e)
	default:
		p := q.plugins[e.key.plugin]
		if p == nil {
			p = &pluginQueue{fresh: entryHeap{less: byStamp}, updates: entryHeap{less: byStamp}, index: -1}
			q.plugins[e.key.plugin] = p
		}
		h := &p.updates
		if e.carried == 0 {
			h = &p.fresh
		}
		heap.Push(h, e)
		e.slot.owner = p
		if p.index < 0 {
			heap.Push(&q.turns, p)
		}
	}
}

// remove takes e out of the queue.
func (q *tokenQueue) remove(e *entry) {
	p := e.slot.owner
	heap.Remove(e.slot.in, e.slot.index)
	if p != nil && p.fresh.Len()+p.updates.Len() == 0 && p.index >= 0 {
		heap.Remove(&q.turns, p.index) // it stays in plugins, which are few, with its turn
		p.updateNext = false           // new first, when it waits again
	}
}

// served takes e, which got a token, out of the queue: its plugin's turn
// comes again after every other plugin's waiting.
func (q *tokenQueue) served(e *entry) {
	p := e.slot.owner
	if p != nil {
		q.turn++
		p.served, p.updateNext = q.turn, e.slot.in == &p.fresh
	}
	q.remove(e)
	if p != nil && p.index >= 0 {
		heap.Fix(&q.turns, p.index)
	}
	e.slot.recreate = false
}
