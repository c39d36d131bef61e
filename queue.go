package k8s_event

import (
	"container/heap"
	"container/list"
	"strings"
	"sync/atomic"
	"time"
)

// The order in which a bucket's entries take its tokens, new information first: in the flush,
// events whose patch found them gone; then the plugins, least recently served first, so that each
// plugin waiting puts at most one event before one served after it; within a plugin, its entries
// settling (evicted, their latest write unanswered) and its re-creates (whose patch found the
// event gone: the plugin takes back its turn, see keep) first, then the line its place was kept
// for (a turn went to a newer line, see keep), then its shapes the same way, so
// that one shape of many events does not hold back a new one; within a shape, new events and
// updates of written ones take turns, new first; the new events by member (the
// name a line is about), least recently served first, so that a client's many events of a shape
// do not hold back a host's; each in the order it began to wait. With the bucket's requests in
// flight at their cap, the first plugin with none out goes. Entries waiting for a time (backoff,
// Retry-After, quiet) are in the timers. Every choice is a heap operation. Owned by the
// scheduler's goroutine.

// slot is where a job waits: one heap at a time, or none.
type slot struct {
	in       *jobHeap
	index    int
	owner    *turnQueue    // of in, when in is a plugin's, a shape's or a member's
	served   uint64        // the turn it was last served
	stamp    uint64        // when it began to wait for a write that lands: oldest first
	at       time.Time     // in the timers: when to look at it again
	recreate bool          // its patch found the event gone
	never    *list.Element // in its bucket's unwritten, while it waits and was never written
	ownNever *list.Element // in its plugin's
}

// jobHeap is a heap of jobs that know their place in it.
type jobHeap struct {
	es   []*job
	less func(a, b *job) bool
}

func (h *jobHeap) Len() int           { return len(h.es) }
func (h *jobHeap) Less(i, j int) bool { return h.less(h.es[i], h.es[j]) }
func (h *jobHeap) Swap(i, j int) {
	h.es[i], h.es[j] = h.es[j], h.es[i]
	h.es[i].slot.index, h.es[j].slot.index = i, j
}
func (h *jobHeap) Push(x any) {
	e := x.(*job)
	e.slot.in, e.slot.index = h, len(h.es)
	h.es = append(h.es, e)
}
func (h *jobHeap) Pop() any {
	n := len(h.es) - 1
	e := h.es[n]
	h.es[n], h.es = nil, h.es[:n]
	e.slot.in, e.slot.owner = nil, nil
	return e
}

func byStamp(a, b *job) bool { return a.slot.stamp < b.slot.stamp }
func byTime(a, b *job) bool  { return a.slot.at.Before(b.slot.at) }

// The depths of a turnQueue.
const (
	depthPlugin uint8 = iota
	depthShape
	depthMember
)

// turnQueue is what one plugin, one shape of a plugin, or one member of a shape has waiting in one
// bucket: a plugin's shapes take turns, and a shape's members with new events. What only a plugin
// keeps is apart, so that the queues of a shape and a member, one each for most events, are small.
type turnQueue struct {
	*pluginTurns            // of a plugin; nil below
	settling     jobHeap    // of a plugin
	updates      jobHeap    // of a shape
	fresh        jobHeap    // of a member: its new events
	depth        uint8      // depthPlugin, depthShape or depthMember
	updateNext   bool       // of a shape
	turns        turns      // of a plugin, its shapes waiting; of a shape, its members
	parent       *turnQueue // of a shape or a member
	shape        uint64     // of a shape: its key in its plugin's shapes
	member       string     // of a member: its key in its plugin's members
	served       uint64     // the turn it was last served
	since        uint64     // the stamp it began to wait
	index        int        // in the turns; -1 when nothing of it waits
}

// pluginTurns is what a plugin's turnQueue keeps beside those of its shapes and members.
type pluginTurns struct {
	shapes    map[uint64]*turnQueue
	members   map[memberKey]*turnQueue // of all its shapes: one map, not one a shape
	unwritten list.List                // its entries never written that wait, oldest first
	age       *atomic.Int64            // its metric (metrics.go), once shown
	name      string
	changed   bool // its oldest never written may have changed
	// opener is the job that began its wait, while it waits: a turn that goes to a newer one
	// keeps the plugin's place for it (see keep)
	opener *job
	// owed is the job its next turn goes to: its place in the rotation was kept for it
	owed        *job
	openerStamp uint64
	owedStamp   uint64
}

// memberKey is a member of a shape, in its plugin's members.
type memberKey struct {
	shape  uint64
	member string
}

func newTurnQueue(depth uint8, parent *turnQueue, served uint64) *turnQueue {
	t := &turnQueue{depth: depth, parent: parent, served: served, index: -1}
	switch depth {
	case depthPlugin:
		t.settling.less = byStamp
		t.pluginTurns = &pluginTurns{shapes: map[uint64]*turnQueue{},
			members: map[memberKey]*turnQueue{}}
	case depthShape:
		t.updates.less = byStamp
	default:
		t.fresh.less = byStamp
	}
	return t
}

