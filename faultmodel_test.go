package k8s_event

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"
)

// The stepped fault model drives the production scheduler, message by
// message, through the harness (helpers_test.go), against the in-process
// API server, through the real client-go, under a seeded schedule of
// faults, lines, reloads, event expiries, fatal lines and a shutdown, and
// checks every clause of the accounting contract after each step. Time is
// a fake clock on which a request that gets no answer takes its time-out,
// as in CoreDNS. One goroutine drives it, so that a seed replays the same
// run:
//
//	go test -run TestFaultModel -faultmodel.seed=N -v .
var (
	faultSeeds = flag.Int("faultmodel.seeds", seedsFromEnv("K8S_EVENT_FAULT_SEEDS", 300), "number of seeds the fault model runs (default $K8S_EVENT_FAULT_SEEDS or 300)")
	faultSeed  = flag.Uint64("faultmodel.seed", 0, "run this seed of the fault model only")
)

// seedsFromEnv lets tools that cannot pass test flags (mutation testing)
// set the number of seeds.
func seedsFromEnv(name string, n int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return n
}

// faultStats adds up what the runs injected and saw.
type faultStats struct {
	seeds, steps, lines, fatals, reloads, expiries, stops int
	requests, refused                                     int
	ends                                                  int // end events seen written
	firsts, ordered                                       int // first lines checked written in their bound; requests checked in order
	injected                                              map[string]int
	workload                                              map[string]int // the faults the reads of the workload met, by kind ("none" too)
}

func TestFaultModel(t *testing.T) {
	stats := faultStats{injected: map[string]int{}, workload: map[string]int{}}
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
	t.Logf("%d seeds in %v: %d steps, %d lines, %d fatal lines, %d reloads, %d expiries, %d stops, %d storm ends; %d requests reached the API, %d refused before; %d handed out in order, %d first lines written within their bound, %d lines of hosts found promoted; faults:%s",
		stats.seeds, time.Since(start).Round(time.Millisecond), stats.steps, stats.lines, stats.fatals, stats.reloads, stats.expiries, stats.stops,
		stats.ends, stats.requests, stats.refused, stats.ordered, stats.firsts, hostsPromoted, b.String())
	t.Logf("reads of the workload (fleet): %v", stats.workload)
	if *faultSeed == 0 && stats.seeds >= 300 {
		if err := workloadFaults(&stats); err != nil {
			t.Error(err)
		}
	}
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
	clk   *steppedClock
	api   *fakeAPI
	h     *harness
	p     *pipeline // the concurrent model's
	stats *faultStats
	mode  apiMode

	before    ledger
	fed       float64 // lines handed to the listener
	expired   int64   // counts of events the TTL removed
	realTime  bool    // the concurrent model: a silent API makes calls wait for their time-out
	maxBurst  int
	maxQPS    float64
	lastFatal time.Duration
	podReads  []apiRequest // the reads of the pod and workload that reached the API, with the reason they were made for; under api.mu

	quiet    time.Duration     // of every configuration of the run; 0: off
	endNames map[string]string // the name of the end event of each end message seen

	hosts    *hosts         // the stepped model's failing hosts (faultpromote_test.go)
	ends     *endWatch      // the stepped model's record of storms (faultends_test.go)
	order    *tokenOrder    // the stepped model's reference of the token order
	watch    *pipelineOrder // the concurrent model's
	firsts   []*firstLine   // lines of plugins that had nothing pending, until checked
	readings []time.Time    // the concurrent model's clock readings
	back     time.Time      // when the API last came back from an outage
	qps      float64        // the rate in effect
	held     *heldCheck     // the Retry-Afters the scheduler was told, shared with the faults' model
	fleet    *modelFleet    // the workload and the fleet's shares (faultfleet_test.go)
	wait     time.Duration  // what fleet adds to a line's wait, in the configuration in effect

	saidMu sync.Mutex
	said   []error // what the concurrent model's scheduler said of failed writes and reads
}

// reports is what the scheduler said of failed writes and reads so far.
func (m *model) reports() []error {
	if m.h != nil {
		return m.h.reports
	}
	m.saidMu.Lock()
	defer m.saidMu.Unlock()
	return slices.Clone(m.said)
}

