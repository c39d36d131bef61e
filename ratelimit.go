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

	// combineAfter distinct lines of one plugin and level within combineWindow
	// make every further new line of that plugin and level part of a
	// combined event, so that per-query errors cannot create an object each.
	combineAfter  = 10
	combineWindow = 10 * time.Minute
	maxWindows    = 1024
	// maxShapes bounds the combined events of one plugin and level in a
	// window; lines of further shapes join one more, of shape otherShapes.
	maxShapes   = 10
	otherShapes = 1 // a shapeHash is never 1 in practice

	// Failed writes back off exponentially, with up to 20% jitter, from
	// retryBase to retryMax; an event is retried for as long as it stays in
	// the cache.
	retryBase = time.Second
	retryMax  = time.Minute
	// rejectPause is how long an event waits after the API refused it.
	rejectPause = time.Minute

	// flushPause spaces the retries of a failed write during the flush at shutdown.
	flushPause = 200 * time.Millisecond
)

// eventKey identifies one event: a log line, or, with an empty message, the
// combined event of a plugin, level and shape.
type eventKey struct {
	level   level
	plugin  string
	message string
	shape   uint64 // of a combined event: shapeHash of its lines
}

func (k eventKey) combined() bool { return k.message == "" }

// entry is what the correlator knows of one event. Its fields are guarded
// by the pipeline's mutex.
type entry struct {
	key eventKey
	tally
	message     string // latest line; a combined event adds combinedPrefix when written
	first, last time.Time

	name  string // the Event object's name once created
	tried string // the name of a create that reached the API and got no answer

	// doubt is the count of the latest write that reached the API and got
	// no answer; zero once a later answer settled it.
	doubt    int64
	failures int       // consecutive failed writes, for the backoff
	retryAt  time.Time // no attempt before this, but at shutdown

	queued   bool // handed to the work queue, due now or later
	inflight bool
	evicted  bool
}

type windowKey struct {
	level  level
	plugin string
}

type window struct {
	start    time.Time
	distinct int
	shapes   map[uint64]struct{} // of its combined events, at most maxShapes
}

// combinedShape is the shape whose combined event a line joins: its own,
// or otherShapes once the window has maxShapes. Called with p.mu held.
func (w *window) combinedShape(message string) uint64 {
	shape := shapeHash(message)
	if _, ok := w.shapes[shape]; ok {
		return shape
	}
	if len(w.shapes) >= maxShapes {
		return otherShapes
	}
	if w.shapes == nil {
		w.shapes = map[uint64]struct{}{}
	}
	w.shapes[shape] = struct{}{}
	return shape
}

