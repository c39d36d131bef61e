package k8s_event

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
)

// TestBucketWaitsForTheNextRefill: without a token, the wait is until the
// next one at the bucket's rate, counting the tokens of requests still out.
func TestBucketWaitsForTheNextRefill(t *testing.T) {
	now := epoch
	b := newBucket(1.0/300, 2, now)
	for id := range uint64(2) {
		if !b.take(id+1, now) {
			t.Fatal("no token in a full bucket")
		}
	}
	if b.take(3, now) {
		t.Fatal("a third token from a bucket of two")
	}
	if w := b.wait(now); w < 299*time.Second || w > 301*time.Second {
		t.Errorf("wait %v with both tokens out, want 300 s", w)
	}
	b.settle(1, false, now) // never reached the API: the token is back
	if w := b.wait(now); w != 0 || !b.take(4, now) {
		t.Errorf("after an unsent request: wait %v, want the token back", w)
	}
	b.settle(2, true, now)
	b.settle(4, true, now)
	if w := b.wait(now); w < 299*time.Second || w > 301*time.Second {
		t.Errorf("after two requests spent: wait %v, want 300 s", w)
	}
	if b.inFlight() != 0 {
		t.Errorf("%d requests out after all settled", b.inFlight())
	}
	// Half a token refilled: half the wait is left.
	if w := b.wait(now.Add(150 * time.Second)); w < 149*time.Second || w > 151*time.Second {
		t.Errorf("wait %v with half a token refilled, want 150 s", w)
	}
	now = now.Add(300 * time.Second)
	if w := b.wait(now); w != 0 {
		t.Errorf("wait %v once a refill came, want 0", w)
	}
	if w := newBucket(0, 0, now).wait(now); w != 365*24*time.Hour {
		t.Errorf("a bucket that never refills waits %v", w)
	}
}

// TestBucketGivesBackNoMoreThanItWouldHold: a token handed back is what the
// bucket would hold more had the request never been made: refills the cap
// took meanwhile are not given back.
func TestBucketGivesBackNoMoreThanItWouldHold(t *testing.T) {
	const qps = 1.0 / 300
	for _, tt := range []struct {
		name    string
		out     time.Duration // how long the request was out
		burst   int
		want    float64 // tokens once it is handed back
		wantOut float64 // tokens once it is spent
	}{
		{"at once", 0, 1, 1, 0},
		{"half a refill", 150 * time.Second, 1, 1, 0.5},
		{"a whole refill", 300 * time.Second, 1, 1, 1},
		{"longer than a refill", time.Hour, 1, 1, 1},
		{"half a refill, burst 3", 150 * time.Second, 3, 3, 2.5},
	} {
		t.Run(tt.name, func(t *testing.T) {
			for _, reached := range []bool{false, true} {
				b := newBucket(qps, tt.burst, epoch)
				if !b.take(1, epoch) {
					t.Fatal("no token in a full bucket")
				}
				at := epoch.Add(tt.out)
				b.settle(1, reached, at)
				want := tt.want
				if reached {
					want = tt.wantOut
				}
				b.advance(at)
				if math.Abs(b.tokens-want) > 1e-9 {
					t.Errorf("reached %v: %.4f tokens, want %.4f", reached, b.tokens, want)
				}
			}
		})
	}

	// Two out, the bucket refills to half a token short of full: the first
	// handed back fills it, the second has nothing left to give back.
	b := newBucket(qps, 2, epoch)
	b.take(1, epoch)
	b.take(2, epoch)
	at := epoch.Add(450 * time.Second) // 1.5 tokens
	b.settle(1, false, at)
	b.settle(2, false, at)
	if b.advance(at); b.tokens != 2 {
		t.Errorf("%.4f tokens after two handed back in a bucket of 2, want 2", b.tokens)
	}
	// Settling an unknown request, or one twice, gives nothing.
	b.take(3, at)
	b.settle(3, true, at)
	b.settle(3, false, at)
	b.settle(99, false, at)
	if b.advance(at); b.tokens != 1 {
		t.Errorf("%.4f tokens after a spent token settled again, want 1", b.tokens)
	}
}

// TestBucketTokenHandedBackAfterAnotherSpent: of two requests out, one
// spends its token and the other hands it back: the bucket has one token
// again, and one only.
func TestBucketTokenHandedBackAfterAnotherSpent(t *testing.T) {
	b := newBucket(1.0/300, 2, epoch)
	b.take(1, epoch)
	b.take(2, epoch)
	b.settle(1, true, epoch)
	b.settle(2, false, epoch)
	if !b.take(3, epoch) {
		t.Fatal("the token handed back cannot be taken")
	}
	if b.take(4, epoch) {
		t.Error("two tokens after one spent and one handed back")
	}
}

