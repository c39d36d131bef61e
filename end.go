package k8s_event

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// The end of a storm. A storm's entry (isStorm) whose lines are all written is watched by the
// scheduler until its last quiet held fewer than max(2, 1 % of its peak) lines and none of its
// top members (flow), or at the latest until it had no new line for quiet; then the scheduler
// decides the end: a stormEnd joins the ends to write. Later lines count on the same object; the
// next end comes once the storm rose above its threshold again. Nothing of this runs on the DNS
// path.
//
// An end carries no lines: it has no tally, so it never enters the accounting of lines. It is
// written once, from its own bucket, endBucket; a create that got no answer is retried under the
// same name, as the creates of lines are.

// stormEnd is the end of a storm, an event of its own: it waits and is written as a job
// (scheduler.go) of endBucket, apart from the entry of its storm, which goes on with its lines.
type stormEnd struct {
	job               // its storm's key, the state of its create, its place in the queues
	message string    // what it says
	at      time.Time // when the end was decided: the event's time
}

const (
	endBucket  = numLevels // the bucket of end events, after the levels'
	numBuckets = numLevels + 1
)

const (
	// handOffGrace is how long after its quiet a storm's end waits for a
	// line logged before then that is still on its way to the scheduler:
	// far more than the microseconds that takes, short against any quiet.
	handOffGrace = 250 * time.Millisecond
	// handOffWait is how often an end looks again while lines wait in the hand-off queue.
	handOffWait = 10 * time.Millisecond
)

// quietAt is when the storm of e, all written, may be said to have ended: once the last quiet held
// fewer than its threshold of lines and none of its top members, and at the latest quiet after its
// last line; false when e is no storm waiting for its quiet, or one that has not risen above its
// threshold since its latest end.
func quietAt(e *entry, quiet time.Duration) (time.Time, bool) {
	if quiet <= 0 || e.evicted || e.inflight != 0 || e.pending() > 0 || e.dropped > 0 ||
		!e.stormWritten || !isStorm(e.key, e.seen-e.storm) {
		return time.Time{}, false
	}
	at := e.last.Add(quiet)
	if p := e.flow; p != nil && p.rest { // whatever quiet was when it ended
		return time.Time{}, false
	}
	if p := e.flow; p != nil && p.width == int64(quiet/flowSlots) {
		if p.armed { // on e.last's monotonic reading, as the scheduler's clock
			calm := e.last.Add(time.Duration(p.calmAt() - p.latest))
			calm = slices.MaxFunc([]time.Time{calm, p.topLast.Add(quiet)}, time.Time.Compare)
			at = slices.MinFunc([]time.Time{at, calm}, time.Time.Compare)
		}
	}
	if p := e.flow; p != nil && p.ends != nil {
		at = p.ends.roomAt(at)
	}
	return at.Add(handOffGrace), true
}

// maxEnds is the ends of one plugin and level's storms in any budgetWindow, beside its budget of
// events: a client whose storms rise and fall cannot flood ends, nor hold back another plugin's.
const maxEnds = 10

// endBudget is the times of the latest ends of a plugin and level, on the scheduler's clock.
type endBudget struct {
	made [maxEnds]time.Time
	next int
}

// roomAt is the first time from at when an end is within the budget.
func (b *endBudget) roomAt(at time.Time) time.Time {
	oldest := b.made[b.next]
	if oldest.IsZero() || !at.Before(oldest.Add(budgetWindow)) {
		return at
	}
	return oldest.Add(budgetWindow)
}

func (b *endBudget) spend(at time.Time) {
	b.made[b.next] = at
	b.next = (b.next + 1) % maxEnds
}

// endOf makes the end of e's storm, decided at now.
func endOf(e *entry, now time.Time) *stormEnd {
	about, top, shapes := e.message, "", 0
	if e.key.combined() { // its shape, not a line of one of its members
		about = lineShape(strings.TrimPrefix(e.message, e.key.plugin))
		top, shapes = e.hitters.names(true), len(e.hitters.shapes)
		e.hitters.newStorm()
	}
	if top == "" && e.key.member != "" { // a member's event names it, else its end is its shape's
		top = fmt.Sprintf("%s ≥%d", e.key.member, e.seen-e.storm)
	}
	from := e.first
	if e.flow != nil && e.flow.ends != nil {
		e.flow.ends.spend(now)
	}
	if e.flow != nil && !e.flow.from.IsZero() {
		from = e.flow.from
		e.flow.rest, e.flow.armed, e.flow.from = true, false, time.Time{}
	}
	end := &stormEnd{
		job:     job{key: e.key},
		message: endMessage(e.key.plugin, about, top, shapes, e.seen-e.storm, from, e.stamped),
		at:      now,
	}
	end.end = end
	e.storm, e.stormWritten = e.seen, false
	return end
}