// pipeline is the running machinery: the listener feeds lines, the
// correlator folds them into entries, the writers post them.
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
	buckets  [numLevels]*rate.Limiter // one per reason: a flood of one level cannot starve another
	reserved [numLevels]int           // requests in flight, each holding a token it may still spend
	rand     *rand.Rand               // backoff jitter
	doubtful int64                    // lines dropped whose latest write may have landed unanswered

	queue    workqueue.TypedDelayingInterface[*entry]
	names    *eventNames
	reporter rejectionLog

	// I/O time limits, in real time: CoreDNS's exit waits on them.
	writeTimeout time.Duration
	fatalTimeout time.Duration
	flushPause   time.Duration
	flushers     int

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
		rand:           rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64())),
		queue:          workqueue.NewTypedDelayingQueueWithConfig(workqueue.TypedDelayingQueueConfig[*entry]{Clock: clk}),
		names:          newEventNames(),
		writeTimeout:   writeTimeout,
		fatalTimeout:   fatalTimeout,
		flushPause:     flushPause,
		flushers:       workers,
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
	for e := range p.settling {
		if len(p.settling) <= p.cacheSize {
			break
		}
		delete(p.settling, e)
		p.drop(e, dropEvicted)
	}
	var due []*entry
	for _, e := range p.cache.Values() {
		if e.pending() > 0 && !e.inflight && !e.retryAt.After(now) {
			e.queued = true
			due = append(due, e)
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

func (p *pipeline) correlate() {
	defer close(p.correlatorDone)
	var last time.Time
	for ln := range p.lines {
		p.observe(ln)
		for len(p.lines) > 0 {
			p.observe(<-p.lines)
		}
		// Lines that come more often than stormGap are taken in batches:
		// a correlator parked on an empty queue costs the listener a
		// wake-up of another thread per line, one asleep for batchPause
		// costs one per batch. Real time: this is about threads, not
		// about what the lines say.
		now := time.Now()
		if now.Sub(last) < stormGap {
			time.Sleep(batchPause)
		}
		last = now
	}
}

// observe folds one line into its entry and, unless it is queued already,
// queues the entry for writing.
func (p *pipeline) observe(ln line) {
	msg := eventMessage(ln.text)
	key := eventKey{level: ln.level, plugin: ln.plugin, message: msg}

	p.mu.Lock()
	e, ok := p.cache.Get(key)
	if !ok {
		if w := p.window(ln); w.distinct > combineAfter {
			aggregated[ln.level].Inc()
			// The window is of one plugin: its prefix is no part of the shape.
			key.message, key.shape = "", w.combinedShape(strings.TrimPrefix(msg, ln.plugin))
			e, ok = p.cache.Get(key)
		}
	}
	if !ok {
		e = &entry{key: key, first: ln.at}
		p.cache.Add(key, e)
	}
	e.see()
	e.message = msg
	if ln.at.After(e.last) {
		e.last = ln.at
	}
	add := !e.queued
	e.queued = true
	p.mu.Unlock()

	if add {
		p.queue.Add(e)
	}
}

// combinedPrefix marks the message of a combined event, as client-go does.
const combinedPrefix = "(combined from similar events): "

// window counts a new distinct line in the window of its plugin and level.
// Called with p.mu held.
func (p *pipeline) window(ln line) *window {
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
		w.start, w.distinct, w.shapes = ln.at, 0, nil
	}
	w.distinct++
	return w
}

// evicted is the LRU's eviction callback, called with p.mu held.
func (p *pipeline) evicted(_ eventKey, e *entry) {
	e.evicted = true
	p.retire(e)
}

// retire decides the fate of an evicted entry once no write of it is in
// flight: its pending lines are dropped, unless its latest write got no
// answer; then it stays, for as long as there is room, until one more
// write settles what the API holds. Called with p.mu held.
func (p *pipeline) retire(e *entry) {
	if !e.evicted || e.inflight {
		return
	}
	if e.doubt > 0 && e.pending() > 0 {
		if _, ok := p.settling[e]; ok || len(p.settling) < p.cacheSize {
			p.settling[e] = struct{}{}
			return
		}
	}
	delete(p.settling, e)
	p.drop(e, dropEvicted)
}

// drop gives up the pending lines of e. Called with p.mu held.
func (p *pipeline) drop(e *entry, reason dropReason) {
	if e.doubt > 0 && e.pending() > 0 {
		p.doubtful += min(e.doubt-e.carried, e.pending())
	}
	e.tally.drop(reason)
}

// reserve claims a token of the bucket of l for a request about to be
// sent. The token is spent only if the request reaches the API (spend); one
// that never left this process hands it back. Requests per bucket thus
// never exceed BURST + QPS x T, retries included, and an unreachable API
// costs no tokens. Without a token it tells how long until one is free.
// Called with p.mu held.
func (p *pipeline) reserve(l level, now time.Time) (time.Duration, bool) {
	b := p.buckets[l]
	need := float64(p.reserved[l] + 1)
	have := b.TokensAt(now)
	if have >= need {
		p.reserved[l]++
		return 0, true
	}
	wait := time.Duration((need - have) / float64(b.Limit()) * float64(time.Second))
	return max(wait, time.Millisecond), false
}

// spend ends a reservation: the token is taken if the request reached the
// API, whatever its answer. Called with p.mu held.
func (p *pipeline) spend(l level, now time.Time, reached bool) {
	p.reserved[l]--
	if reached {
		p.buckets[l].ReserveN(now, 1)
	}
}

// backoffFor is the wait after the n-th failure in a row: exponential,
// capped at retryMax, plus up to 20% jitter, and never shorter than what
// the API asked for. Called with p.mu held.
func (p *pipeline) backoffFor(n int, asked time.Duration) time.Duration {
	d := retryMax
	if n <= 7 {
		d = min(retryBase<<(n-1), retryMax)
	}
	d += time.Duration(p.rand.Int64N(int64(d)/5 + 1))
	return max(d, asked)
}

func (p *pipeline) processNext() bool {
	e, shutdown := p.queue.Get()
	if shutdown {
		return false
	}
	defer p.queue.Done(e)
	if !p.flushing.Load() { // the flush at shutdown writes what is pending
		p.sync(e)
	}
	return true
}

// sync writes one entry if it is due and its bucket has a token: an entry
// queued many times is written once, with the latest count.
func (p *pipeline) sync(e *entry) {
	p.mu.Lock()
	e.queued = false
	now := p.clock.Now()
	var report error
	wait := e.retryAt.Sub(now)
	if wait <= 0 {
		var res attemptResult
		res, wait, report = p.attempt(p.ctx, e)
		if res == attemptRedo {
			wait = 0
		}
	}
	if e.pending() > 0 && e.dropped == 0 && !e.queued {
		e.queued = true
		p.mu.Unlock()
		p.requeue(e, wait)
	} else {
		p.mu.Unlock()
	}
	p.say(now, report)
}

// say logs why a write failed, at most once a minute; nothing for nil.
func (p *pipeline) say(now time.Time, err error) {
	if err != nil {
		p.reporter.report(now, err, p.pod.namespace())
	}
}

func (p *pipeline) requeue(e *entry, wait time.Duration) {
	if wait > 0 {
		p.queue.AddAfter(e, wait)
	} else {
		p.queue.Add(e)
	}
}

type attemptResult uint8

const (
	attemptNone      attemptResult = iota // nothing pending
	attemptThrottled                      // no token
	attemptWrote                          // written
	attemptRedo                           // to be written again at once: created, gone or name taken
	attemptRefused                        // refused by the API: paused
	attemptFailed                         // failed: backing off
)

// attempt makes one write of e if its bucket has a token, and books the
// outcome. It is called with p.mu held and releases it during the request.
// It returns how long until e may be tried again, and an error to report.
func (p *pipeline) attempt(ctx context.Context, e *entry) (attemptResult, time.Duration, error) {
	if e.pending() == 0 || e.dropped > 0 {
		return attemptNone, 0, nil
	}
	l := e.key.level
	now := p.clock.Now()
	if wait, ok := p.reserve(l, now); !ok {
		throttled[l].Inc()
		return attemptThrottled, wait, nil
	}
	spec := writeSpec{key: e.key, message: e.message, count: e.seen, first: e.first, last: e.last, name: e.name, tried: e.tried}
	e.inflight = true
	p.mu.Unlock()

	res := p.write(ctx, spec, true)

	p.mu.Lock()
	now = p.clock.Now()
	p.spend(l, now, res.reached)
	e.inflight = false
	defer p.retire(e)
	switch res.outcome {
	case writeOK:
		e.carry(spec.count)
		e.name, e.tried, e.doubt, e.failures, e.retryAt = res.name, "", 0, 0, time.Time{}
		eventWrites.WithLabelValues(l.reason(), res.verb).Inc()
		return attemptWrote, 0, nil
	case writeGone: // the event expired or was deleted: create it anew
		e.name, e.doubt = "", 0
		return attemptRedo, 0, nil
	case writeExists: // a create that got no answer had been applied: patch it
		e.name, e.tried = res.name, ""
		return attemptRedo, 0, nil
	case writeNameTaken: // another writer's event has this name: take a new one
		e.tried = ""
		return attemptRedo, 0, nil
	case writeRefused:
		e.retryAt = now.Add(rejectPause)
		return attemptRefused, rejectPause, res.err
	default:
		if res.unsure {
			e.doubt = spec.count
			if spec.name == "" {
				e.tried = res.name // it may have been applied: retry under the same name
			}
		}
		e.failures++
		d := p.backoffFor(e.failures, res.retryAfter)
		e.retryAt = now.Add(d)
		return attemptFailed, d, res.err
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
		deadline := time.AfterFunc(timeout, p.cancel)
		defer deadline.Stop()
		p.deregister()
		if !p.started.Load() { // tests that drive the pipeline by hand
			go p.correlate()
		}
		<-p.correlatorDone

		// Writers finish the write in hand and leave the rest to the flush.
		p.flushing.Store(true)
		p.queue.ShutDown()
		p.workersDone.Wait()
		p.flush()
		p.cancel()

		p.mu.Lock()
		defer p.mu.Unlock()
		for _, e := range p.pendingEntries() {
			p.drop(e, dropShutdown)
		}
	})
}

