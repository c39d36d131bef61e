package k8s_event

import (
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
)

// holdFirstCreate makes the first create the fake API sees wait until
// release is closed, then answers it 429: the write is in flight meanwhile,
// and it is never applied. entered is closed once that create is in flight.
func holdFirstCreate(api *fakeAPI) (entered, release chan struct{}) {
	return holdFirstCreateThen(api, fault{code: 429})
}

// holdFirstCreateThen is holdFirstCreate with the fault f once released.
func holdFirstCreateThen(api *fakeAPI, f fault) (entered, release chan struct{}) {
	entered, release = make(chan struct{}), make(chan struct{})
	var once sync.Once
	api.setFault(func(r apiRequest) fault {
		if r.verb != "create" {
			return fault{}
		}
		held := false
		once.Do(func() { held = true })
		if !held {
			return fault{}
		}
		close(entered)
		<-release
		return f
	})
	return entered, release
}

// TestEndsQuietOffWhileEndInFlight: "A reload takes the new value at
// once: `off` says no more ends", and the fault models check that no end
// is written with `quiet off`. An end whose create is in flight when the
// reload to `quiet off` comes, and which then fails (429: not applied),
// must not be tried again and written afterwards.
func TestEndsQuietOffWhileEndInFlight(t *testing.T) {
	const quiet = time.Minute
	p, api, clk := newTestPipeline(t, quietConfig(100, 100, quiet))
	for range 12 {
		p.observe(ln(levelError, "errors", "upstream unhealthy", clk.Now()))
	}
	drain(p)
	entered, release := holdFirstCreate(api)
	clk.Step(quiet + handOffGrace)
	done := make(chan struct{})
	go func() { defer close(done); wake(p) }() // the end is decided, its create goes out
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the end's create never reached the API")
	}
	p.apply(quietConfig(100, 100, 0), api.client) // quiet off while the end's create is in flight
	close(release)                                // the create is answered 429: not applied
	<-done
	api.setFault(nil)
	clk.Step(2 * retryMax)
	wake(p)
	runQueue(p, clk, time.Second, 5, func() bool { return false })
	if ends := endsIn(api); len(ends) != 0 {
		t.Errorf("%d ends written after a reload to quiet off (the end's create was in flight at the reload and failed): %q", len(ends), ends[0].Message)
	}
}

// TestEndsShrinkWhileEndInFlight: "At most CACHESIZE ends wait to be
// written"; a reload that shrinks CACHESIZE "keeps the oldest CACHESIZE".
// Two ends wait, the newer one's create in flight; a reload to CACHESIZE 1
// keeps the older one and leaves the newer to its write, which fails: two
// ends then wait with CACHESIZE 1, and both are written once the API
// server answers.
func TestEndsShrinkWhileEndInFlight(t *testing.T) {
	const quiet = time.Minute
	cfg := quietConfig(100, 100, quiet)
	cfg.cacheSize = 4
	p, api, clk := newTestPipeline(t, cfg)
	for range 12 {
		p.observe(ln(levelWarning, "p0", "upstream unhealthy", clk.Now()))
	}
	drain(p)
	api.setFault(func(r apiRequest) fault {
		if r.verb == "create" {
			return fault{code: 429, retryAfter: 3600}
		}
		return fault{}
	})
	clk.Step(quiet + handOffGrace)
	wake(p) // the first storm's end is decided; its create is asked to wait an hour
	p.mu.Lock()
	waiting := len(p.ends)
	p.mu.Unlock()
	if waiting != 1 {
		t.Fatalf("%d ends waiting, want 1", waiting)
	}
	api.setFault(nil)

	// A second storm, which ends a minute later; the first end backs off.
	for range 12 {
		p.observe(ln(levelWarning, "p1", "upstream unhealthy", clk.Now()))
	}
	drain(p)
	entered, release := holdFirstCreate(api)
	clk.Step(quiet + handOffGrace)
	done := make(chan struct{})
	go func() {
		defer close(done)
		drain(p)
		p.mu.Lock()
		var storm *entry
		for _, e := range p.cache.Values() {
			if e.key.plugin == "plugin/p1: " {
				storm = e
			}
		}
		p.mu.Unlock()
		p.sync(storm) // its quiet timer: the end is decided
		drain(p)      // and its create goes out
	}()
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the second end's create never reached the API")
	}
	small := cfg
	small.cacheSize = 1
	p.apply(small, api.client)
	close(release) // 429: not applied
	<-done
	api.setFault(nil)
	p.mu.Lock()
	waiting = len(p.ends)
	p.mu.Unlock()
	if waiting > small.cacheSize {
		t.Errorf("%d ends waiting after a reload to CACHESIZE %d (one was in flight at the reload and failed), want at most %d", waiting, small.cacheSize, small.cacheSize)
	}
	clk.Step(2 * time.Hour)
	wake(p)
	if n := len(endsIn(api)); n > small.cacheSize {
		t.Errorf("%d ends written after the API came back, more than the %d that may wait", n, small.cacheSize)
	}
}

