package k8s_event

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// The concurrent fault model runs the pipeline as CoreDNS does: the
// scheduler's goroutine, a writer goroutine for each request, lines logged
// from another goroutine, reloads and expiries from a third, and a stop at
// the end, against the in-process API server under faults, with a pod UID
// from the downward API or, in a third of the seeds, read from the API.
// Every dispatch is held to the token order as it is made, on the
// scheduler's goroutine; between rounds the clock moves and, once the
// pipeline is quiet, the rest of the contract is checked. A seed replays
// the same schedule of lines, faults, reloads and clock steps; the
// interleaving is the scheduler's:
//
//	go test -race -run TestFaultModelConcurrent -faultmodel.seed=N -v .
var concurrentSeeds = flag.Int("faultmodel.concurrent", seedsFromEnv("K8S_EVENT_CONCURRENT_SEEDS", 8), "number of seeds the concurrent fault model runs (default $K8S_EVENT_CONCURRENT_SEEDS or 8)")

func TestFaultModelConcurrent(t *testing.T) {
	stats := faultStats{injected: map[string]int{}, workload: map[string]int{}}
	start := time.Now()
	first, n := uint64(1), uint64(*concurrentSeeds)
	if *faultSeed != 0 {
		first, n = *faultSeed, 1
	}
	for seed := first; seed < first+n; seed++ {
		if err := runConcurrentModel(seed, &stats); err != nil {
			t.Fatalf("seed %d: %v\nreplay: go test -race -run 'TestFaultModelConcurrent$' -faultmodel.seed=%d -v .", seed, err, seed)
		}
	}
	t.Logf("%d seeds in %v: %d rounds, %d lines, %d reloads, %d expiries, %d storm ends; %d requests reached the API, %d refused before; %d handed out in order, %d first lines written within their bound; faults: %v",
		stats.seeds, time.Since(start).Round(time.Millisecond), stats.steps, stats.lines, stats.reloads, stats.expiries, stats.ends,
		stats.requests, stats.refused, stats.ordered, stats.firsts, stats.injected)
}