// pendingEntries lists the entries with lines to write: those settling,
// then the cache's from the least recently seen. Called with p.mu held.
func (p *pipeline) pendingEntries() []*entry {
	var out []*entry
	for e := range p.settling {
		out = append(out, e)
	}
	slices.SortFunc(out, func(a, b *entry) int {
		return cmp.Or(a.first.Compare(b.first), strings.Compare(a.key.plugin, b.key.plugin),
			strings.Compare(a.key.message, b.key.message), cmp.Compare(a.key.level, b.key.level), strings.Compare(a.name, b.name))
	})
	for _, e := range p.cache.Values() {
		if e.pending() > 0 && e.dropped == 0 {
			out = append(out, e)
		}
	}
	return out
}

// flush writes what is pending, each event until it is written, its bucket
// is empty, the API refuses it, or the time is up. Failed writes are tried
// again every flushPause: only those that reach the API cost a token.
func (p *pipeline) flush() {
	p.mu.Lock()
	todo := p.pendingEntries()
	p.mu.Unlock()

	work := make(chan *entry)
	var wg sync.WaitGroup
	for range p.flushers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for e := range work {
				p.flushOne(e)
			}
		}()
	}
	for _, e := range todo {
		select {
		case work <- e:
		case <-p.ctx.Done():
		}
	}
	close(work)
	wg.Wait()
}

func (p *pipeline) flushOne(e *entry) {
	for p.ctx.Err() == nil {
		p.mu.Lock()
		res, _, report := p.attempt(p.ctx, e)
		p.mu.Unlock()
		p.say(p.clock.Now(), report)
		switch res {
		case attemptRedo:
			continue
		case attemptFailed:
			select {
			case <-p.ctx.Done():
			case <-time.After(p.flushPause):
			}
		default:
			return
		}
	}
}
