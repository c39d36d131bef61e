package k8s_event

import (
	"cmp"
	"fmt"
	"hash/maphash"
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
// of the event's lines has a counter. Its message names those members with lower-bound counts;
// a member of promoteAt lines becomes an event of its own, within the budget (correlator.go).

const (
	hitterSlots      = 32
	maxCountedShapes = 256 // of the lines of other shapes
	promoteAt        = 10  // lines of one member that make it an event of its own
	maxMemberLen     = 64  // bytes of a member kept, so that a summary takes at most a few KiB
	maxHitters       = 256 // bytes of a message that name hitters
	// sketchWidth is the counters of each of the two rows of a count-min sketch (Cormode and
	// Muthukrishnan): a member counts in one counter of each row, so the lesser is an upper bound
	// on its lines that churn of other members barely moves, unlike a counter of the summary.
	sketchWidth = 256
)

// hitter is a counter of the summary. Counters are small, so that a line's scan reads little: the
// member's bytes are kept apart, in held.
type hitter struct {
	n, at      uint8 // the member's length, and its place in held
	count, err int64 // count is an upper bound, count-err a lower bound
	from       int64 // count when the current storm began
}

// low is a lower bound on the member's lines, or on those of the current storm only.
func (s hitter) low(storm bool) int64 {
	if storm {
		return s.count - max(s.err, s.from)
	}
	return s.count - s.err
}

type hitters struct {
	slots  []hitter
	held   [][maxMemberLen]byte // the members, in place: a line's member is a part of the line, not kept
	hashes [hitterSlots]uint32  // of the members, with shapeSeed: their low half, scanned alone
	low    int64                // at most the least count of a slot
	next   int                  // where the search for a slot of the least count goes on
	lines  int64
	sketch [2][sketchWidth]uint8 // the lines of budgetWindow from since, at most 255
	since  time.Time
	shapes []uint64 // of the lines of other shapes: those of the current storm, up to maxCountedShapes
}

// add counts a line of member at at and tells whether member is now among the top (see top).
func (h *hitters) add(member string, at time.Time) bool {
	h.lines++
	if member == "" {
		return false
	}
	member = cutMember(member)
	if at.Sub(h.since) >= budgetWindow {
		h.sketch, h.since = [2][sketchWidth]uint8{}, at
	}
	x := maphash.String(shapeSeed, member) // its counters: a byte of it for each row
	for r, i := range [2]uint8{uint8(x), uint8(x >> 8)} {
		if h.sketch[r][i] < 255 { // far above promoteAt
			h.sketch[r][i]++
		}
	}
	i := -1
	for j, y := range h.hashes[:len(h.slots)] {
		if y == uint32(x) && h.member(h.slots[j]) == member {
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
	return h.isTop(h.slots[i], false)
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
		h.low = slices.MinFunc(h.slots, func(a, b hitter) int { return cmp.Compare(a.count, b.count) }).count
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

// upperBound is the most lines member may have had within budgetWindow: never below its lines, so
// that no member of promoteAt lines is missed however many others churn.
func (h *hitters) upperBound(member string) int64 {
	x := maphash.String(shapeSeed, member)
	return int64(min(h.sketch[0][uint8(x)], h.sketch[1][uint8(x>>8)]))
}

// top lists the members that are isTop, most first.
func (h *hitters) top(storm bool) []hitter {
	out := slices.DeleteFunc(slices.Clone(h.slots), func(s hitter) bool { return !h.isTop(s, storm) })
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
	if f.name == "" && f.ip != "" {
		return cutMember(hostOf(f.ip))
	}
	return cutMember(f.name)
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