func runConcurrentModel(seed uint64, stats *faultStats) (err error) {
	// m drives the run; faults draws the faults, in the writers' goroutines,
	// under the fake API's lock, from a generator of its own.
	m := &model{rng: rand.New(rand.NewPCG(seed, 0xc0c0)), clk: newSteppedClock(), stats: stats, held: &heldCheck{}}
	faults := &model{rng: rand.New(rand.NewPCG(seed, 0xfa17)), stats: stats, held: m.held}
	if m.api, err = startFakeAPI(m.clk); err != nil {
		return err
	}
	defer m.api.close()
	m.api.setFault(faults.fault)
	setMode := func(mode apiMode) {
		m.api.mu.Lock()
		faults.mode = mode
		m.api.mu.Unlock()
		m.setMode(mode)
	}
	m.back = m.clk.Now().Add(-recoveryBound) // no outage before
	m.readings = []time.Time{m.clk.Now()}

	cfg := faultConfigs[m.rng.IntN(len(faultConfigs))]
	m.maxBurst, m.maxQPS = cfg.burst, cfg.qps
	if m.rng.IntN(4) != 0 { // storms end, from the scheduler's timer
		m.quiet = time.Duration(30+m.rng.IntN(151)) * time.Second
	}
	cfg.quiet = m.quiet
	m.endNames = map[string]string{}
	m.before = readLedger()
	pod := testPod()
	if m.rng.IntN(3) == 0 { // no UID from the downward API
		pod = testPodWithoutUID()
		if m.rng.IntN(2) == 0 {
			m.api.addPod(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: testRef.Name, Namespace: testRef.Namespace, UID: testRef.UID}})
		}
	}
	m.addWorkload()
	m.configured(cfg)
	m.qps, m.wait = m.rateOf(cfg), fleetWait(cfg)
	m.p = newPipeline(cfg, m.api.client, pod, m.clk)
	report := m.p.sched.report
	m.p.sched.report = func(now time.Time, err error) {
		m.saidMu.Lock()
		m.said = append(m.said, err)
		m.saidMu.Unlock()
		report(now, err)
	}
	m.p.writeTimeout = 250 * time.Millisecond
	m.p.sched.flushPause = time.Millisecond
	m.p.sched.rand = rand.New(rand.NewPCG(seed, 1))
	m.watch = watchPipelineOrder(m.p)
	ordered := m.p.dispatch
	m.p.dispatch = func(now time.Time) ([]request, time.Time) {
		reqs, wake := ordered(now)
		m.held.handed(reqs, now)
		return reqs, wake
	}
	watched := m.p.outcome
	m.p.outcome = func(res result, now time.Time) { m.held.told(res, now); watched(res, now) }
	defer m.p.cancel()
	m.p.start()
	stats.seeds++

	rounds := 6 + m.rng.IntN(10)
	// In a third of the seeds, stop comes right after a round's lines are
	// logged: writes in flight, lines on their way to the correlator,
	// entries waiting out backoffs, and the flush has to sort them out.
	stopIn := -1
	if m.rng.IntN(3) == 0 {
		stopIn = m.rng.IntN(rounds)
	}
	for round := range rounds {
		stats.steps++
		if m.rng.IntN(3) == 0 {
			modes := []apiMode{apiHealthy, apiRefusing, apiSilent, apiFlaky, apiFlaky}
			setMode(modes[m.rng.IntN(len(modes))])
		}
		// The lines of the round are drawn here and logged by another
		// goroutine, while a reload or an expiry runs in a third.
		var lines []line
		for range m.rng.IntN(16) {
			lines = append(lines, ln(modelLevels[m.rng.IntN(len(modelLevels))], fmt.Sprint("p", m.rng.IntN(3)),
				fmt.Sprintf("upstream %d unhealthy: %d", m.rng.IntN(3), m.rng.IntN(20)), time.Time{}))
		}
		var reload *config
		expire := false
		switch r := m.rng.IntN(8); {
		case r == 0:
			c := faultConfigs[m.rng.IntN(len(faultConfigs))]
			c.quiet = m.quiet
			reload = &c
			m.maxBurst, m.maxQPS = max(m.maxBurst, c.burst), max(m.maxQPS, c.qps)
		case r == 1:
			expire = true
		case r == 2:
			m.scaled()
		}
		m.noteRound(lines)
		if reload != nil { // before or after the lines: the least rate counts for them
			m.reloaded(*reload)
		}
		var wg sync.WaitGroup
		wg.Go(func() {
			for _, l := range lines {
				m.p.listener.capture(l.level, l.plugin, "%s", true, []any{l.text[len(l.plugin):]})
			}
		})
		wg.Go(func() {
			switch {
			case reload != nil:
				m.p.apply(*reload, &reloadClient{m.api.client}) // a client of its own: see watchPipelineOrder
				stats.reloads++
			case expire:
				m.expired += m.api.expire()
				stats.expiries++
			}
		})
		wg.Wait()
		m.fed += float64(len(lines))
		stats.lines += len(lines)
		if round == stopIn {
			return m.stopConcurrent(stats)
		}
		// The clock moves only while nothing is on its way to the API: a
		// request is stamped when the server sees it, and its token was
		// taken when it was sent; a step in between would make the two
		// times differ as no real clock does.
		if err := m.quietCheck(); err != nil {
			return err
		}
		if m.rng.IntN(8) == 0 { // the wall clock steps; the monotonic one goes on
			m.clk.stepWall(time.Duration(m.rng.IntN(4*3600)-2*3600) * time.Second)
		}
		m.tick(time.Duration(1+m.rng.IntN(90)) * time.Second)
	}

	// The API comes back for good: within recoveryBound, every pending
	// event whose bucket has a token is written.
	setMode(apiHealthy)
	back := m.clk.Now()
	for m.clk.Since(back) <= recoveryBound+m.herd()+2*time.Second {
		if err := m.quietCheck(); err != nil {
			return err
		}
		m.tick(time.Second)
	}
	if err := m.quietCheck(); err != nil {
		return err
	}
	if err := m.recovered(back); err != nil {
		return err
	}
	return m.stopConcurrent(stats)
}