// TestBucketSetKeepsTokensUpToTheNewBurst: a reload keeps the tokens, up to
// the new burst; what a request out may give back is held to it too.
func TestBucketSetKeepsTokensUpToTheNewBurst(t *testing.T) {
	b := newBucket(1.0/300, 3, epoch)
	b.take(1, epoch)
	b.take(2, epoch) // one token left, two out
	b.set(1.0/300, 1, epoch)
	b.settle(1, false, epoch)
	b.settle(2, false, epoch)
	if b.advance(epoch); b.tokens != 1 {
		t.Errorf("%.4f tokens after a reload to burst 1 and two handed back, want 1", b.tokens)
	}
	b.set(10, 10, epoch) // a raised rate refills at once at the new rate
	if w := b.wait(epoch); w != 0 {
		t.Fatalf("wait %v with a token", w)
	}
	for id := uint64(3); b.take(id, epoch); id++ {
	}
	if w := b.wait(epoch); w > 100*time.Millisecond {
		t.Errorf("wait %v at 10 a second", w)
	}
}

// TestBucketHandsBackNoTokenTwice: two requests out overlap in what they
// may hand back once the bucket refilled near its cap; both handed back
// must not let more requests reach the server than BURST + QPS x T.
func TestBucketHandsBackNoTokenTwice(t *testing.T) {
	const refill = 300 * time.Second
	b := newBucket(1/refill.Seconds(), 2, epoch)
	b.take(1, epoch) // a and c: neither will reach the server
	b.take(2, epoch)
	at := epoch.Add(refill * 3 / 2) // 1.5 tokens
	var reached []time.Time
	if !b.take(3, at) {
		t.Fatal("no token at 1.5")
	}
	reached = append(reached, at)
	b.settle(1, false, at)
	b.settle(2, false, at)
	b.settle(3, true, at)
	// Without a and c, the bucket was full at 1.5 refills, and b left
	// one token.
	for now := at; now.Before(at.Add(refill)); now = now.Add(time.Second) {
		for b.take(uint64(len(reached)+10), now) {
			reached = append(reached, now)
		}
	}
	for i := range reached {
		for j := i; j < len(reached); j++ {
			span := reached[j].Sub(reached[i]).Seconds()
			if n := float64(j - i + 1); n > 2+span/refill.Seconds()+1e-9 {
				t.Fatalf("%v requests reached the server in %.0fs, bound %.3f: %v", n, span, 2+span/refill.Seconds(), reached)
			}
		}
	}
}

// TestBucketBoundsRequestsThatReached: whatever requests are made, however
// long each is out and whether or not it reaches the server, the requests
// that reached it over any interval T are at most BURST + QPS x T, and
// once nothing is out the bucket holds exactly what a bucket would that
// only those requests had taken, reloads or not.
func TestBucketBoundsRequestsThatReached(t *testing.T) {
	for seed := range uint64(200) {
		r := rand.New(rand.NewPCG(seed, 1))
		qps := []float64{1.0 / 300, 0.5, 1, 3.7, 20}[r.IntN(5)]
		burst := 1 + r.IntN(6)
		b, shadow := newBucket(qps, burst, epoch), newBucket(qps, burst, epoch)
		type out struct {
			id      uint64
			reached bool
			back    time.Time
		}
		var outs []out
		var reachedAt []time.Time
		now := epoch
		mean := time.Duration(float64(time.Second) / qps / 2)
		// In half the seeds one request at most is out at a time.
		single := seed%2 == 0
		// In a quarter, reloads change the rate and the burst: the bound
		// is then of no one rate, but what is handed back is still exact.
		reloads := seed%4 == 1
		for id := uint64(1); id < 400; id++ {
			now = now.Add(time.Duration(r.Float64() * float64(mean)))
			// Settle what is back by now, in the order it comes back.
			slices.SortFunc(outs, func(a, c out) int { return a.back.Compare(c.back) })
			for len(outs) > 0 && !outs[0].back.After(now) {
				o := outs[0]
				outs = outs[1:]
				b.settle(o.id, o.reached, o.back)
				if o.reached {
					shadow.settle(o.id, true, o.back)
				}
			}
			if len(outs) == 0 {
				b.advance(now)
				shadow.advance(now)
				if math.Abs(b.tokens-shadow.tokens) > 1e-9 {
					t.Fatalf("seed %d: %.6f tokens with nothing out, want %.6f: what was handed back is not exact", seed, b.tokens, shadow.tokens)
				}
			}
			if reloads && r.IntN(20) == 0 {
				q, n := []float64{1.0 / 300, 0.5, 1, 3.7, 20}[r.IntN(5)], 1+r.IntN(6)
				b.set(q, n, now)
				shadow.set(q, n, now)
			}
			if len(b.bounds) > len(b.out)+1 {
				t.Fatalf("seed %d: %d bounds kept with %d requests out", seed, len(b.bounds), len(b.out))
			}
			if single && len(outs) > 0 || !b.take(id, now) {
				continue
			}
			o := out{id: id, reached: r.IntN(3) > 0, back: now.Add(time.Duration(r.Float64() * 4 * float64(mean)))}
			if r.IntN(4) == 0 {
				o.back = now // refused at once
			}
			if o.reached {
				if !shadow.take(id, now) {
					t.Fatalf("seed %d: a request took a token that a bucket of the requests that reached has not", seed)
				}
				reachedAt = append(reachedAt, now)
			}
			outs = append(outs, o)
		}
		for i := range reachedAt {
			for j := i; j < len(reachedAt) && !reloads; j++ {
				span := reachedAt[j].Sub(reachedAt[i]).Seconds()
				if n := float64(j - i + 1); n > float64(burst)+qps*span+1e-6 {
					t.Fatalf("seed %d (QPS %v BURST %d): %v requests reached the server in %.3fs, bound %.3f",
						seed, qps, burst, n, span, float64(burst)+qps*span)
				}
			}
		}
		if len(reachedAt) < burst {
			t.Fatalf("seed %d: only %d requests reached: the test proves nothing", seed, len(reachedAt))
		}
	}
}

