package k8s_event

import (
	"fmt"
	"math/rand/v2"
	"net/http"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// addDaemonSet stores a DaemonSet that wants desired pods, and the pod named name that it made.
func addDaemonSet(api *fakeAPI, name string, desired int32) {
	api.addApp("daemonsets", &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Name: "node-local-dns", Namespace: testRef.Namespace},
		Status:     appsv1.DaemonSetStatus{DesiredNumberScheduled: desired},
	})
	addPodOf(api, name, "DaemonSet", "node-local-dns")
}

// TestFleetReadsNOnlyWhenItsShareCanWrite: N is read only when a write is due. A replica on its
// floor (N far above BURST) that has lines waiting for its hourly token has no write due, so it
// does not read N every ten minutes while it waits: over hours, its reads of the workload are not
// more than its writes and the three of the first finding.
func TestFleetReadsNOnlyWhenItsShareCanWrite(t *testing.T) {
	h, api, clk := newTestHarness(t, fleetConfig(0.01, 5))
	addDaemonSet(api, testRef.Name, 5000)
	for i := range 4 * 60 { // a line a minute for four hours, each a new event
		h.observe(ln(levelError, "forward", fmt.Sprintf("upstream %d down", i), clk.Now()))
		h.advance(time.Minute)
	}
	writes := len(reachedAt(api, levelError.reason()))
	got := len(reads(api))
	if got > writes+fleetReads {
		t.Errorf("%d reads of the workload for %d writes in 4 h: N was read while no write could go "+
			"(the share had no token): %v", got, writes, reads(api))
	}
}

// TestReloadWithoutFleetEndsTheHerdWait: a reload takes the new settings at once, and without
// fleet there is no spread. A write that waits its part of the herd's window (30 s at start, N
// not read yet) goes at once when a reload removes fleet.
func TestReloadWithoutFleetEndsTheHerdWait(t *testing.T) {
	h, api, clk := newTestHarness(t, fleetConfig(1, 20))
	addDeployment(api, testRef.Name, 2, intstr.FromInt32(0))
	h.s.rand = rand.New(rand.NewPCG(7, 7))
	h.observe(ln(levelError, "errors", "a", clk.Now()))
	h.advance(0)
	wait := h.s.fleet.herdAt.Sub(clk.Now())
	if wait < time.Second {
		t.Fatalf("drew a herd wait of %v; the test wants one of a second or more", wait)
	}
	h.apply(testConfig(all, 100, 1000, 256)) // the same rate, fleet removed
	h.advance(100 * time.Millisecond)
	if c, _ := api.writes(); c != 1 {
		t.Errorf("%d creates 100 ms after a reload removed fleet, want 1: the write still waits "+
			"the herd's %v drawn under fleet", c, wait)
	}
}

// TestHerdSpreadsTheReadsRetriedAfterAnOutage: after an outage (no answer), a replica's first
// request, a write or a read of its pod or workload, waits a random part of the herd's window. A
// write retried in an outage waits its backoff and then a new part of the window; so must a read
// of the workload, else N replicas whose reads of N the outage cut off read again on their
// backoffs' schedule alone, together.
func TestHerdSpreadsTheReadsRetriedAfterAnOutage(t *testing.T) {
	h, api, clk := newTestHarness(t, fleetConfig(1, 20))
	addDeployment(api, testRef.Name, 400, intstr.FromInt32(0)) // W = 20 s once read
	h.s.rand = rand.New(rand.NewPCG(3, 3))
	api.setFault(func(apiRequest) fault { return fault{reset: true} })
	h.observe(ln(levelError, "errors", "a", clk.Now()))
	h.advance(5 * time.Minute)
	at := requestTimes(api)
	if len(at) < 6 {
		t.Fatalf("%d reads in 5 min of outage, want the first and its retries", len(at))
	}
	spread := 0
	for i := 1; i < len(at); i++ {
		nominal := min(retryBase<<min(i-1, 7), retryMax)
		if at[i].Sub(at[i-1]) > nominal+nominal/5+time.Millisecond {
			spread++
		}
	}
	if spread == 0 {
		t.Errorf("none of %d reads retried in the outage waited a part of the herd's window "+
			"beyond its backoff: %v", len(at)-1, gaps(at))
	}
}

func gaps(at []time.Time) []time.Duration {
	var out []time.Duration
	for i := 1; i < len(at); i++ {
		out = append(out, at[i].Sub(at[i-1]).Round(time.Millisecond))
	}
	return out
}

