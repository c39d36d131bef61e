package k8s_event

import (
	"cmp"
	"context"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	clog "github.com/coredns/coredns/plugin/pkg/log"
	"github.com/go-logr/logr"
	"github.com/hashicorp/golang-lru/v2/simplelru"
	"golang.org/x/time/rate"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
)

const (
	// queueSize bounds the lines waiting between the listener and the correlator.
	queueSize = 1024
	// In a storm, the correlator takes lines in batches, at most one every
	// batchPause: well under the time it takes to fill the queue.
	stormGap   = time.Millisecond
	batchPause = time.Millisecond
	// workers is the number of concurrent API writers.
	workers = 2

	// flushPause spaces the retries of a failed write during the flush at shutdown.
	flushPause = 200 * time.Millisecond
)

// pipeline is the running machinery: the listener feeds lines, the
// correlator folds them into entries, the writers post them.
//
// Goroutines and what they own:
//   - the listener runs in whatever goroutine logged; it only reads levels,
//     clock and sends on lines (hook.go), or writes a fatal line itself;
//   - one correlator goroutine (correlate) is the only receiver of lines;
//   - workers goroutines (processNext) take entries from the queue, which
//     hands an entry to one of them at a time;
//   - apply runs in caddy's reload, stop in its shutdown or exit hook, and
//     the flush in stop's goroutines, while the workers finish the write
//     they have in hand (an entry in flight is the flush's only once back).
//
// mu guards the cache, windows, settling, buckets, reserved, held, rand, doubtful,
// quiet, ends and every field of every entry; it is never held across a
// request. The queue, names and reporter lock themselves (the queue's Add,
// which never blocks, is called under mu by spend; nothing takes mu under
// the queue's lock); the atomics need no lock.
type pipeline struct {
	clock  clock.WithTicker
	levels atomic.Uint32 // levelSet
	lines  chan line
	pod    *podIdentity
	client atomic.Pointer[kubernetes.Interface]

	mu        sync.Mutex // guards everything below but the queue; never held across I/O
	cache     *simplelru.LRU[eventKey, *entry]
	cacheSize int
	windows   map[windowKey]*window
	// settling holds evicted entries whose latest write got no answer: one
	// more write tells what the API holds. At most cacheSize of them.
	settling map[*entry]struct{}
	// One bucket per reason, so that a flood of one level cannot starve
	// another, and one more, endBucket, for the events that say a storm
	// ended: a storm cannot starve its end, nor ends a level.
	buckets  [numBuckets]*rate.Limiter
	reserved [numBuckets]int                 // requests in flight, each holding a token it may still spend
	held     [numBuckets]map[*entry]struct{} // entries waiting while those tokens are held (reserve)
	// requestEnded, when set, is closed as the next request ends (spend).
	requestEnded chan struct{}
	rand         *rand.Rand // backoff jitter
	doubtful     int64      // lines dropped whose latest write may have landed unanswered
	// quiet is how long a storm has had no new line when its end is said;
	// 0: never. ends holds the end events decided and not yet written,
	// at most cacheSize of them (end.go).
	quiet time.Duration
	ends  map[*entry]struct{}
	// observed is the time of the latest line the correlator took: a storm
	// is not said to end while lines of before its quiet may still be on
	// their way from the listener.
	observed time.Time

	queue    workqueue.TypedDelayingInterface[*entry]
	names    *eventNames
	reporter rejectionLog

	// I/O time limits, in real time: CoreDNS's exit waits on them.
	writeTimeout time.Duration
	fatalTimeout time.Duration
	flushPause   time.Duration
	flushInTurn  bool      // the flush makes one attempt at a time (the stepped fault model replays so)
	flushEnd     time.Time // set by stop before the flush starts

	started        atomic.Bool
	flushing       atomic.Bool
	ctx            context.Context // cancelled when the flush time is up
	cancel         context.CancelFunc
	correlatorDone chan struct{}
	workersDone    sync.WaitGroup
	closeOnce      sync.Once
	stopOnce       sync.Once
}

func newPipeline(cfg config, client kubernetes.Interface, pod *podIdentity, clk clock.WithTicker) *pipeline {
	p := &pipeline{
		clock:          clk,
		lines:          make(chan line, queueSize),
		pod:            pod,
		windows:        map[windowKey]*window{},
		settling:       map[*entry]struct{}{},
		ends:           map[*entry]struct{}{},
		rand:           rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64())),
		queue:          workqueue.NewTypedDelayingQueueWithConfig(workqueue.TypedDelayingQueueConfig[*entry]{Clock: clk}),
		names:          newEventNames(),
		writeTimeout:   writeTimeout,
		fatalTimeout:   fatalTimeout,
		flushPause:     flushPause,
		correlatorDone: make(chan struct{}),
	}
	// client-go logs about a request through the logger of its context; a
	// discarding one keeps those lines from reaching a plugin logger (the
	// kubernetes plugin routes klog into its own) and so from becoming events.
	p.ctx, p.cancel = context.WithCancel(klog.NewContext(context.Background(), logr.Discard()))
	p.cache, _ = simplelru.NewLRU[eventKey, *entry](cfg.cacheSize, p.evicted)
	now := clk.Now()
	for l := range p.buckets {
		p.buckets[l] = rate.NewLimiter(rate.Limit(cfg.qps), cfg.burst)
		p.buckets[l].AllowN(now, 0) // start the bucket full at now, also under a fake clock
	}
	p.apply(cfg, client)
	return p
}

