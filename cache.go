package k8s_event

import (
	"cmp"
	"container/heap"
	"container/list"
	"hash/maphash"
	"maps"
	"slices"
	"strings"
)

// The cache of entries, of at most CACHESIZE. When it is full, the entry that leaves is the one
// whose loss costs the least information: a fully written event that is no storm, least recently
// seen first; then a storm waiting for its end, least recently seen first; then, among the
// entries with lines to write, one of the plugin and level with the most of them, within it of
// the shape with the most, within that of the member with the most, least recently seen first.
// So noise that fills the cache evicts its own lines, never another plugin's first line, and
// within a plugin a client's names of one shape evict their own, never a host's line of another
// shape or member. A choice costs O(1), and O(log n) in the groups when a line's entry changes
// group. The scheduler's evicted accounts for the lines of what leaves.

// links are an entry's place in one queue of the cache: a list, least recently placed first.
type links struct {
	elem  *list.Element
	in    *list.List
	group *group // of in, when in is a member's group
}

// pendingKey is a group of entries with lines to write: a plugin and level (depth 1), a shape of
// it (depth 2), or a member of that shape (depth 3).
type pendingKey struct {
	windowKey
	depth  uint8
	shape  uint64
	member string
}

// group is the entries with lines to write of a pendingKey: its list holds them at depth 3; above,
// its kids are the groups beneath it, the one with the most entries first.
type group struct {
	list.List
	key    pendingKey
	n      int    // entries beneath it
	seen   uint64 // when an entry beneath it was placed or seen last
	at     int    // its index in its parent's kids, or in the cache's most
	parent *group
	kids   groups
}

// groups is a heap of groups, the one with the most entries first.
type groups []*group

func (h groups) Len() int           { return len(h) }
func (h groups) Less(i, j int) bool { return h[i].n > h[j].n }

// first is, of the groups with the most entries, the one with the fewest lines to write in the
// entry it would evict (members: a host's event of many lines outlives a client's fresh names),
// then seen least recently: it looks only at those, which the heap keeps at its top.
func (h groups) first() *group {
	best, stack := h[0], []int{0}
	for len(stack) > 0 {
		i := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if i >= len(h) || h[i].n != h[0].n {
			continue
		}
		if l, b := h[i].lines(), best.lines(); l < b || l == b && h[i].seen < best.seen {
			best = h[i]
		}
		stack = append(stack, 2*i+1, 2*i+2)
	}
	return best
}

// lines is the lines to write of the entry a member's group would evict first; 0 above members.
func (g *group) lines() int64 {
	if front := g.Front(); front != nil {
		return front.Value.(*entry).pending()
	}
	return 0
}

func (h groups) Swap(i, j int) { h[i], h[j] = h[j], h[i]; h[i].at, h[j].at = i, j }
func (h *groups) Push(x any)   { g := x.(*group); g.at = len(*h); *h = append(*h, g) }
func (h *groups) Pop() any {
	n := len(*h) - 1
	g := (*h)[n]
	(*h)[n] = nil // a group gone must not be kept, nor the line its member is a part of
	*h = (*h)[:n]
	return g
}

type cache struct {
	entries map[eventKey]*entry
	// found is the entry get found last, nil once it left: a storm's lines find their combined
	// event without hashing its key.
	found           *entry
	size            int
	evicted         func(*entry)
	members         int // entries of one member's lines
	written, storms list.List
	pending         map[pendingKey]*group
	most            groups // the plugins and levels
	clock           uint64 // of the groups' seen
	shaped          []byte // room for the shape of an event of its own line
	// others is how many entries outside the cache share its size: the settling entries and the
	// ends waiting (none when nil); giveWay frees one of them when the cache has nothing left to
	// evict, false when it cannot.
	others  func() int
	giveWay func() bool
	// byMember are the entries of one member's lines by the hash of its whole name: names cut
	// alike to the same key.member stay apart, and a name is one member in any case of its letters.
	byMember map[memberID]*entry
}

func newCache(size int, evicted func(*entry)) *cache {
	return &cache{entries: map[eventKey]*entry{}, size: size, evicted: evicted,
		pending: map[pendingKey]*group{}, byMember: map[memberID]*entry{}}
}

// memberID is the event of one member's lines: its whole name's foldHash within its combined
// event's key.
type memberID struct {
	level  level
	plugin string
	shape  uint64
	whole  uint64
}

func (e *entry) memberID() memberID {
	return memberID{e.key.level, e.key.plugin, e.key.shape, e.whole}
}

func (c *cache) get(key eventKey) (*entry, bool) {
	if f := c.found; f != nil && f.key.shape == key.shape && f.key.level == key.level &&
		len(f.key.message) == len(key.message) && f.key == key { // the cheapest fields first
		return f, true
	}
	e, ok := c.entries[key]
	if ok {
		c.found = e
	}
	return e, ok
}

