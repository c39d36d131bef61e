package k8s_event

import (
	"context"
	"errors"
	"math"
	"time"
)

const (
	// Failed writes back off exponentially, with up to 20% jitter, from
	// retryBase to retryMax; an event is retried for as long as it stays in
	// the cache.
	retryBase = time.Second
	retryMax  = time.Minute
	// rejectPause is how long an event waits after the API refused it.
	rejectPause = time.Minute
)

// reserve claims a token of bucket b for a request about to be sent. The
// token is spent only if the request reaches the API (spend); one that
// never left this process hands it back. Requests per bucket thus never
// exceed BURST + QPS x T, retries included, and an unreachable API costs
// no tokens. Without a token it tells how long until one is free, counting
// the tokens held by requests in flight as spent; e, when requests hold
// tokens of the bucket, is woken as soon as one of them comes back unspent
// (spend), to wait no longer than it must. Called with p.mu held.
func (p *pipeline) reserve(b level, e *entry, now time.Time) (time.Duration, bool) {
	bucket := p.buckets[b]
	need := float64(p.reserved[b] + 1)
	have := bucket.TokensAt(now)
	if have >= need {
		p.reserved[b]++
		delete(p.held[b], e)
		return 0, true
	}
	if e != nil && p.reserved[b] > 0 {
		if p.held[b] == nil {
			p.held[b] = map[*entry]struct{}{}
		}
		p.held[b][e] = struct{}{}
	}
	wait := time.Duration((need - have) / float64(bucket.Limit()) * float64(time.Second))
	return max(wait, time.Millisecond), false
}

// spend ends a reservation: the token is taken if the request reached the
// API, whatever its answer. A token handed back wakes one of the entries
// that found the bucket's tokens held, one that still has something to
// write: one token, one write, so an API that refuses connections wakes no
// crowd. Add never blocks, so it is made under p.mu. Called with p.mu held.
func (p *pipeline) spend(b level, now time.Time, reached bool) {
	p.reserved[b]--
	if reached {
		p.buckets[b].ReserveN(now, 1)
	} else {
		for e := range p.held[b] {
			delete(p.held[b], e)
			if p.writable(e, now) {
				p.queue.Add(e)
				break
			}
		}
	}
	if p.reserved[b] == 0 {
		clear(p.held[b]) // what they waited for is settled: their waits are right
	}
	if p.requestEnded != nil { // the flush waits for it (requestDone)
		close(p.requestEnded)
		p.requestEnded = nil
	}
}

// requestDone is closed when the next request in flight ends, spent or
// handed back. Called with p.mu held.
func (p *pipeline) requestDone() <-chan struct{} {
	if p.requestEnded == nil {
		p.requestEnded = make(chan struct{})
	}
	return p.requestEnded
}

// noToken is what an attempt without a token tells: busy while requests in
// flight hold tokens of b that may come back, else throttled. Called with
// p.mu held.
func (p *pipeline) noToken(b level) attemptResult {
	if p.reserved[b] > 0 {
		return attemptBusy
	}
	return attemptThrottled
}

// writable tells whether e has a write to make now: lines pending and not
// given up, or an end still to write, with no write in flight, no backoff
// and no Retry-After to wait out. Called with p.mu held.
func (p *pipeline) writable(e *entry, now time.Time) bool {
	if e.inflight || e.retryAt.After(now) || e.asked.After(now) {
		return false
	}
	if e.end != nil {
		_, ok := p.ends[e]
		return ok
	}
	return e.pending() > 0 && e.dropped == 0
}

// backoffFor is the wait after the n-th failure in a row: exponential,
// capped at retryMax, plus up to 20% jitter, and never shorter than what
// the API asked for. Called with p.mu held.
func (p *pipeline) backoffFor(n int, asked time.Duration) time.Duration {
	d := retryMax
	if n <= 7 {
		d = min(retryBase<<(n-1), retryMax)
	}
	d += time.Duration(p.rand.Int64N(int64(d)/5 + 1))
	return max(d, asked)
}

func (p *pipeline) processNext() bool {
	e, shutdown := p.queue.Get()
	if shutdown {
		return false
	}
	defer p.queue.Done(e)
	if !p.flushing.Load() { // the flush at shutdown writes what is pending
		p.sync(e)
	}
	return true
}

// sync writes one entry if it is due and its bucket has a token: an entry
// queued many times is written once, with the latest count.
func (p *pipeline) sync(e *entry) {
	p.mu.Lock()
	e.queued = false
	now := p.clock.Now()
	var report error
	wait := e.retryAt.Sub(now)
	if wait <= 0 {
		var res attemptResult
		res, wait, report = p.attempt(p.ctx, e)
		switch res {
		case attemptRedo:
			wait = 0
		case attemptInFlight: // the flush's write of e, racing stop: it settles e
			p.mu.Unlock()
			return
		}
	}
	if e.end != nil {
		_, due := p.ends[e]
		e.queued = due
		p.mu.Unlock()
		if due {
			p.requeue(e, wait)
		}
		p.say(now, report)
		return
	}
	if e.pending() > 0 && e.dropped == 0 && !e.queued {
		e.queued = true
		p.mu.Unlock()
		p.requeue(e, wait)
	} else {
		// All written: a storm waits for its quiet. The entry is not
		// marked queued, so that a new line hands it over at once.
		quiet, end := p.watchQuiet(e, p.clock.Now())
		p.mu.Unlock()
		if quiet > 0 {
			p.queue.AddAfter(e, quiet)
		}
		if end != nil {
			p.queue.Add(end)
		}
	}
	p.say(now, report)
}

