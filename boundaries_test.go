package k8s_event

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"
	_ "unsafe" // go:linkname

	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/plugin"
	"github.com/coredns/kubeapi"
	clock "k8s.io/utils/clock"
)

// Tests at the edges of the contract's conditions: each pins a boundary
// that the other tests pass on either side of.

// stepQueue moves the fake clock by d and lets the work queue hand over
// what its timers made due, as CoreDNS's writers would.
func stepQueue(p *pipeline, clk interface{ Step(time.Duration) }, d time.Duration) {
	clk.Step(d)
	time.Sleep(20 * time.Millisecond) // the delaying queue moves due keys in a goroutine of its own
	drain(p)
}

// TestStormEndsAtExactlyQuiet: the queue's timer for a storm fires at its
// last line plus quiet and the hand-off grace to the nanosecond; the end is
// said then.
func TestStormEndsAtExactlyQuiet(t *testing.T) {
	const quiet = time.Minute
	p, api, clk := newTestPipeline(t, quietConfig(100, 100, quiet))
	logStorm(p, levelError, 0, 12, clk.Now())
	drain(p) // written: the storm waits for its quiet in the queue's timer
	stepQueue(p, clk, quiet+handOffGrace)
	if n := len(endsIn(api)); n != 1 {
		t.Fatalf("%d ends when the timer fired at exactly quiet, want 1", n)
	}
}

// TestShorterQuietEndsAtOnce: a reload to a shorter quiet looks again at
// every storm waiting in the queue's timer, and one quiet for longer than
// the new value ends at once, without waiting for the old timer.
func TestShorterQuietEndsAtOnce(t *testing.T) {
	p, api, clk := newTestPipeline(t, quietConfig(100, 100, 5*time.Minute))
	logStorm(p, levelError, 0, 12, clk.Now())
	drain(p)
	stepQueue(p, clk, 2*time.Minute)
	if n := len(endsIn(api)); n != 0 {
		t.Fatalf("%d ends after 2m of a 5m quiet", n)
	}
	p.apply(quietConfig(100, 100, time.Minute), api.client)
	drain(p)
	if n := len(endsIn(api)); n != 1 {
		t.Errorf("%d ends right after a reload to quiet 1m of a storm quiet for 2m, want 1", n)
	}
	stepQueue(p, clk, 5*time.Minute) // the old timer fires: nothing more to say
	if n := len(endsIn(api)); n != 1 {
		t.Errorf("%d ends once the old timer fired, want 1", n)
	}
}

// TestQuietOnAfterOff: storms written while quiet was off wait for nothing;
// a reload that turns quiet on looks at them, and they end once quiet.
func TestQuietOnAfterOff(t *testing.T) {
	p, api, clk := newTestPipeline(t, quietConfig(100, 100, 0))
	logStorm(p, levelError, 0, 12, clk.Now())
	drain(p)
	stepQueue(p, clk, 30*time.Second)
	p.apply(quietConfig(100, 100, time.Minute), api.client)
	drain(p)
	if n := len(endsIn(api)); n != 0 {
		t.Fatalf("%d ends 30s into a quiet of 1m", n)
	}
	stepQueue(p, clk, 30*time.Second+handOffGrace)
	if n := len(endsIn(api)); n != 1 {
		t.Errorf("%d ends once the storm was quiet for the new 1m, want 1", n)
	}
}

// TestCountOfExactlyInt32: an event whose count reaches 2^31-1 exactly is
// full: the next line goes to a new object at once, and the full one is not
// patched again for nothing.
func TestCountOfExactlyInt32(t *testing.T) {
	p, api, clk := newTestPipeline(t, testConfig(all, 100, 100, 64))
	before := readLedger()
	p.observe(ln(levelError, "errors", "long-lived", clk.Now()))
	const more = math.MaxInt32 - 1
	seeUnlogged(t, p, before, more)
	drain(p)
	p.observe(ln(levelError, "errors", "long-lived", clk.Now()))
	drain(p)
	checkLedger(t, api, before, more+2)
	creates, patches := api.writes()
	if creates != 2 || patches != 0 {
		t.Errorf("%d creates and %d patches, want 2 creates: one full at 2^31-1, one for the next line", creates, patches)
	}
}

