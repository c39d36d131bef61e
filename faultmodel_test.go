package k8s_event

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"
)

// The fault model runs the pipeline against the in-process API server,
// through the real client-go, under a seeded schedule of faults, lines,
// reloads, event expiries and a shutdown, and checks every clause of the
// accounting contract after each step. One goroutine drives it, so that a
// seed replays the same run:
//
//	go test -run TestFaultModel -faultmodel.seed=N -v .
var (
	faultSeeds = flag.Int("faultmodel.seeds", seedsFromEnv(300), "number of seeds the fault model runs (default $K8S_EVENT_FAULT_SEEDS or 300)")
	faultSeed  = flag.Uint64("faultmodel.seed", 0, "run this seed of the fault model only")
)

// seedsFromEnv lets tools that cannot pass test flags (mutation testing)
// set the number of seeds.
func seedsFromEnv(n int) int {
	if v, err := strconv.Atoi(os.Getenv("K8S_EVENT_FAULT_SEEDS")); err == nil && v > 0 {
		return v
	}
	return n
}

// faultStats adds up what the runs injected and saw.
type faultStats struct {
	seeds, steps, lines, fatals, reloads, expiries, stops int
	requests, refused                                     int
	ends                                                  int // end events seen written
	injected                                              map[string]int
}

func TestFaultModel(t *testing.T) {
	stats := faultStats{injected: map[string]int{}}
	start := time.Now()
	first, n := uint64(1), uint64(*faultSeeds)
	if *faultSeed != 0 {
		first, n = *faultSeed, 1
	}
	for seed := first; seed < first+n; seed++ {
		if err := runFaultModel(seed, &stats); err != nil {
			t.Fatalf("seed %d: %v\nreplay: go test -run 'TestFaultModel$' -faultmodel.seed=%d -v .", seed, err, seed)
		}
	}
	kinds := make([]string, 0, len(stats.injected))
	for k := range stats.injected {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	var b strings.Builder
	for _, k := range kinds {
		fmt.Fprintf(&b, " %s=%d", k, stats.injected[k])
	}
	t.Logf("%d seeds in %v: %d steps, %d lines, %d fatal lines, %d reloads, %d expiries, %d stops, %d storm ends; %d requests reached the API, %d refused before; faults:%s",
		stats.seeds, time.Since(start).Round(time.Millisecond), stats.steps, stats.lines, stats.fatals, stats.reloads, stats.expiries, stats.stops,
		stats.ends, stats.requests, stats.refused, b.String())
}

// apiMode is how the API behaves during a step.
type apiMode uint8

const (
	apiHealthy  apiMode = iota
	apiRefusing         // connections refused: nothing reaches it
	apiSilent           // connections accepted, never answered
	apiFlaky            // each request meets a random fault, or none
)

// model is one run of the fault model.
type model struct {
	rng   *rand.Rand
	clk   *clocktesting.FakeClock
	api   *fakeAPI
	p     *pipeline
	stats *faultStats
	mode  apiMode

	before    ledger
	fed       float64 // lines handed to the listener
	expired   int64   // counts of events the TTL removed
	realTime  bool    // a silent API makes calls wait for their time-out
	maxBurst  int
	maxQPS    float64
	lastFatal time.Duration
	podReads  []apiRequest // the pod reads that reached the API, with the reason they were made for; under api.mu

	quiet    time.Duration     // of every configuration of the run; 0: off
	endNames map[string]string // the name of the end event of each end message seen
}

var (
	faultConfigs = []config{
		testConfig(all, defaultQPS, defaultBurst, defaultCacheSize),
		testConfig(all, defaultQPS, 3, 4),
		testConfig(all, 0.1, 2, 2),
		testConfig(all, 1, 5, 16),
		testConfig(all, 10, 1, 3),
	}
	modelPlugins = []string{"plugin/errors: ", "plugin/forward: ", "plugin/reload: "}
	modelLevels  = []level{levelError, levelWarning, levelInfo}
)

func runFaultModel(seed uint64, stats *faultStats) (err error) {
	m := &model{rng: rand.New(rand.NewPCG(seed, 0x6b38)), clk: clocktesting.NewFakeClock(epoch), stats: stats}
	if m.api, err = startFakeAPI(m.clk); err != nil {
		return err
	}
	defer m.api.close()
	m.api.setFault(m.fault)

	cfg := faultConfigs[m.rng.IntN(len(faultConfigs))]
	m.maxBurst, m.maxQPS = cfg.burst, cfg.qps
	if m.rng.IntN(4) != 0 { // storms end after a quiet of 30 s to 3 min
		m.quiet = time.Duration(30+m.rng.IntN(151)) * time.Second
	}
	cfg.quiet = m.quiet
	m.endNames = map[string]string{}
	pod := testPod()
	if m.rng.IntN(3) == 0 { // no UID from the downward API
		ref := testRef
		ref.UID = ""
		pod.ref.Store(&ref)
		pod.lookup.Store(true)
		if m.rng.IntN(2) == 0 {
			m.api.addPod(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: testRef.Name, Namespace: testRef.Namespace, UID: testRef.UID}})
		}
	}
	m.before = readLedger()
	m.p = newPipeline(cfg, m.api.client, pod, m.clk)
	// Long enough that a loaded machine under the race detector does not
	// time answers out; the model's hangs are instant but where the time
	// a call takes is checked.
	m.p.writeTimeout = 250 * time.Millisecond
	m.p.fatalTimeout = 20 * time.Millisecond
	m.p.flushPause = time.Millisecond
	m.p.flushInTurn = true
	m.p.rand = rand.New(rand.NewPCG(seed, 1))
	m.p.queue.ShutDown() // the model is the scheduler: due() runs what is due
	defer m.p.cancel()
	stats.seeds++

	steps := 10 + m.rng.IntN(30)
	for range steps {
		if err := m.step(); err != nil {
			return err
		}
	}
	// Every run ends its outages with the API back for good, so that the
	// clause of recovery within one maximal backoff is checked each time.
	if err := m.recover(); err != nil {
		return err
	}
	return m.stop()
}

