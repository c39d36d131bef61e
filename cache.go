package k8s_event

import "container/heap"

// The cache of entries, of at most CACHESIZE. When it is full, the entry that leaves is the one
// whose loss costs the least information: a fully written event that is no storm, least recently
// seen first; then a storm waiting for its end, least recently seen first; then, among the
// entries with lines to write, one of the plugin and level with the most of them, least recently
// seen first. So noise that fills the cache evicts its own lines, never another plugin's first
// line. A choice costs O(1), and O(log n) in the plugins and levels with lines to write when a
// line's entry changes group. The scheduler's evicted accounts for the lines of what leaves.

// queue is a list of entries, least recently placed first, linked through the entries.
type queue struct {
	front, back *entry
	n           int
}

// links are an entry's place in one queue of the cache.
type links struct {
	prev, next *entry
	in         *queue
}

func (q *queue) push(e *entry) {
	e.prev, e.next, e.in = q.back, nil, q
	if q.back != nil {
		q.back.next = e
	} else {
		q.front = e
	}
	q.back = e
	q.n++
}

func (q *queue) remove(e *entry) {
	if e.prev != nil {
		e.prev.next = e.next
	} else {
		q.front = e.next
	}
	if e.next != nil {
		e.next.prev = e.prev
	} else {
		q.back = e.prev
	}
	e.prev, e.next, e.in = nil, nil, nil
	q.n--
}

// group is the queue of the entries of one plugin and level with lines to write.
type group struct {
	queue
	key windowKey
	at  int // its index in the heap
}

// groups is a heap of groups, the one with the most entries first.
type groups []*group

func (h groups) Len() int           { return len(h) }
func (h groups) Less(i, j int) bool { return h[i].n > h[j].n }
func (h groups) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].at, h[j].at = i, j
}
func (h *groups) Push(x any) {
	g := x.(*group)
	g.at = len(*h)
	*h = append(*h, g)
}
func (h *groups) Pop() any {
	old := *h
	g := old[len(old)-1]
	*h = old[:len(old)-1]
	return g
}

type cache struct {
	entries         map[eventKey]*entry
	size            int
	evicted         func(*entry)
	written, storms queue
	pending         map[windowKey]*group
	most            groups
}

func newCache(size int, evicted func(*entry)) *cache {
	return &cache{entries: map[eventKey]*entry{}, size: size, evicted: evicted, pending: map[windowKey]*group{}}
}

func (c *cache) get(key eventKey) (*entry, bool) {
	e, ok := c.entries[key]
	return e, ok
}

// add caches e, making room for it first.
func (c *cache) add(e *entry) {
	for len(c.entries) >= c.size && c.evictOne() {
	}
	c.entries[e.key] = e
	c.place(e, true)
}

// place puts e in the queue its state says; seen moves it to the back of
// its queue even when it stays in it.
func (c *cache) place(e *entry, seen bool) {
	if e.in == nil && c.entries[e.key] != e {
		return // evicted, or an end
	}
	if !seen && c.queueOf(e) == e.in {
		return
	}
	c.unlink(e) // first: a group left empty leaves the heap
	q := c.queueOf(e)
	q.push(e)
	if g, ok := c.pending[groupKey(e)]; ok && q == &g.queue {
		if g.n == 1 {
			heap.Push(&c.most, g)
		} else {
			heap.Fix(&c.most, g.at)
		}
	}
}

func groupKey(e *entry) windowKey { return windowKey{e.key.level, e.key.plugin} }

// queueOf is the queue e belongs in.
func (c *cache) queueOf(e *entry) *queue {
	switch {
	case e.inflight != 0 || e.pending() > 0 && e.dropped == 0:
		g, ok := c.pending[groupKey(e)]
		if !ok {
			g = &group{key: groupKey(e)}
			c.pending[g.key] = g
		}
		return &g.queue
	case e.stormWritten && isStorm(e.key, e.seen-e.storm):
		return &c.storms
	}
	return &c.written
}

// unlink takes e out of its queue.
func (c *cache) unlink(e *entry) {
	q := e.in
	if q == nil {
		return
	}
	q.remove(e)
	if g, ok := c.pending[groupKey(e)]; ok && q == &g.queue {
		if g.n == 0 {
			heap.Remove(&c.most, g.at)
			delete(c.pending, g.key)
		} else {
			heap.Fix(&c.most, g.at)
		}
	}
}

// evictOne evicts the entry whose loss costs the least; false when none is left.
func (c *cache) evictOne() bool {
	for {
		var e *entry
		switch {
		case c.written.front != nil:
			e = c.written.front
		case c.storms.front != nil:
			e = c.storms.front
		case len(c.most) > 0:
			e = c.most[0].front
		default:
			return false
		}
		if c.queueOf(e) != e.in { // its state changed since it was placed
			c.place(e, false)
			continue
		}
		c.unlink(e)
		delete(c.entries, e.key)
		c.evicted(e)
		return true
	}
}

// resize keeps at most size entries.
func (c *cache) resize(size int) {
	c.size = size
	for len(c.entries) > size && c.evictOne() {
	}
}

// values lists the cached entries, in no order.
func (c *cache) values() []*entry {
	out := make([]*entry, 0, len(c.entries))
	for _, e := range c.entries {
		out = append(out, e)
	}
	return out
}