// apply takes new settings without losing what is pending. Events waiting
// for a token are looked at again at once: a higher rate may let them go.
func (p *pipeline) apply(cfg config, client kubernetes.Interface) {
	p.client.Store(&client)
	p.mu.Lock()
	now := p.clock.Now()
	for _, b := range p.buckets {
		b.SetLimitAt(now, rate.Limit(cfg.qps))
		b.SetBurstAt(now, cfg.burst)
	}
	p.cacheSize = cfg.cacheSize
	p.cache.Resize(cfg.cacheSize)
	quieter := cfg.quiet > 0 && (p.quiet == 0 || cfg.quiet < p.quiet)
	p.quiet = cfg.quiet
	for e := range p.settling {
		if len(p.settling) <= p.cacheSize {
			break
		}
		if e.inflight {
			continue // its write may land with every line: retire decides once it is back
		}
		delete(p.settling, e)
		p.drop(e, dropEvicted)
	}
	p.trimEnds()
	var due []*entry
	for _, e := range p.pendingEntries() { // the settling ones too
		if e.pending() > 0 && !e.inflight && !e.retryAt.After(now) {
			e.queued = true
			due = append(due, e)
		}
	}
	for e := range p.ends { // ends waiting for a token, too
		if !e.inflight && !e.retryAt.After(now) {
			due = append(due, e)
		}
	}
	if quieter { // storms may have gone quiet by the new measure: look again
		for _, e := range p.cache.Values() {
			if !e.queued && !e.inflight && e.pending() == 0 && e.name != "" && isStorm(e.key, e.seen-e.base) {
				due = append(due, e)
			}
		}
	}
	p.mu.Unlock()
	p.levels.Store(uint32(cfg.levels))
	for _, e := range due {
		p.queue.Add(e)
	}
}

func (p *pipeline) start() {
	p.started.Store(true)
	go p.correlate()
	for range workers {
		p.workersDone.Add(1)
		go func() {
			defer p.workersDone.Done()
			for p.processNext() {
			}
		}()
	}
}

// deregister removes the listener and closes the hand-off: after it, no
// line enters the pipeline.
func (p *pipeline) deregister() {
	p.closeOnce.Do(func() {
		// Deregistering waits for listener calls in flight, so nothing
		// sends on p.lines once it returns.
		clog.DeregisterListener(p)
		close(p.lines)
	})
}

// stop ends the pipeline: no new line is taken, and every pending event
// whose bucket has a token is written within timeout (real time: CoreDNS
// exits when it returns). What is still pending then is dropped.
func (p *pipeline) stop(timeout time.Duration) {
	p.stopOnce.Do(func() {
		p.flushEnd = time.Now().Add(timeout)
		deadline := time.AfterFunc(timeout, p.cancel)
		defer deadline.Stop()
		p.deregister()
		if !p.started.Load() { // tests that drive the pipeline by hand
			go p.correlate()
		}
		<-p.correlatorDone

		// Writers finish the write in hand and leave the rest to the flush,
		// which starts at once: a write that hangs holds up only its own
		// event, whose turn in the flush comes once it is back.
		p.flushing.Store(true)
		p.queue.ShutDown()
		p.flush()
		p.workersDone.Wait() // bounded: the deadline cancels what is still in flight
		p.cancel()

		p.mu.Lock()
		defer p.mu.Unlock()
		for _, e := range p.pendingEntries() {
			p.drop(e, dropShutdown)
		}
		clear(p.ends) // they carry no lines: nothing to account for
	})
}

// pendingEntries lists the entries with lines to write: those settling,
// then the cache's from the least recently seen. Called with p.mu held.
func (p *pipeline) pendingEntries() []*entry {
	out := p.settlingEntries()
	for _, e := range p.cache.Values() {
		if e.pending() > 0 && e.dropped == 0 {
			out = append(out, e)
		}
	}
	return out
}

// settlingEntries lists the settling entries, oldest first. Called with
// p.mu held.
func (p *pipeline) settlingEntries() []*entry {
	out := make([]*entry, 0, len(p.settling))
	for e := range p.settling {
		out = append(out, e)
	}
	slices.SortFunc(out, func(a, b *entry) int {
		return cmp.Or(a.first.Compare(b.first), strings.Compare(a.key.plugin, b.key.plugin),
			strings.Compare(a.key.message, b.key.message), cmp.Compare(a.key.level, b.key.level), strings.Compare(a.name, b.name))
	})
	return out
}