// heldCheck holds the scheduler to the 429s it was told: no request of any kind is handed out
// within max(Retry-After, 1 s) of the answer reaching it. It orders decisions, not times: the
// stepped model's clock does not move between a 429's answer and the next dispatch, so each
// answer taken and each request handed out gets the next number of one sequence, and a request
// numbered after a 429's answer and handed out before its hold ends fails the model. A request
// handed out before the answer came may still leave after it, at the same instant.
type heldCheck struct {
	mu      sync.Mutex
	seq     uint64      // of the latest answer taken or request handed out
	fromSeq uint64      // of the 429 whose hold ends last; 0: none yet
	from    time.Time   // when that 429 reached the scheduler
	until   time.Time   // when its hold ends
	told429 []time.Time // when each 429 reached the scheduler
	err     error
}

// told takes an answer as the scheduler gets it, at now.
func (c *heldCheck) told(res result, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seq++
	if statusCode(res.err) != http.StatusTooManyRequests {
		return
	}
	c.told429 = append(c.told429, now)
	if until := now.Add(max(res.retryAfter, time.Second)); until.After(c.until) {
		c.fromSeq, c.from, c.until = c.seq, now, until
	}
}

// toldSince says whether a 429 reached the scheduler at from or later.
func (c *heldCheck) toldSince(from time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.told429) > 0 && !c.told429[len(c.told429)-1].Before(from)
}

// handed takes requests as the scheduler hands them out, at now: by dispatch, or granted to a
// fatal line.
func (c *heldCheck) handed(reqs []request, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, r := range reqs {
		c.seq++
		if c.fromSeq != 0 && c.seq > c.fromSeq && now.Before(c.until) && c.err == nil {
			c.err = fmt.Errorf("a %s was handed out at %v, after a 429 told at %v, within its Retry-After until %v",
				r.verb, now, c.from, c.until)
		}
	}
}

// leaves takes a request leaving the client at at: one that leaves after the instant of a 429,
// within its hold, fails the model however it was handed out (the concurrent model's fatal
// lines are granted in the listener's goroutine, outside the sequence).
func (c *heldCheck) leaves(r apiRequest) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if r.at.After(c.from) && r.at.Before(c.until) && c.err == nil {
		c.err = fmt.Errorf("a %s of %s left at %v, within the Retry-After told at %v until %v", r.verb, r.resource, r.at, c.from, c.until)
	}
}

func (c *heldCheck) failed() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

var (
	faultConfigs = []config{
		testConfig(all, defaultQPS, defaultBurst, defaultCacheSize),
		testConfig(all, defaultQPS, 3, 4),
		testConfig(all, 0.1, 2, 2),
		testConfig(all, 1, 5, 16),
		testConfig(all, 10, 1, 3),
		withFleet(testConfig(all, 1, 5, 16), 3, 10),
		withFleet(testConfig(all, 10, 4, 8), 0.5, 4),
	}
	modelPlugins = []string{"plugin/errors: ", "plugin/forward: ", "plugin/reload: "}
	modelLevels  = []level{levelError, levelWarning, levelInfo}
)

func runFaultModel(seed uint64, stats *faultStats) (err error) {
	m := &model{rng: rand.New(rand.NewPCG(seed, 0x6b38)), clk: newSteppedClock(), stats: stats, held: &heldCheck{}}
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
		pod = testPodWithoutUID()
		if m.rng.IntN(2) == 0 {
			m.api.addPod(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: testRef.Name, Namespace: testRef.Namespace, UID: testRef.UID}})
		}
	}
	m.addWorkload()
	m.configured(cfg)
	m.qps, m.wait = m.rateOf(cfg), fleetWait(cfg)
	m.before = readLedger()
	m.h = newHarnessOn(nil, cfg, m.api, m.clk, pod)
	// A request that gets no answer takes its time-out on the fake clock;
	// in real time the fake API loses its answer at once.
	m.h.lostAfter = writeTimeout
	m.h.writeTimeout = 250 * time.Millisecond
	m.h.s.rand = rand.New(rand.NewPCG(seed, 1))
	m.h.got = func(res result, now time.Time) {
		m.held.told(res, now)
		if f := m.h.s.flights[res.id]; f.j != nil && !f.read && m.order != nil {
			m.order.resumed(f.j, res)
		}
	}
	m.h.handed = m.held.handed
	m.watchOrder()
	m.hosts = newHosts(seed)
	m.ends = newEndWatch()
	m.back = m.clk.Now().Add(-recoveryBound) // no outage before
	// A quarter of the answers come back late, up to a second, and so out
	// of the order of their requests, after later dispatches.
	m.h.hold = func(request) time.Duration {
		if m.rng.IntN(4) != 0 {
			return 0
		}
		return time.Duration(1+m.rng.IntN(1000)) * time.Millisecond
	}
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
	m.held.leaves(r)
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
		k := m.rng.IntN(24)
		if workloadRead(r) && k >= 15 {
			// The reads of the workload are few: more of them meet an error status.
			k = 7 + m.rng.IntN(8)
		}
		switch k {
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
	if workloadRead(r) {
		m.stats.workload[cmp.Or(kind, "none")]++
	}
	if r.resource != "events" && !f.unsent && m.h != nil {
		// A read of the pod or of its workload is made for a write of one
		// entry, and takes the token of that entry's bucket. The stepped
		// model sends from the goroutine that owns the scheduler, so it may
		// look.
		if fl, ok := m.h.s.flights[m.h.sending.id]; ok && (fl.read || fl.fleet) {
			r.reason = bucketName(fl.bucket)
			if fl.fleet && m.h.s.fleet.n > 0 { // a stale N's read: the read bucket's token alone
				r.reason = staleRead
			}
		}
		m.podReads = append(m.podReads, r)
	}
	return f
}