// TestSettlingStaysWithinRoom: an evicted event whose write got no answer
// again stays settling while the settling ones fit in the cache size, its
// own place included.
func TestSettlingStaysWithinRoom(t *testing.T) {
	p, api, clk := newTestPipeline(t, testConfig(all, 100, 100, 2))
	p.writeTimeout = 50 * time.Millisecond
	api.setFault(func(apiRequest) fault { return fault{hang: true} })
	for _, m := range []string{"a", "b"} {
		p.observe(ln(levelError, "errors", m, clk.Now()))
	}
	drain(p) // both creates unanswered
	p.observe(ln(levelError, "errors", "c", clk.Now()))
	p.observe(ln(levelError, "errors", "d", clk.Now())) // a and b are evicted, settling
	drain(p)
	p.mu.Lock()
	settling := slices.Collect(func(yield func(*entry) bool) {
		for e := range p.settling {
			if !yield(e) {
				return
			}
		}
	})
	p.mu.Unlock()
	if len(settling) != 2 {
		t.Fatalf("%d settling, want 2", len(settling))
	}
	clk.Step(2 * retryMax)
	p.sync(settling[0]) // no answer again: it still may have landed
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.settling[settling[0]]; !ok || settling[0].dropped != 0 {
		t.Errorf("a settling event unanswered again was dropped (%d lines) with 2 settling in a cache of 2", settling[0].dropped)
	}
}

// TestStartupTakesKubeapiClient: a block with kubeapi starts with its
// client; a block without it is refused, named by its zone and port.
func TestStartupTakesKubeapiClient(t *testing.T) {
	saved := dnsserver.Directives
	dnsserver.Directives = append(slices.Clone(saved), "kubeapi")
	t.Cleanup(func() { dnsserver.Directives = saved })
	saveGlobal := global
	global = &broadcaster{clock: clock.RealClock{}}
	t.Cleanup(func() { global = saveGlobal })

	api := newFakeAPI(t, clock.RealClock{})
	block := &dnsserver.Config{Zone: ".", Port: "1053"}
	registerHandler(block, &kubeapi.KubeAPI{Client: api.client}) // as CoreDNS does when it builds the block's chain
	inst := newInstance(t, api, "k8s_event")
	inst.client = nil
	inst.blocks = []*dnsserver.Config{block}
	if err := inst.startup(); err != nil {
		t.Fatalf("startup with kubeapi: %v", err)
	}
	t.Cleanup(func() { global.detach(inst) })
	if inst.client != api.client {
		t.Error("the instance does not use the kubeapi client of its block")
	}

	bare := newInstance(t, api, "k8s_event")
	bare.client = nil
	bare.blocks = []*dnsserver.Config{{Zone: "example.org.", Port: "53"}}
	err := bare.startup()
	if err == nil || !strings.Contains(err.Error(), "(example.org.:53)") {
		t.Errorf("startup without kubeapi: %v, want an error naming example.org.:53", err)
	}
	if got := blockName(nil); got != "?" {
		t.Errorf("blockName(nil) = %q", got)
	}
}

//go:linkname registerHandler github.com/coredns/coredns/core/dnsserver.(*Config).registerHandler
func registerHandler(*dnsserver.Config, plugin.Handler)

