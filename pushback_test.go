package k8s_event

import (
	"math/rand/v2"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestTooManyRequestsHoldsEveryBucket: a 429 holds every request of the replica, of every
// bucket, for its Retry-After; then the replica sends at most one request a second, climbing
// back to its full rate as writes succeed. The time held is counted, and every line is still
// accounted for.
func TestTooManyRequestsHoldsEveryBucket(t *testing.T) {
	h, api, clk := newTestHarness(t, testConfig(all, 100, 100, 64))
	before := readLedger()
	heldBefore := testutil.ToFloat64(heldTotal)
	api.setFault(firstOnly(fault{code: http.StatusTooManyRequests, retryAfter: 3}))
	told := clk.Now()
	h.observe(ln(levelError, "errors", "busy", told))
	drain(h) // 429, Retry-After 3 s
	for i, l := range []level{levelWarning, levelInfo, levelError} {
		h.observe(ln(l, "forward", "other "+string(rune('a'+i)), clk.Now()))
	}
	h.advance(10 * time.Second)
	var last time.Time
	var gaps []time.Duration
	for i, r := range requestTimes(api) {
		if i == 0 {
			continue // the 429
		}
		if r.Before(told.Add(3 * time.Second)) {
			t.Errorf("request %d at %v, within the Retry-After of 3 s told at %v", i, r.Sub(told), told)
		}
		if !last.IsZero() {
			gaps = append(gaps, r.Sub(last))
		}
		last = r
	}
	if len(gaps) != 3 {
		t.Fatalf("%d requests after the 429, want 4: %v", len(gaps)+1, requestTimes(api))
	}
	// Each success halves the gap, from 1 s: at least 1 s, 0.5 s, 0.25 s.
	for i, g := range gaps {
		if least := time.Second >> i; g < least {
			t.Errorf("gap %d after the hold is %v, want at least %v", i+1, g, least)
		}
	}
	if held := testutil.ToFloat64(heldTotal) - heldBefore; held < 3 || held > 3.6 {
		t.Errorf("held %v s, want the Retry-After of 3 s plus up to 20%%", held)
	}
	checkLedger(t, api, before, 4)
}

// TestTooManyRequestsHoldsAFatalLine: a fatal line within a Retry-After is not sent; it is
// dropped as throttled, as one that finds its bucket empty.
func TestTooManyRequestsHoldsAFatalLine(t *testing.T) {
	h, api, clk := newTestHarness(t, testConfig(all, 100, 100, 64))
	api.setFault(firstOnly(fault{code: http.StatusTooManyRequests}))
	h.observe(ln(levelError, "errors", "busy", clk.Now()))
	drain(h)
	before := readLedger()
	h.Fatal("plugin/reload: ", "cannot go on")
	if d := readLedger().since(before); d.dropped[dropThrottled] != 1 {
		t.Errorf("dropped %v, want the fatal line throttled within the 1 s a 429 holds at least", d.dropped)
	}
	if n := len(requestTimes(api)); n != 1 {
		t.Errorf("%d requests, want only the one answered 429", n)
	}
}

// TestPushbackClimbsBack: the gap after a 429 halves with each success until it is gone, and a
// hold is the Retry-After, at least a second, plus up to 20%.
func TestPushbackClimbsBack(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	var p pushback
	now := epoch
	if added := p.tooMany(now, 0, r); added < time.Second || added > 1200*time.Millisecond {
		t.Errorf("held %v for a 429 without Retry-After, want 1 s plus up to 20%%", added)
	}
	if added := p.tooMany(now, 500*time.Millisecond, r); added != 0 && p.until.Sub(now) > 1200*time.Millisecond {
		t.Errorf("a shorter Retry-After held %v more", added)
	}
	for n := 0; p.gap > 0; n++ {
		if n > 6 {
			t.Fatalf("gap %v after %d successes", p.gap, n)
		}
		p.succeeded()
	}
	now = p.until
	p.sent(now, r)
	if w := p.wait(now); w != 0 {
		t.Errorf("wait %v with no gap left", w)
	}
}

// requestTimes lists the times every request reached the API, in order.
func requestTimes(api *fakeAPI) []time.Time {
	api.mu.Lock()
	defer api.mu.Unlock()
	var out []time.Time
	for _, r := range api.requests {
		out = append(out, r.at)
	}
	slices.SortFunc(out, time.Time.Compare)
	return out
}
