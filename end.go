package k8s_event

import (
	"cmp"
	"context"
	"slices"
	"strings"
	"time"
)

// The end of a storm. A storm's entry (isStorm) whose lines are all written
// waits, as a delayed item of the work queue, until it has had no new line
// for quiet; the writer that takes it then decides the end: it hands a new
// entry, the end, to the queue, and starts the storm's entry afresh, so
// that its next line is a new storm, created as a new object, with its own
// end. Nothing of this runs on the DNS path.
//
// An end carries no lines: its tally stays empty, so it never enters the
// accounting of lines. It is written once, from its own bucket, endBucket;
// a create that got no answer is retried under the same name, as the
// creates of lines are.

// endSpec is what an end event says; set on end entries only.
type endSpec struct {
	message string
	at      time.Time // when the end was decided: the event's time
}

const (
	endBucket  = numLevels // the bucket of end events, after the levels'
	numBuckets = numLevels + 1
)

// watchQuiet tells how long until e, a written entry with nothing pending,
// has been quiet for p.quiet; 0 when there is nothing to wait for. If that
// time is up, it ends the storm and returns its end, for the caller to
// queue once it released p.mu. Called with p.mu held, by the one writer
// that holds e.
func (p *pipeline) watchQuiet(e *entry, now time.Time) (time.Duration, *entry) {
	if p.quiet <= 0 || e.end != nil || e.evicted || e.inflight || e.pending() > 0 || e.dropped > 0 || e.name == "" {
		return 0, nil
	}
	count := e.seen - e.base
	if !isStorm(e.key, count) {
		return 0, nil
	}
	// A line logged just before the quiet was up may still be on its way:
	// in the listener between its time stamp and the hand-off, on the
	// hand-off queue, or in the correlator. The end waits handOffGrace
	// more for it, and longer while the correlator is behind.
	due := e.last.Add(p.quiet)
	if wait := due.Add(handOffGrace).Sub(now); wait > 0 {
		return wait, nil
	}
	if len(p.lines) > 0 && p.observed.Before(due) {
		return handOffWait, nil
	}
	var end *entry
	if len(p.ends) < p.cacheSize {
		end = &entry{key: e.key, queued: true, end: &endSpec{
			message: endMessage(e.key.plugin, e.message, count, e.first, e.last),
			at:      now,
		}}
		p.ends[end] = struct{}{}
	}
	// The storm is over: its next line starts a new object and a new count.
	e.base, e.name, e.first = e.seen, "", time.Time{}
	return 0, end
}

const (
	// handOffGrace is how long after its quiet a storm's end waits for a
	// line logged before then that is still on its way to the correlator:
	// far more than the microseconds that takes, short against any quiet.
	handOffGrace = 250 * time.Millisecond
	// handOffWait is how often an end looks again while the correlator is
	// behind; it takes the hand-off queue in batches of at most batchPause.
	handOffWait = 10 * batchPause
)

// trimEnds applies quiet and the cache size to the ends not written yet: a
// reload to quiet off says no more ends, one that shrinks the cache keeps
// the oldest CACHESIZE. An end whose write is in flight is left to it.
// Called with p.mu held.
func (p *pipeline) trimEnds() {
	keep := p.cacheSize
	if p.quiet <= 0 {
		keep = 0
	}
	if len(p.ends) <= keep {
		return
	}
	for i, e := range p.endEntries() {
		if i >= keep && !e.inflight {
			delete(p.ends, e)
		}
	}
}

// endEntries lists the ends not written yet, oldest first. Called with
// p.mu held.
func (p *pipeline) endEntries() []*entry {
	out := make([]*entry, 0, len(p.ends))
	for e := range p.ends {
		out = append(out, e)
	}
	slices.SortFunc(out, func(a, b *entry) int {
		return cmp.Or(a.end.at.Compare(b.end.at), strings.Compare(a.end.message, b.end.message))
	})
	return out
}

// attemptEnd makes one write of an end event if its bucket has a token,
// like attempt does for lines. Called with p.mu held; it releases it
// during the request.
func (p *pipeline) attemptEnd(ctx context.Context, e *entry) (attemptResult, time.Duration, error) {
	if _, ok := p.ends[e]; !ok {
		return attemptNone, 0, nil
	}
	l := e.key.level
	spec := writeSpec{key: e.key, message: e.end.message, count: 1, first: e.end.at, last: e.end.at, tried: e.tried, end: true}
	res, now, wait, ok := p.request(ctx, e, endBucket, spec)
	if !ok {
		throttledEnd[l].Inc()
		return p.noToken(endBucket), wait, nil
	}
	// A reload during the request may have turned quiet off or shrunk the
	// cache: an end still to write is held to them once it is back.
	defer p.trimEnds()
	if res.lookup {
		return afterLookup(e, res, now)
	}
	switch res.outcome {
	case writeOK, writeExists: // written, or found written by an earlier try
		delete(p.ends, e)
		e.name, e.tried = res.name, ""
		eventWrites.WithLabelValues(endReason(l), res.verb).Inc()
		ended[l].Inc()
		return attemptWrote, 0, nil
	case writeNameTaken:
		e.tried = ""
		return attemptRedo, 0, nil
	case writeRefused: // said once in the log; the end is given up
		delete(p.ends, e)
		return attemptRefused, 0, res.err
	default:
		e.asked = now.Add(res.retryAfter)
		if res.unsure {
			e.tried = res.name // it may have been applied: retry under the same name
		}
		e.failures++
		d := p.backoffFor(e.failures, res.retryAfter)
		e.retryAt = now.Add(d)
		return attemptFailed, d, res.err
	}
}