// TestEndsLineTakenNotYetFoldedKeepsStorm: an end waits "for a line logged
// just before then that is still on its way to the correlator". The
// correlator has taken a line logged 1 ms before the quiet was up off the
// hand-off queue and waits for the pipeline's lock to fold it in; the
// writer whose quiet timer fired holds that lock. The queue is empty: no
// end may be decided then, or the line starts a second object.
func TestEndsLineTakenNotYetFoldedKeepsStorm(t *testing.T) {
	const quiet = time.Minute
	p, api, clk, storm := writtenStorm(t, quiet)
	p.mu.Lock()
	clk.Step(quiet - time.Millisecond)
	p.lines <- ln(levelError, "errors", "upstream unhealthy", clk.Now()) // the listener's hand-off
	deadline := time.Now().Add(10 * time.Second)
	for len(p.lines) > 0 { // the correlator took it, and waits for the lock
		if time.Now().After(deadline) {
			p.mu.Unlock()
			t.Fatal("the correlator never took the line")
		}
		time.Sleep(time.Millisecond)
	}
	clk.Step(time.Millisecond)
	// The writer that holds the storm, its quiet timer fired: as sync does
	// once the entry has nothing pending.
	_, end := p.watchQuiet(storm, clk.Now())
	p.mu.Unlock()
	if end != nil {
		p.queue.Add(end)
	}
	waitSeen(t, p, storm, 13)
	drain(p)
	checkStormGoesOn(t, api)
}

// listenerClock is a fake clock that, once armed, holds the listener
// between its reading of the time and its hand-off of the line: the line
// is logged at the time read, and on its way to the correlator.
type listenerClock struct {
	*clocktesting.FakeClock
	armed        atomic.Bool
	read, resume chan struct{}
}

func (c *listenerClock) Now() time.Time {
	now := c.FakeClock.Now()
	if c.armed.Load() && calledFromTake() && c.armed.CompareAndSwap(true, false) {
		close(c.read)
		<-c.resume
	}
	return now
}

func calledFromTake() bool {
	pcs := make([]uintptr, 16)
	frames := runtime.CallersFrames(pcs[:runtime.Callers(2, pcs)])
	for {
		f, more := frames.Next()
		if strings.HasSuffix(f.Function, "(*pipeline).take") {
			return true
		}
		if !more {
			return false
		}
	}
}

