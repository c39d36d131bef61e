package k8s_event

import (
	"fmt"
	"math"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
	_ "unsafe" // for go:linkname

	"github.com/coredns/caddy"
	"k8s.io/utils/clock"
)

// Edges of the accounting contract where writers, reloads and signals meet.

// TestShrinkKeepsSettlingInFlight: a reload that shrinks the cache must not
// drop the lines of a settling event whose write is in flight: the write
// lands with them.
func TestShrinkKeepsSettlingInFlight(t *testing.T) {
	p, api, clk := newTestPipeline(t, testConfig(all, 100, 100, 2))
	p.writeTimeout = 50 * time.Millisecond
	before := readLedger()
	var mu sync.Mutex
	mode := "hang"
	api.setFault(func(apiRequest) fault {
		mu.Lock()
		defer mu.Unlock()
		switch mode {
		case "hang":
			return fault{hang: true}
		case "slow":
			return fault{delay: 300 * time.Millisecond}
		}
		return fault{}
	})
	for _, m := range []string{"a", "b"} {
		for range 4 {
			p.observe(ln(levelError, "errors", m, clk.Now()))
		}
	}
	drain(p) // both creates applied, unanswered
	mu.Lock()
	mode = ""
	mu.Unlock()
	p.observe(ln(levelError, "errors", "c", clk.Now()))
	p.observe(ln(levelError, "errors", "d", clk.Now())) // a and b are evicted, settling
	drain(p)
	p.mu.Lock()
	settling := make([]*entry, 0, 2)
	for e := range p.settling {
		settling = append(settling, e)
	}
	p.mu.Unlock()
	if len(settling) != 2 {
		t.Fatalf("%d settling, want 2", len(settling))
	}
	mu.Lock()
	mode = "slow"
	mu.Unlock()
	p.writeTimeout = 10 * time.Second
	clk.Step(retryMax * 2)
	var wg sync.WaitGroup
	for _, e := range settling {
		wg.Go(func() { p.sync(e) })
	}
	waitFor(t, func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return settling[0].inflight && settling[1].inflight
	})
	p.apply(testConfig(all, 100, 100, 1), api.client)
	wg.Wait()
	mu.Lock()
	mode = ""
	mu.Unlock()
	drain(p)
	checkLedger(t, api, before, 10)
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, e := range settling {
		if e.dropped != 0 {
			t.Errorf("%q: %d lines dropped (evicted) although its write landed with them", e.message, e.dropped)
		}
	}
}

// waitFor waits until cond holds, for at most 10 s.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition never met")
		}
		time.Sleep(time.Millisecond)
	}
}

//go:linkname purgeEventHooks github.com/coredns/caddy.purgeEventHooks
func purgeEventHooks()

//go:linkname cloneEventHooks github.com/coredns/caddy.cloneEventHooks
func cloneEventHooks() *sync.Map

//go:linkname restoreEventHooks github.com/coredns/caddy.restoreEventHooks
func restoreEventHooks(*sync.Map)

// TestSIGUSR1KeepsLameduck: caddy's SIGUSR1 handler purges the event hooks
// before it restarts, and restores them only when the restart fails. After
// a SIGUSR1 reload, SIGTERM must still keep the pipeline through the
// lameduck.
func TestSIGUSR1KeepsLameduck(t *testing.T) {
	saved := cloneEventHooks()
	t.Cleanup(func() { restoreEventHooks(saved); global.exiting.Store(false) })
	b := newTestBroadcaster(t)
	client := newFakeAPI(t, clock.RealClock{})
	old := newInstance(t, client, "k8s_event")
	if err := b.attach(old); err != nil {
		t.Fatal(err)
	}
	purgeEventHooks() // SIGUSR1, before the restart
	inst := newInstance(t, client, "k8s_event")
	if err := b.attach(inst); err != nil { // the new instance's startup
		t.Fatal(err)
	}
	b.shutdown(old)
	caddy.EmitEvent(caddy.ShutdownEvent, nil) // SIGTERM
	if !global.exiting.Load() {
		t.Fatal("after a SIGUSR1 reload, SIGTERM is not seen: the shutdown hook would detach the instance before the lameduck")
	}
}

// TestCreateAnswered5xxButCommitted: kube-apiserver answers 500 when etcd
// times out, and etcd may have committed. The retry must find the event,
// not make a second one.
func TestCreateAnswered5xxButCommitted(t *testing.T) {
	for _, code := range []int{500, 503, 504} {
		t.Run(http.StatusText(code), func(t *testing.T) {
			p, api, clk := newTestPipeline(t, testConfig(all, 100, 100, 64))
			before := readLedger()
			var once sync.Once
			api.setFault(func(r apiRequest) (f fault) {
				once.Do(func() { f = fault{code: code, apply: true} })
				return f
			})
			p.observe(ln(levelError, "errors", "committed", clk.Now()))
			drain(p)
			clk.Step(retryMax * 2)
			due(p)
			if ev := only(t, events(t, api)); ev.Count != 1 {
				t.Errorf("count %d, want 1", ev.Count)
			}
			checkLedger(t, api, before, 1)
		})
	}
}