// flowSlots is the number of slots a quiet is counted in.
const flowSlots = 8

// flow counts an event's lines in slots of quiet/flowSlots, so that the scheduler knows, within a
// slot, how many lines the last quiet held. Slots are of the correlator's elapsed time, on the
// monotonic clock: a step of the wall clock is no time that passed.
type flow struct {
	width   int64 // of a slot, in nanoseconds
	slots   [flowSlots]int64
	at      int64      // the slot of the latest line
	latest  int64      // the latest line, in elapsed nanoseconds
	ends    *endBudget // of its plugin and level
	peak    int64      // the most lines a quiet held
	armed   bool       // above its threshold since its latest end
	rest    bool       // ended, and not above its threshold since
	from    time.Time
	topLast time.Time // the latest line of a top member
	// counted is the first slot from which quiet changed: the quiets that end before a quiet past
	// it held lines uncounted, and are no calm.
	counted int64
}

// add counts a line at at, el on the correlator's elapsed time; top: of one of the event's top
// members, with more lines of its own in the last quiet than the threshold.
func (p *flow) add(at time.Time, el, quiet time.Duration, top bool) {
	w := int64(quiet / flowSlots)
	n := int64(el) / max(w, 1)
	if p.width != w { // new, or quiet changed: counted afresh, from its peak; the lines of the
		counted, carried := int64(0), int64(0) // last quiet count as of now, unless it ended since
		if p.width != 0 {
			counted = n
		}
		if p.width > 0 && !p.rest {
			carried = p.held(p.at)
		}
		*p = flow{width: w, at: n, armed: p.armed, rest: p.rest, from: p.from, topLast: p.topLast,
			ends: p.ends, peak: p.peak, counted: counted}
		p.slots[slotOf(n)] = carried
	}
	p.latest = max(p.latest, int64(el))
	if n > p.at {
		for i := p.at + 1; i <= n && i <= p.at+flowSlots; i++ {
			p.slots[slotOf(i)] = 0
		}
		p.at = n
	}
	if n > p.at-flowSlots {
		p.slots[slotOf(n)]++
	}
	if p.from.IsZero() {
		p.from = at
	}
	if top {
		p.topLast = at
	}
	held := p.held(p.at)
	p.peak = max(p.peak, held)
	if held > p.threshold() {
		p.armed, p.rest = true, false
	}
}

func slotOf(n int64) int64 { return (n%flowSlots + flowSlots) % flowSlots }

// held is the number of lines in the quiet that ends with slot n.
func (p *flow) held(n int64) int64 {
	var sum int64
	for i := max(n, p.at) - flowSlots + 1; i <= min(n, p.at); i++ {
		sum += p.slots[slotOf(i)]
	}
	return sum
}

// threshold is max(2, 1 % of the peak): a storm whose last quiet held fewer lines has ended.
func (p *flow) threshold() int64 { return max(2, p.peak/100) }

// calmAt is the end of the first slot whose quiet held fewer lines than
// the threshold, in elapsed nanoseconds.
func (p *flow) calmAt() int64 {
	n, thr := max(p.at, p.counted+flowSlots-1), p.threshold()
	for p.held(n) >= thr {
		n++
	}
	return (n + 1) * p.width
}

// ends are the ends decided and not yet written, oldest first. Owned by the scheduler's goroutine.
type ends struct{ list []*stormEnd }

// add keeps end unless limit ends wait already: a storm ending beyond that starts afresh.
func (q *ends) add(end *stormEnd, limit int) {
	if len(q.list) < limit {
		q.list = append(q.list, end)
	}
}

// remove forgets end: written, or given up.
func (q *ends) remove(end *stormEnd) {
	q.list = slices.DeleteFunc(q.list, func(e *stormEnd) bool { return e == end })
}

// trim keeps the oldest limit ends; one whose write is in flight is left to it.
func (q *ends) trim(limit int) {
	if len(q.list) > limit {
		kept := slices.DeleteFunc(q.list[limit:], func(e *stormEnd) bool { return e.inflight == 0 })
		q.list = q.list[:limit+len(kept)]
	}
}
