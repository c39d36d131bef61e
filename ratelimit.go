package k8s_event

import (
	"math"
	"math/rand/v2"
	"time"
)

// The token buckets. Each reason has a bucket of BURST tokens refilled at
// QPS, and the ends of storms one more (endBucket). A request takes a
// token when it is sent, so that the requests of a reason that reach the
// API server over any time T are at most BURST + QPS x T, retries and pod
// reads included. A request that never reached the server (its connection
// was refused) gives its token back, but never more of it than the bucket
// would hold had the request never been made: while it was out, the bucket
// may have filled up and lost refills to its cap, and those are not given
// back. So the bound holds for the requests that reached the server, and
// a refused request costs nothing that the bound would miss.
//
// golang.org/x/time/rate cannot hand back a fraction of a token, which the
// exact give-back needs: the bucket is this small type.

// bucket is a token bucket with give-back. Owned by the scheduler's
// goroutine; no lock.
type bucket struct {
	qps    float64
	burst  float64
	tokens float64
	at     time.Time
	// out is, for each request out with a token of this bucket, how much
	// of that token it may give back: what the bucket would hold more
	// without it, at most 1.
	out map[uint64]float64
}

func newBucket(qps float64, burst int, now time.Time) *bucket {
	return &bucket{qps: qps, burst: float64(burst), tokens: float64(burst), at: now, out: map[uint64]float64{}}
}

// advance refills the bucket up to now. What the cap takes from the
// refill is taken from what requests out may give back too.
func (b *bucket) advance(now time.Time) {
	if now.After(b.at) {
		b.tokens = min(b.burst, b.tokens+b.qps*now.Sub(b.at).Seconds())
		b.at = now
	}
	b.clampOut()
}

// clampOut holds what requests out may give back to the room the bucket
// has: no request may give back more than the bucket would hold without
// it. Requests out together share that room: two that would each fill it must
// not hand back twice as much, or the requests that reached the server
// could exceed BURST + QPS x T. So what they may give back adds up to the
// room at most, cut in proportion when it would not: exact for a request
// out alone, never more than exact for several.
func (b *bucket) clampOut() {
	room := max(b.burst-b.tokens, 0)
	var sum float64
	for _, g := range b.out {
		sum += g
	}
	if sum <= room {
		return
	}
	for id, g := range b.out {
		b.out[id] = g * room / sum
	}
}

// take takes a token for request id, if there is one.
func (b *bucket) take(id uint64, now time.Time) bool {
	b.advance(now)
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	b.out[id] = 1
	return true
}

// settle ends request id: its token is spent if it reached the server,
// and given back as far as the bucket allows if it did not.
func (b *bucket) settle(id uint64, reached bool, now time.Time) {
	b.advance(now)
	g, ok := b.out[id]
	delete(b.out, id)
	if ok && !reached {
		b.tokens = min(b.burst, b.tokens+g)
		b.clampOut()
	}
}

// wait is how long until the bucket has a token; 0 when it has one now.
func (b *bucket) wait(now time.Time) time.Duration {
	b.advance(now)
	if b.tokens >= 1 {
		return 0
	}
	if b.qps <= 0 {
		return math.MaxInt64
	}
	return time.Duration(math.Ceil((1 - b.tokens) / b.qps * float64(time.Second)))
}

// set takes a new rate and burst; the tokens stay, up to the new burst.
func (b *bucket) set(qps float64, burst int, now time.Time) {
	b.advance(now)
	b.qps, b.burst = qps, float64(burst)
	b.tokens = min(b.tokens, b.burst)
	b.clampOut()
}

// inFlight is the number of requests out with a token of this bucket.
func (b *bucket) inFlight() int { return len(b.out) }

const (
	// Failed writes back off exponentially, with up to 20% jitter, from
	// retryBase to retryMax; an event is retried for as long as it stays in
	// the cache.
	retryBase = time.Second
	retryMax  = time.Minute
	// rejectPause is how long an event waits after the API refused it.
	rejectPause = time.Minute
)

// backoff is the wait after the n-th failure in a row: exponential, capped
// at retryMax, plus up to 20% jitter, and never shorter than what the API
// asked for.
func backoff(r *rand.Rand, n int, asked time.Duration) time.Duration {
	d := retryMax
	if n <= 7 {
		d = min(retryBase<<(n-1), retryMax)
	}
	d += time.Duration(r.Int64N(int64(d)/5 + 1))
	return max(d, asked)
}