// TestCountPastInt32: an event's count is an int32. Lines past it go to a
// new event; none is booked as carried that no count holds.
func TestCountPastInt32(t *testing.T) {
	p, api, clk := newTestPipeline(t, testConfig(all, 100, 100, 64))
	before := readLedger()
	p.observe(ln(levelError, "errors", "long-lived", clk.Now()))
	const more = math.MaxInt32 + 4
	seeUnlogged(t, p, before, more)
	drain(p)
	clk.Step(time.Second)
	due(p)
	d := checkLedger(t, api, before, more+1)
	if d.pending != 0 {
		t.Errorf("pending %v, want 0", d.pending)
	}
	if n := len(events(t, api)); n != 2 {
		t.Errorf("%d events, want 2: one full at 2^31-1, one with the rest", n)
	}
}

// TestLookupPendingIsNotTheEntrysFailure: without COREDNS_POD_UID, a create
// that finds the pod lookup not yet due waits for the lookup, and is not
// backed off as if its own write had failed.
func TestLookupPendingIsNotTheEntrysFailure(t *testing.T) {
	p, api, clk := newTestPipeline(t, testConfig(all, 100, 100, 64))
	ref := testRef
	ref.UID = ""
	p.pod.ref.Store(&ref)
	p.pod.lookup.Store(true)
	api.setFault(func(r apiRequest) fault {
		if r.resource == "pods" {
			return fault{code: 503}
		}
		return fault{}
	})
	for _, m := range []string{"a", "b", "c"} {
		p.observe(ln(levelError, "errors", m, clk.Now()))
	}
	// A ten-minute outage of the pod lookup, stepped by the second.
	for range 600 {
		due(p)
		clk.Step(time.Second)
	}
	p.mu.Lock()
	p.pod.mu.Lock()
	for _, e := range p.cache.Values() {
		if e.failures > 0 || e.retryAt.After(p.pod.nextTry) {
			t.Errorf("event %q booked %d failures of its own while the lookup was pending, next try %v after the lookup's",
				e.message, e.failures, e.retryAt.Sub(p.pod.nextTry))
		}
	}
	p.pod.mu.Unlock()
	p.mu.Unlock()
	api.setFault(nil)
	pod := corev1Pod
	pod.Name, pod.Namespace = testRef.Name, testRef.Namespace
	api.addPod(&pod)
	end := clk.Now()
	for len(events(t, api)) < 3 && clk.Since(end) < 5*time.Minute {
		due(p)
		clk.Step(time.Second)
	}
	if took := clk.Since(end); took > retryMax+retryMax/5 {
		t.Errorf("every event written %v after the outage, promised within %v", took, retryMax+retryMax/5)
	}
}

// TestFlushHonoursRetryAfter: a 429 asking for longer than the flush has
// left is not retried in the flush: the line is dropped with its cause.
func TestFlushHonoursRetryAfter(t *testing.T) {
	p, api, clk := newTestPipeline(t, testConfig(all, 100, 100, 64))
	p.flushPause = 10 * time.Millisecond
	before := readLedger()
	api.setFault(func(apiRequest) fault { return fault{code: http.StatusTooManyRequests, retryAfter: 30} })
	p.observe(ln(levelError, "errors", "busy", clk.Now()))
	p.stop(2 * time.Second)
	if c, _ := api.writes(); c != 1 {
		t.Errorf("%d creates in a 2 s flush after a 429 asking for 30 s, want 1", c)
	}
	d := checkLedger(t, api, before, 1)
	if d.dropped[dropShutdown] != 1 {
		t.Errorf("dropped %v, want 1 at shutdown", d.dropped)
	}
}

// TestCombinedMessageStartsWithPlugin: routing on the message prefix
// "^plugin/NAME: " must see combined events too, those of a storm.
func TestCombinedMessageStartsWithPlugin(t *testing.T) {
	p, api, clk := newTestPipeline(t, testConfig(all, 100, 100, 64))
	for i := range combineAfter + 2 {
		p.observe(ln(levelError, "forward", fmt.Sprint("timeout after ", i), clk.Now()))
	}
	drain(p)
	combined := 0
	for _, ev := range events(t, api) {
		if !strings.HasPrefix(ev.Message, "plugin/forward: ") {
			t.Errorf("message %q does not start with the plugin", ev.Message)
		}
		if strings.Contains(ev.Message, combinedPrefix) {
			combined++
		}
	}
	if combined != 1 {
		t.Errorf("%d combined events, want 1", combined)
	}
}

// TestClockSteppedBack: a wall clock stepped back gives later lines earlier
// times; lastTimestamp never moves back, nor before firstTimestamp.
func TestClockSteppedBack(t *testing.T) {
	p, api, clk := newTestPipeline(t, testConfig(all, 100, 100, 64))
	at := clk.Now()
	p.observe(ln(levelError, "errors", "stepped", at))
	drain(p)
	p.observe(ln(levelError, "errors", "stepped", at.Add(-time.Hour)))
	drain(p)
	ev := only(t, events(t, api))
	if ev.Count != 2 || ev.LastTimestamp.Time.Before(ev.FirstTimestamp.Time) || !ev.LastTimestamp.Time.Equal(at) {
		t.Errorf("count %d, first %v, last %v; want 2 and both at %v", ev.Count, ev.FirstTimestamp, ev.LastTimestamp, at)
	}
}

// seeUnlogged books n more lines of every cached event as seen and
// pending, without logging each; the pending ones are taken back when the
// test ends.
func seeUnlogged(t *testing.T, p *pipeline, before ledger, n int64) {
	t.Helper()
	p.mu.Lock()
	for _, e := range p.cache.Values() {
		e.seen += n
	}
	p.mu.Unlock()
	pendingLines.Add(float64(n))
	t.Cleanup(func() { pendingLines.Sub(readLedger().since(before).pending) })
}
