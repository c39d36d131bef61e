package k8s_event

import (
	"cmp"
	"fmt"
	"hash/maphash"
	"math"
	"net/netip"
	"slices"
	"strings"
	"time"
	"unicode/utf8"
)

// The heavy hitters of a combined event. A member of a line is the name it is about: its first
// DNS name, else its first IP address, never a port. Each combined event keeps a space-saving
// summary of its members (Metwally et al.): hitterSlots counters, each an upper bound on its
// member's lines with the error it may hold, so that any member with more than lines/hitterSlots
// of the event's lines has a counter. Its message names those members with lower-bound counts.
// Promotion is decided apart, by a promoter of each plugin and level (below): a member whose
// lines of the sliding hour are at least promoteAt, by an exact lower bound, becomes an event of
// its own, within a room of the budget that new shapes cannot spend (correlator.go), the members
// of the most lines first.

const (
	hitterSlots      = 32
	maxCountedShapes = 256 // of the lines of other shapes
	promoteAt        = 10  // lines of one member that make it an event of its own
	maxMemberLen     = 64  // bytes of a member kept, so that a summary takes at most a few KiB
	maxHitters       = 256 // bytes of a message that name hitters
)

// hitter is a counter of the summary. Counters are small, so that a line's scan reads little: the
// member's bytes are kept apart, in held.
type hitter struct {
	count, err int64 // count is an upper bound, count-err a lower bound
	from       int64 // count when the current storm began
	// recent is its lines of the half quiet before half and of half, as counted since it took its
	// slot: a lower bound of its lines within the last quiet.
	recent [2]int32
	half   int32 // two a second at most: 34 years of them
	n, at  uint8 // the member's length, and its place in held (last, so that a hitter is 40 B)
}

// tick counts a line at el (the correlator's elapsed time) in its halves of quiet, and returns its
// lines within the last quiet, at least those of the last half quiet.
func (s *hitter) tick(el, quiet time.Duration) int64 {
	if quiet < 2 {
		return 0
	}
	k := int32(el / (quiet / 2))
	switch k {
	case s.half:
	case s.half + 1:
		s.recent = [2]int32{s.recent[1], 0}
	default: // later, or a quiet of another length
		s.recent = [2]int32{}
	}
	s.half = k
	s.recent[1]++
	return int64(s.recent[0]) + int64(s.recent[1])
}

// low is a lower bound on the member's lines, or on those of the current storm only.
func (s hitter) low(storm bool) int64 {
	if storm {
		return s.count - max(s.err, s.from)
	}
	return s.count - s.err
}

type hitters struct {
	slots []hitter
	// the members, in place: a line's member is a part of the line, not kept
	held   [][maxMemberLen]byte
	hashes [hitterSlots]uint32 // of the members, with shapeSeed: their low half, scanned alone
	low    int64               // at most the least count of a slot
	next   int                 // where the search for a slot of the least count goes on
	lines  int64
	// of the lines of other shapes: the low halves of the hashes of those of the current storm, up
	// to maxCountedShapes, in an array made at the first (2^-32 a pair to take two for one)
	shapes []uint32
}

// countShape counts the shape of hash x among the other shapes of the current storm.
func (h *hitters) countShape(x uint64) {
	if h.shapes == nil {
		h.shapes = make([]uint32, 0, maxCountedShapes)
	}
	if len(h.shapes) < maxCountedShapes && !slices.Contains(h.shapes, uint32(x)) {
		h.shapes = append(h.shapes, uint32(x))
	}
}

// add counts a line of member at el, the correlator's elapsed time, and tells whether member is
// now among the top (see top), with its lines within the last quiet.
func (h *hitters) add(member string, el, quiet time.Duration) (bool, int64) {
	member = cutMember(member)
	return h.count(member, foldHash(member), el, quiet)
}

