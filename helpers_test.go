package k8s_event

import (
	"context"
	"io"
	"log"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coredns/caddy"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/clock"
	clocktesting "k8s.io/utils/clock/testing"
)

// testRef is the pod that test events are about.
var testRef = corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Name: "coredns-0", Namespace: "kube-system", UID: types.UID("uid-0")}

const testNode = "node-0"

// testPod returns the identity of the test pod, its UID known.
func testPod() podIdentity {
	return podIdentity{ref: testRef, node: testNode, verb: verbListPod}
}

// testPodWithoutUID returns the identity of the test pod as the downward
// API gives it without COREDNS_POD_UID: the UID is to be read.
func testPodWithoutUID() podIdentity {
	id := testPod()
	id.ref.UID, id.lookup = "", true
	return id
}

var epoch = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func testConfig(levels levelSet, qps float64, burst, cache int) config {
	return config{levels: levels, qps: qps, burst: burst, cacheSize: cache}
}

// newTestPipeline returns a pipeline on a fake API server, not started: tests that run it as
// CoreDNS does call start. It runs in real time, as in CoreDNS: run waits on its clock (its
// batch pause, its timer), so that a fake clock nobody moves would hold the lines forever. A
// test that moves time itself drives the scheduler with a harness, or steps the clock as the
// concurrent fault model does.
func newTestPipeline(t testing.TB, cfg config) (*pipeline, *fakeAPI, clock.WithTicker) {
	t.Helper()
	clk := clock.RealClock{}
	api := newFakeAPI(t, clk)
	p := newPipeline(cfg, api.client, testPod(), clk)
	t.Cleanup(p.cancel)
	return p, api, clk
}

// harness drives the production scheduler as run does, from the test's
// goroutine: lines come through the real listener or are handed to
// observe, requests go through the real writer and client-go to the fake
// API server, and time is a fake clock that only the test moves. A
// request that reaches the API and gets no answer is answered when its
// time-out would end, lostAfter after it was sent on the fake clock (0: at
// once), so that a hang takes its time as it does in CoreDNS.
type harness struct {
	t            testing.TB
	clk          testClock
	api          *fakeAPI
	s            *scheduler
	*listener    // lines logged through it reach the scheduler on run
	client       kubernetes.Interface
	writeTimeout time.Duration // real time, for each request to the fake API
	lostAfter    time.Duration
	hold         func(request) time.Duration                // how long the answer of a request is held back; nil: none
	dispatch     func(now time.Time) ([]request, time.Time) // the scheduler's dispatch, or a model's around it
	sent         func(r request, res result)                // shown each answer as the API gives it, before the scheduler has it
	got          func(res result, now time.Time)            // shown each answer as the scheduler gets it
	handed       func(reqs []request, now time.Time)        // shown the requests the scheduler hands out
	sending      request                                    // the request being sent
	later        []delayed                                  // results still to come, by time
	reports      []error                                    // what the scheduler said of failed writes
	failed       []error                                    // what a model found wrong while it ran
}

type delayed struct {
	at  time.Time
	res result
}

func newHarness(t testing.TB, cfg config) *harness {
	t.Helper()
	clk := clocktesting.NewFakeClock(epoch)
	return newHarnessOn(t, cfg, newFakeAPI(t, clk), clk, testPod())
}

// testClock is a fake clock the test moves: clocktesting's, or a
// steppedClock (faultmodel_test.go).
type testClock interface {
	clock.WithTicker
	SetTime(time.Time)
	Step(time.Duration)
}

func newHarnessOn(t testing.TB, cfg config, api *fakeAPI, clk testClock, pod podIdentity) *harness {
	h := &harness{t: t, clk: clk, api: api, client: api.client, writeTimeout: writeTimeout}
	h.s = newScheduler(cfg, pod, clk.Now())
	h.dispatch = h.s.dispatch
	h.listener = newListener(clk, h.fatal)
	h.levels.Store(uint32(cfg.levels))
	h.s.backlog = func() int { return len(h.lines) }
	h.s.report = func(_ time.Time, err error) {
		if err != nil {
			h.reports = append(h.reports, err)
		}
	}
	return h
}

