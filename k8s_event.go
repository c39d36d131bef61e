// Package k8s_event is a CoreDNS plugin that turns CoreDNS's log lines into Kubernetes Events on
// its pod, so that `kubectl get events` and `kubectl describe pod` show what CoreDNS logged.
//
// Only the listener runs on the DNS path; one goroutine owns everything else that decides what to
// write, and writers only do I/O:
//
//	listener (hook.go)        level test, format, non-blocking hand-off
//	pipeline (pipeline.go)    the scheduler's goroutine, the writers', the fatal path, stop
//	scheduler (scheduler.go)  what to send next: backoff, Retry-After, settling, shutdown
//	  correlator.go           repeats counted, storms combined by shape (shape.go) and by
//	                          member (hitters.go), within a budget of new events
//	  cache.go, queue.go      eviction by information; the order of tokens
//	  ratelimit.go, end.go    a token bucket per reason; when a storm is over
//	  pod.go                  the pod the events are about, and its UID
//	writers (writer.go)       one HTTP request each, and what came of it
//
// Events are built in event.go; only account.go moves lines between seen, carried and dropped.
// One pipeline serves the whole process, whatever the number of server blocks and across reloads:
// the broadcaster below attaches caddy instances to it and stops it when the last one is gone.
package k8s_event

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coredns/caddy"
	"github.com/coredns/coredns/core/dnsserver"
	clog "github.com/coredns/coredns/plugin/pkg/log"
	"github.com/coredns/kubeapi"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/clock"
)

// flushTimeout bounds how long the final shutdown waits for pending events.
const flushTimeout = 5 * time.Second

// instance is the k8s_event state of one caddy instance (one Corefile): the
// merged settings of its server blocks and the API client of the first one.
type instance struct {
	mu     sync.Mutex
	cfg    config
	blocks []*dnsserver.Config
	client kubernetes.Interface
}

type instanceKey struct{}

// instanceOf returns the state of the instance that c configures, creating it for the first block.
func instanceOf(c *caddy.Controller) *instance {
	if inst, ok := c.Get(instanceKey{}).(*instance); ok {
		return inst
	}
	inst := &instance{}
	c.Set(instanceKey{}, inst)
	return inst
}

// addBlock merges one block's settings. It returns the instance when this was
// the first block, nil otherwise, so that hooks are wired once per instance.
//
// Levels are the union over all blocks. The rate is process-wide: a block without a rate line takes
// the rate of one that has it, and two different rate lines are an error. So is quiet.
func (inst *instance) addBlock(cfg config, block *dnsserver.Config) (*instance, error) {
	inst.mu.Lock()
	defer inst.mu.Unlock()
	first := len(inst.blocks) == 0
	switch {
	case first:
		inst.cfg = cfg
	case cfg.rateSet && inst.cfg.rateSet && !sameRate(cfg, inst.cfg):
		return nil, fmt.Errorf("rate %g %d %d conflicts with rate %g %d %d of another server "+
			"block: the rate is process-wide",
			cfg.qps, cfg.burst, cfg.cacheSize, inst.cfg.qps, inst.cfg.burst, inst.cfg.cacheSize)
	case cfg.quietSet && inst.cfg.quietSet && cfg.quiet != inst.cfg.quiet:
		return nil, fmt.Errorf("quiet %s conflicts with quiet %s of another server block: quiet "+
			"is process-wide",
			quietString(cfg.quiet), quietString(inst.cfg.quiet))
	case cfg.fleetSet && inst.cfg.fleetSet && !sameFleet(cfg, inst.cfg):
		return nil, fmt.Errorf("fleet %g %d conflicts with fleet %g %d of another server block: "+
			"fleet is process-wide",
			cfg.fleetQPS, cfg.fleetBurst, inst.cfg.fleetQPS, inst.cfg.fleetBurst)
	default:
		if cfg.fleetSet && !inst.cfg.fleetSet {
			inst.cfg.fleetQPS, inst.cfg.fleetBurst = cfg.fleetQPS, cfg.fleetBurst
			inst.cfg.fleetSet = true
		}
		if cfg.quietSet && !inst.cfg.quietSet {
			inst.cfg.quiet, inst.cfg.quietSet = cfg.quiet, true
		}
		inst.cfg.levels |= cfg.levels
		if cfg.rateSet && !inst.cfg.rateSet {
			inst.cfg.qps, inst.cfg.burst, inst.cfg.cacheSize, inst.cfg.rateSet = cfg.qps,
				cfg.burst, cfg.cacheSize, true
		}
	}
	inst.blocks = append(inst.blocks, block)
	if first {
		return inst, nil
	}
	return nil, nil
}

func sameFleet(a, b config) bool {
	return a.fleetQPS == b.fleetQPS && a.fleetBurst == b.fleetBurst
}

func sameRate(a, b config) bool {
	return a.qps == b.qps && a.burst == b.burst && a.cacheSize == b.cacheSize
}