// TestBackoffBounds: "exponential backoff from 1 s up to 1 min, plus up to
// 20% jitter, and never sooner than a Retry-After asks".
func TestBackoffBounds(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for n := 1; n <= 40; n++ {
		base := min(retryBase<<min(n-1, 7), retryMax)
		lo, hi := base, base+base/5
		for range 200 {
			if d := backoff(r, n, 0); d < lo || d > hi {
				t.Fatalf("backoff after %d failures: %v, want %v to %v", n, d, lo, hi)
			}
		}
	}
	if d := backoff(r, 1, 90*time.Second); d != 90*time.Second {
		t.Errorf("backoff with a Retry-After of 90 s: %v", d)
	}
	if d := backoff(r, 3, time.Second); d < 4*time.Second {
		t.Errorf("backoff after 3 failures with a Retry-After of 1 s: %v, want at least 4 s", d)
	}
}

// A request that never reached the server gives its token back, but never
// more than the bucket would hold had the request never been made. A
// reload that raises BURST while requests are out must not turn refills
// the old cap took into tokens.
func TestGiveBackAfterBurstRaisedIsNoMoreThanWithoutTheRequests(t *testing.T) {
	t0 := epoch
	with := newBucket(0.1, 2, t0)    // two requests go out and never reach the server
	without := newBucket(0.1, 2, t0) // the same bucket, the requests never made
	if !with.take(1, t0) || !with.take(2, t0) {
		t.Fatal("a full bucket of 2 refused a token")
	}
	// 10 s at 0.1/s: one token comes back into the bucket with the
	// requests out; the one without them was full and lost it to its cap.
	t1 := t0.Add(10 * time.Second)
	with.set(0.1, 10, t1) // a reload raises BURST
	without.set(0.1, 10, t1)
	with.settle(1, false, t1)
	with.settle(2, false, t1)
	got, want := with.tokens, without.tokens
	if math.Abs(got-want) > 1e-9 {
		t.Errorf("after two requests that never reached the server: %v tokens, want %v, as without them", got, want)
	}
}

// The same through the scheduler: requests refused before they reach the
// server while a reload raises BURST leave the bucket no fuller than it
// would be had they never been made, so the API server sees no more than
// the twin scheduler would let through.
func TestRefusedRequestsAcrossBurstReloadCostNothingAndGiveNothing(t *testing.T) {
	cfg := testConfig(all, 0.1, 2, 16)
	s := newScheduler(cfg, testPod(), epoch)
	twin := newScheduler(cfg, testPod(), epoch)
	s.observe(ln(levelError, "errors", "a", epoch))
	s.observe(ln(levelError, "errors", "b", epoch))
	reqs, _ := s.dispatch(epoch)
	if len(reqs) != 2 {
		t.Fatalf("%d requests, want 2", len(reqs))
	}
	t1 := epoch.Add(10 * time.Second)
	raised := testConfig(all, 0.1, 10, 16)
	s.apply(raised, t1)
	twin.apply(raised, t1)
	for _, r := range reqs {
		s.outcome(result{id: r.id, outcome: writeFailed, reached: false, err: errRefused}, t1)
	}
	b, tb := s.buckets[levelError], twin.buckets[levelError]
	b.advance(t1)
	tb.advance(t1)
	if b.tokens > tb.tokens+1e-9 {
		t.Errorf("error bucket holds %v tokens after two refused requests, the same scheduler without them %v", b.tokens, tb.tokens)
	}
}