// TestShrinkTrimsSettlingToTheNewSize: a reload that shrinks the cache
// drops settling events until they fit the new size, and no more.
func TestShrinkTrimsSettlingToTheNewSize(t *testing.T) {
	p, api, clk := newTestPipeline(t, testConfig(all, 100, 100, 3))
	p.writeTimeout = 50 * time.Millisecond
	api.setFault(func(apiRequest) fault { return fault{hang: true} })
	for _, m := range []string{"a", "b", "c"} {
		p.observe(ln(levelError, "errors", m, clk.Now()))
	}
	drain(p) // three creates unanswered
	api.setFault(func(apiRequest) fault { return fault{} })
	for _, m := range []string{"d", "e", "f"} {
		p.observe(ln(levelError, "errors", m, clk.Now())) // a, b and c are evicted, settling
	}
	p.mu.Lock()
	settling := len(p.settling)
	p.mu.Unlock()
	if settling != 3 {
		t.Fatalf("%d settling, want 3", settling)
	}
	p.apply(testConfig(all, 100, 100, 2), api.client)
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.settling) != 2 {
		t.Errorf("%d settling after a reload to a cache of 2, want 2", len(p.settling))
	}
}

// TestDoubtOfDroppedLines: lines dropped while the latest write of their
// event got no answer may be in the API: doubtful counts those the write
// carried beyond what an answered write did, no more and no fewer.
func TestDoubtOfDroppedLines(t *testing.T) {
	p, _, _ := newTestPipeline(t, testConfig(all, 100, 100, 4))
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, tt := range []struct {
		seen, carried, doubt, want int64
	}{
		{seen: 6, carried: 1, doubt: 4, want: 3}, // the unanswered write carried lines 2 to 4
		{seen: 6, carried: 2, doubt: 0, want: 0}, // every write answered
		{seen: 3, carried: 1, doubt: 6, want: 2}, // no more than were pending
	} {
		e := &entry{tally: tally{seen: tt.seen, carried: tt.carried}, doubt: tt.doubt}
		pendingLines.Add(float64(e.pending()))
		before := p.doubtful
		p.drop(e, dropEvicted)
		if got := p.doubtful - before; got != tt.want {
			t.Errorf("seen %d, carried %d, doubt %d: doubtful rose by %d, want %d", tt.seen, tt.carried, tt.doubt, got, tt.want)
		}
	}
}

// TestEndsWaitingAreCapped: at most CACHESIZE ends wait to be written; a
// storm that ends beyond that starts afresh without one.
func TestEndsWaitingAreCapped(t *testing.T) {
	const quiet = time.Minute
	cfg := quietConfig(100, 100, quiet)
	cfg.cacheSize = 2
	p, api, clk := newTestPipeline(t, cfg)
	for round := range 2 { // two storms, then two more that evict them
		api.setFault(nil)
		for i := range 2 {
			for range 12 {
				p.observe(ln(levelWarning, fmt.Sprintf("p%d-%d", round, i), "upstream unhealthy", clk.Now()))
			}
		}
		drain(p)
		api.setFault(func(apiRequest) fault { return fault{unsent: true} }) // the ends cannot be written
		clk.Step(quiet + handOffGrace)
		wake(p)
	}
	p.mu.Lock()
	waiting := len(p.ends)
	p.mu.Unlock()
	if waiting != cfg.cacheSize {
		t.Errorf("%d ends waiting after four storms ended with the API refusing them, want CACHESIZE %d", waiting, cfg.cacheSize)
	}
}

// TestShorterQuietEndsRepeatedLine: the look again of a reload to a
// shorter quiet also takes a storm of one line repeated, not combined.
func TestShorterQuietEndsRepeatedLine(t *testing.T) {
	p, api, clk := newTestPipeline(t, quietConfig(100, 100, 5*time.Minute))
	for range 12 {
		p.observe(ln(levelError, "forward", "upstream unhealthy", clk.Now()))
	}
	drain(p)
	stepQueue(p, clk, 2*time.Minute)
	p.apply(quietConfig(100, 100, time.Minute), api.client)
	drain(p)
	if n := len(endsIn(api)); n != 1 {
		t.Errorf("%d ends right after a reload to quiet 1m of a repeated line quiet for 2m, want 1", n)
	}
}