// startup resolves the API client of every block that enables k8s_event and
// attaches the instance to the process-wide pipeline.
func (inst *instance) startup() error {
	inst.mu.Lock()
	for _, b := range inst.blocks {
		client, err := kubeapi.Client(b)
		if err != nil || client == nil {
			inst.mu.Unlock()
			return fmt.Errorf("%s: the kubeapi plugin must be enabled in the same server block "+
				"(%s:%s)", pluginName, b.Zone, b.Port)
		}
		if inst.client == nil {
			inst.client = client
		}
	}
	inst.mu.Unlock()
	return global.attach(inst)
}

func (inst *instance) shutdown() error { global.shutdown(inst); return nil }

// restartFailed runs on the old instance when a reload failed: the new
// instance may have attached before failing, and none of its hooks will run.
func (inst *instance) restartFailed() error { global.forgetAfter(inst); return nil }

func (inst *instance) settings() (config, kubernetes.Interface) {
	inst.mu.Lock()
	defer inst.mu.Unlock()
	return inst.cfg, inst.client
}

// broadcaster owns the process-wide pipeline and the instances attached to it.
type broadcaster struct {
	mu       sync.Mutex
	attached []*instance // in the order they started; the newest one's settings apply
	p        *pipeline
	clock    clock.WithTicker
	// exiting is set when the process was told to stop (SIGTERM, SIGINT).
	exiting atomic.Bool
}

var global = &broadcaster{clock: clock.RealClock{}}

// On SIGTERM caddy runs every shutdown hook, then the final ones (the health plugin's lameduck
// among them, while the servers still answer and log), then the process-exit hooks, and then stops
// the servers. So once the process is exiting, the pipeline outlives the shutdown hooks and stops
// in a process-exit hook: what CoreDNS logs through its lameduck is written too.
//
// caddy's SIGUSR1 handler purges every event hook before it restarts and restores them only when
// the restart fails, so the hook is registered again by each instance that attaches.
func init() {
	registerExitingHook()
	caddy.OnProcessExit = append(caddy.OnProcessExit, global.exit)
}

// registerExitingHook registers the hook that tells the process is exiting, unless it is there.
func registerExitingHook() {
	defer func() {
		// caddy has no look-up of hooks, and panics on a second registration
		// under one name: that one is the hook already in place.
		_ = recover()
	}()
	caddy.RegisterEventHook(pluginName, exitingHook)
}

func exitingHook(ev caddy.EventName, _ any) error {
	if ev == caddy.ShutdownEvent {
		global.exiting.Store(true)
	}
	return nil
}

// shutdown is an instance's shutdown hook: on a reload it detaches the old
// instance; when the process exits, exit stops the pipeline later.
func (b *broadcaster) shutdown(inst *instance) {
	if !b.exiting.Load() {
		b.detach(inst)
	}
}

// exit detaches every instance, which stops the pipeline and flushes it.
func (b *broadcaster) exit() {
	b.change(func() bool {
		changed := len(b.attached) > 0
		b.attached = nil
		return changed
	})
}

func (b *broadcaster) attach(inst *instance) error {
	registerExitingHook()
	return b.change(func() bool {
		if slices.Contains(b.attached, inst) {
			return false // a second block's startup
		}
		b.attached = append(b.attached, inst)
		return true
	})
}

func (b *broadcaster) detach(inst *instance) {
	b.change(func() bool {
		b.attached = slices.DeleteFunc(b.attached, func(a *instance) bool { return a == inst })
		return true
	})
}

// forgetAfter detaches the instances that attached after inst: after a
// failed reload, caddy keeps inst running, and those never started.
func (b *broadcaster) forgetAfter(inst *instance) {
	b.change(func() bool {
		if i := slices.Index(b.attached, inst); i >= 0 {
			b.attached = b.attached[: i+1 : i+1]
		}
		return true
	})
}

// change edits the attached instances and, if edit says they changed, reconciles the pipeline with
// them; a stop it calls for runs after the lock is released.
func (b *broadcaster) change(edit func() bool) error {
	b.mu.Lock()
	if !edit() {
		b.mu.Unlock()
		return nil
	}
	stop, err := b.reconcileLocked()
	b.mu.Unlock()
	stop.finish()
	return err
}

// stopping is a pipeline whose listener is gone and whose flush is still to run, outside the
// broadcaster's lock: a reload that removes k8s_event must not wait for it.
type stopping struct{ p *pipeline }

func (s stopping) finish() {
	if s.p != nil {
		s.p.stop(flushTimeout)
	}
}

// reconcileLocked runs the pipeline with the newest instance's settings, or takes it down when none
// is left; the caller finishes the stop after unlocking.
func (b *broadcaster) reconcileLocked() (stopping, error) {
	if len(b.attached) == 0 {
		p := b.p
		b.p = nil
		if p != nil {
			p.deregister()
		}
		return stopping{p}, nil
	}
	cfg, client := b.attached[len(b.attached)-1].settings()
	if client == nil {
		return stopping{}, errors.New("no Kubernetes API client")
	}
	if b.p == nil {
		b.p = newPipeline(cfg, client, podFromEnv(), b.clock)
		b.p.start()
		return stopping{}, clog.RegisterListener(b.p.listener)
	}
	b.p.apply(cfg, client)
	return stopping{}, nil
}