// TestFleetDoesNotTakeTheWholeBurstFromADaemonSetNotYetCounted: a DaemonSet whose controller has
// not yet computed its status says desiredNumberScheduled 0 (observedGeneration behind its
// generation), while it has pods: this one at least. Each of its replicas then reads N as 1 and
// takes BURST + 1 at once, N times the fleet's BURST, which no scale explains (no drift): such a
// count is not N, and the replica stays on its floor until the count is there.
func TestFleetDoesNotTakeTheWholeBurstFromADaemonSetNotYetCounted(t *testing.T) {
	h, api, clk := newTestHarness(t, fleetConfig(1, 20))
	api.addApp("daemonsets", &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Name: "node-local-dns", Namespace: testRef.Namespace,
			Generation: 1},
		Status: appsv1.DaemonSetStatus{ObservedGeneration: 0, DesiredNumberScheduled: 0},
	})
	addPodOf(api, testRef.Name, "DaemonSet", "node-local-dns")
	distinct(h, levelError, 40, clk.Now())
	h.advance(herdMaxWindow + time.Second)
	if c, _ := api.writes(); c > 1 {
		t.Errorf("%d creates in 31 s with N read as %d from a DaemonSet not yet counted, want "+
			"the floor's 1: 500 such replicas write %d where the fleet's bound is about 550",
			c, h.s.fleet.n, 500*c)
	}
}

// TestFatalLineIsWrittenAtOnceWithinTheFleetsShare: a fatal line does not wait its part of the
// herd's window (CoreDNS exits within fatalTimeout: a spread fatal line would never be written),
// but it takes a token of the fleet's share like any write: with the floor's one spent, the next
// is dropped as throttled.
func TestFatalLineIsWrittenAtOnceWithinTheFleetsShare(t *testing.T) {
	h, api, _ := newTestHarness(t, fleetConfig(1, 20))
	addDeployment(api, testRef.Name, 400, intstr.FromInt32(0))
	h.s.rand = rand.New(rand.NewPCG(7, 7))
	before := testutil.ToFloat64(throttled[levelFatal])
	h.Fatal("plugin/reload: ", "Corefile changed and cannot be loaded")
	if c, _ := api.writes(); c != 1 {
		t.Errorf("%d creates of a fatal line at start, want 1 at once", c)
	}
	h.Fatal("plugin/reload: ", "Corefile changed and cannot be loaded again")
	if c, _ := api.writes(); c != 1 {
		t.Errorf("%d creates of two fatal lines at start, want 1: the floor's share is one", c)
	}
	if got := testutil.ToFloat64(throttled[levelFatal]) - before; got != 1 {
		t.Errorf("%v fatal lines throttled, want 1", got)
	}
}

// TestTooManyRequestsOnAReadOfNHoldsEveryRequest: a 429 answered to a read of the workload
// holds every request of the replica for its Retry-After, and every line is still accounted for.
func TestTooManyRequestsOnAReadOfNHoldsEveryRequest(t *testing.T) {
	h, api, clk := newTestHarness(t, fleetConfig(1, 20))
	addDeployment(api, testRef.Name, 4, intstr.FromInt32(0))
	before := readLedger()
	told := time.Time{}
	api.setFault(func(r apiRequest) fault {
		if r.resource == "replicasets" && told.IsZero() {
			told = r.at
			return fault{code: http.StatusTooManyRequests, retryAfter: 7}
		}
		return fault{}
	})
	distinct(h, levelError, 10, clk.Now())
	h.observe(ln(levelWarning, "health", "slow", clk.Now()))
	h.advance(2 * time.Minute)
	if told.IsZero() {
		t.Fatal("no read of the ReplicaSet")
	}
	for _, at := range requestTimes(api) {
		if at.After(told) && at.Before(told.Add(7*time.Second)) {
			t.Errorf("a request at %v, within the Retry-After of 7 s told at %v", at.Sub(told), told)
		}
	}
	checkLedger(t, api, before, 11)
}

// TestFleetWritesAgainSoonAfterAnOutageAnswered503: an outage is "no answer, a 5xx": a load
// balancer in front of a restarting kube-apiserver answers 503, and kube-apiserver answers 500
// or 504 while etcd is away. After such an outage, a replica whose first finding of N it cut off
// writes within 82 s plus the herd's window of the return with its share of N, not on its floor
// alone (one write of the reason an hour) for ten minutes.
func TestFleetWritesAgainSoonAfterAnOutageAnswered503(t *testing.T) {
	h, api, clk := newTestHarness(t, fleetConfig(1, 5))
	addDeployment(api, testRef.Name, 3, intstr.FromInt32(1)) // N = 4
	down := true
	api.setFault(func(r apiRequest) fault {
		if down {
			return fault{code: http.StatusServiceUnavailable}
		}
		return fault{}
	})
	line := 0
	logFor := func(d time.Duration) { // a new event every 5 s
		for end := clk.Now().Add(d); clk.Now().Before(end); line++ {
			h.observe(ln(levelError, "errors", fmt.Sprint("upstream down ", line), clk.Now()))
			h.advance(5 * time.Second)
		}
	}
	logFor(2 * time.Minute)
	down = false
	up := clk.Now()
	logFor(82*time.Second + time.Duration(4/herdRate*float64(time.Second)))
	var after []time.Time
	for _, at := range reachedAt(api, levelError.reason()) {
		if !at.Before(up) {
			after = append(after, at)
		}
	}
	if len(after) < 2 || h.s.fleet.n != 4 {
		t.Errorf("%d writes within %v of the API server's return with N %d, want its share of "+
			"N 4 (2.25 at once): reads %q", len(after), clk.Now().Sub(up), h.s.fleet.n, reads(api))
	}
}