// count is add of a member cut already, whose foldHash is x.
func (h *hitters) count(member string, x uint64, el, quiet time.Duration) (bool, int64) {
	h.lines++
	if member == "" {
		return false, 0
	}
	i := -1
	for j, y := range h.hashes[:len(h.slots)] {
		if s := h.slots[j]; y == uint32(x) && foldEq(h.held[s.at][:s.n], member) {
			i = j
			break
		}
	}
	if i < 0 { // a new slot, or the least one taken over: its count is the new one's error
		var c int64
		if i = len(h.slots); i < hitterSlots {
			h.slots, h.held = append(h.slots, hitter{}), append(h.held, [maxMemberLen]byte{})
		} else {
			i = h.least()
			c = h.slots[i].count
		}
		h.hashes[i] = uint32(x)
		h.slots[i] = hitter{n: uint8(copy(h.held[i][:], member)), at: uint8(i), count: c, err: c}
	}
	h.slots[i].count++
	return h.isTop(h.slots[i], false), h.slots[i].tick(el, quiet)
}

// least is a slot of the least count. Counts only grow, each line by one: the least count found
// last is a lower bound, and the search goes on from the slot where it ended.
func (h *hitters) least() int {
	for {
		for k := range hitterSlots {
			if j := (h.next + k) % hitterSlots; h.slots[j].count <= h.low {
				h.next = j
				return j
			}
		}
		h.low = slices.MinFunc(h.slots,
			func(a, b hitter) int { return cmp.Compare(a.count, b.count) }).count
	}
}

// member is the member that s counts.
func (h *hitters) member(s hitter) string { return string(h.held[s.at][:s.n]) }

// isTop: more than lines/hitterSlots, and two lines or more (of the current storm).
func (h *hitters) isTop(s hitter, storm bool) bool {
	return s.count*hitterSlots > h.lines && s.low(storm) >= 2
}

// newStorm starts the count of the current storm's lines afresh.
func (h *hitters) newStorm() {
	h.shapes = h.shapes[:0]
	for i := range h.slots {
		h.slots[i].from = h.slots[i].count
	}
}

// top lists the members that are isTop, most first.
func (h *hitters) top(storm bool) []hitter {
	out := slices.DeleteFunc(slices.Clone(h.slots),
		func(s hitter) bool { return !h.isTop(s, storm) })
	slices.SortFunc(out, func(a, b hitter) int { return int(b.count - a.count) })
	return out
}

// names are the top members (of the current storm) with their lower bounds, within maxHitters
// bytes: "most: a.example.org. ≥12, 10.0.0.1 ≥5"; empty when none.
func (h *hitters) names(storm bool) string {
	var b strings.Builder
	for _, s := range h.top(storm) {
		sep := "most: "
		if b.Len() > 0 {
			sep = ", "
		}
		item := fmt.Sprintf("%s%s ≥%d", sep, h.member(s), s.low(storm))
		if b.Len()+len(item) > maxHitters {
			break
		}
		b.WriteString(item)
	}
	return b.String()
}

// member is what a line is about: its first DNS name, else its first IP address without its port;
// empty if neither. At most maxMemberLen bytes, a part of the line.
func (f *found) member() string {
	return cutMember(f.whole())
}

// whole is the member uncut: members are counted by its hash, so that names cut alike stay apart.
func (f *found) whole() string {
	if f.name == "" && f.ip != "" {
		return hostOf(f.ip)
	}
	return f.name
}

// foldHash is the hash with shapeSeed of s with its ASCII capitals in lower case: DNS names are
// compared so (RFC 4343). Without a copy when s has no capital, as names mostly have none; else
// folded through a buffer on the stack.
func foldHash(s string) uint64 {
	i := 0
	for i < len(s) && (s[i] < 'A' || s[i] > 'Z') {
		i++
	}
	if i == len(s) {
		return maphash.String(shapeSeed, s)
	}
	var h maphash.Hash
	h.SetSeed(shapeSeed)
	h.WriteString(s[:i])
	var buf [maxMemberLen]byte
	for s = s[i:]; s != ""; s = s[min(len(s), len(buf)):] {
		n := copy(buf[:], s)
		for j, c := range buf[:n] {
			if c >= 'A' && c <= 'Z' {
				buf[j] = c + 'a' - 'A'
			}
		}
		h.Write(buf[:n])
	}
	return h.Sum64()
}