// add caches e, making room for it first.
func (c *cache) add(e *entry) {
	c.makeRoom()
	c.entries[e.key] = e
	if e.key.member != "" {
		c.members++
		c.byMember[e.memberID()] = e
	}
	c.place(e, true)
}

// place puts e in the queue its state says; seen moves it to the back even when it stays in it.
func (c *cache) place(e *entry, seen bool) {
	if e.in == nil && c.entries[e.key] != e {
		return // evicted
	}
	pending := c.isPending(e)
	if pending && e.group != nil || !pending && c.queueOf(e) == e.in {
		if seen {
			e.in.MoveToBack(e.elem) // its groups keep their sizes: the heaps stay
			c.clock++
			for g := e.group; g != nil; g = g.parent {
				g.seen = c.clock
			}
		}
		return
	}
	c.unlink(e)
	if !pending {
		q := c.queueOf(e)
		e.elem, e.in = q.PushBack(e), q
		return
	}
	g := c.leaf(e)
	e.elem, e.in, e.group = g.PushBack(e), &g.List, g
	c.clock++
	for ; g != nil; g = g.parent {
		g.n++
		g.seen = c.clock
		h := &c.most
		if g.parent != nil {
			h = &g.parent.kids
		}
		if g.n == 1 {
			heap.Push(h, g)
		} else {
			heap.Fix(h, g.at)
		}
	}
}

// leaf is the group of e's member within its shape, made with those above it if need be.
func (c *cache) leaf(e *entry) *group {
	wk := windowKey{e.key.level, e.key.plugin}
	shape, member := e.key.shape, e.key.member
	if !e.key.combined() { // an event of its own line: the shape and member of the line
		var f found
		c.shaped = appendShape(c.shaped[:0], strings.TrimPrefix(e.key.message, e.key.plugin), &f)
		shape, member = maphash.Bytes(shapeSeed, c.shaped), f.member()
	}
	var parent *group
	for _, k := range [...]pendingKey{{wk, 1, 0, ""}, {wk, 2, shape, ""}, {wk, 3, shape, member}} {
		g, ok := c.pending[k]
		if !ok {
			g = &group{key: k, parent: parent}
			c.pending[k] = g
		}
		parent = g
	}
	return parent
}

// isPending: e has lines to write, or a write in flight.
func (c *cache) isPending(e *entry) bool {
	return e.inflight != 0 || e.pending() > 0 && e.dropped == 0
}

func (c *cache) queueOf(e *entry) *list.List {
	switch {
	case c.isPending(e):
		if e.group != nil {
			return e.in
		}
		return nil
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
	g := e.group
	e.elem, e.in, e.group = nil, nil, nil
	for ; g != nil; g = g.parent {
		g.n--
		h := &c.most
		if g.parent != nil {
			h = &g.parent.kids
		}
		if g.n == 0 {
			heap.Remove(h, g.at)
			delete(c.pending, g.key)
		} else {
			heap.Fix(h, g.at)
		}
	}
}

// evictOne evicts the entry whose loss costs the least; false when none is left.
func (c *cache) evictOne() bool { return c.evict(true) }

// evictWritten evicts a written event, else a storm waiting for its end: none with a line to
// write; false when none is left.
func (c *cache) evictWritten() bool { return c.evict(false) }

func (c *cache) evict(pending bool) bool {
	for {
		front := cmp.Or(c.written.Front(), c.storms.Front())
		if front == nil && pending && len(c.most) > 0 {
			g := c.most.first()
			for len(g.kids) > 0 {
				g = g.kids.first()
			}
			front = g.Front()
		}
		if front == nil {
			return false
		}
		e := front.Value.(*entry)
		if c.isPending(e) != (e.group != nil) || !c.isPending(e) && c.queueOf(e) != e.in {
			// its state changed since it was placed
			c.place(e, false)
			continue
		}
		c.unlink(e)
		delete(c.entries, e.key)
		if c.found == e {
			c.found = nil
		}
		if e.key.member != "" {
			c.members--
			if c.byMember[e.memberID()] == e {
				delete(c.byMember, e.memberID())
			}
		}
		c.evicted(e)
		return true
	}
}

func (c *cache) resize(size int) {
	c.size = size
	for c.units() > size && c.free() {
	}
}

// makeRoom frees a unit of the size for one more entry, cached or not, if none is free.
func (c *cache) makeRoom() {
	for c.units() >= c.size && c.free() {
	}
}

// units is the cached entries and those outside the cache that share its size.
func (c *cache) units() int {
	n := len(c.entries)
	if c.others != nil {
		n += c.others()
	}
	return n
}

// free evicts an entry, or when none is cached, has one outside give way; false if none can.
// An evicted entry that settles keeps its unit: the caller looks again.
func (c *cache) free() bool {
	return c.evictOne() || c.giveWay != nil && c.giveWay()
}

// values lists the cached entries, in no order.
func (c *cache) values() []*entry { return slices.Collect(maps.Values(c.entries)) }