// staleRead marks a read of an N known already: it takes a token of the read bucket, not of the
// write's.
const staleRead = "stale N"

// bucketName names a bucket: its reason, or "ends" for the bucket the
// ends of both levels share.
func bucketName(b level) string {
	if b == endBucket {
		return "ends"
	}
	return b.reason()
}

// inspect runs f with the scheduler in the goroutine that owns it: the
// model's own in the stepped model, the pipeline's run in the concurrent
// one (or the test's, once run has returned).
func (m *model) inspect(f func(s *scheduler)) {
	if m.p == nil {
		f(m.h.s)
		return
	}
	done := make(chan struct{})
	if m.p.post(context.Background(), inspectMsg{look: f, done: done}) {
		<-done
		return
	}
	f(m.p.sched)
}

// step feeds lines, maybe reloads or expires, moves the clock, does what is
// due meanwhile and checks the contract.
func (m *model) step() error {
	m.stats.steps++
	if m.rng.IntN(4) == 0 {
		modes := []apiMode{apiHealthy, apiRefusing, apiSilent, apiFlaky, apiFlaky}
		m.setMode(modes[m.rng.IntN(len(modes))])
	}
	for range m.rng.IntN(12) {
		m.line()
		m.h.take()
		m.noteFirst()
	}
	if err := m.hostLines(); err != nil {
		return err
	}
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
		m.h.apply(cfg)
		m.reloaded(cfg)
		m.stats.reloads++
	case r < 5:
		m.expired += m.api.expire()
		m.stats.expiries++
	case r < 6:
		if err := m.fatal(); err != nil {
			return err
		}
	case r < 8:
		m.scaled()
	}
	if m.rng.IntN(10) == 0 { // the wall clock steps (NTP, a VM resumed); the monotonic one goes on
		m.clk.stepWall(time.Duration(m.rng.IntN(4*3600)-2*3600) * time.Second)
		m.stats.injected["wall step"]++
	}
	m.h.advance(time.Duration(1+m.rng.IntN(90)) * time.Second)
	return m.check()
}

// steppedClock is a fake clock whose readings carry a monotonic reading,
// as time.Now's do, and whose wall clock the model steps apart from it.
// Timers run on the monotonic clock, as Go's do.
type steppedClock struct {
	*clocktesting.FakeClock              // the monotonic clock, from epoch
	base                    time.Time    // a time.Now reading: the monotonic clock at epoch
	step                    atomic.Int64 // of the wall clock from the monotonic one
}

func newSteppedClock() *steppedClock {
	return &steppedClock{FakeClock: clocktesting.NewFakeClock(epoch), base: time.Now()}
}

func (c *steppedClock) Now() time.Time {
	elapsed := c.FakeClock.Now().Sub(epoch)
	return afterStep(c.base, elapsed, epoch.Sub(c.base.Round(0))+time.Duration(c.step.Load()))
}

func (c *steppedClock) Since(t time.Time) time.Duration { return c.Now().Sub(t) }

