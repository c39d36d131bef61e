package k8s_event

import (
	"context"
	"sync"
	"time"

	clog "github.com/coredns/coredns/plugin/pkg/log"
	"github.com/go-logr/logr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
)

const (
	// In a storm, run takes lines in batches, one every batchPause at most.
	stormGap   = time.Millisecond
	batchPause = time.Millisecond
)

// pipeline wires the parts together and runs the scheduler's goroutine:
//
//	listener (hook.go) --lines--> run: scheduler (scheduler.go) --requests--> writers (writer.go)
//	                                ^-------------------- results -------------------'
//
// run is the only goroutine that touches the scheduler: one message at a time (lines, a
// result, the timer, a reload, stop, the deadline, a fatal line's request for a token),
// then what can be sent goes to writer goroutines, and the one timer is armed for the
// next thing due. It never waits on I/O, so a fatal line gets its token at once.
type pipeline struct {
	clock    clock.WithTicker
	listener *listener
	sched    *scheduler
	// sched's, which run calls; a test may wrap them
	dispatch func(now time.Time) ([]request, time.Time)
	outcome  func(res result, now time.Time)
	client   kubernetes.Interface // run's own; apply replaces it
	results  chan result
	inbox    chan message
	reporter rejectionLog
	said     sync.WaitGroup // the plugin's own log lines being written

	// I/O time limits, in real time: CoreDNS's exit waits on them.
	writeTimeout time.Duration
	fatalTimeout time.Duration

	ctx       context.Context // cancelled when the flush's time is up
	cancel    context.CancelFunc
	done      chan struct{} // closed when run returns
	closeOnce sync.Once
	stopOnce  sync.Once
}

func newPipeline(cfg config, client kubernetes.Interface, pod podIdentity,
	clk clock.WithTicker) *pipeline {
	p := &pipeline{
		clock:        clk,
		sched:        newScheduler(cfg, pod, clk.Now()),
		client:       client,
		results:      make(chan result, numBuckets*maxInFlight+1),
		inbox:        make(chan message),
		writeTimeout: writeTimeout,
		fatalTimeout: fatalTimeout,
		done:         make(chan struct{}),
	}
	p.dispatch, p.outcome = p.sched.dispatch, p.sched.outcome
	p.listener = newListener(clk, p.writeFatal)
	p.listener.levels.Store(uint32(cfg.levels))
	p.sched.backlog = func() int { return len(p.listener.lines) }
	ns := pod.namespace()
	p.sched.report = func(now time.Time, err error) {
		if say := p.reporter.report(now, err, ns); say != nil {
			p.said.Go(say) // run never waits on stderr
		}
	}
	// client-go logs about a request through the logger of its context; a
	// discarding one keeps those lines from reaching a plugin logger (the
	// kubernetes plugin routes klog into its own) and so from becoming events.
	p.ctx, p.cancel = context.WithCancel(klog.NewContext(context.Background(), logr.Discard()))
	return p
}

func (p *pipeline) start() { go p.run() }

func (p *pipeline) run() {
	defer close(p.done)
	lines := (<-chan line)(p.listener.lines)
	take := lines // nil while a batch pause lasts
	var timer, pause clock.Timer
	var wake, resume <-chan time.Time
	var batch time.Time
	for {
		dispatch := true
		select {
		case ln, ok := <-take:
			if !ok {
				lines, take = nil, nil
				break
			}
			dispatch = p.sched.observe(ln)
			// Lines that come meanwhile too, a queue's worth at most: then the other
			// messages get their turn. len, which the listeners write, once a run.
			taken := 1
			for n := len(lines); n > 0 && taken < queueSize; n = len(lines) {
				for range min(n, queueSize-taken) {
					dispatch = p.sched.observe(<-lines) || dispatch
					taken++
				}
			}
			// Lines more often than stormGap are taken in batches: a parked goroutine costs
			// the listener a thread wake-up per line, one that takes no line for batchPause
			// one per batch. No pause when lines wait, nor in the flush (stop); results and
			// messages are taken meanwhile. Both are on the injected clock, as everything run
			// waits for.
			now := p.clock.Now()
			if taken < queueSize && !p.sched.stopping && now.Sub(batch) < stormGap {
				if pause == nil {
					pause = p.clock.NewTimer(batchPause)
				} else { // it fired, and was taken: one timer for every pause
					pause.Reset(batchPause)
				}
				take, resume = nil, pause.C()
			}
			batch = now
		case <-resume:
			take, resume = lines, nil
			continue
		case res := <-p.results:
			p.outcome(res, p.clock.Now())
		case <-wake:
		case m := <-p.inbox:
			p.take(m, p.clock.Now())
			if _, ok := m.(stopMsg); ok && pause != nil {
				// The flush takes lines without pause: the listener is gone, so there is no
				// wake-up to save, and the flush's time is short.
				pause.Stop()
				take, resume = lines, nil
			}
		}
		if !dispatch {
			continue
		}
		now := p.clock.Now()
		reqs, next := p.dispatch(now)
		for _, r := range reqs {
			p.send(r)
		}
		if lines == nil && p.sched.finished(reqs, next) {
			if pause != nil {
				pause.Stop()
			}
			p.sched.dropRemaining()
			return
		}
		if timer != nil {
			timer.Stop()
		}
		timer, wake = nil, nil
		if !next.IsZero() {
			timer = p.clock.NewTimer(next.Sub(now))
			wake = timer.C()
		}
	}
}