// stopConcurrent stops the pipeline, whatever it is doing, and checks the
// contract once it is over: every line written, or dropped with its cause,
// and stop within its time (with room for a slow machine).
func (m *model) stopConcurrent(stats *faultStats) error {
	const timeout = time.Second
	m.firsts = nil // written in the flush as far as its time allows
	start := time.Now()
	m.p.stop(timeout)
	if took := time.Since(start); took > timeout+2*time.Second {
		return fmt.Errorf("stop took %v of its %v", took, timeout)
	}
	if err := m.quietCheck(); err != nil {
		return fmt.Errorf("after stop: %w", err)
	}
	if d := readLedger().since(m.before); d.pending != 0 {
		return fmt.Errorf("%v lines still pending after stop", d.pending)
	}
	stats.ends += len(m.endNames)
	stats.ordered += m.watch.checked()
	m.api.mu.Lock()
	stats.requests += len(m.api.requests)
	stats.refused += m.api.refused
	m.api.mu.Unlock()
	return nil
}

// quietCheck waits until the pipeline is quiet (no line queued for the
// scheduler, no request in flight, for a few polls in a row) and checks the contract then. A check that fails at
// a moment that only looked quiet is tried again until the wait is over.
//
// Lines that come in a burst are taken in batches, with a pause of batchPause between them on
// run's clock: while lines wait and nothing is on its way to the API, the clock moves by the
// pause, as real time would, from run's goroutine, so that nothing is sent meanwhile.
func (m *model) quietCheck() error {
	deadline := time.Now().Add(10 * time.Second)
	calm := 0
	for {
		quiet := len(m.p.listener.lines) == 0
		m.inspect(func(s *scheduler) {
			quiet = quiet && len(s.flights) == 0
			if len(s.flights) == 0 && len(m.p.listener.lines) > 0 {
				m.tick(batchPause)
			}
		})
		if quiet {
			calm++
		} else {
			calm = 0
		}
		if calm >= 3 {
			err := m.check()
			if err == nil || time.Now().After(deadline) || m.watch.failed() != nil { // a dispatch out of order stays so
				return err
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not quiet within 10 s")
		}
		time.Sleep(time.Millisecond)
	}
}

// tick moves the clock by d: the scheduler sees only the readings it
// moves to.
func (m *model) tick(d time.Duration) {
	m.clk.Step(d)
	m.readings = append(m.readings, m.clk.Now())
}

// noteRound notes, before the lines of a round are logged, the first line
// of each plugin and reason that has nothing pending: its wait is bounded.
// Lines are only taken away meanwhile: a plugin with nothing pending now
// has nothing pending when its line comes.
func (m *model) noteRound(lines []line) {
	waiting := map[level]map[string]bool{} // plugins with lines waiting, by reason
	read := false
	m.inspect(func(s *scheduler) {
		for _, e := range entriesOf(s) {
			if e.pending() > 0 && e.dropped == 0 {
				if waiting[e.key.level] == nil {
					waiting[e.key.level] = map[string]bool{}
				}
				waiting[e.key.level][pluginLabel(e.key.plugin)] = true
			}
		}
		read = s.pod.lookup
	})
	dropped := readLedger().since(m.before).droppedAll()
	for _, ln := range lines {
		p := pluginLabel(ln.plugin)
		for _, l := range m.firsts {
			if l.landed.IsZero() && l.reason == ln.level && l.plugin != p {
				l.others[p] = true
			}
		}
		if waiting[ln.level][p] {
			continue
		}
		others := map[string]bool{}
		for q := range waiting[ln.level] {
			others[q] = true
		}
		for _, o := range lines {
			if o.level == ln.level && pluginLabel(o.plugin) != p {
				others[pluginLabel(o.plugin)] = true
			}
		}
		m.firsts = append(m.firsts, &firstLine{plugin: p, reason: ln.level, at: m.clk.Now(), others: others, qps: m.qps, fleet: m.wait,
			read: read, outage: m.mode != apiHealthy || m.clk.Since(m.back) < recoveryBound, dropped: dropped})
		if waiting[ln.level] == nil {
			waiting[ln.level] = map[string]bool{}
		}
		waiting[ln.level][p] = true // its next lines are those of a busy plugin
	}
}

// deadlineOnReadings is m.deadline as the concurrent model's clock makes
// it: the scheduler sees time only at the readings the model moves to, and
// a bucket may hold one token at a time, so that each refill ends at the
// first reading after it is due. The pod's read takes a token of its own.
func (m *model) deadlineOnReadings(l *firstLine) (time.Time, bool) {
	if _, ok := m.deadline(l); !ok {
		return time.Time{}, false
	}
	reading := func(t time.Time) time.Time {
		for _, at := range m.readings {
			if !at.Before(t) {
				return at
			}
		}
		return t
	}
	t, refills, extra := l.at, 1+len(l.others), writeTimeout+l.fleet
	if l.outage {
		if m.back.After(t) {
			t = m.back
		}
		t = reading(t.Add(recoveryBound + pushbackBound + l.fleet))
	} else if m.held.toldSince(l.at) {
		t = reading(t.Add(pushbackBound))
	}
	if l.read {
		refills, extra = refills+1, extra+writeTimeout
	}
	for range refills {
		t = reading(t.Add(time.Duration(float64(time.Second) / l.qps)))
	}
	return reading(t.Add(extra)), true
}

// checkLanded holds the concurrent model's first lines to their bound:
// a write of their plugin and reason lands at the API within it, or at the
// first reading of the clock past it. A line whose plugin's lines may have
// been dropped since is not followed further.
func (m *model) checkLanded() error {
	dropped := readLedger().since(m.before).droppedAll()
	m.api.mu.Lock()
	reqs := slices.Clone(m.api.requests)
	m.api.mu.Unlock()
	return m.judgeFirsts(func(l *firstLine) bool {
		if dropped != l.dropped {
			return false
		}
		for _, r := range reqs {
			if r.resource == "events" && r.plugin == l.plugin && r.reason == l.reason.reason() && !r.at.Before(l.at) &&
				(r.code >= 200 && r.code < 300 || r.verb == "create" && r.code == 409) && (l.landed.IsZero() || r.at.Before(l.landed)) {
				l.landed = r.at
			}
		}
		return true
	}, m.deadlineOnReadings)
}

// pipelineOrder holds every dispatch of a pipeline to the reference of the
// token order (queue_test.go), as the stepped model's watchOrder does: it
// wraps the scheduler's dispatch and outcome, which only run calls, so that
// it sees the dispatches in the order they were made, whatever order their
// requests reach the API in, and each answer before the scheduler has it.
// A fatal line's request is granted outside dispatch and answered with no
// entry: the reference takes no notice of either.
type pipelineOrder struct {
	order  *tokenOrder          // run's
	client kubernetes.Interface // run's: the client of the settings in effect at the last dispatch
	mu     sync.Mutex
	n      int   // requests checked
	err    error // the first found out of order
}

// reloadClient is the client a reload hands the pipeline: one of its own at
// each reload, so that the dispatch after it knows that the settings changed.
type reloadClient struct{ kubernetes.Interface }

func watchPipelineOrder(p *pipeline) *pipelineOrder {
	w := &pipelineOrder{order: newTokenOrder(), client: p.client}
	p.dispatch = func(now time.Time) ([]request, time.Time) {
		if p.client != w.client { // a reload took effect since the last dispatch, in run's previous message
			w.client = p.client
			w.order.reloaded()
		}
		reqs, wake, err := w.order.dispatch(p.sched, now)
		w.mu.Lock()
		w.n += len(reqs)
		if w.err == nil && err != nil {
			w.err = fmt.Errorf("out of order: %w", err)
		}
		w.mu.Unlock()
		return reqs, wake
	}
	p.outcome = func(res result, now time.Time) {
		if f := p.sched.flights[res.id]; f.j != nil && !f.read {
			w.order.answered(f.j, res)
			w.order.resumed(f.j, res)
		}
		p.sched.outcome(res, now)
	}
	return w
}

// failed is the first dispatch found out of order, or nil.
func (w *pipelineOrder) failed() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

// checked is how many requests were checked in order.
func (w *pipelineOrder) checked() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.n
}
