package k8s_event

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/utils/clock"
)

// reachedOf counts the requests for events of reason that reached the
// server: with every request hanging, those still out.
func (api *fakeAPI) reachedOf(reason string) int {
	api.mu.Lock()
	defer api.mu.Unlock()
	n := 0
	for _, r := range api.requests {
		if r.reason == reason {
			n++
		}
	}
	return n
}

// Requests in flight per bucket are capped at maxInFlight, whatever BURST
// is: fatal lines logged at once from many goroutines, against an API
// server that answers nothing, must not have more than maxInFlight
// requests of the fatal bucket out at once.
func TestFatalRequestsInFlightAreCapped(t *testing.T) {
	const n = 3 * maxInFlight
	p, api, _ := newTestPipeline(t, testConfig(all, 1, n, 64))
	p.fatalTimeout = time.Second
	api.setFault(func(apiRequest) fault { return fault{hang: true} })
	p.start()
	defer p.stop(time.Second)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.listener.Fatalf("plugin/reload: ", "cannot go on %d", i)
		}()
	}
	// Every fatal line's create is out, hanging, until fatalTimeout.
	deadline := time.Now().Add(800 * time.Millisecond)
	peak := 0
	for time.Now().Before(deadline) {
		peak = max(peak, api.reachedOf(levelFatal.reason()))
		time.Sleep(5 * time.Millisecond)
	}
	wg.Wait()
	if peak > maxInFlight {
		t.Errorf("%d requests of the fatal bucket out at once against a silent API server, want at most maxInFlight = %d", peak, maxInFlight)
	}
}

// countingClock is the real clock, counting the timers armed on it.
type countingClock struct {
	clock.RealClock
	timers atomic.Int64
}

func (c *countingClock) NewTimer(d time.Duration) clock.Timer {
	c.timers.Add(1)
	return c.RealClock.NewTimer(d)
}

// The scheduler's goroutine sleeps while an event waits for a token: at
// the slowest rate the Corefile accepts, an event that found its bucket
// empty arms a timer for when a token comes, not one that fires at once,
// again and again, with the goroutine spinning.
func TestGoroutineSleepsWhileEventWaitsAtSlowRate(t *testing.T) {
	clk := &countingClock{}
	api := newFakeAPI(t, clk)
	p := newPipeline(testConfig(all, 1e-12, 1, 64), api.client, testPod(), clk)
	t.Cleanup(p.cancel)
	p.start()
	defer p.stop(100 * time.Millisecond)
	p.listener.Errorf("plugin/errors: ", "first")
	p.listener.Errorf("plugin/errors: ", "second, waits for a token")
	time.Sleep(200 * time.Millisecond)
	if n := clk.timers.Load(); n > 10 {
		t.Errorf("%d timers armed in 200 ms while one event waits for a token at QPS 1e-12: the goroutine spins", n)
	}
}
