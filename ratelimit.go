package k8s_event

import (
	"context"
	"math/rand/v2"
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
	// workers is the number of concurrent API writers.
	workers = 2

	// combineAfter distinct lines of one plugin and level within combineWindow
	// make every further new line of that plugin and level part of one
	// combined event, so that per-query errors cannot create an object each.
	combineAfter  = 10
	combineWindow = 10 * time.Minute
	maxWindows    = 1024

	// Retries of failed writes back off exponentially, with jitter, up to
	// retryMax; an entry is retried for as long as it stays in the cache.
	retryBase = time.Second
	retryMax  = time.Minute
	// rejectPause is how long a key waits after the API refused it for good.
	rejectPause = time.Minute
)

// eventKey identifies one event: a log line, or, with an empty message, the
// combined event of a plugin and level.
type eventKey struct {
	level   level
	plugin  string
	message string
}

func (k eventKey) combined() bool { return k.message == "" }

// entry is what the correlator knows of one event.
type entry struct {
	message     string // latest message; a combined event adds combinedPrefix when written
	count       int64  // lines seen
	written     int64  // lines carried by successful writes, or given up
	name        string // the Event object's name once created
	tried       string // the name of a create whose outcome is unknown
	first, last time.Time
	retryAt     time.Time // no attempt before this
	queued      bool      // in the work queue, due now or later
	inflight    bool
	evicted     bool
}

type windowKey struct {
	level  level
	plugin string
}

type window struct {
	start    time.Time
	distinct int
}

// pipeline is the running machinery: the listener feeds lines, the
// correlator folds them into entries, the writers post them.
type pipeline struct {
	clock  clock.WithTicker
	levels atomic.Uint32 // levelSet
	lines  chan line
	pod    podRef
	client atomic.Pointer[kubernetes.Interface]

	mu      sync.Mutex // guards cache, windows and entries; never held across I/O
	cache   *simplelru.LRU[eventKey, *entry]
	windows map[windowKey]*window

	buckets [numLevels]*rate.Limiter // one per reason: a flood of one level cannot starve another
	backoff workqueue.TypedRateLimiter[eventKey]
	queue   workqueue.TypedDelayingInterface[eventKey]

	names    eventNames
	uidOnce  sync.Once
	reporter rejectionLog

	flushing       atomic.Bool
	ctx            context.Context // cancelled when the flush time is up
	cancel         context.CancelFunc
	correlatorDone chan struct{}
	workersDone    sync.WaitGroup
	stopOnce       sync.Once
}

