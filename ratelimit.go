package k8s_event

import (
	"math"
	"math/rand/v2"
	"time"
)

// The token buckets: one per reason of BURST tokens refilled at QPS, and one for the ends of storms
// (endBucket). A request takes a token when it is sent, retries and pod reads included, so the
// requests of a reason that reach the API server over any T are at most BURST + QPS x T. One that
// never reached the server gives its token back, as far as the bucket would hold had it never been
// made (x/time/rate cannot give back part of a token). Owned by the scheduler's goroutine; no lock.
//
// The tokens at any time are the least, over every moment s before, of BURST at s plus the refills
// since, less the tokens taken since (and BURST now). A request handed back is taken out of every
// such sum it is in. Only the moments just before a take can be the least, and of those only the
// ones that may still be, given the requests out, are kept: at most one more than the requests out.
type bucket struct {
	qps    float64
	burst  float64
	tokens float64
	at     time.Time
	out    map[uint64]struct{} // the requests out with a token of this bucket
	bounds []bound             // oldest first
}

// bound is BURST at a moment just before a take, refilled since, less the
// tokens taken since; ids are the requests among those still out.
type bound struct {
	v   float64
	ids map[uint64]struct{}
}

func newBucket(qps float64, burst int, now time.Time) *bucket {
	return newShareBucket(qps, float64(burst), now)
}

// newShareBucket is a bucket whose burst may be a part of a token, as a replica's share of a fleet.
func newShareBucket(qps, burst float64, now time.Time) *bucket {
	return &bucket{qps: qps, burst: burst, tokens: burst, at: now, out: map[uint64]struct{}{}}
}

func (b *bucket) advance(now time.Time) {
	if now.After(b.at) {
		d := b.qps * now.Sub(b.at).Seconds()
		for i := range b.bounds {
			b.bounds[i].v += d
		}
		b.at = now
	}
	b.prune()
}

// prune drops the bounds that can no longer be the least, and sets tokens to the least of the
// others and BURST. A bound at BURST or more never is again (BURST later is less); nor is one at or
// above a later one, since it holds every request out the later one holds, and the same give-backs
// raise it as much; of two that hold the same requests, the greater.
func (b *bucket) prune() {
	least, w := b.burst, len(b.bounds)
	for i := len(b.bounds) - 1; i >= 0; i-- { // newest first
		if b.bounds[i].v < least {
			least = b.bounds[i].v
			w--
			b.bounds[w] = b.bounds[i]
		}
	}
	// b.bounds[w:] are kept, oldest first, each less than the next.
	n := 0
	for _, bd := range b.bounds[w:] {
		if n > 0 && len(b.bounds[n-1].ids) == len(bd.ids) {
			continue // the same requests out, and the older is less
		}
		b.bounds[n] = bd
		n++
	}
	clear(b.bounds[n:])
	b.bounds = b.bounds[:n]
	b.tokens = least
}

func (b *bucket) take(id uint64, now time.Time) bool {
	b.advance(now)
	if b.tokens < 1 {
		return false
	}
	b.bounds = append(b.bounds, bound{v: b.burst, ids: map[uint64]struct{}{}})
	for i := range b.bounds {
		b.bounds[i].ids[id] = struct{}{}
		b.bounds[i].v--
	}
	b.out[id] = struct{}{}
	b.prune()
	return true
}

// settle ends request id: its token is spent if it reached the server,
// and handed back if it did not, as far as the bucket would hold without it.
func (b *bucket) settle(id uint64, reached bool, now time.Time) {
	b.advance(now)
	if _, ok := b.out[id]; !ok {
		return
	}
	delete(b.out, id)
	for i, bd := range b.bounds {
		if _, ok := bd.ids[id]; ok {
			delete(bd.ids, id)
			if !reached {
				b.bounds[i].v++
			}
		}
	}
	b.prune()
}

// wait is how long until the bucket has a token; 0 when it has one now.
func (b *bucket) wait(now time.Time) time.Duration {
	b.advance(now)
	if b.tokens >= 1 {
		return 0
	}
	// QPS may be as small as a float allows: wait at most a year.
	return time.Duration(math.Ceil(min((1-b.tokens)/b.qps, 365*24*3600) * float64(time.Second)))
}

// last tells that the bucket holds one token at most.
func (b *bucket) last(now time.Time) bool {
	b.advance(now)
	return b.tokens < 2
}

// set takes a new rate and burst; the tokens stay, up to the new burst.
func (b *bucket) set(qps float64, burst int, now time.Time) { b.setRate(qps, float64(burst), now) }

// setRate is set, with a burst that may be a part of a token.
func (b *bucket) setRate(qps, burst float64, now time.Time) {
	b.advance(now)
	// The old BURST now is a bound still: a greater one does not fill the bucket at once.
	b.bounds = append(b.bounds, bound{v: b.burst, ids: map[uint64]struct{}{}})
	b.qps, b.burst = qps, burst
	b.prune()
}

func (b *bucket) inFlight() int { return len(b.out) }

// untouched tells that no token was ever taken, or all were given back, and none is out: the
// bucket is full.
func (b *bucket) untouched(now time.Time) bool {
	b.advance(now)
	return len(b.out) == 0 && b.tokens >= b.burst
}

const (
	// Failed writes back off exponentially, with up to 20% jitter, from retryBase to retryMax; an
	// event is retried for as long as it stays in the cache.
	retryBase = time.Second
	retryMax  = time.Minute
	// rejectPause is how long an event waits after the API refused it.
	rejectPause = time.Minute
)

// backoff is the wait after the n-th failure in a row: exponential, capped at retryMax, plus up to
// 20% jitter, and never shorter than what the API asked for.
func backoff(r *rand.Rand, n int, asked time.Duration) time.Duration {
	d := min(retryBase<<min(n-1, 7), retryMax)
	d += time.Duration(r.Int64N(int64(d)/5 + 1))
	return max(d, asked)
}