// newTestHarness is newHarness, with its fake API and clock.
func newTestHarness(t testing.TB, cfg config) (*harness, *fakeAPI, *clocktesting.FakeClock) {
	t.Helper()
	h := newHarness(t, cfg)
	return h, h.api, h.clk.(*clocktesting.FakeClock)
}

// drain does what is due now.
func drain(h *harness) { h.run() }

// apply reloads the scheduler with cfg, as a Corefile reload does.
func (h *harness) apply(cfg config) {
	h.levels.Store(uint32(cfg.levels))
	h.s.apply(cfg, h.clk.Now())
}

// observe hands a line to the scheduler, as run does with the listener's.
func (h *harness) observe(ln line) { h.s.observe(ln) }

// take hands the scheduler the lines the listener queued.
func (h *harness) take() {
	for len(h.lines) > 0 {
		h.s.observe(<-h.lines)
	}
}

// run does what is due now: it takes the lines queued, hands over the
// results whose time has come, and sends what the scheduler decides, until
// it decides nothing more. It returns when the scheduler asks to be asked
// again.
func (h *harness) run() time.Time {
	h.take()
	for {
		now := h.clk.Now()
		for len(h.later) > 0 && !h.later[0].at.After(now) {
			res := h.later[0].res
			h.later = h.later[1:]
			h.outcome(res, now)
		}
		reqs, wake := h.dispatch(now)
		if len(reqs) == 0 {
			return wake
		}
		if h.handed != nil {
			h.handed(reqs, now)
		}
		for _, r := range reqs {
			h.send(r)
		}
	}
}

// send makes one request, and hands its result over now or when its
// time-out ends.
func (h *harness) send(r request) {
	ctx, cancel := context.WithTimeout(context.Background(), h.writeTimeout)
	h.sending = r
	res := do(ctx, h.client, r)
	h.sending = request{}
	cancel()
	if h.sent != nil {
		h.sent(r, res)
	}
	after := time.Duration(0)
	if h.hold != nil {
		after = h.hold(r)
	}
	if h.lostAfter > 0 && res.reached && res.err != nil && statusCode(res.err) == 0 {
		after = h.lostAfter
	}
	if after > 0 {
		h.later = append(h.later, delayed{h.clk.Now().Add(after), res})
		slices.SortStableFunc(h.later, func(a, b delayed) int { return a.at.Compare(b.at) })
		return
	}
	h.outcome(res, h.clk.Now())
}

// outcome hands the scheduler a result.
func (h *harness) outcome(res result, now time.Time) {
	if h.got != nil {
		h.got(res, now)
	}
	h.s.outcome(res, now)
}

// next is the earliest of wake and the results still to come; zero if none.
func (h *harness) next(wake time.Time) time.Time {
	if len(h.later) > 0 && (wake.IsZero() || h.later[0].at.Before(wake)) {
		return h.later[0].at
	}
	return wake
}

// advance moves the clock by d, doing at each moment what is due then.
func (h *harness) advance(d time.Duration) {
	end := h.clk.Now().Add(d)
	for {
		next := h.next(h.run())
		if next.IsZero() || next.After(end) {
			h.clk.SetTime(end)
			h.run()
			return
		}
		h.clk.SetTime(next)
	}
}

// stop runs the flush for at most timeout on the fake clock, as stop does:
// at the deadline the results still to come end, as their cancelled
// requests do, and what is left is dropped.
func (h *harness) stop(timeout time.Duration) {
	h.take()
	h.s.stop(h.clk.Now(), timeout)
	deadline := h.clk.Now().Add(timeout)
	for {
		wake := h.run()
		if h.s.finished(nil, wake) && len(h.later) == 0 {
			break
		}
		next := h.next(wake)
		if next.IsZero() || next.After(deadline) {
			h.clk.SetTime(deadline)
			h.s.expire()
			for _, d := range h.later {
				h.outcome(d.res, deadline)
			}
			h.later = nil
			break
		}
		h.clk.SetTime(next)
	}
	h.s.dropRemaining()
}

