package k8s_event

import (
	"cmp"
	"context"
	"slices"
	"sync"
	"time"
)

// The flush at shutdown writes what is pending, each event until it is
// written, its bucket is empty, the API refuses it, or the time is up.
// Failed writes are tried again every flushPause, and no sooner than a
// Retry-After asks: only those that reach the API cost a token. It starts
// as soon as the workers stop taking entries, while they finish the write
// in hand. One dispatcher hands the entries, in order, to goroutines of
// their own, one at a time: the next goes once the one before has taken
// its token and sent its request, or is done. So tokens go in order, and
// a request that hangs holds up only its own event. An entry that waits
// (for a Retry-After, a pause, a token held by a request in flight, or its
// own write in hand) is put aside and looked at again in its turn. What
// turns up meanwhile is flushed too: the end of a storm whose last write
// was in hand, an evicted event whose write in hand got no answer.

// flush runs the dispatcher until nothing is left, or the time is up.
func (p *pipeline) flush() {
	workersGone := make(chan struct{})
	go func() {
		p.workersDone.Wait()
		close(workersGone)
	}()
	q := &flushQueue{waiting: map[*entry]flushTurn{}, last: map[*entry]flushTurn{}, offered: map[*entry]struct{}{}, changed: make(chan struct{})}
	p.mu.Lock()
	q.offer(append(p.pendingEntries(), p.endEntries()...))
	p.mu.Unlock()
	var wg sync.WaitGroup
	for {
		e, last, ok := q.next(p, workersGone)
		if !ok {
			break
		}
		sent, done := make(chan struct{}), make(chan struct{})
		var once sync.Once
		ctx := context.WithValue(p.ctx, requestSentKey{}, func() { once.Do(func() { close(sent) }) })
		wg.Go(func() {
			defer close(done)
			q.put(e, p.flushOne(ctx, e, last))
		})
		if p.flushInTurn {
			sent = done
		}
		select {
		case <-sent:
		case <-done:
		case <-p.ctx.Done():
		}
	}
	wg.Wait()
}

// requestSentKey carries, in a flush's context, what request calls once
// its request is on its way: the dispatcher then hands out the next entry.
type requestSentKey struct{}

func requestSent(ctx context.Context) {
	if f, ok := ctx.Value(requestSentKey{}).(func()); ok {
		f()
	}
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
		return closed(t.ended)
	}
	return !now.Before(t.at)
}

func closed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// flushQueue holds the entries of a flush: ready ones, and those put aside.
type flushQueue struct {
	mu      sync.Mutex
	ready   []*entry
	waiting map[*entry]flushTurn
	last    map[*entry]flushTurn // what the last turn of an entry kept
	offered map[*entry]struct{}  // every entry ever offered
	taken   int                  // entries in a flush goroutine's hands
	changed chan struct{}        // closed, and made anew, when one is put back
}

// offer adds the entries not offered before, those whose write is in hand
// last: their turn waits for it. Called with p.mu held.
func (q *flushQueue) offer(es []*entry) {
	var fresh []*entry
	for _, e := range es {
		if _, ok := q.offered[e]; !ok {
			q.offered[e] = struct{}{}
			fresh = append(fresh, e)
		}
	}
	slices.SortStableFunc(fresh, func(a, b *entry) int {
		return cmp.Compare(boolInt(a.inflight), boolInt(b.inflight))
	})
	q.mu.Lock()
	q.ready = append(q.ready, fresh...)
	q.mu.Unlock()
}

// next hands out the next entry whose turn it is, with what its last turn
// was; it waits while every entry left is put aside or in hand, and tells
// false once none is left and the workers are gone, or the flush's time
// is up.
func (q *flushQueue) next(p *pipeline, workersGone <-chan struct{}) (*entry, flushTurn, bool) {
	for {
		gone := closed(workersGone)
		// What a write in hand left since: an end, an event settling.
		p.mu.Lock()
		q.offer(append(p.settlingEntries(), p.endEntries()...))
		ended := p.requestDone()
		p.mu.Unlock()

		q.mu.Lock()
		now := time.Now()
		var at time.Time
		for e, t := range q.waiting {
			switch {
			case t.due(now):
				delete(q.waiting, e)
				q.ready = append(q.ready, e)
			case t.ended == nil && (at.IsZero() || t.at.Before(at)):
				at = t.at
			}
		}
		if len(q.ready) > 0 {
			e := q.ready[0]
			q.ready = q.ready[1:]
			last := q.last[e]
			delete(q.last, e)
			q.taken++
			q.mu.Unlock()
			return e, last, true
		}
		if len(q.waiting) == 0 && q.taken == 0 && gone {
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
		goneCh := workersGone
		if gone {
			goneCh = nil
		}
		select {
		case <-ended:
		case <-fire:
		case <-changed:
		case <-goneCh:
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

// put takes an entry back from its goroutine: put aside until its turn, or
// done with.
func (q *flushQueue) put(e *entry, t flushTurn) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.taken--
	if !t.done() {
		q.waiting[e] = t
		q.last[e] = flushTurn{honoured: t.honoured}
	}
	close(q.changed)
	q.changed = make(chan struct{})
}

// flushOne writes e, and tells when to look at it again if it has to wait.
func (p *pipeline) flushOne(ctx context.Context, e *entry, last flushTurn) flushTurn {
	honoured := last.honoured
	for ctx.Err() == nil {
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
		res, _, report := p.attempt(ctx, e)
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
