package k8s_event

import (
	"math/rand/v2"
	"time"
)

// A 429 (API Priority and Fairness, EventRateLimit) says that the API server is past its budget:
// not this event's, the replica's. So the pushback holds every request of the replica, of every
// bucket, pod and workload reads and fatal lines included, for the Retry-After asked, at least
// pushbackMin, plus up to 20% jitter. Then the replica sends at most one request every gap, and the
// gap halves with each write that succeeds, until it is gone: a 429 costs at most twice the gap,
// pushbackGap, after the hold, and replicas told the same Retry-After do not come back together.
// Owned by the scheduler's goroutine.
const (
	pushbackMin    = time.Second
	pushbackGap    = time.Second
	pushbackGapMin = pushbackGap / 32 // below it, no gap
)

type pushback struct {
	until time.Time     // no request before this
	gap   time.Duration // the least time between two requests, with jitter; 0: none
	next  time.Time     // the earliest the next request may leave, by the gap
}

// tooMany takes a 429 answered at now with retryAfter (0 when none was asked). It returns how
// much longer every request is now held.
func (p *pushback) tooMany(now time.Time, retryAfter time.Duration, r *rand.Rand) time.Duration {
	d := max(retryAfter, pushbackMin)
	until := now.Add(d + jitter(r, d))
	p.gap = pushbackGap
	if !until.After(p.until) {
		return 0
	}
	added := until.Sub(later(p.until, now))
	p.until = until
	return added
}

// succeeded takes a write that succeeded: the rate climbs back.
func (p *pushback) succeeded() {
	p.gap /= 2
	if p.gap < pushbackGapMin {
		p.gap = 0
	}
}

// wait is how long a request must wait at now; 0 when it may leave.
func (p *pushback) wait(now time.Time) time.Duration {
	return max(p.until.Sub(now), p.next.Sub(now), 0)
}

// sent notes a request that leaves at now.
func (p *pushback) sent(now time.Time, r *rand.Rand) {
	if p.gap > 0 {
		p.next = now.Add(p.gap + jitter(r, p.gap))
	}
}

// jitter is up to 20% of d, at random.
func jitter(r *rand.Rand, d time.Duration) time.Duration {
	return time.Duration(r.Int64N(int64(d)/5 + 1))
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