// fault decides what happens to one request; the mode of the step sets
// the odds.
func (m *model) fault(r apiRequest) fault {
	var f fault
	var kind string
	switch m.mode {
	case apiRefusing:
		f, kind = fault{unsent: true}, "refused"
	case apiSilent:
		// No answer ever comes. The client gives up at its time-out; the
		// model skips that wait, but where the time a call takes is what
		// is checked: the fatal line and the stop.
		f, kind = fault{lost: !m.realTime, hang: m.realTime, apply: m.rng.IntN(4) == 0}, "silent"
	case apiFlaky:
		switch k := m.rng.IntN(24); k {
		case 0, 1:
			f, kind = fault{unsent: true}, "refused"
		case 2, 3:
			f, kind = fault{lost: true, apply: m.rng.IntN(2) == 0}, "lost"
		case 4:
			f, kind = fault{reset: true, apply: m.rng.IntN(2) == 0}, "reset"
		case 5:
			f, kind = fault{delay: time.Duration(m.rng.IntN(2000)) * time.Microsecond}, "slow"
		case 6:
			f, kind = fault{lost: !m.realTime, hang: m.realTime, apply: m.rng.IntN(2) == 0}, "hang"
		case 7, 8, 9, 10, 11, 12, 14:
			codes := []int{401, 403, 422, 429, 500, 503, 0, 504}
			f.code = codes[k-7]
			kind = fmt.Sprint(f.code)
			if f.code == 429 && m.rng.IntN(2) == 0 {
				f.retryAfter = 1 + m.rng.IntN(5)
				kind = "429+Retry-After"
			}
			if f.code >= 500 && m.rng.IntN(2) == 0 {
				// etcd committed, kube-apiserver timed out waiting for it
				f.apply = true
				kind += "+applied"
			}
		case 13:
			switch r.verb {
			case "create": // a patch's 404 comes from expiry, as on a real API
				f, kind = fault{code: 404}, "404"
			case "patch": // a create's 409 is a name taken, which unique names rule out
				f, kind = fault{code: 409}, "409"
			}
		}
	}
	if kind != "" {
		m.stats.injected[kind]++
	}
	if r.resource == "pods" && !f.unsent && m.p != nil {
		// A pod read is made for the create of the one entry in flight
		// (the model runs one write at a time) and takes its bucket's token.
		m.p.mu.Lock()
		for _, e := range m.p.pendingEntries() {
			if e.inflight {
				r.reason = e.key.level.reason()
			}
		}
		m.p.mu.Unlock()
		m.podReads = append(m.podReads, r)
	}
	return f
}

