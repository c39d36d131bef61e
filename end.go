package k8s_event

import (
	"strings"
	"time"
)

// The end of a storm. A storm's entry (isStorm) whose lines are all written is watched by the
// scheduler until it has had no new line for quiet; then the scheduler decides the end: a new
// entry, the end, joins the ends to write, and the storm's entry starts afresh, so that its next
// line is a new storm, created as a new object, with its own end. Nothing of this runs on the DNS
// path.
//
// An end carries no lines: its tally stays empty, so it never enters the accounting of lines. It is
// written once, from its own bucket, endBucket; a create that got no answer is retried under the
// same name, as the creates of lines are.

// endSpec is what an end event says; set on end entries only.
type endSpec struct {
	message string
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
	// handOffWait is how often an end looks again while lines wait in the
	// hand-off queue.
	handOffWait = 10 * time.Millisecond
)

// quietAt is when the storm of e, all written, may be said to have ended;
// false when e is no storm waiting for its quiet.
func quietAt(e *entry, quiet time.Duration) (time.Time, bool) {
	if quiet <= 0 || e.end != nil || e.evicted || e.inflight != 0 || e.pending() > 0 || e.dropped > 0 || !e.stormWritten {
		return time.Time{}, false
	}
	if !isStorm(e.key, e.seen-e.storm) {
		return time.Time{}, false
	}
	return e.last.Add(quiet + handOffGrace), true
}

// endOf makes the end of e's storm, decided at now, and starts the storm
// afresh: its next line starts a new object and a new count.
func endOf(e *entry, now time.Time) *entry {
	about, top := e.message, ""
	if e.key.combined() { // its shape, not a line of one of its members
		about = lineShape(strings.TrimPrefix(e.message, e.key.plugin))
		top = e.hitters.String()
	}
	end := &entry{key: e.key, end: &endSpec{
		message: endMessage(e.key.plugin, about, top, e.seen-e.storm, e.first, e.stamped),
		at:      now,
	}}
	e.storm, e.stormWritten, e.first = e.seen, false, time.Time{}
	e.base, e.name = e.seen, ""
	return end
}

// ends are the ends decided and not yet written, oldest first. Owned by the scheduler's goroutine.
type ends struct {
	list []*entry
}

// add keeps end unless limit ends wait already: a storm that ends beyond
// that starts afresh without one.
func (q *ends) add(end *entry, limit int) {
	if len(q.list) < limit {
		q.list = append(q.list, end)
	}
}

// remove forgets end: written, or given up.
func (q *ends) remove(end *entry) {
	for i, e := range q.list {
		if e == end {
			q.list = append(q.list[:i], q.list[i+1:]...)
			return
		}
	}
}

// trim keeps the oldest limit ends; one whose write is in flight is left to it.
func (q *ends) trim(limit int) {
	if len(q.list) <= limit {
		return
	}
	kept := q.list[:0]
	for i, e := range q.list {
		if i < limit || e.inflight != 0 {
			kept = append(kept, e)
		}
	}
	clear(q.list[len(kept):])
	q.list = kept
}