// SetTime moves the monotonic clock to t, a reading of this clock.
func (c *steppedClock) SetTime(t time.Time) { c.FakeClock.SetTime(epoch.Add(t.Sub(c.base))) }

// stepWall steps the wall clock by d.
func (c *steppedClock) stepWall(d time.Duration) { c.step.Add(int64(d)) }

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
		m.h.Error(plugin, text)
	case levelWarning:
		m.h.Warning(plugin, text)
	default:
		m.h.Infof(plugin, "%s", text)
	}
	m.fed++
	m.stats.lines++
}

// fatal logs a fatal line: it is written before the listener returns,
// whatever else is in flight.
func (m *model) fatal() error {
	start := time.Now()
	m.h.Fatal("plugin/reload: ", "cannot go on")
	m.fed++
	m.stats.fatals++
	if took := time.Since(start); took > fatalTimeout+time.Second {
		return fmt.Errorf("a fatal line took %v, fatal time %v", took, fatalTimeout)
	}
	return nil
}

// check holds the contract. Requests still in flight (those that hang
// until their time-out) blur it as answers that never came do: each may
// land with the lines it carries.
func (m *model) check() error {
	d := readLedger().since(m.before)
	live := countsIn(m.api)
	var doubt float64
	var settling, cached, cacheSize, ends int
	var lost error
	m.inspect(func(s *scheduler) {
		for _, e := range entriesOf(s) {
			if e.doubt > 0 {
				doubt += float64(min(e.doubt-e.carried, e.pending()))
			}
		}
		for _, f := range s.flights {
			if e := f.j; e != nil && e.lines != nil && !f.read {
				doubt += float64(min(e.lines.base+f.count-e.lines.carried, e.lines.pending()))
			}
		}
		doubt += float64(s.doubtful)
		settling, cached, cacheSize = len(s.settling), len(s.corr.cache.entries), s.set.cacheSize
		for e := range s.settling {
			if e.inflight != 0 {
				settling-- // a shrink leaves it until its answer is back
			}
		}
		ends = len(s.ends.list)
		lost = lostEntries(s)
	})
	if lost != nil {
		return lost
	}

	// An event's times never run back on the wall clock, whatever steps it
	// took. An end is written once: retries of a create that got no answer
	// take its name again, and no end is said twice.
	for _, ev := range m.api.list() {
		if ev.LastTimestamp.Before(&ev.FirstTimestamp) {
			return fmt.Errorf("event %q last at %v, before its first at %v", ev.Message, ev.LastTimestamp, ev.FirstTimestamp)
		}
		if !strings.HasSuffix(ev.Reason, "Ended") {
			continue
		}
		if ev.Type != corev1.EventTypeNormal || ev.Count != 1 {
			return fmt.Errorf("end event %q of type %s, count %d", ev.Message, ev.Type, ev.Count)
		}
		said := ev.Reason + " " + ev.Message
		if _, ok := m.endNames[said]; !ok && m.quiet == 0 && m.p == nil {
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
	if m.p == nil { // the stepped model: the order of every dispatch, the wait of first lines
		if err := errors.Join(m.h.failed...); err != nil {
			return err
		}
		if err := m.checkFirsts(); err != nil {
			return err
		}
	} else if err := errors.Join(m.watch.failed(), m.checkLanded()); err != nil { // the concurrent model: the same, as it runs
		return err
	}
	return m.checkBound()
}

// checkBound: the requests made for the events of one bucket that reached
// the API, pod reads included, over any interval T, are at most BURST +
// QPS x T.
func (m *model) checkBound() error {
	if err := m.held.failed(); err != nil {
		return err
	}
	m.api.mu.Lock()
	byBucket := map[string][]time.Time{}
	for _, r := range m.api.requests {
		if r.resource == "events" {
			b := r.reason
			if strings.HasSuffix(b, "Ended") {
				b = "ends"
			}
			byBucket[b] = append(byBucket[b], r.at)
		}
	}
	for _, r := range m.podReads {
		if r.reason == "" {
			m.api.mu.Unlock()
			return fmt.Errorf("a %s of %s at %v made for no event", r.verb, r.resource, r.at)
		}
		if r.reason != staleRead {
			byBucket[r.reason] = append(byBucket[r.reason], r.at)
		}
	}
	m.api.mu.Unlock()
	if err := m.checkShare(m.reports()); err != nil {
		return err
	}
	for reason, at := range byBucket {
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

// lostEntries tells of an entry with something to write that waits
// nowhere: not in flight, in no queue, in no timer, not set aside for the
// pod's read. It would never be written.
func lostEntries(s *scheduler) error {
	for _, e := range jobsOf(s) {
		if e.slot.owner != nil && e.slot.owner.index < 0 {
			return fmt.Errorf("%q waits in the queue of a plugin that has no turn", jobText(e))
		}
		l := e.lines
		if l != nil && (l.pending() == 0 || l.dropped > 0) || e.inflight != 0 || e.slot.in != nil {
			continue
		}
		if at := e.retryAt; s.stopping && (at.After(s.deadline) || e.asked.After(s.deadline)) {
			continue // never sent again: dropped when the flush ends
		}
		return fmt.Errorf("%q has something to write and waits nowhere", jobText(e))
	}
	return nil
}

// entriesOf lists the entries of s's cache and those settling.
func entriesOf(s *scheduler) []*entry {
	out := s.corr.cache.values()
	for e := range s.settling {
		out = append(out, e)
	}
	return out
}

// recoveryBound is how long after the API server's return every pending
// event whose bucket has a token is written: a request sent just before
// may still take its time-out, and a failure then backs off at most one
// maximal backoff and its jitter.
const recoveryBound = writeTimeout + retryMax + retryMax/5

// recover brings the API back for good and checks that every pending
// event lands within recoveryBound, as far as the tokens allow.
func (m *model) recover() error {
	m.setMode(apiHealthy)
	back := m.clk.Now()
	m.h.advance(recoveryBound + m.herd())
	return m.recovered(back)
}

// recovered checks, once recoveryBound has passed since back, that nothing
// whose bucket has a token waits.
func (m *model) recovered(back time.Time) (err error) {
	m.inspect(func(s *scheduler) {
		now := m.clk.Now()
		for _, e := range entriesOf(s) {
			if e.pending() == 0 || e.dropped > 0 || e.inflight != 0 {
				continue
			}
			b := e.key.level
			if tokens := s.buckets[b].wait(now) + s.fleet.wait(b, now); tokens == 0 {
				err = fmt.Errorf("%v after the API came back, %q is pending with %d lines and a %s token; retry in %v, %d failures, pod read due %v",
					m.clk.Since(back), e.key.message, e.pending(), bucketName(b), e.retryAt.Sub(now), e.failures, s.pod.nextTry.Sub(now))
				return
			}
		}
		for _, e := range s.ends.list {
			if e.inflight == 0 && s.buckets[endBucket].wait(now)+s.fleet.wait(endBucket, now) == 0 {
				err = fmt.Errorf("%v after the API came back, the end %q waits with an end token; retry in %v, %d failures",
					m.clk.Since(back), e.message, e.retryAt.Sub(now), e.failures)
				return
			}
		}
	})
	return err
}

// stop runs the flush with the API in the mode it is in: it ends by its
// deadline, and on a healthy API it writes every pending event whose bucket
// has a token.
func (m *model) stop() error {
	m.stats.stops++
	m.h.hold = nil // answers held past the deadline would keep the last token of their bucket
	pending := m.h.pendingEntries()
	m.h.stop(flushTimeout)
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
	if m.mode != apiHealthy {
		return nil
	}
	for _, e := range pending {
		b := e.key.level
		if e.dropped > 0 && m.h.s.buckets[b].wait(m.clk.Now())+m.h.s.fleet.wait(b, m.clk.Now()) == 0 {
			return fmt.Errorf("%q was dropped at a healthy stop with a %s token left; entry %+v", e.key.message, bucketName(b), *e)
		}
	}
	return nil
}

// firstLine is a line of a plugin that had nothing pending in its reason
// when it was logged: README.md bounds its wait.
type firstLine struct {
	e       *entry // the stepped model's: the entry of its event
	plugin  string // the concurrent model's: its plugin's label and reason
	reason  level
	dropped float64         // the concurrent model's: lines dropped before it
	n       int64           // it is written by a write of e that carries n lines
	at      time.Time       // logged
	others  map[string]bool // other plugins of its reason with lines waiting before it is written
	qps     float64         // the least rate in effect since, the fleet's share's included
	fleet   time.Duration   // the most that fleet adds to its wait since: the herd's window and the reads of N
	read    bool            // the pod's UID was still to read
	outage  bool            // the API was down or failing since
	landed  time.Time
}

// watchOrder holds every dispatch to the reference of the token order,
// and notes when the write of each first line lands.
func (m *model) watchOrder() {
	m.order = newTokenOrder()
	m.h.dispatch = func(now time.Time) ([]request, time.Time) {
		before := m.endsCheck()
		reqs, wake, err := m.order.dispatch(m.h.s, now)
		m.stats.ordered += len(reqs)
		err = errors.Join(before, err, m.endsCheck())
		if err != nil && len(m.h.failed) == 0 {
			m.h.failed = append(m.h.failed, err)
		}
		return reqs, wake
	}
	m.h.sent = func(r request, res result) {
		f := m.h.s.flights[r.id]
		if f.j == nil || f.read {
			return
		}
		m.order.answered(f.j, res)
		e := f.j.lines // nil for an end
		upTo := int64(-1)
		switch {
		case e == nil:
		case res.outcome == writeOK:
			upTo = e.base + f.count
		case res.outcome == writeExists && f.retry:
			upTo = e.triedCount
		}
		for _, l := range m.firsts {
			if e != nil && l.e == e && l.landed.IsZero() && upTo >= l.n {
				l.landed = m.clk.Now()
			}
		}
	}
}

// endsCheck checks the ends decided since the last look, in the stepped model.
func (m *model) endsCheck() error {
	if m.ends == nil {
		return nil
	}
	return m.ends.check(m.h.s)
}

// setMode sets how the API behaves from now on.
func (m *model) setMode(mode apiMode) {
	if mode != apiHealthy {
		for _, l := range m.firsts {
			l.outage = true
		}
	} else if m.mode != apiHealthy {
		m.back = m.clk.Now()
	}
	m.mode = mode
}

// reloaded takes a reload to cfg.
func (m *model) reloaded(cfg config) {
	m.configured(cfg)
	m.qps, m.wait = m.rateOf(cfg), fleetWait(cfg)
	for _, l := range m.firsts {
		l.qps = min(l.qps, m.qps)
		l.fleet = max(l.fleet, m.wait)
	}
	if m.order != nil {
		m.order.reloaded()
	}
}

// noteFirst looks at the line just taken: when its plugin had nothing
// pending in its reason, its wait is bounded.
func (m *model) noteFirst() {
	var e *entry
	for _, x := range m.h.s.corr.cache.values() {
		if e == nil || x.seq > e.seq {
			e = x
		}
	}
	if e != nil && m.ends != nil {
		m.ends.line(e, m.clk.Now(), m.quiet)
	}
	if e == nil || e.dropped > 0 {
		return
	}
	waiting := map[string]bool{} // other plugins of its reason with lines waiting
	busy := e.pending() > 1
	for _, x := range entriesOf(m.h.s) {
		if x == e || x.key.level != e.key.level || x.pending() == 0 || x.dropped > 0 {
			continue
		}
		if x.key.plugin == e.key.plugin {
			busy = true
		} else {
			waiting[x.key.plugin] = true
		}
	}
	for _, l := range m.firsts {
		switch {
		case !l.landed.IsZero() || l.e.key.level != e.key.level:
		case l.e.key.plugin != e.key.plugin:
			l.others[e.key.plugin] = true
		case e != l.e && e.name == "" && l.e.name != "":
			// Within a shape new events and updates take turns, new first (queue.go): one new
			// event of the line's own plugin that came after it may go ahead of its update once.
			l.others[e.key.plugin+" new"] = true
		}
	}
	if busy {
		return
	}
	m.firsts = append(m.firsts, &firstLine{e: e, n: e.seen, at: m.clk.Now(), others: waiting, qps: m.qps, fleet: m.wait,
		read: m.h.s.pod.lookup, outage: m.mode != apiHealthy || m.clk.Since(m.back) < recoveryBound})
}

// checkFirsts holds the first lines to README.md's bound: with the API
// answering, one refill for the line and one for each other plugin of its
// reason with lines waiting before it is written, plus the write's own
// time and the pod's read when the UID is to read; after an outage (or
// within recoveryBound of one), that plus recoveryBound from the API's
// return. The bound is on the monotonic clock.
func (m *model) checkFirsts() error {
	return m.judgeFirsts(func(l *firstLine) bool {
		return !l.e.evicted && !m.h.s.stopping // else dropped, or written in the flush as far as its time allows
	}, m.deadline)
}

// judgeFirsts holds each first line that follow keeps following to its
// deadline: a line that landed, or is still out, past it fails the model;
// one that landed within it is counted and forgotten.
func (m *model) judgeFirsts(follow func(*firstLine) bool, deadlineOf func(*firstLine) (time.Time, bool)) error {
	now := m.clk.Now()
	kept := m.firsts[:0]
	for _, l := range m.firsts {
		if !follow(l) {
			continue
		}
		deadline, ok := deadlineOf(l)
		if !ok {
			kept = append(kept, l)
			continue
		}
		switch {
		case !l.landed.IsZero() && l.landed.After(deadline), l.landed.IsZero() && now.After(deadline):
			return m.lateFirst(l, deadline)
		case l.landed.IsZero():
			kept = append(kept, l)
		default:
			m.stats.firsts++
		}
	}
	m.firsts = kept
	return nil
}

// deadline is when README's bound on the wait of l ends: with the API
// answering, one refill for l and one for each other plugin of its reason
// with lines waiting before it is written, at the least rate in effect,
// plus the write's own time, and the pod's read while the UID is to read;
// after an outage (or within recoveryBound of one), that plus
// recoveryBound from the API's return. None while the API is still down.
func (m *model) deadline(l *firstLine) (time.Time, bool) {
	bound := time.Duration(float64(1+len(l.others))/l.qps*float64(time.Second)) + writeTimeout + l.fleet
	if l.read {
		bound += writeTimeout
	}
	if !l.outage {
		if m.held.toldSince(l.at) {
			bound += pushbackBound
		}
		return l.at.Add(bound), true
	}
	if m.mode != apiHealthy {
		return time.Time{}, false
	}
	from := l.at
	if m.back.After(from) {
		from = m.back
	}
	return from.Add(bound + recoveryBound + pushbackBound + l.fleet), true
}

// pushbackBound is what a 429 adds to a line's wait, before the API server's return or while
// it answers: its hold, the longest Retry-After the model asks (5 s) plus 20 %, and twice the
// gap after it.
const pushbackBound = (5*time.Second + 2*pushbackGap) * 6 / 5

// lateFirst says that l was not written by deadline.
func (m *model) lateFirst(l *firstLine, deadline time.Time) error {
	written := "not yet"
	if !l.landed.IsZero() {
		written = l.landed.Sub(l.at).String() + " after"
	}
	what := l.plugin + " " + l.reason.reason()
	if l.e != nil {
		what = fmt.Sprintf("%q", l.e.message)
	}
	return fmt.Errorf("a line (%s) of a plugin with nothing pending in its reason, logged %v after the API was last back, written %s, bound %v (other plugins waiting: %d, rate %v, pod read: %v, after an outage: %v)",
		what, l.at.Sub(m.back), written, deadline.Sub(l.at), len(l.others), l.qps, l.read, l.outage)
}

// TestHeldCheckCatchesARequestAtTheInstantOfA429: the models' check of the Retry-After holds
// every request handed out once a 429 reached the scheduler. In the stepped model the clock does
// not move between a 429's answer and the next dispatch: a request handed out then, at the same
// instant, is within the Retry-After and must be caught; one handed out before the answer came,
// at the same instant, is not.
func TestHeldCheckCatchesARequestAtTheInstantOfA429(t *testing.T) {
	tooMany := result{err: apierrors.NewTooManyRequests("slow down", 3), retryAfter: 3 * time.Second}
	if statusCode(tooMany.err) != http.StatusTooManyRequests {
		t.Fatalf("status %d", statusCode(tooMany.err))
	}
	create := []request{{verb: verbCreate}}

	var after heldCheck
	after.handed(create, epoch)
	after.told(tooMany, epoch)
	after.handed(create, epoch)
	if after.failed() == nil {
		t.Errorf("a create handed out at the instant a 429 with Retry-After 3 s reached the " +
			"scheduler, after it, passed the check")
	}

	var before heldCheck
	before.handed(append(create, create...), epoch)
	before.told(tooMany, epoch)
	before.told(result{}, epoch.Add(time.Second))
	before.handed(create, epoch.Add(3*time.Second))
	if err := before.failed(); err != nil {
		t.Errorf("requests handed out before the 429, and one once its hold ended: %v", err)
	}
}