// step feeds lines, maybe reloads or expires, moves the clock, runs what
// is due and checks the contract.
func (m *model) step() error {
	m.stats.steps++
	if m.rng.IntN(4) == 0 {
		modes := []apiMode{apiHealthy, apiRefusing, apiSilent, apiFlaky, apiFlaky}
		m.mode = modes[m.rng.IntN(len(modes))]
	}
	for range m.rng.IntN(12) {
		m.line()
	}
	m.correlate()
	switch r := m.rng.IntN(40); {
	case r < 3:
		cfg := faultConfigs[m.rng.IntN(len(faultConfigs))]
		switch m.rng.IntN(6) { // a reload may change quiet too, or turn it off or on
		case 0:
			m.quiet = 0
		case 1:
			m.quiet = time.Duration(30+m.rng.IntN(151)) * time.Second
		}
		cfg.quiet = m.quiet
		m.maxBurst, m.maxQPS = max(m.maxBurst, cfg.burst), max(m.maxQPS, cfg.qps)
		m.p.apply(cfg, m.api.client)
		m.stats.reloads++
	case r < 5:
		m.expired += m.api.expire()
		m.stats.expiries++
	case r < 6:
		if err := m.fatal(); err != nil {
			return err
		}
	}
	m.clk.Step(time.Duration(1+m.rng.IntN(90)) * time.Second)
	m.due()
	return m.check()
}

// line logs one line through the listener: a repeat, a distinct line of a
// storm, at one of three levels from one of three plugins.
func (m *model) line() {
	plugin := modelPlugins[m.rng.IntN(len(modelPlugins))]
	var text string
	if m.rng.IntN(3) == 0 {
		text = fmt.Sprintf("%d q%d.example.org. A: i/o timeout", m.rng.IntN(3), m.rng.IntN(1000))
	} else {
		text = fmt.Sprintf("upstream %d unhealthy", m.rng.IntN(3))
	}
	switch modelLevels[m.rng.IntN(len(modelLevels))] {
	case levelError:
		m.p.Error(plugin, text)
	case levelWarning:
		m.p.Warning(plugin, text)
	default:
		m.p.Infof(plugin, "%s", text)
	}
	m.fed++
	m.stats.lines++
}

// correlate does the correlator's work for the lines queued.
func (m *model) correlate() {
	for len(m.p.lines) > 0 {
		m.p.observe(<-m.p.lines)
	}
}

// fatal logs a fatal line: it must return within the fatal time.
func (m *model) fatal() error {
	m.realTime = true
	defer func() { m.realTime = false }()
	start := time.Now()
	m.p.Fatal("plugin/reload: ", "cannot go on")
	m.fed++
	m.stats.fatals++
	if took := time.Since(start); took > m.p.fatalTimeout+time.Second {
		return fmt.Errorf("a fatal line took %v, fatal time %v", took, m.p.fatalTimeout)
	}
	return nil
}