// empty tells that nothing of t waits.
func (t *turnQueue) empty() bool {
	return t.settling.Len()+t.updates.Len()+t.fresh.Len()+len(t.turns) == 0
}

// head is the job t sends next.
func (t *turnQueue) head() *job {
	switch {
	case t.settling.Len() > 0:
		return t.settling.es[0]
	case t.depth == depthPlugin && t.owes():
		return t.owed
	case t.depth == depthMember:
		return t.fresh.es[0]
	case t.depth == depthShape && t.updates.Len() > 0 && (t.updateNext || len(t.turns) == 0):
		return t.updates.es[0]
	}
	return t.turns[0].head()
}

// turns is a heap of plugins, shapes or members, least recently served first.
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
	first     jobHeap // in the flush, the re-creates
	plugins   map[string]*turnQueue
	turns     turns
	turn      uint64
	unwritten list.List      // of the entries never written that wait, oldest first
	changed   []*turnQueue   // plugins whose oldest never written may have changed
	flying    map[string]int // requests in flight, by plugin
}

func newTokenQueue() *tokenQueue {
	return &tokenQueue{first: jobHeap{less: byStamp}, plugins: map[string]*turnQueue{},
		flying: map[string]int{}}
}

// head is the job that takes the bucket's next token; nil when none waits. With capped, the
// bucket's requests in flight are at their cap: the first plugin with none out goes, the others
// wait for an answer. Plugins are few: those of the Corefile.
func (q *tokenQueue) head(capped bool) *job {
	if q.first.Len() > 0 && (!capped || q.flying[q.first.es[0].key.plugin] == 0) {
		return q.first.es[0]
	}
	if !capped {
		if len(q.turns) == 0 {
			return nil
		}
		return q.turns[0].head()
	}
	var best *turnQueue
	for _, p := range q.turns {
		if q.flying[p.head().key.plugin] == 0 && (best == nil || turns{p, best}.Less(0, 1)) {
			best = p
		}
	}
	if best == nil {
		return nil
	}
	return best.head()
}

// ahead counts, for a line of the waiting plugin served last, the plugins that may go ahead of
// it: those waiting and those served before it, which may log while it waits (each goes once);
// and of those waiting, the ones whose turn goes, or went, to a line newer than the one that
// began their wait (each goes once more, see keep). Plugins are few, those of the Corefile: past
// scanPlugins, it counts them all, and each plugin waiting twice, so that a pass stays O(log n).
func (q *tokenQueue) ahead() (once, twice int) {
	if len(q.plugins) > scanPlugins {
		return len(q.plugins), len(q.turns)
	}
	last := uint64(0)
	for _, p := range q.turns {
		last = max(last, p.served)
		if p.owes() || p.opens() && p.head() != p.opener {
			twice++
		}
	}
	for _, p := range q.plugins {
		if p.index >= 0 || p.served < last {
			once++
		}
	}
	return once, twice
}

// scanPlugins is the most plugins of a bucket ahead counts one by one.
const scanPlugins = 64

// plugin is the queue of a plugin, made if need be; it stays, as plugins are few.
func (q *tokenQueue) plugin(name string) *turnQueue {
	p := q.plugins[name]
	if p == nil {
		p = newTurnQueue(depthPlugin, nil, 0)
		p.name = name
		q.plugins[name] = p
	}
	return p
}

// neverWritten lists e among the entries never written that wait, its bucket's and its plugin's.
func (q *tokenQueue) neverWritten(e *entry) {
	p := q.plugin(e.key.plugin)
	e.slot.never = q.unwritten.PushBack(e)
	e.slot.ownNever = p.unwritten.PushBack(e)
	q.change(p)
}

// written takes e out of the entries never written.
func (q *tokenQueue) written(e *entry) {
	if e.slot.never == nil {
		return
	}
	p := q.plugins[e.key.plugin]
	q.unwritten.Remove(e.slot.never)
	p.unwritten.Remove(e.slot.ownNever)
	e.slot.never, e.slot.ownNever = nil, nil
	q.change(p)
}

// change notes that p's oldest entry never written may have changed.
func (q *tokenQueue) change(p *turnQueue) {
	if !p.changed {
		p.changed = true
		q.changed = append(q.changed, p)
	}
}

// pushFirst queues e before the plugins' turns, behind those that began to wait before it.
func (q *tokenQueue) pushFirst(e *job) { heap.Push(&q.first, e) }

