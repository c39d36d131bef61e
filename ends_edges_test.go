package k8s_event

import (
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// endsIn lists the end events the fake API holds.
func endsIn(api *fakeAPI) []corev1.Event {
	var out []corev1.Event
	for _, e := range api.list() {
		if strings.HasSuffix(e.Reason, "Ended") {
			out = append(out, e)
		}
	}
	return out
}

// runQueue lets the work queue run for a while on the fake clock, in small
// steps, as CoreDNS's writers would: only what the queue hands over is
// written, nothing is woken by hand. It stops as soon as cond holds.
func runQueue(p *pipeline, clk interface{ Step(time.Duration) }, step time.Duration, rounds int, cond func() bool) bool {
	for range rounds {
		clk.Step(step)
		time.Sleep(5 * time.Millisecond) // the delaying queue moves due keys in a goroutine of its own
		drain(p)
		if cond() {
			return true
		}
	}
	return false
}

// TestEndsReloadShrinkKeepsEndsWithinCache: "At most CACHESIZE ends wait to
// be written". A reload that shrinks the cache must leave at most the new
// CACHESIZE ends waiting, as it does for the settling entries.
func TestEndsReloadShrinkKeepsEndsWithinCache(t *testing.T) {
	const quiet = time.Minute
	cfg := quietConfig(100, 100, quiet)
	cfg.cacheSize = 4
	p, api, clk := newTestPipeline(t, cfg)
	for i := range 4 { // four storms of their own, each one event of 12 lines
		for range 12 {
			p.observe(ln(levelWarning, fmt.Sprintf("p%d", i), "upstream unhealthy", clk.Now()))
		}
	}
	drain(p)
	var down atomic.Bool
	api.setFault(func(apiRequest) fault { return fault{unsent: down.Load()} })
	down.Store(true) // the API server is unreachable: the ends wait
	clk.Step(quiet + handOffGrace)
	wake(p)
	p.mu.Lock()
	waiting := len(p.ends)
	p.mu.Unlock()
	if waiting != 4 {
		t.Fatalf("%d ends waiting before the reload, want 4", waiting)
	}

	small := cfg
	small.cacheSize = 1
	p.apply(small, api.client)
	p.mu.Lock()
	waiting = len(p.ends)
	p.mu.Unlock()
	if waiting > small.cacheSize {
		t.Errorf("%d ends waiting after a reload to CACHESIZE %d, want at most %d", waiting, small.cacheSize, small.cacheSize)
	}
	down.Store(false)
	clk.Step(2 * retryMax)
	wake(p)
	if n := len(endsIn(api)); n > small.cacheSize {
		t.Errorf("%d ends written after the API came back, more than the %d that may wait", n, small.cacheSize)
	}
}

// TestEndsReloadRateWakesThrottledEnds: "events that waited for a token
// are looked at again at once under the new rate". An end that waits for
// a token of its bucket is an event too; after a reload to a high rate it
// must go as soon as the new rate gives it a token, as a line event does.
func TestEndsReloadRateWakesThrottledEnds(t *testing.T) {
	const quiet = time.Minute
	p, api, clk := newTestPipeline(t, quietConfig(1.0/3600, 1, quiet))
	for range 12 { // two storms, one per level: each takes its level's only token
		p.observe(ln(levelWarning, "errors", "upstream slow", clk.Now()))
		p.observe(ln(levelError, "errors", "upstream unhealthy", clk.Now()))
	}
	drain(p)
	clk.Step(quiet + handOffGrace)
	wake(p) // both end; the first end takes the end bucket's token, the second waits an hour
	if n := len(endsIn(api)); n != 1 {
		t.Fatalf("%d ends written with one token, want 1", n)
	}
	// A line event that waits for a token too: the warning bucket is empty.
	p.observe(ln(levelWarning, "forward", "a lone line", clk.Now()))
	drain(p)
	if n := len(api.list()); n != 3 {
		t.Fatalf("%d events before the reload, want 3", n)
	}

	p.apply(quietConfig(1000, 1, quiet), api.client)
	lineWritten := func() bool {
		for _, e := range api.list() {
			if strings.Contains(e.Message, "a lone line") {
				return true
			}
		}
		return false
	}
	both := func() bool { return lineWritten() && len(endsIn(api)) == 2 }
	runQueue(p, clk, 10*time.Millisecond, 200, both)
	if !lineWritten() {
		t.Fatalf("the line event that waited for a token was not written within 2s of the reload")
	}
	if n := len(endsIn(api)); n != 2 {
		t.Errorf("%d ends written within 2s after a reload to 1000 QPS, want 2: the end that waited for a token still waits for the old rate's refill", n)
	}
}

// TestEndsQuietOffSaysNoMoreEnds: "A reload takes the new value at once:
// `off` says no more ends". An end decided before a reload to `quiet off`
// and not yet written must not be written after it.
func TestEndsQuietOffSaysNoMoreEnds(t *testing.T) {
	const quiet = time.Minute
	p, api, clk := newTestPipeline(t, quietConfig(100, 100, quiet))
	for range 12 {
		p.observe(ln(levelError, "errors", "upstream unhealthy", clk.Now()))
	}
	drain(p)
	var down atomic.Bool
	api.setFault(func(apiRequest) fault { return fault{unsent: down.Load()} })
	down.Store(true)
	clk.Step(quiet + handOffGrace)
	wake(p) // the end is decided; its create cannot reach the API
	if n := len(endsIn(api)); n != 0 {
		t.Fatalf("%d ends written while the API was unreachable", n)
	}
	p.apply(quietConfig(100, 100, 0), api.client) // quiet off
	down.Store(false)
	clk.Step(2 * retryMax)
	wake(p)
	if ends := endsIn(api); len(ends) != 0 {
		t.Errorf("%d ends written after a reload to quiet off: %q", len(ends), ends[0].Message)
	}
}

// TestEndsLineHandedOffBeforeQuietEndsNoStorm: a storm ends after "QUIET
// without a new line". A line logged 1 ms before the quiet elapsed, handed
// off by the listener (and so counted in lines_total) but not yet taken by
// the correlator when a writer's quiet timer fires, must keep the storm
// going. The writer looks only at the cache, decides the end, and the line
// then starts a new object: the end says the storm of 12 lines stopped at
// its last line, "none since", while a 13th came within QUIET.
func TestEndsLineHandedOffBeforeQuietEndsNoStorm(t *testing.T) {
	const quiet = time.Minute
	p, api, clk := newTestPipeline(t, quietConfig(100, 100, quiet))
	for range 12 {
		p.observe(ln(levelError, "errors", "upstream unhealthy", clk.Now()))
	}
	drain(p)
	clk.Step(quiet - time.Millisecond)
	p.lines <- ln(levelError, "errors", "upstream unhealthy", clk.Now()) // the listener's hand-off
	clk.Step(time.Millisecond)
	p.mu.Lock()
	storms := p.cache.Values()
	p.mu.Unlock()
	for _, e := range storms { // the writer whose quiet timer fired
		p.sync(e)
	}
	p.observe(<-p.lines) // the correlator takes the line
	drain(p)
	checkStormGoesOn(t, api)
}

// TestClientLimiterDoesNotHoldTheFlush: "Ends still unwritten at shutdown
// are written in the flush if their bucket has a token". The client
// CoreDNS's kubeapi plugin builds (rest.InClusterConfig or a kubeconfig,
// QPS left 0) gets client-go's default limiter, 5 requests a second with a
// burst of 10, shared by every bucket: it would let about 10 + 5 x 2 of 40
// ends whose bucket holds 100 tokens through a flush of 2 s. The buckets
// are the limit, so the client's is not used.
func TestClientLimiterDoesNotHoldTheFlush(t *testing.T) {
	const quiet, storms = time.Minute, 40
	p, api, clk := newTestPipeline(t, quietConfig(100, 100, quiet))
	for i := range storms {
		for range 12 {
			p.observe(ln(levelWarning, fmt.Sprintf("p%d", i), "upstream unhealthy", clk.Now()))
		}
	}
	drain(p)
	var down atomic.Bool
	api.setFault(func(apiRequest) fault { return fault{unsent: down.Load()} })
	down.Store(true) // the ends are decided while the API server is away
	clk.Step(quiet + handOffGrace)
	wake(p)
	if n := len(endsIn(api)); n != 0 {
		t.Fatalf("%d ends written while the API server was away", n)
	}
	// The API server is back, and CoreDNS shuts down: the flush writes the
	// ends with the client kubeapi gives, client-go's defaults.
	cs, err := kubernetes.NewForConfig(&rest.Config{Host: api.srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	var prod kubernetes.Interface = cs
	p.client.Store(&prod)
	p.stop(2 * time.Second)
	if n := len(endsIn(api)); n != storms {
		t.Errorf("%d of %d ends written in the flush with the end bucket full; client-go's default limiter (%v QPS, burst %d) held the rest back",
			n, storms, rest.DefaultQPS, rest.DefaultBurst)
	}
}

// TestSteadyStormIsNotSaidToEnd: "When one plugin logs more than 10
// distinct lines at one level within 10 minutes ..., every further new
// line of that plugin and level joins the combined event of its shape",
// and a storm ends after QUIET "without a new line". A storm of one
// distinct line a minute, one shape, never stops: from its 11th line on,
// every line has more than 10 distinct lines of its plugin within the 10
// minutes before it. The correlator's window restarts after 10 minutes
// instead, so the next 10 lines become events of their own, the combined
// event gets no line for 11 minutes, and with the default quiet of 5m it
// is said to have ended ("1 line like ..., none since") at minute 15 while
// a line of its shape still comes every minute.
func TestSteadyStormIsNotSaidToEnd(t *testing.T) {
	p, api, clk := newTestPipeline(t, quietConfig(100, 100, defaultQuiet))
	for i := range 40 {
		logStorm(p, levelError, i, 1, clk.Now())
		wake(p)
		if ends := endsIn(api); len(ends) > 0 {
			t.Errorf("minute %d: an end is said while a line of the storm's shape comes every minute: %q", i, ends[0].Message)
			break
		}
		clk.Step(time.Minute)
	}
	own := 0
	for _, e := range api.list() {
		if e.Reason == "CoreDNSError" && !strings.Contains(e.Message, combinedPrefix) {
			own++
		}
	}
	if own > combineAfter {
		t.Errorf("%d lines of the storm are events of their own, want the first %d only", own, combineAfter)
	}
}

// checkStormGoesOn fails the test if an end was said for the storm of
// CoreDNSError lines, or if its lines went into more than one object:
// a line of before its quiet kept it going.
func checkStormGoesOn(t *testing.T, api *fakeAPI) {
	t.Helper()
	for _, e := range endsIn(api) {
		t.Errorf("end said although a line came just before the quiet was up: %q", e.Message)
	}
	var objects []string
	for _, e := range api.list() {
		if e.Reason == "CoreDNSError" {
			objects = append(objects, fmt.Sprintf("%s count %d", e.Name, e.Count))
		}
	}
	if len(objects) != 1 {
		t.Errorf("the storm's lines are in %d objects, want 1: %v", len(objects), objects)
	}
}

// waitSeen waits until the correlator folded e's n-th line in.
func waitSeen(t *testing.T, p *pipeline, e *entry, n int64) {
	t.Helper()
	waitFor(t, func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return e.seen == n
	})
}