func (p *pipeline) send(r request) {
	client := p.client
	go func() {
		ctx, cancel := context.WithTimeout(p.ctx, p.writeTimeout)
		res := do(ctx, client, r)
		cancel()
		p.results <- res // run receives every result before it returns
	}()
}

// message is what run takes besides lines, results and its timer: one of the types below.
type message interface{ inbox() }

// grant is run's answer to a fatalMsg: the request to make, if a token was taken, and the client.
type grant struct {
	req    request
	ok     bool
	client kubernetes.Interface
}

type (
	// applyMsg brings new settings and the client of a reload; done is closed once in force.
	applyMsg struct {
		cfg    config
		client kubernetes.Interface
		done   chan struct{}
	}
	// fatalMsg asks a token and a request for a fatal line; the answer comes on reply at once.
	fatalMsg struct {
		ln    line
		reply chan<- grant
	}
	// stopMsg begins the flush: what is pending is written as tokens allow until end.
	stopMsg struct{ end time.Time }
	// expireMsg says that the flush's time is up: nothing more is sent.
	expireMsg struct{}
	// inspectMsg runs look on the scheduler in run's goroutine, which owns it: the fault models
	// read its state so. done is closed after.
	inspectMsg struct {
		look func(*scheduler)
		done chan struct{}
	}
)

func (applyMsg) inbox()   {}
func (fatalMsg) inbox()   {}
func (stopMsg) inbox()    {}
func (expireMsg) inbox()  {}
func (inspectMsg) inbox() {}

// take carries out m, in run.
func (p *pipeline) take(m message, now time.Time) {
	switch m := m.(type) {
	case applyMsg:
		p.client = m.client
		p.sched.apply(m.cfg, now)
		close(m.done)
	case fatalMsg:
		req, ok := p.sched.fatal(m.ln, now)
		m.reply <- grant{req, ok, p.client}
	case stopMsg:
		p.sched.stop(now, m.end.Sub(now))
	case expireMsg:
		p.sched.expire()
	case inspectMsg:
		m.look(p.sched)
		close(m.done)
	}
}

// post hands m to run; false when run is gone or ctx ended first.
func (p *pipeline) post(ctx context.Context, m message) bool {
	select {
	case p.inbox <- m:
		return true
	case <-p.done:
	case <-ctx.Done():
	}
	return false
}

// apply takes new settings, as the scheduler's apply does.
func (p *pipeline) apply(cfg config, client kubernetes.Interface) {
	p.listener.levels.Store(uint32(cfg.levels))
	applied := make(chan struct{})
	if p.post(context.Background(), applyMsg{cfg: cfg, client: client, done: applied}) {
		<-applied
	}
}

// writeFatal writes a fatal line at once, in the goroutine that logged it: CoreDNS exits right
// after the listeners return, and nothing queued would be written. It takes a token of the fatal
// bucket like any write, waits for no other write nor the UID, and gives up after fatalTimeout.
func (p *pipeline) writeFatal(ln line) {
	var t tally
	t.see()
	ctx, cancel := context.WithTimeout(p.ctx, p.fatalTimeout)
	defer cancel()
	granted := make(chan grant, 1)
	if !p.post(ctx, fatalMsg{ln: ln, reply: granted}) {
		t.drop(dropFailed)
		return
	}
	g := <-granted // run answers at once: it never waits on I/O
	if !g.ok {
		t.drop(dropThrottled)
		return
	}
	res := do(ctx, g.client, g.req)
	p.results <- res // run does not return while this request is out
	if res.outcome != writeOK {
		t.drop(dropFailed)
		return
	}
	t.carry(1)
}

// deregister removes the listener and closes the hand-off: after it, no line enters the pipeline.
func (p *pipeline) deregister() {
	p.closeOnce.Do(func() {
		// Deregistering waits for listener calls in flight: none sends on the hand-off after it.
		clog.DeregisterListener(p.listener)
		close(p.listener.lines)
	})
}

// stop ends the pipeline: no new line is taken, and what is pending is written as tokens allow
// within timeout (real time: CoreDNS exits when it returns). What is still pending then is dropped.
func (p *pipeline) stop(timeout time.Duration) {
	p.stopOnce.Do(func() {
		expired, said := make(chan struct{}), make(chan struct{})
		// Real time on purpose, unlike run's waits: CoreDNS exits when stop returns, whatever
		// the injected clock says.
		expire := time.AfterFunc(timeout, func() {
			close(expired)
			p.cancel() // requests in flight end now
			p.post(context.Background(), expireMsg{})
		})
		defer expire.Stop()
		end := p.clock.Now().Add(timeout) // deregistering may wait for a fatal line
		p.deregister()
		p.post(context.Background(), stopMsg{end: end})
		<-p.done
		p.cancel()
		go func() { p.said.Wait(); close(said) }()
		select { // the plugin's own log lines are out before CoreDNS exits, in the flush's time
		case <-said:
		case <-expired:
		}
	})
}