// push queues e, settling or not, behind those that began to wait before it.
// A shape or a member that waits again takes the place of its entry served last.
// A re-create goes with the entries settling: it is its patch's write continued.
// An end is a new event of its storm's shape and member.
func (q *tokenQueue) push(e *job, settling bool) {
	p := q.plugin(e.key.plugin)
	if settling || e.slot.recreate {
		q.into(&p.settling, p, e)
		return
	}
	k, m, written := e.key.shape, e.key.member, false
	switch l := e.lines; {
	case l != nil && l.group != nil: // the cache knows its shape and member
		k, m = l.group.key.shape, l.group.key.member
	case !e.key.combined():
		k = shapeHash(strings.TrimPrefix(e.key.message, e.key.plugin))
	}
	if e.lines != nil {
		written = e.lines.carried != 0
	}
	sh := p.shapes[k]
	if sh == nil {
		sh = newTurnQueue(depthShape, p, e.slot.served)
		sh.shape = k
		p.shapes[k] = sh
	}
	if written && !e.slot.recreate {
		q.into(&sh.updates, sh, e)
		return
	}
	mq := p.members[memberKey{k, m}]
	if mq == nil {
		mq = newTurnQueue(depthMember, sh, e.slot.served)
		mq.member = m
		p.members[memberKey{k, m}] = mq
	}
	q.into(&mq.fresh, mq, e)
}

// resume gives the plugin of e, whose patch found its event gone, back the turn it had when e
// began to wait (see keep): the patch and its re-create are one turn of two writes.
func (q *tokenQueue) resume(e *entry) {
	q.keep(q.plugin(e.key.plugin), &e.job)
}

// keep gives plugin p back the place in the rotation it had when j began to wait, once, and its
// next turn to j: a turn of p that did not write j, the line that began p's wait (it went to a
// newer line of p, new information first, or j's patch found its event gone), goes after every
// plugin that had no turn since j began to wait and before those that had one (they went ahead
// of j once already). So each plugin goes ahead of a line once at most, and twice when its own
// turn went to a line newer than its oldest waiting one (a refill more in the bound).
func (q *tokenQueue) keep(p *turnQueue, j *job) {
	if j.slot.stamp == 0 || p.owes() {
		return
	}
	p.owed, p.owedStamp = j, j.slot.stamp
	if j.slot.stamp >= p.served {
		return
	}
	p.served = j.slot.stamp
	if p.index >= 0 {
		heap.Fix(&q.turns, p.index)
	}
}

// owes tells that p's next turn goes to a job waiting in p, whose place p kept.
func (p *turnQueue) owes() bool {
	return p.owed != nil && p.owed.slot.owner != nil && p.owed.slot.stamp == p.owedStamp
}

// opens tells that the job that began p's wait still waits in p.
func (p *turnQueue) opens() bool {
	return p.opener != nil && p.opener.slot.owner != nil && p.opener.slot.stamp == p.openerStamp
}

// into pushes e in h, of t, and t and those above it in their turns if they were not.
func (q *tokenQueue) into(h *jobHeap, t *turnQueue, e *job) {
	heap.Push(h, e)
	e.slot.owner = t
	for ; t != nil && t.index < 0; t = t.parent {
		t.since = e.slot.stamp
		if t.parent == nil {
			t.opener, t.openerStamp = e, e.slot.stamp
			heap.Push(&q.turns, t)
		} else {
			heap.Push(&t.parent.turns, t)
		}
	}
}

func (q *tokenQueue) remove(e *job) {
	t := e.slot.owner
	heap.Remove(e.slot.in, e.slot.index)
	for ; t != nil && t.empty() && t.index >= 0; t = t.parent {
		switch t.depth {
		case depthPlugin: // it stays in plugins, which are few, with its turn
			heap.Remove(&q.turns, t.index)
			t.owed = nil // a wait of the plugin ends, and so does its place kept
		case depthShape:
			heap.Remove(&t.parent.turns, t.index)
			delete(t.parent.shapes, t.shape)
		default:
			heap.Remove(&t.parent.turns, t.index)
			delete(t.parent.parent.members, memberKey{t.parent.shape, t.member})
		}
	}
}

// served takes e, which got a token for the request of id, out of the queue: its member's turn
// comes again after every other member of its shape waiting, its shape's after every other shape
// of its plugin waiting, and its plugin's after every other plugin waiting. A turn is the id of
// its request, on the count of the stamps at which entries begin to wait: the two compare.
func (q *tokenQueue) served(e *job, id uint64) {
	t := e.slot.owner
	if t != nil {
		q.turn = id
		e.slot.served = q.turn
		if t.depth == depthShape {
			t.updateNext = false
		} else if t.depth == depthMember {
			t.parent.updateNext = true
		}
		for u := t; u != nil; u = u.parent {
			u.served = q.turn
		}
	}
	q.remove(e)
	p := q.plugins[e.key.plugin]
	if p != nil && p.owed == e { // its place kept is taken
		p.owed = nil
	}
	if t != nil && p.opens() && e.slot.stamp > p.openerStamp {
		q.keep(p, p.opener) // the turn went to a line newer than the one that began p's wait
	}
	for u := t; u != nil; u = u.parent {
		if u.index < 0 {
			continue
		}
		if u.parent == nil {
			heap.Fix(&q.turns, u.index)
		} else {
			heap.Fix(&u.parent.turns, u.index)
		}
	}
	e.slot.recreate = false
}