func newPipeline(cfg config, client kubernetes.Interface, pod podRef, clk clock.WithTicker) *pipeline {
	p := &pipeline{
		clock:          clk,
		lines:          make(chan line, queueSize),
		pod:            pod,
		windows:        map[windowKey]*window{},
		backoff:        jittered{workqueue.NewTypedItemExponentialFailureRateLimiter[eventKey](retryBase, retryMax)},
		queue:          workqueue.NewTypedDelayingQueueWithConfig(workqueue.TypedDelayingQueueConfig[eventKey]{Clock: clk}),
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

// apply takes new settings without losing what is pending.
func (p *pipeline) apply(cfg config, client kubernetes.Interface) {
	now := p.clock.Now()
	for _, b := range p.buckets {
		b.SetLimitAt(now, rate.Limit(cfg.qps))
		b.SetBurstAt(now, cfg.burst)
	}
	p.mu.Lock()
	p.cache.Resize(cfg.cacheSize)
	p.mu.Unlock()
	p.client.Store(&client)
	p.levels.Store(uint32(cfg.levels))
}

func (p *pipeline) start() {
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

func (p *pipeline) correlate() {
	defer close(p.correlatorDone)
	for ln := range p.lines {
		p.observe(ln)
	}
}

// observe folds one line into its entry and, unless it is queued already,
// queues the entry for writing.
func (p *pipeline) observe(ln line) {
	msg := eventMessage(ln.text)
	key := eventKey{level: ln.level, plugin: ln.plugin, message: msg}

	p.mu.Lock()
	e, ok := p.cache.Get(key)
	if !ok && p.tooManyDistinct(ln) {
		aggregated[ln.level].Inc()
		key.message = ""
		e, ok = p.cache.Get(key)
	}
	if !ok {
		e = &entry{first: ln.at}
		p.cache.Add(key, e)
	}
	e.count++
	e.message = msg
	if ln.at.After(e.last) {
		e.last = ln.at
	}
	add := !e.queued
	e.queued = true
	pendingLines.Inc()
	p.mu.Unlock()

	if add {
		p.queue.Add(key)
	}
}

// combinedPrefix marks the message of a combined event, as client-go does.
const combinedPrefix = "(combined from similar events): "

// tooManyDistinct counts a new distinct line of its plugin and level and
// tells whether their window is over the limit. Called with p.mu held.
func (p *pipeline) tooManyDistinct(ln line) bool {
	wk := windowKey{ln.level, ln.plugin}
	w, ok := p.windows[wk]
	if !ok {
		if len(p.windows) >= maxWindows {
			clear(p.windows)
		}
		w = &window{start: ln.at}
		p.windows[wk] = w
	}
	if ln.at.Sub(w.start) > combineWindow {
		w.start, w.distinct = ln.at, 0
	}
	w.distinct++
	return w.distinct > combineAfter
}

// evicted is the LRU's eviction callback, called with p.mu held.
func (p *pipeline) evicted(_ eventKey, e *entry) {
	e.evicted = true
	if !e.inflight {
		p.give(e, dropEvicted)
	}
}

// give gives up the unwritten lines of e, counting them under reason.
// Called with p.mu held.
func (p *pipeline) give(e *entry, reason string) { p.giveUpTo(e, e.count, reason) }

// giveUpTo gives up the unwritten lines of e up to its count upTo.
func (p *pipeline) giveUpTo(e *entry, upTo int64, reason string) {
	if n := upTo - e.written; n > 0 {
		droppedVec.WithLabelValues(reason).Add(float64(n))
		pendingLines.Sub(float64(n))
		e.written = upTo
	}
}

func (p *pipeline) processNext() bool {
	key, shutdown := p.queue.Get()
	if shutdown {
		return false
	}
	defer p.queue.Done(key)
	p.sync(key)
	return true
}

// sync writes one entry if its bucket has a token: a key queued many times
// is written once, with the latest count.
func (p *pipeline) sync(key eventKey) {
	flushing := p.flushing.Load()
	p.mu.Lock()
	e, ok := p.cache.Peek(key)
	if !ok {
		p.mu.Unlock()
		return
	}
	e.queued = false // the work queue never hands one key to two writers at once
	if e.count == e.written {
		p.mu.Unlock()
		return
	}
	now := p.clock.Now()
	if wait := e.retryAt.Sub(now); wait > 0 && !flushing {
		e.queued = true
		p.mu.Unlock()
		p.queue.AddAfter(key, wait)
		return
	}
	bucket := p.buckets[key.level]
	r := bucket.ReserveN(now, 1)
	if wait := r.DelayFrom(now); wait > 0 || !r.OK() {
		r.CancelAt(now)
		e.queued = !flushing
		p.mu.Unlock()
		throttled[key.level].Inc()
		if !flushing {
			p.queue.AddAfter(key, wait)
		}
		return
	}
	snap := *e
	e.inflight = true
	p.mu.Unlock()

	name, verb, err := p.write(key, snap)

	p.mu.Lock()
	defer p.mu.Unlock()
	e.inflight = false
	now = p.clock.Now()
	switch outcome := classify(err); outcome {
	case writeOK:
		pendingLines.Sub(float64(snap.count - snap.written))
		e.written, e.name, e.tried = snap.count, name, ""
		eventWrites.WithLabelValues(key.level.reason(), verb).Inc()
		p.backoff.Forget(key)
	case writeGone:
		e.name = "" // the event expired or was deleted: create it anew
	case writeExists:
		// A create that timed out had reached the API: patch that event.
		e.name, e.tried = name, ""
	case writeRejected:
		// Lines that came during the write are kept for the next try.
		p.giveUpTo(e, snap.count, dropRejected)
		e.retryAt = now.Add(rejectPause)
		p.reporter.report(now, err, p.pod.eventNamespace())
	default:
		if outcome == writeUnsent {
			r.CancelAt(now) // the API never saw it: give the token back
		}
		if verb == "create" {
			e.tried = name // it may have been applied: retry under the same name
		}
		e.retryAt = now.Add(p.backoff.When(key))
		p.reporter.report(now, err, p.pod.eventNamespace())
	}
	if e.evicted {
		p.give(e, dropEvicted)
		return
	}
	if e.count > e.written && !flushing {
		e.queued = true
		p.queue.Add(key)
	}
}

// jittered spreads retries of many keys that failed together.
type jittered struct {
	workqueue.TypedRateLimiter[eventKey]
}

func (j jittered) When(key eventKey) time.Duration {
	d := j.TypedRateLimiter.When(key)
	return d + time.Duration(rand.Int64N(int64(d)/5+1))
}

// stop ends the pipeline: no new line is taken, pending entries are written
// within timeout as far as their buckets allow, the rest is counted.
func (p *pipeline) stop(timeout time.Duration) {
	p.stopOnce.Do(func() {
		// Deregistering waits for listener calls in flight, so nothing
		// sends on p.lines once it returns.
		clog.DeregisterListener(p)
		close(p.lines)
		<-p.correlatorDone

		p.flushing.Store(true)
		p.mu.Lock()
		var dirty []eventKey
		for _, k := range p.cache.Keys() {
			if e, _ := p.cache.Peek(k); e.count > e.written {
				dirty = append(dirty, k)
			}
		}
		p.mu.Unlock()
		for _, k := range dirty {
			p.queue.Add(k)
		}

		drained := make(chan struct{})
		go func() { p.queue.ShutDownWithDrain(); close(drained) }()
		select {
		case <-drained:
		case <-p.clock.After(timeout):
			p.cancel()
			<-drained
		}
		p.queue.ShutDown()
		p.cancel()
		p.workersDone.Wait()

		p.mu.Lock()
		for _, e := range p.cache.Values() {
			p.give(e, dropShutdown)
		}
		p.mu.Unlock()
	})
}