// fatal writes a fatal line as the pipeline's writeFatal does, in the
// goroutine that logged it.
func (h *harness) fatal(ln line) {
	var t tally
	t.see()
	req, ok := h.s.fatal(ln, h.clk.Now())
	if !ok {
		t.drop(dropThrottled)
		return
	}
	if h.handed != nil {
		h.handed([]request{req}, h.clk.Now())
	}
	ctx, cancel := context.WithTimeout(context.Background(), fatalTimeout)
	res := do(ctx, h.client, req)
	cancel()
	h.outcome(res, h.clk.Now())
	if res.outcome != writeOK {
		t.drop(dropFailed)
		return
	}
	t.carry(1)
}

// entry returns the cached entry of key, or nil.
func (h *harness) entry(key eventKey) *entry {
	e, _ := h.s.corr.cache.get(key)
	return e
}

// pendingEntries lists the entries with lines to write.
func (h *harness) pendingEntries() []*entry {
	var out []*entry
	for _, e := range entriesOf(h.s) {
		if e.pending() > 0 && e.dropped == 0 {
			out = append(out, e)
		}
	}
	return out
}

// events lists the events the fake API holds.
func events(t testing.TB, api *fakeAPI) []corev1.Event {
	t.Helper()
	return api.list()
}

var corev1Pod = corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "coredns-1", Namespace: "kube-system", UID: "uid-1"}}

func newController(stanza string) *caddy.Controller { return caddy.NewTestController("dns", stanza) }

// logCapture is the standard logger's output, which CoreDNS's loggers write
// through; the plugin writes it from goroutines of its own, which stop
// waits for.
type logCapture struct {
	mu sync.Mutex
	b  strings.Builder
}

func captureLog(t *testing.T) *logCapture {
	c := &logCapture{}
	log.SetOutput(c)
	t.Cleanup(func() { log.SetOutput(io.Discard) })
	return c
}

func (c *logCapture) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.b.Write(p)
}

func (c *logCapture) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.b.String()
}

func TestMain(m *testing.M) {
	log.SetOutput(io.Discard) // CoreDNS's loggers write through the standard logger
	os.Exit(m.Run())
}

var all = levelSet(1<<numLevels - 1)

func ln(l level, plugin, msg string, at time.Time) line {
	return line{level: l, plugin: "plugin/" + plugin + ": ", text: "plugin/" + plugin + ": " + msg, at: at}
}

func only(t *testing.T, evs []corev1.Event) corev1.Event {
	t.Helper()
	if len(evs) != 1 {
		t.Fatalf("got %d events, want 1: %+v", len(evs), evs)
	}
	return evs[0]
}

// ledger is a reading of the metrics the accounting contract is stated in.
type ledger struct {
	lines, pending float64
	dropped        [numDropReasons]float64
}

func readLedger() ledger {
	var l ledger
	for lv := range numLevels {
		l.lines += testutil.ToFloat64(linesTotal[lv])
	}
	l.pending = testutil.ToFloat64(pendingLines)
	for r := range numDropReasons {
		l.dropped[r] = testutil.ToFloat64(droppedTotal[r])
	}
	return l
}

func (l ledger) since(before ledger) ledger {
	d := ledger{lines: l.lines - before.lines, pending: l.pending - before.pending}
	for r := range d.dropped {
		d.dropped[r] = l.dropped[r] - before.dropped[r]
	}
	return d
}

func (l ledger) droppedAll() float64 {
	var n float64
	for _, d := range l.dropped {
		n += d
	}
	return n
}

// countsIn adds up the counts of the events the API holds.
func countsIn(api *fakeAPI) float64 {
	var n float64
	for _, ev := range api.list() {
		if strings.HasSuffix(ev.Reason, "Ended") {
			continue // an end carries no lines: it is no part of the ledger
		}
		n += float64(ev.Count)
	}
	return n
}

// checkLedger checks the contract at a quiet moment: the counts in the API
// plus the lines pending plus the lines dropped are the lines taken, with
// lines handed to observe by hand counted in extra.
func checkLedger(t *testing.T, api *fakeAPI, before ledger, extra float64) ledger {
	t.Helper()
	d := readLedger().since(before)
	if got, want := countsIn(api)+d.pending+d.droppedAll(), d.lines+extra; got != want {
		t.Errorf("counts %v + pending %v + dropped %v = %v, want lines %v", countsIn(api), d.pending, d.dropped, got, want)
	}
	return d
}