// TestEndsLineLoggedBeforeQuietInListenerKeepsStorm: an end waits "for a
// line logged just before then that is still on its way to the
// correlator". A line logged 1 ms before the quiet was up, whose listener
// has read the time and not yet put the line on the hand-off queue when
// the writer's quiet timer fires: the queue is empty, and no end may be
// decided ("none since"), or the line starts a second object.
func TestEndsLineLoggedBeforeQuietInListenerKeepsStorm(t *testing.T) {
	const quiet = time.Minute
	clk := &listenerClock{FakeClock: clocktesting.NewFakeClock(epoch), read: make(chan struct{}), resume: make(chan struct{})}
	api := newFakeAPI(t, clk.FakeClock)
	p := newPipeline(quietConfig(100, 100, quiet), api.client, testPod(), clk)
	t.Cleanup(func() { p.queue.ShutDown(); p.cancel() })
	for range 12 {
		p.observe(ln(levelError, "errors", "upstream unhealthy", clk.Now()))
	}
	drain(p)
	go p.correlate()
	t.Cleanup(func() { close(p.lines); <-p.correlatorDone })
	p.mu.Lock()
	storm := p.cache.Values()[0]
	p.mu.Unlock()

	clk.Step(quiet - time.Millisecond)
	clk.armed.Store(true)
	logged := make(chan struct{})
	go func() { defer close(logged); p.Error("plugin/errors: ", "upstream unhealthy") }()
	select {
	case <-clk.read: // logged now, 1 ms before the quiet is up
	case <-time.After(10 * time.Second):
		t.Fatal("the listener never read the time")
	}
	clk.Step(time.Millisecond)
	p.sync(storm) // the storm's quiet timer fires
	close(clk.resume)
	<-logged
	waitSeen(t, p, storm, 13)
	drain(p)
	checkStormGoesOn(t, api)
}

// TestEndsLineOutOfOrderInHandOffKeepsStorm: an end waits "for a line
// logged just before then that is still on its way to the correlator". Two
// goroutines log: one a line of the storm 1 ms before its quiet is up, the
// other a line of another plugin at the moment it is up, and the second
// puts its line on the hand-off queue first. Once the correlator took that
// one, the storm's line is still on the queue, and the latest time the
// correlator saw is not before the quiet was up: no end may be decided.
func TestEndsLineOutOfOrderInHandOffKeepsStorm(t *testing.T) {
	const quiet = time.Minute
	p, api, clk, storm := writtenStorm(t, quiet)

	clk.Step(quiet - time.Millisecond)
	before := clk.Now() // the storm's line is logged
	clk.Step(time.Millisecond)
	p.lines <- ln(levelWarning, "forward", "a line of another plugin", clk.Now()) // handed off first
	deadline := time.Now().Add(10 * time.Second)
	for {
		p.mu.Lock()
		seen := p.observed
		p.mu.Unlock()
		if seen.Equal(clk.Now()) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the correlator never took the other plugin's line")
		}
		time.Sleep(time.Millisecond)
	}
	p.mu.Lock()
	p.lines <- ln(levelError, "errors", "upstream unhealthy", before) // the storm's line, handed off second
	_, end := p.watchQuiet(storm, clk.Now())                          // the writer whose quiet timer fired
	p.mu.Unlock()
	if end != nil {
		p.queue.Add(end)
	}
	deadline = time.Now().Add(10 * time.Second)
	for {
		p.mu.Lock()
		seen := storm.seen
		p.mu.Unlock()
		if seen == 13 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the correlator never folded the storm's line in")
		}
		time.Sleep(time.Millisecond)
	}
	drain(p)
	checkStormGoesOn(t, api)
}

// writtenStorm returns a pipeline whose storm of one repeated error line is
// written and waits for its quiet, with the correlator running.
func writtenStorm(t *testing.T, quiet time.Duration) (*pipeline, *fakeAPI, *clocktesting.FakeClock, *entry) {
	t.Helper()
	p, api, clk := newTestPipeline(t, quietConfig(100, 100, quiet))
	for range 12 {
		p.observe(ln(levelError, "errors", "upstream unhealthy", clk.Now()))
	}
	drain(p)
	go p.correlate()
	t.Cleanup(func() { close(p.lines); <-p.correlatorDone })
	p.mu.Lock()
	defer p.mu.Unlock()
	return p, api, clk, p.cache.Values()[0]
}