// foldEq tells whether b and s are equal, ASCII capitals and small letters alike.
func foldEq(b []byte, s string) bool {
	if len(b) != len(s) {
		return false
	}
	for i := range b {
		x, y := b[i], s[i]
		if x == y {
			continue
		}
		if x|0x20 != y|0x20 || x|0x20 < 'a' || x|0x20 > 'z' {
			return false
		}
	}
	return true
}

// hostOf is the IP address of a word, its port cut; empty if none.
func hostOf(w string) string {
	if a, err := netip.ParseAddr(w); err == nil {
		return a.String()
	}
	if ap, err := netip.ParseAddrPort(w); err == nil {
		return ap.Addr().String()
	}
	return ""
}

// cutMember keeps at most maxMemberLen bytes of m, whole runes only.
func cutMember(m string) string {
	if len(m) <= maxMemberLen {
		return m
	}
	i := maxMemberLen
	for i > 0 && !utf8.RuneStart(m[i]) {
		i--
	}
	return m[:i]
}

// The promoter of a plugin and level decides which members become events of their own. It is a
// space-saving summary of promoterSlots members over a sliding hour: each counter keeps its lines
// by quarter of budgetWindow (the last four and the one under way), those it counted itself apart
// from those it took over with its slot, so that a quarter's lines leave when it does, and the
// lines it counted itself are an exact lower bound on its member's lines within the last hour and
// a quarter. A member is promoted once that bound reaches promoteAt: a name of fewer lines never
// is, whatever the noise. Space-saving keeps a counter for every member with more than
// 1/promoterSlots of the lines of the window, so under noise of N lines in the window a member
// with promoteAt + N/promoterSlots lines is promoted; with no noise, promoteAt lines in any hour.
// A place of the room goes to the member of the most lines not promoted yet (elect): a client's
// names just over promoteAt cannot take it from a host of more lines.

const (
	promoterSlots = 256
	promoterGens  = 5 // quarters of budgetWindow: the last four, and the one under way
	promoterGen   = budgetWindow / (promoterGens - 1)
	maxPromoters  = 16 // plugins and levels with lines past their events of their own
)

// counter is a member's lines of each quarter (its slot's index is the quarter modulo
// promoterGens): own counted for it, taken over from the member it replaced.
type counter struct {
	own, taken [promoterGens]uint32
	n          uint8
	// state is notElected, elected (its place is spent: its event comes at its next line) or
	// promoted
	state  uint8
	member [maxMemberLen]byte
}

// The states of a counter's member.
const (
	notElected = iota
	elected
	promoted
)

func (c *counter) total() (sum uint32) {
	for g := range promoterGens {
		sum += c.own[g] + c.taken[g]
	}
	return sum
}

// low is the exact lower bound of the counter's member's lines within the window.
func (c *counter) low() (sum int64) {
	for _, n := range c.own {
		sum += int64(n)
	}
	return sum
}

type promoter struct {
	owner  *window       // the budget it belongs to, which points back to it
	used   time.Duration // the latest line
	gen    int64         // the quarter under way
	slots  []counter
	index  [promoterIndex]int16 // open addressing by a member's hash: its slot + 1, 0 when free
	least  uint32               // at most the least total of a slot
	next   int                  // where the search for a slot of the least total goes on
	hashes []uint64             // of each slot's member
	last   int                  // the slot of the latest line, -1 when it has none
}

// promoterIndex is the size of a promoter's index: a quarter full at most, so a probe is short.
const promoterIndex = 4 * promoterSlots

func newPromoter() *promoter {
	return &promoter{
		slots:  make([]counter, 0, promoterSlots),
		hashes: make([]uint64, 0, promoterSlots),
	}
}