// due runs every entry whose time has come, in a fixed order: those with
// lines pending, the ends, and the written storms waiting for their quiet
// (the work queue's timers).
func (m *model) due() {
	m.p.mu.Lock()
	es := append(m.p.pendingEntries(), m.p.endEntries()...)
	for _, e := range m.p.cache.Values() {
		if e.pending() == 0 && !e.evicted {
			es = append(es, e)
		}
	}
	m.p.mu.Unlock()
	m.run(es)
	// The ends that storms reached in this pass are queued at once.
	m.p.mu.Lock()
	var ends []*entry
	for _, e := range m.p.endEntries() {
		if e.retryAt.IsZero() && e.failures == 0 {
			ends = append(ends, e)
		}
	}
	m.p.mu.Unlock()
	m.run(ends)
}

// run syncs the entries whose time has come, in order.
func (m *model) run(es []*entry) {
	for _, e := range es {
		m.p.mu.Lock()
		ready := !e.retryAt.After(m.clk.Now())
		m.p.mu.Unlock()
		if ready {
			m.p.sync(e)
		}
	}
}

// check holds the contract at a quiet moment: no write in flight, no line
// between the listener and the correlator.
func (m *model) check() error {
	d := readLedger().since(m.before)
	live := countsIn(m.api)
	m.p.mu.Lock()
	var doubt float64
	for _, e := range m.p.pendingEntries() {
		if e.doubt > 0 {
			doubt += float64(min(e.doubt-e.carried, e.pending()))
		}
	}
	doubt += float64(m.p.doubtful)
	settling, cached, cacheSize := len(m.p.settling), m.p.cache.Len(), m.p.cacheSize
	ends := len(m.p.ends)
	m.p.mu.Unlock()

	// An end is written once: retries of a create that got no answer take
	// its name again, and no end is said twice.
	for _, ev := range m.api.list() {
		if !strings.HasSuffix(ev.Reason, "Ended") {
			continue
		}
		if ev.Type != corev1.EventTypeNormal || ev.Count != 1 {
			return fmt.Errorf("end event %q of type %s, count %d", ev.Message, ev.Type, ev.Count)
		}
		said := ev.Reason + " " + ev.Message
		if _, ok := m.endNames[said]; !ok && m.quiet == 0 {
			// The check runs after every step: an end it has not seen was
			// written since, and quiet is off since before that.
			return fmt.Errorf("end event %q with quiet off", ev.Message)
		}
		if name, ok := m.endNames[said]; ok && name != ev.Name {
			return fmt.Errorf("end %q written twice: %s and %s", said, name, ev.Name)
		}
		m.endNames[said] = ev.Name
	}
	if ends > cacheSize {
		return fmt.Errorf("%d ends waiting, cache size %d", ends, cacheSize)
	}

	if d.lines != m.fed {
		return fmt.Errorf("lines_total rose by %v, %v lines were logged", d.lines, m.fed)
	}
	// Every line is in an event's count, pending or dropped, exactly once.
	// Two things blur the sum, and each is bounded: a write that reached the
	// API without an answer may have landed (doubt), and an event the TTL
	// removed takes its count with it (expired).
	sum := live + d.pending + d.droppedAll()
	if sum < d.lines-float64(m.expired) || sum > d.lines+doubt {
		return fmt.Errorf("counts %v + pending %v + dropped %v = %v, lines %v (expired %d, doubt %v)",
			live, d.pending, d.dropped, sum, d.lines, m.expired, doubt)
	}
	if m.expired == 0 && doubt == 0 && sum != d.lines {
		return fmt.Errorf("counts %v + pending %v + dropped %v = %v, lines %v", live, d.pending, d.dropped, sum, d.lines)
	}
	if settling > cacheSize || cached > cacheSize {
		return fmt.Errorf("%d entries cached and %d settling, cache size %d", cached, settling, cacheSize)
	}
	return m.checkBound()
}