// A bucket's wait is how long until it has a token: never negative, for
// any rate the Corefile accepts ((0, 1000]).
func TestWaitIsNeverNegativeForAnAcceptedRate(t *testing.T) {
	cfg, err := parse(newController("k8s_event {\n rate 1e-12 1\n}"))
	if err != nil {
		t.Fatalf("rate 1e-12 refused: %v", err)
	}
	b := newBucket(cfg.qps, cfg.burst, epoch)
	if !b.take(1, epoch) {
		t.Fatal("a full bucket refused a token")
	}
	if w := b.wait(epoch); w <= 0 {
		t.Errorf("an empty bucket at QPS %g says a token comes in %v", cfg.qps, w)
	}
}

// The scheduler's next wake is never before now: an event that waits for
// a token at the slowest accepted rate is looked at again when it may
// have one, not at once, over and over.
func TestEventWaitingForTokenAtSlowRateWakesNoSoonerThanNow(t *testing.T) {
	s := newScheduler(testConfig(all, 1e-12, 1, 16), testPod(), epoch)
	s.observe(ln(levelError, "errors", "a", epoch))
	s.observe(ln(levelError, "errors", "b", epoch))
	reqs, wake := s.dispatch(epoch)
	if len(reqs) != 1 {
		t.Fatalf("%d requests, want 1", len(reqs))
	}
	if !wake.IsZero() && !wake.After(epoch) {
		t.Errorf("the scheduler asks to be woken at %v, %v before now", wake, epoch.Sub(wake))
	}
}

// Requests that never reached the server give back no more than the
// bucket would hold without them, also when other requests took tokens
// while they were out: the requests that reach the server stay within
// BURST + QPS x T over any T, here BURST at one instant.
func TestGiveBackWhileOthersTookTokensKeepsTheBound(t *testing.T) {
	const burst = 4
	b := newBucket(1, burst, epoch)
	for id := uint64(1); id <= burst; id++ { // out, and never reach the server
		if !b.take(id, epoch) {
			t.Fatalf("token %d refused", id)
		}
	}
	t1 := epoch.Add(3500 * time.Millisecond) // 3.5 tokens came back in
	reached := 0
	for id := uint64(5); id <= 7; id++ {
		if !b.take(id, t1) {
			t.Fatalf("token %d refused at t1", id)
		}
		b.settle(id, true, t1)
		reached++
	}
	for id := uint64(1); id <= burst; id++ {
		b.settle(id, false, t1)
	}
	for id := uint64(8); b.take(id, t1); id++ {
		b.settle(id, true, t1)
		reached++
	}
	if reached > burst {
		t.Errorf("%d requests reached the server at one instant through a bucket of BURST %d", reached, burst)
	}
}

// The same through the scheduler and the API server: four creates whose
// connections take 3.5 s to be refused are out while others are written;
// once they are refused, the API server has seen more requests of the
// reason at one instant than BURST.
func TestRefusedAfterOthersWroteKeepsRequestsWithinBurst(t *testing.T) {
	const burst = 4
	clk := clocktesting.NewFakeClock(epoch)
	api := newFakeAPI(t, clk)
	var refuse atomic.Bool
	api.setFault(func(apiRequest) fault { return fault{unsent: refuse.Load()} })
	s := newScheduler(testConfig(all, 1, burst, 64), testPod(), epoch)
	send := func(r request) result {
		ctx, cancel := context.WithTimeout(context.Background(), writeTimeout)
		defer cancel()
		return do(ctx, api.client, r)
	}
	for i := range burst {
		s.observe(ln(levelError, "errors", fmt.Sprint("slow to refuse ", i), clk.Now()))
	}
	out, _ := s.dispatch(clk.Now()) // their connections are being tried
	if len(out) != burst {
		t.Fatalf("%d requests, want %d", len(out), burst)
	}
	clk.Step(3500 * time.Millisecond)
	t1 := clk.Now()
	for i := range 6 {
		s.observe(ln(levelError, "errors", fmt.Sprint("written ", i), t1))
	}
	reqs, _ := s.dispatch(t1)
	for _, r := range reqs {
		s.outcome(send(r), t1)
	}
	refuse.Store(true)
	for _, r := range out {
		s.outcome(send(r), t1) // refused: never reached the server
	}
	refuse.Store(false)
	reqs, _ = s.dispatch(t1)
	for _, r := range reqs {
		s.outcome(send(r), t1)
	}
	api.mu.Lock()
	n := 0
	for _, r := range api.requests {
		if r.at.Equal(t1) && r.reason == levelError.reason() {
			n++
		}
	}
	api.mu.Unlock()
	if n > burst {
		t.Errorf("%d requests of %s reached the API server at one instant, BURST is %d", n, levelError.reason(), burst)
	}
}