// find is the place in the index of the slot of hash x, or the free place where it would go.
func (p *promoter) find(x uint64) int {
	k := int(x % promoterIndex)
	for p.index[k] != 0 && p.hashes[p.index[k]-1] != x {
		k = (k + 1) % promoterIndex
	}
	return k
}

// forget takes the place k out of the index, moving back the places after it that probed past it.
func (p *promoter) forget(k int) {
	p.index[k] = 0
	for j := (k + 1) % promoterIndex; p.index[j] != 0; j = (j + 1) % promoterIndex {
		home := int(p.hashes[p.index[j]-1] % promoterIndex)
		// j's entry stays unless k lies cyclically within [home, j).
		if (j > k && (home <= k || home > j)) || (j < k && home <= k && home > j) {
			p.index[k], p.index[j] = p.index[j], 0
			k = j
		}
	}
}

// add counts a line of member, whose uncut text's foldHash is x, at at (the correlator's elapsed
// time) and returns the exact lower bound of member's lines within the window.
func (p *promoter) add(member string, x uint64, at time.Duration) int64 {
	p.used = at
	p.advance(int64(at / promoterGen))
	g := p.gen % promoterGens
	k := p.find(x)
	p.last = -1
	if p.index[k] != 0 {
		c := &p.slots[p.index[k]-1]
		if !c.memberIs(member) { // another member of the same hash keeps its slot
			return 0
		}
		c.own[g]++
		p.last = int(p.index[k] - 1)
		return c.low()
	}
	var i int
	if len(p.slots) < promoterSlots {
		i = len(p.slots)
		p.slots, p.hashes = append(p.slots, counter{}), append(p.hashes, 0)
	} else {
		i = p.leastSlot()
		p.forget(p.find(p.hashes[i]))
		k = p.find(x) // the places moved
	}
	c := &p.slots[i]
	for k := range promoterGens { // the lines of the member it replaces, each in its quarter
		c.taken[k] += c.own[k]
		c.own[k] = 0
	}
	c.n = uint8(copy(c.member[:], member))
	c.own[g], c.state, p.last = 1, notElected, i
	p.index[k], p.hashes[i] = int16(i+1), x
	return 1
}

// elect is the slot of the member of the most lines of the window, at least promoteAt, neither
// elected nor promoted; of as many, last (the slot of the line being counted) first; -1 if none.
// It is looked for only when a place of the room is free, at most maxPromoted times an hour.
func (p *promoter) elect() int {
	best, most := -1, int64(promoteAt-1)
	for i := range p.slots {
		c := &p.slots[i]
		if c.state != notElected {
			continue
		}
		if n := c.low(); n > most || n == most && i == p.last {
			best, most = i, n
		}
	}
	return best
}

func (c *counter) memberIs(m string) bool { return foldEq(c.member[:c.n], m) }

// advance makes gen the quarter under way: the quarters that left the window are forgotten.
func (p *promoter) advance(gen int64) {
	if gen <= p.gen {
		return
	}
	for k := p.gen + 1; k <= gen && k <= p.gen+promoterGens; k++ {
		for i := range p.slots {
			p.slots[i].own[k%promoterGens], p.slots[i].taken[k%promoterGens] = 0, 0
		}
	}
	p.gen, p.least = gen, 0
}

// leastSlot is a slot of the least total. Within a quarter totals only grow: the least found
// last is a lower bound, and the search goes on from the slot where it ended.
func (p *promoter) leastSlot() int {
	n := len(p.slots)
	for {
		low := uint32(math.MaxUint32)
		j := p.next % n
		for range n {
			i := j
			j++
			if j == n { // around, without a division a slot
				j = 0
			}
			t := p.slots[i].total()
			if t <= p.least {
				p.next = j
				return i
			}
			low = min(low, t)
		}
		p.least = low
	}
}

// reset empties the promoter for another plugin and level.
func (p *promoter) reset() {
	p.index = [promoterIndex]int16{}
	p.slots, p.hashes, p.least, p.next, p.gen = p.slots[:0], p.hashes[:0], 0, 0, 0
	p.last = -1
}
