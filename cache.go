package k8s_event

import (
	"cmp"
	"container/heap"
	"container/list"
	"maps"
	"slices"
)

// The cache of entries, of at most CACHESIZE. When it is full, the entry that leaves is the one
// whose loss costs the least information: a fully written event that is no storm, least recently
// seen first; then a storm waiting for its end, least recently seen first; then, among the
// entries with lines to write, one of the plugin and level with the most of them, least recently
// seen first. So noise that fills the cache evicts its own lines, never another plugin's first
// line. A choice costs O(1), and O(log n) in the plugins and levels with lines to write when a
// line's entry changes group. The scheduler's evicted accounts for the lines of what leaves.

// links are an entry's place in one queue of the cache: a list, least recently placed first.
type links struct {
	elem *list.Element
	in   *list.List
}

// group is the queue of the entries of one plugin and level with lines to write.
type group struct {
	list.List
	key windowKey
	at  int // its index in the heap
}

// groups is a heap of groups, the one with the most entries first.
type groups []*group

func (h groups) Len() int           { return len(h) }
func (h groups) Less(i, j int) bool { return h[i].Len() > h[j].Len() }
func (h groups) Swap(i, j int)      { h[i], h[j] = h[j], h[i]; h[i].at, h[j].at = i, j }
func (h *groups) Push(x any)        { g := x.(*group); g.at = len(*h); *h = append(*h, g) }
func (h *groups) Pop() any {
	g := (*h)[len(*h)-1]
	*h = (*h)[:len(*h)-1]
	return g
}

type cache struct {
	entries         map[eventKey]*entry
	size            int
	evicted         func(*entry)
	members         int // entries of one member's lines
	written, storms list.List
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
	if e.key.member != "" {
		c.members++
	}
	c.place(e, true)
}

// place puts e in the queue its state says; seen moves it to the back even when it stays in it.
func (c *cache) place(e *entry, seen bool) {
	if e.in == nil && c.entries[e.key] != e {
		return // evicted, or an end
	}
	if c.queueOf(e) == e.in {
		if seen {
			e.in.MoveToBack(e.elem) // its group keeps its size: the heap stays
		}
		return
	}
	c.unlink(e) // first: a group left empty leaves the heap
	q := c.queueOf(e)
	e.elem, e.in = q.PushBack(e), q
	if g, ok := c.pending[groupKey(e)]; ok && q == &g.List {
		if g.Len() == 1 {
			heap.Push(&c.most, g)
		} else {
			heap.Fix(&c.most, g.at)
		}
	}
}

func groupKey(e *entry) windowKey { return windowKey{e.key.level, e.key.plugin} }

func (c *cache) queueOf(e *entry) *list.List {
	switch {
	case e.inflight != 0 || e.pending() > 0 && e.dropped == 0:
		if e.in != nil && e.in != &c.written && e.in != &c.storms {
			return e.in // its group: an entry's plugin and level never change
		}
		g, ok := c.pending[groupKey(e)]
		if !ok {
			g = &group{key: groupKey(e)}
			c.pending[g.key] = g
		}
		return &g.List
	case e.stormWritten && isStorm(e.key, e.seen-e.storm):
		return &c.storms
	}
	return &c.written
}

func (c *cache) unlink(e *entry) {
	q := e.in
	if q == nil {
		return
	}
	q.Remove(e.elem)
	e.elem, e.in = nil, nil
	if g, ok := c.pending[groupKey(e)]; ok && q == &g.List {
		if g.Len() == 0 {
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
		front := cmp.Or(c.written.Front(), c.storms.Front())
		if front == nil && len(c.most) > 0 {
			front = c.most[0].Front()
		}
		if front == nil {
			return false
		}
		e := front.Value.(*entry)
		if c.queueOf(e) != e.in { // its state changed since it was placed
			c.place(e, false)
			continue
		}
		c.unlink(e)
		delete(c.entries, e.key)
		if e.key.member != "" {
			c.members--
		}
		c.evicted(e)
		return true
	}
}

func (c *cache) resize(size int) {
	c.size = size
	for len(c.entries) > size && c.evictOne() {
	}
}

// values lists the cached entries, in no order.
func (c *cache) values() []*entry { return slices.Collect(maps.Values(c.entries)) }
