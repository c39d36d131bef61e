package k8s_event

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"unicode/utf8"
)

// The heavy hitters of a combined event. A member of a line is the name it is about: its first
// DNS name, else its first IP address, never a port. Each combined event keeps a space-saving
// summary of its members (Metwally et al.): hitterSlots counters, each an upper bound on its
// member's lines with the error it may hold, so that any member with more than lines/hitterSlots
// of the event's lines has a counter. Its message names those members with lower-bound counts;
// a member of promoteAt lines becomes an event of its own, within the budget (correlator.go).

const (
	hitterSlots  = 32
	promoteAt    = 10  // lines of one member that make it an event of its own
	maxMemberLen = 64  // bytes of a member kept, so that a summary takes at most a few KiB
	maxHitters   = 256 // bytes of a message that name hitters
)

type hitter struct {
	member     string
	count, err int64 // count is an upper bound, count-err a lower bound
}

// hitters is the summary of the members of a combined event.
type hitters struct {
	slots []hitter
	lines int64
}

// add counts a line of member and tells whether member is now among the
// top (see top).
func (h *hitters) add(member string) bool {
	h.lines++
	if member == "" {
		return false
	}
	least := -1
	for i := range h.slots {
		s := &h.slots[i]
		if s.member == member {
			s.count++
			return h.isTop(*s)
		}
		if least < 0 || s.count < h.slots[least].count {
			least = i
		}
	}
	if len(h.slots) < hitterSlots {
		h.slots = append(h.slots, hitter{member: member, count: 1})
		return h.isTop(h.slots[len(h.slots)-1])
	}
	s := &h.slots[least]
	*s = hitter{member: member, count: s.count + 1, err: s.count}
	return h.isTop(*s)
}

// isTop: more than lines/hitterSlots, and two lines or more.
func (h *hitters) isTop(s hitter) bool { return s.count*hitterSlots > h.lines && s.count-s.err >= 2 }

// lowerBound is the least number of lines member may have had.
func (h *hitters) lowerBound(member string) int64 {
	for _, s := range h.slots {
		if s.member == member {
			return s.count - s.err
		}
	}
	return 0
}

// top lists the members above lines/hitterSlots with two lines or more,
// most first.
func (h *hitters) top() []hitter {
	var out []hitter
	for _, s := range h.slots {
		if h.isTop(s) {
			out = append(out, s)
		}
	}
	slices.SortFunc(out, func(a, b hitter) int { return int(b.count - a.count) })
	return out
}

// String names the top members with their lower bounds, within
// maxHitters bytes: "most: a.example.org. ≥12, 10.0.0.1 ≥5"; empty when none.
func (h *hitters) String() string {
	var b strings.Builder
	for _, s := range h.top() {
		sep := "most: "
		if b.Len() > 0 {
			sep = ", "
		}
		item := fmt.Sprintf("%s%s ≥%d", sep, s.member, s.count-s.err)
		if b.Len()+len(item) > maxHitters {
			break
		}
		b.WriteString(item)
	}
	return b.String()
}

// member is what a line is about: its first DNS name, else its first IP
// address without its port; empty if neither. At most maxMemberLen bytes.
func member(msg string) string {
	ip := ""
	for w := range strings.FieldsSeq(msg) {
		for part := range strings.SplitSeq(w, "->") {
			part = strings.TrimRightFunc(strings.TrimLeft(part, "({\"'<"), func(r rune) bool { return r < utf8.RuneSelf && closing[r] })
			switch {
			case isName(part):
				return cutMember(part)
			case ip == "":
				ip = hostOf(part)
			}
		}
	}
	return ip
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
	return strings.Clone(strings.ToValidUTF8(m[:min(len(m), maxMemberLen)], "")) // not the line
}
