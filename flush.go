package k8s_event

import (
	"cmp"
	"slices"
	"sync"
	"time"
)

// The flush at shutdown writes what is pending, each event until it is
// written, its bucket is empty, the API refuses it, or the time is up.
// Failed writes are tried again every flushPause, and no sooner than a
// Retry-After asks: only those that reach the API cost a token. It starts
// as soon as the workers stop taking entries, while they finish the write
// in hand; an entry that waits (for a Retry-After, a pause, a token held
// by a request in flight, or its own write in hand) is put aside, so that
// the flushers take other entries meanwhile and one slow request holds up
// only what waits for it.

// flush offers first what is pending now, those whose write is in hand
// last; then, once the workers are gone, what they left that was not
// offered yet: the end of a storm whose last write was in hand when the
// flush began.
func (p *pipeline) flush() {
	offered := map[*entry]struct{}{}
	for round := 0; p.ctx.Err() == nil; round++ {
		p.mu.Lock()
		var todo []*entry
		for _, e := range append(p.pendingEntries(), p.endEntries()...) {
			if _, ok := offered[e]; !ok {
				offered[e] = struct{}{}
				todo = append(todo, e)
			}
		}
		slices.SortStableFunc(todo, func(a, b *entry) int {
			return cmp.Compare(boolInt(a.inflight), boolInt(b.inflight))
		})
		p.mu.Unlock()
		if len(todo) == 0 && round > 0 {
			return
		}
		p.flushAll(todo)
		if round == 0 {
			p.waitWorkers()
		}
	}
}

// waitWorkers waits for the workers to finish the write in hand, or for
// the flush's time to be up.
func (p *pipeline) waitWorkers() {
	done := make(chan struct{})
	go func() {
		p.workersDone.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-p.ctx.Done():
	}
}

// flushAll flushes todo with p.flushers goroutines.
func (p *pipeline) flushAll(todo []*entry) {
	q := &flushQueue{ready: todo, waiting: map[*entry]flushTurn{}, changed: make(chan struct{})}
	var wg sync.WaitGroup
	for range p.flushers {
		wg.Go(func() {
			for {
				e, last, ok := q.next(p)
				if !ok {
					return
				}
				q.put(e, p.flushOne(e, last))
			}
		})
	}
	wg.Wait()
}

// flushTurn is when an entry put aside is looked at again: once a request
// ends, or at a time (real, as the flush's deadline is); zero when it is
// done with.
type flushTurn struct {
	ended    <-chan struct{}
	at       time.Time
	honoured time.Time // the latest Retry-After waited out
}

func (t flushTurn) done() bool { return t.ended == nil && t.at.IsZero() }

// due tells whether the turn has come: its request ended or its time is up.
func (t flushTurn) due(now time.Time) bool {
	if t.ended != nil {
		select {
		case <-t.ended:
			return true
		default:
			return false
		}
	}
	return !now.Before(t.at)
}

// flushQueue holds the entries of a flush: ready ones, and those put aside.
type flushQueue struct {
	mu      sync.Mutex
	ready   []*entry
	waiting map[*entry]flushTurn
	last    map[*entry]flushTurn // what the last turn of an entry kept
	taken   int                  // entries in a flusher's hands
	changed chan struct{}        // closed, and made anew, when one is put back
}

// next hands a flusher the next entry whose turn it is, with what its last
// turn was; it waits while every entry left is put aside, and tells false
// once none is left or the flush's time is up.
func (q *flushQueue) next(p *pipeline) (*entry, flushTurn, bool) {
	for {
		q.mu.Lock()
		now := time.Now()
		var ended <-chan struct{}
		var at time.Time
		for e, t := range q.waiting {
			switch {
			case t.due(now):
				delete(q.waiting, e)
				q.ready = append(q.ready, e)
			case t.ended != nil:
				ended = t.ended // all still open are the one of the next request to end
			case at.IsZero() || t.at.Before(at):
				at = t.at
			}
		}
		if len(q.ready) > 0 {
			e := q.ready[0]
			q.ready = q.ready[1:]
			last := q.turns(e)
			q.taken++
			q.mu.Unlock()
			return e, last, true
		}
		if len(q.waiting) == 0 && q.taken == 0 {
			q.mu.Unlock()
			return nil, flushTurn{}, false
		}
		changed := q.changed
		q.mu.Unlock()
		var timer *time.Timer
		var fire <-chan time.Time
		if !at.IsZero() {
			timer = time.NewTimer(at.Sub(now))
			fire = timer.C
		}
		select {
		case <-ended:
		case <-fire:
		case <-changed:
		case <-p.ctx.Done():
		}
		if timer != nil {
			timer.Stop()
		}
		if p.ctx.Err() != nil {
			return nil, flushTurn{}, false
		}
	}
}

// turns is what the last turn of e kept: the Retry-After it waited out.
// Called with q.mu held.
func (q *flushQueue) turns(e *entry) flushTurn {
	t := q.last[e]
	delete(q.last, e)
	return t
}

// put takes an entry back from a flusher: put aside until its turn, or
// done with.
func (q *flushQueue) put(e *entry, t flushTurn) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.taken--
	if !t.done() {
		q.waiting[e] = t
		if q.last == nil {
			q.last = map[*entry]flushTurn{}
		}
		q.last[e] = flushTurn{honoured: t.honoured}
	}
	close(q.changed)
	q.changed = make(chan struct{})
}

// flushOne writes e, and tells when to look at it again if it has to wait.
func (p *pipeline) flushOne(e *entry, last flushTurn) flushTurn {
	honoured := last.honoured
	for p.ctx.Err() == nil {
		p.mu.Lock()
		// A Retry-After is honoured in the flush too: one answered before
		// the flush, or to the write in hand when it began.
		if e.asked.After(honoured) && !e.inflight {
			honoured = e.asked
			if asked := e.asked.Sub(p.clock.Now()); asked > 0 {
				p.mu.Unlock()
				return p.pause(asked, honoured)
			}
		}
		res, _, report := p.attempt(p.ctx, e)
		var ended <-chan struct{}
		if res == attemptBusy || res == attemptInFlight {
			ended = p.requestDone()
		}
		var pause time.Duration
		if res == attemptFailed {
			// A Retry-After is honoured in the flush too; one longer than
			// the flush has left leaves the lines to be dropped at its end.
			pause, honoured = max(p.flushPause, e.asked.Sub(p.clock.Now())), e.asked
		}
		p.mu.Unlock()
		p.say(p.clock.Now(), report)
		switch res {
		case attemptRedo:
			continue
		case attemptBusy, attemptInFlight:
			// A request in flight holds the token, or is e's own write in
			// hand: look again once a request ends.
			return flushTurn{ended: ended, honoured: honoured}
		case attemptFailed:
			return p.pause(pause, honoured)
		default: // written, refused, or no token
			return flushTurn{}
		}
	}
	return flushTurn{}
}

// pause is a turn after d, or none if the flush ends before that.
func (p *pipeline) pause(d time.Duration, honoured time.Time) flushTurn {
	at := time.Now().Add(d)
	if at.After(p.flushEnd) {
		return flushTurn{}
	}
	return flushTurn{at: at, honoured: honoured}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