// checkBound: the requests made for the events of one reason that reached
// the API, pod reads included, over any interval T, are at most BURST +
// QPS x T.
func (m *model) checkBound() error {
	m.api.mu.Lock()
	byReason := map[string][]time.Time{}
	for _, r := range m.api.requests {
		if r.resource == "events" {
			byReason[r.reason] = append(byReason[r.reason], r.at)
		}
	}
	for _, r := range m.podReads {
		if r.reason == "" {
			m.api.mu.Unlock()
			return fmt.Errorf("a pod read at %v with no event in flight", r.at)
		}
		byReason[r.reason] = append(byReason[r.reason], r.at)
	}
	m.api.mu.Unlock()
	for reason, at := range byReason {
		sort.Slice(at, func(i, j int) bool { return at[i].Before(at[j]) })
		for i := range at {
			for j := i; j < len(at); j++ {
				if bound := float64(m.maxBurst) + m.maxQPS*at[j].Sub(at[i]).Seconds(); float64(j-i+1) > bound+1e-9 {
					return fmt.Errorf("%d %s requests from %v to %v, bound %.2f", j-i+1, reason, at[i], at[j], bound)
				}
			}
		}
	}
	return nil
}

// recover brings the API back for good and checks that every pending
// event lands within one maximal backoff and its jitter, as far as the
// tokens allow.
func (m *model) recover() error {
	m.mode = apiHealthy
	back := m.clk.Now()
	for m.clk.Since(back) <= retryMax+retryMax/5+time.Second {
		m.clk.Step(time.Second)
		m.due()
	}
	m.p.mu.Lock()
	defer m.p.mu.Unlock()
	for _, e := range m.p.pendingEntries() {
		l := e.key.level
		if tokens := m.p.buckets[l].TokensAt(m.clk.Now()); tokens >= 1 {
			return fmt.Errorf("%v after the API came back, %q is pending with %d lines and %.2f %s tokens",
				m.clk.Since(back), e.key.message, e.pending(), tokens, l.reason())
		}
	}
	for _, e := range m.p.endEntries() {
		if tokens := m.p.buckets[endBucket].TokensAt(m.clk.Now()); tokens >= 1 {
			return fmt.Errorf("%v after the API came back, the end %q waits with %.2f end tokens; retry in %v, %d failures",
				m.clk.Since(back), e.end.message, tokens, e.retryAt.Sub(m.clk.Now()), e.failures)
		}
	}
	return nil
}

// stop shuts the pipeline down, with the API in the mode it is in: the
// flush is bounded, and on a healthy API it writes every pending event
// whose bucket has a token.
func (m *model) stop() error {
	m.stats.stops++
	m.p.mu.Lock()
	pending := m.p.pendingEntries()
	m.p.mu.Unlock()
	const timeout = 50 * time.Millisecond
	m.realTime = true
	start := time.Now()
	m.p.stop(timeout)
	if took := time.Since(start); took > timeout+2*time.Second {
		return fmt.Errorf("stop took %v, flush time %v", took, timeout)
	}
	if err := m.check(); err != nil {
		return fmt.Errorf("after stop: %w", err)
	}
	m.api.mu.Lock()
	m.stats.requests += len(m.api.requests)
	m.stats.refused += m.api.refused
	m.api.mu.Unlock()
	m.stats.ends += len(m.endNames)
	if d := readLedger().since(m.before); d.pending != 0 {
		return fmt.Errorf("%v lines still pending after stop", d.pending)
	}
	if m.mode != apiHealthy || time.Since(start) >= timeout {
		return nil
	}
	for _, e := range pending {
		l := e.key.level
		if e.dropped > 0 && m.p.buckets[l].TokensAt(m.clk.Now()) >= 1 {
			return fmt.Errorf("%q was dropped at a healthy stop (took %v) with %.3f %s tokens left, %d reserved; entry %+v",
				e.key.message, time.Since(start), m.p.buckets[l].TokensAt(m.clk.Now()), l.reason(), m.p.reserved[l], *e)
		}
	}
	return nil
}