// say logs why a write failed, at most once a minute; nothing for nil.
func (p *pipeline) say(now time.Time, err error) {
	if err != nil {
		p.reporter.report(now, err, p.pod.namespace())
	}
}

func (p *pipeline) requeue(e *entry, wait time.Duration) {
	if wait > 0 {
		p.queue.AddAfter(e, wait)
	} else {
		p.queue.Add(e)
	}
}

type attemptResult uint8

// afterLookup books an attempt whose one request was the pod's read, or
// whose read is due later: the create comes after, with a token of its
// own. A pod read failed nothing of the entry; the lookup keeps its own
// backoff. Called with p.mu held.
func afterLookup(e *entry, res writeResult, now time.Time) (attemptResult, time.Duration, error) {
	e.retryAt, e.asked = now.Add(res.wait), now.Add(res.retryAfter)
	switch {
	case res.outcome == writeOK:
		return attemptRedo, 0, nil
	case errors.Is(res.err, errLookupPending):
		return attemptFailed, res.wait, nil
	}
	return attemptFailed, res.wait, res.err
}

const (
	attemptNone      attemptResult = iota // nothing pending
	attemptThrottled                      // no token
	attemptBusy                           // no token free: requests in flight hold them, and may hand them back
	attemptInFlight                       // a write of this entry is in flight already (only in the flush at stop)
	attemptWrote                          // written
	attemptRedo                           // to be written again at once: created, gone or name taken
	attemptRefused                        // refused by the API: paused
	attemptFailed                         // failed: backing off
)

// request makes one write of e, as spec says, with a token of bucket b:
// ok is false, with the wait for a token, when the bucket has none. It is
// called with p.mu held and releases it during the request; now is the
// time the answer came.
func (p *pipeline) request(ctx context.Context, e *entry, b level, spec writeSpec) (res writeResult, now time.Time, wait time.Duration, ok bool) {
	now = p.clock.Now()
	if wait, ok := p.reserve(b, e, now); !ok {
		return writeResult{}, now, wait, false
	}
	e.inflight = true
	p.mu.Unlock()
	requestSent(ctx)

	res = p.write(ctx, spec, true)

	p.mu.Lock()
	now = p.clock.Now()
	p.spend(b, now, res.reached)
	e.inflight = false
	return res, now, 0, true
}

// attempt makes one write of e if its bucket has a token, and books the
// outcome. It is called with p.mu held and releases it during the request.
// It returns how long until e may be tried again, and an error to report.
func (p *pipeline) attempt(ctx context.Context, e *entry) (attemptResult, time.Duration, error) {
	if e.inflight {
		return attemptInFlight, 0, nil
	}
	if e.end != nil {
		return p.attemptEnd(ctx, e)
	}
	if e.pending() == 0 || e.dropped > 0 {
		return attemptNone, 0, nil
	}
	l := e.key.level
	// An event's count is an int32: lines past it go to a new object.
	count := e.seen - e.base
	full := count >= math.MaxInt32
	if full {
		count = math.MaxInt32
	}
	spec := writeSpec{key: e.key, message: e.message, count: count, first: e.first, last: e.last, name: e.name, tried: e.tried}
	res, now, wait, ok := p.request(ctx, e, l, spec)
	if !ok {
		throttled[l].Inc()
		return p.noToken(l), wait, nil
	}
	defer p.retire(e)
	if res.lookup {
		return afterLookup(e, res, now)
	}
	switch res.outcome {
	case writeOK:
		e.carry(e.base + spec.count)
		e.name, e.tried, e.doubt, e.failures, e.retryAt, e.asked = res.name, "", 0, 0, time.Time{}, time.Time{}
		if full {
			e.base += spec.count
			e.name = ""
		}
		eventWrites.WithLabelValues(l.reason(), res.verb).Inc()
		return attemptWrote, 0, nil
	case writeGone: // the event expired or was deleted: create it anew
		e.name, e.doubt = "", 0
		return attemptRedo, 0, nil
	case writeExists: // a create that got no answer had been applied: patch it
		e.name, e.tried = res.name, ""
		return attemptRedo, 0, nil
	case writeNameTaken: // another writer's event has this name: take a new one
		e.tried = ""
		return attemptRedo, 0, nil
	case writeRefused:
		e.retryAt = now.Add(rejectPause)
		return attemptRefused, rejectPause, res.err
	default:
		e.asked = now.Add(res.retryAfter)
		if res.unsure {
			e.doubt = e.base + spec.count
			if spec.name == "" {
				e.tried = res.name // it may have been applied: retry under the same name
			}
		}
		e.failures++
		d := p.backoffFor(e.failures, res.retryAfter)
		e.retryAt = now.Add(d)
		return attemptFailed, d, res.err
	}
}