// TestFleetFindsNSoonAfterThreeReadsAnswered429: a 429 adds its hold and at most 2.4 s of gaps
// to every bound on a line's wait. Three reads of the workload answered 429 (APF at the herd's
// return) must not leave the replica without N, on its floor alone, for half an hour.
func TestFleetFindsNSoonAfterThreeReadsAnswered429(t *testing.T) {
	h, api, clk := newTestHarness(t, fleetConfig(1, 5))
	addDeployment(api, testRef.Name, 3, intstr.FromInt32(1)) // N = 4
	refused := 0
	api.setFault(func(r apiRequest) fault {
		if r.resource != "events" && refused < 3 {
			refused++
			return fault{code: http.StatusTooManyRequests, retryAfter: 1}
		}
		return fault{}
	})
	distinct(h, levelError, 20, clk.Now())
	h.advance(herdMaxWindow + 82*time.Second + 3*1200*time.Millisecond + 2400*time.Millisecond)
	if h.s.fleet.n != 4 {
		t.Errorf("N %d %v after start and three 429s of 1 s, want 4: reads %q, %d writes",
			h.s.fleet.n, clk.Now().Sub(epoch), reads(api), len(reachedAt(api, levelError.reason())))
	}
}

// TestFleetStopWithAReadOfNInFlightKeepsTheLedger: SIGTERM while the first read of N hangs and
// the herd's wait is not over: nothing more is read, the flush writes what the floor allows, and
// every line is in an event's count or dropped with a reason.
func TestFleetStopWithAReadOfNInFlightKeepsTheLedger(t *testing.T) {
	h, api, clk := newTestHarness(t, fleetConfig(1, 20))
	addDeployment(api, testRef.Name, 4, intstr.FromInt32(0))
	before := readLedger()
	api.setFault(func(r apiRequest) fault {
		if r.resource == "replicasets" {
			return fault{lost: true}
		}
		return fault{}
	})
	h.lostAfter = writeTimeout
	distinct(h, levelError, 12, clk.Now())
	distinct(h, levelWarning, 5, clk.Now())
	h.advance(0)
	h.advance(h.s.fleet.herdAt.Sub(clk.Now()) + 100*time.Millisecond) // the get of the RS hangs
	h.stop(5 * time.Second)
	if got := reads(api); len(got) != 2 {
		t.Errorf("reads %q, want the pod's and the ReplicaSet's that hung, none in the flush", got)
	}
	checkLedger(t, api, before, 17)
}

// TestFleetWritesWithAnNAtMostTenMinutesOld: each replica uses the N it read last, at most 10
// minutes before its write (longer only while the read fails). A replica that read N = 2 eleven
// minutes ago, whose Deployment is now at 500 and whose read of it succeeds, writes with its new
// share, BURST/500 + 1, not the whole BURST/2 + 1 it saved at the old N while the read is out.
func TestFleetWritesWithAnNAtMostTenMinutesOld(t *testing.T) {
	h, api, clk := newTestHarness(t, fleetConfig(1, 20))
	addDeployment(api, testRef.Name, 2, intstr.FromInt32(0))
	h.observe(ln(levelError, "errors", "first", clk.Now()))
	h.advance(herdMaxWindow)
	h.advance(11 * time.Minute) // the bucket is full again, N stale
	addDeployment(api, testRef.Name, 500, intstr.FromInt32(0))
	c0, _ := api.writes()
	distinct(h, levelError, 30, clk.Now())
	h.advance(500 * time.Millisecond)
	if c, _ := api.writes(); h.s.fleet.n != 500 || c-c0 > 2 {
		t.Errorf("%d creates at once, with N %d read 11 min before them (now N %d), want at "+
			"most BURST/500 + 1", c-c0, 2, h.s.fleet.n)
	}
}

// TestFleetUncountedStaysSaidAcrossAReload: coredns_k8s_event_fleet_uncounted is 1 when fleet is
// set and N cannot be read. A reload (any change of the Corefile) that leaves fleet as it was
// does not make N readable: until a read says otherwise, the metric still says so.
func TestFleetUncountedStaysSaidAcrossAReload(t *testing.T) {
	cfg := fleetConfig(0.01, 1)
	h, api, clk := newTestHarness(t, cfg)
	addDeployment(api, testRef.Name, 100, intstr.FromInt32(0))
	api.setFault(func(r apiRequest) fault {
		if r.resource == "replicasets" {
			return fault{code: http.StatusForbidden}
		}
		return fault{}
	})
	distinct(h, levelError, 3, clk.Now())
	h.advance(herdMaxWindow)
	if got := testutil.ToFloat64(fleetUncounted); got != 1 {
		t.Fatalf("fleet_uncounted %v before the reload, want 1", got)
	}
	cfg.quiet = 10 * time.Minute // another line of the Corefile changed
	h.apply(cfg)
	h.advance(time.Hour) // nothing logged: no write due, no read
	if got := testutil.ToFloat64(fleetUncounted); got != 1 {
		t.Errorf("fleet_uncounted %v an hour after a reload that left fleet as it was, want 1: "+
			"N still cannot be read (reads %q)", got, reads(api))
	}
}
