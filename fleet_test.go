package k8s_event

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
)

// fleetConfig is a rate that never binds, and fleet qps burst.
func fleetConfig(qps float64, burst int) config {
	cfg := testConfig(all, 100, 1000, 256)
	cfg.fleetQPS, cfg.fleetBurst, cfg.fleetSet = qps, burst, true
	return cfg
}

// controlledBy is the owner reference a controller sets on what it makes.
func controlledBy(kind, name string) []metav1.OwnerReference {
	return []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: kind, Name: name, UID: types.UID("uid-" + name), Controller: ptr.To(true)}}
}

// addDeployment stores, as a cluster holds them, a Deployment of replicas and maxSurge, its
// ReplicaSet, and the pod named name that the ReplicaSet made.
func addDeployment(api *fakeAPI, name string, replicas int32, maxSurge intstr.IntOrString) {
	ns := testRef.Namespace
	api.addApp("deployments", &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "coredns", Namespace: ns},
		Spec: appsv1.DeploymentSpec{Replicas: ptr.To(replicas), Strategy: appsv1.DeploymentStrategy{
			Type: appsv1.RollingUpdateDeploymentStrategyType, RollingUpdate: &appsv1.RollingUpdateDeployment{MaxSurge: &maxSurge},
		}},
	})
	api.addApp("replicasets", &appsv1.ReplicaSet{
		ObjectMeta: metav1.ObjectMeta{Name: "coredns-5d78c9869d", Namespace: ns, OwnerReferences: controlledBy("Deployment", "coredns")},
		Spec:       appsv1.ReplicaSetSpec{Replicas: ptr.To(replicas)},
	})
	addPodOf(api, name, "ReplicaSet", "coredns-5d78c9869d")
}

func addPodOf(api *fakeAPI, name, kind, owner string) {
	api.addPod(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: testRef.Namespace, UID: testRef.UID, OwnerReferences: controlledBy(kind, owner)}})
}

// distinct logs n lines that make n events, a few plugins' worth.
func distinct(h *harness, l level, n int, at time.Time) {
	for i := range n {
		h.observe(ln(l, fmt.Sprint("p", i%8), fmt.Sprintf("upstream %d down", i/8), at))
	}
}

// reads lists the reads that reached the API, as "verb resource/name".
func reads(api *fakeAPI) []string {
	api.mu.Lock()
	defer api.mu.Unlock()
	var out []string
	for _, r := range api.requests {
		if r.resource != "events" {
			out = append(out, r.verb+" "+r.resource+"/"+r.name)
		}
	}
	return out
}

// TestFleetSharesItsBoundAmongTheWorkloadsPods: with fleet, a replica's writes of one reason are
// its share of BURST and QPS, from N = the Deployment's replicas plus maxSurge, plus the floor:
// at most BURST/N + 1 + (QPS/N + 1/hour) x T. N is found through the pod's ReplicaSet.
func TestFleetSharesItsBoundAmongTheWorkloadsPods(t *testing.T) {
	h, api, clk := newTestHarness(t, fleetConfig(1, 20))
	addDeployment(api, testRef.Name, 8, intstr.FromString("25%")) // N = 8 + 2
	before := readLedger()
	start := clk.Now()
	distinct(h, levelError, 40, start)
	h.advance(0) // the first read waits its part of the herd's window, 30 s while N is not read
	h.advance(h.s.fleet.herdAt.Sub(clk.Now()) + 100*time.Millisecond)
	if got := strings.Join(reads(api), ", "); got != "list pods/, get replicasets/coredns-5d78c9869d, get deployments/coredns" {
		t.Errorf("reads %q, want the pod, its ReplicaSet, the Deployment", got)
	}
	if n := h.s.fleet.n; n != 10 {
		t.Fatalf("N %d, want 10: replicas 8 and maxSurge 25%% rounded up", n)
	}
	if c, _ := api.writes(); c != 3 {
		t.Errorf("%d creates at start, want BURST/N + 1 = 3", c)
	}
	h.advance(100 * time.Second)
	// 3 at the herd's time, under 0.5 s, then (1/10 + 1/3600) x 100 s
	if c, _ := api.writes(); c != 13 {
		t.Errorf("%d creates in 101 s, want 13", c)
	}
	checkBound(t, reachedAt(api, levelError.reason()), 0.1+1/3600.0, 3)
	if n := len(reads(api)); n != 3 {
		t.Errorf("%d reads, want 3: N is fresh for %v", n, fleetStale)
	}
	if got := testutil.ToFloat64(fleetReplicas); got != 10 {
		t.Errorf("fleet_replicas %v, want 10", got)
	}
	checkLedger(t, api, before, 40)
}

// TestFleetReadsNOnlyForAWriteOnceStale: N is read again only when a write is due and the last
// read is older than fleetStale, and then only the workload itself; a change of N changes the
// share.
func TestFleetReadsNOnlyForAWriteOnceStale(t *testing.T) {
	h, api, clk := newTestHarness(t, fleetConfig(1, 20))
	addDeployment(api, testRef.Name, 8, intstr.FromInt32(2))
	h.observe(ln(levelError, "errors", "a", clk.Now()))
	h.advance(time.Second)
	h.advance(time.Hour) // no write due: no read
	if n := len(reads(api)); n != 3 {
		t.Fatalf("%d reads after an hour without writes, want the 3 of the start", n)
	}
	addDeployment(api, testRef.Name, 1, intstr.FromInt32(0))
	h.observe(ln(levelError, "errors", "b", clk.Now()))
	h.advance(time.Second)
	got := reads(api)
	if len(got) != 4 || got[3] != "get deployments/coredns" {
		t.Errorf("reads %q, want one more, of the Deployment", got)
	}
	if n := h.s.fleet.n; n != 1 {
		t.Errorf("N %d, want 1 after the scale down", n)
	}
}

// TestFleetFloorKeepsTheFirstEventAndOneAnHour: a replica whose share is below a token (N above
// BURST) still writes its first event of each reason, then one an hour.
func TestFleetFloorKeepsTheFirstEventAndOneAnHour(t *testing.T) {
	h, api, clk := newTestHarness(t, fleetConfig(0.01, 5))
	api.addApp("daemonsets", &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Name: "node-local-dns", Namespace: testRef.Namespace},
		Status:     appsv1.DaemonSetStatus{DesiredNumberScheduled: 5000},
	})
	addPodOf(api, testRef.Name, "DaemonSet", "node-local-dns")
	distinct(h, levelError, 5, clk.Now())
	h.observe(ln(levelWarning, "health", "slow", clk.Now()))
	h.advance(herdMaxWindow)
	if n := h.s.fleet.n; n != 5000 {
		t.Fatalf("N %d, want the DaemonSet's 5000", n)
	}
	if errs, warns := len(reachedAt(api, levelError.reason())), len(reachedAt(api, levelWarning.reason())); errs != 1 || warns != 1 {
		t.Errorf("%d error and %d warning writes, want the first of each", errs, warns)
	}
	// One token an hour, and a share of 0.01/5000 qps: the next at 1 h less a little.
	h.advance(55 * time.Minute)
	if n := len(reachedAt(api, levelError.reason())); n != 1 {
		t.Errorf("%d error writes within the hour, want 1", n)
	}
	h.advance(5 * time.Minute)
	if n := len(reachedAt(api, levelError.reason())); n != 2 {
		t.Errorf("%d error writes after an hour, want 2", n)
	}
}

// TestFleetUncountedKeepsTheRateBound: when N cannot be read (the ReplicaSet's get is
// forbidden), the rate bound alone is in force: said once in the log and in a metric.
func TestFleetUncountedKeepsTheRateBound(t *testing.T) {
	h, api, clk := newTestHarness(t, fleetConfig(0.01, 1))
	addDeployment(api, testRef.Name, 100, intstr.FromInt32(0))
	api.setFault(func(r apiRequest) fault {
		if r.resource == "replicasets" {
			return fault{code: http.StatusForbidden}
		}
		return fault{}
	})
	distinct(h, levelError, 10, clk.Now())
	h.advance(herdMaxWindow)
	if c, _ := api.writes(); c != 10 {
		t.Errorf("%d creates, want all 10: rate allows them", c)
	}
	said := 0
	for _, err := range h.reports {
		if strings.Contains(err.Error(), "fleet: the pods of this pod's workload cannot be counted") {
			said++
		}
	}
	if said != 1 {
		t.Errorf("said %d times that N cannot be read, want once: %v", said, h.reports)
	}
	if got := testutil.ToFloat64(fleetUncounted); got != 1 {
		t.Errorf("fleet_uncounted %v, want 1", got)
	}
	if n := len(reads(api)); n != 2 {
		t.Errorf("%d reads, want 2: the pod and the forbidden ReplicaSet, never again", n)
	}
}

// TestFleetOnlyTightensRate: a fleet share above what rate allows leaves the rate bound.
func TestFleetOnlyTightensRate(t *testing.T) {
	cfg := fleetConfig(1000, 10000)
	cfg.qps, cfg.burst = 1.0/300, 2
	h, api, clk := newTestHarness(t, cfg)
	addDeployment(api, testRef.Name, 1, intstr.FromInt32(0))
	distinct(h, levelError, 10, clk.Now())
	h.advance(time.Minute)
	// The two tokens of rate: the pod's list, the ReplicaSet's get; the Deployment's next.
	if c, _ := api.writes(); c != 0 {
		t.Errorf("%d creates, want none: rate's two tokens went to the reads", c)
	}
	h.advance(10 * time.Minute)
	if c, _ := api.writes(); c != 1 {
		t.Errorf("%d creates, want 1 by rate's QPS", c)
	}
}

// TestHerdSpreadsTheFirstWrites: the first writes of replicas that start together, and after an
// outage, spread over the window N / herdRate.
func TestHerdSpreadsTheFirstWrites(t *testing.T) {
	const replicas = 40 // a window of 2 s once N is read, 30 s before
	window := herdMaxWindow
	clk := newSteppedClock()
	api := newFakeAPI(t, clk)
	hs := make([]*harness, replicas)
	for i := range hs {
		pod := testPod()
		pod.ref.Name = fmt.Sprint("coredns-", i)
		addDeployment(api, pod.ref.Name, replicas, intstr.FromInt32(0))
		hs[i] = newHarnessOn(t, fleetConfig(100, 1000), api, clk, pod)
		hs[i].s.rand = rand.New(rand.NewPCG(uint64(i), 7))
	}
	// spread runs the replicas for the window and a minute, and checks that their first writes
	// after from[i] are spread over the window.
	spread := func(what string, from []time.Time) {
		t.Helper()
		first := make([]time.Duration, replicas)
		wrote := make([]bool, replicas)
		end := clk.Now().Add(window + time.Minute)
		for ; !clk.Now().After(end); clk.Step(50 * time.Millisecond) {
			for i, h := range hs {
				c, p := api.writes()
				h.run()
				if c2, p2 := api.writes(); !wrote[i] && c2+p2 > c+p {
					wrote[i], first[i] = true, clk.Now().Sub(from[i])
				}
			}
		}
		lo, hi := slicesMinMax(first)
		if hi-lo < window/2 || lo < 0 || hi > window+50*time.Millisecond {
			t.Errorf("%s: the first writes %v to %v after they were due, want them spread over the %v window", what, lo, hi, window)
		}
		for i := range wrote {
			if !wrote[i] {
				t.Fatalf("%s: replica %d did not write", what, i)
			}
		}
	}
	start := make([]time.Time, replicas)
	for i, h := range hs {
		start[i] = clk.Now()
		h.observe(ln(levelError, "errors", "upstream down", start[i]))
	}
	spread("at start", start)
	window = time.Duration(replicas / herdRate * float64(time.Second))

	down := true
	apiDown(api, &down)
	for _, h := range hs {
		h.observe(ln(levelError, "errors", "upstream down", clk.Now()))
	}
	for range 30 {
		for _, h := range hs {
			h.run()
		}
		clk.Step(time.Second)
	}
	down = false
	due := make([]time.Time, replicas) // each replica's retry, the backoff of its last failure
	for i, h := range hs {
		due[i] = h.entry(errorKey("upstream down")).retryAt
	}
	spread("after an outage", due)
}

func slicesMinMax(d []time.Duration) (lo, hi time.Duration) {
	lo, hi = d[0], d[0]
	for _, x := range d {
		lo, hi = min(lo, x), max(hi, x)
	}
	return lo, hi
}

// TestFleetReadsAreBounded: reads of N that keep failing are retried with backoff, within the
// read bucket: at most 3 at once and one every fleetStale; meanwhile the writes wait for N while
// a read may come, and take the floor alone once the reads are spent.
func TestFleetReadsAreBounded(t *testing.T) {
	h, api, clk := newTestHarness(t, fleetConfig(100, 100))
	addDeployment(api, testRef.Name, 2, intstr.FromInt32(0))
	api.setFault(func(r apiRequest) fault {
		if r.resource == "deployments" {
			return fault{code: http.StatusServiceUnavailable}
		}
		return fault{}
	})
	for i := range 60 { // a line a minute
		h.observe(ln(levelError, "errors", fmt.Sprint("upstream ", i%5, " down"), clk.Now()))
		h.advance(time.Minute)
	}
	if n, limit := len(reads(api)), 1+7+int(time.Hour/retryMax); n > limit {
		t.Errorf("%d reads in an hour, want at most %d: the pod, then the backoff's pace", n, limit)
	}
	if n := len(reachedAt(api, levelError.reason())); n < 1 || n > 2 {
		t.Errorf("%d writes in an hour without N, want the floor's: 1 or 2", n)
	}
}

// TestFleetWithoutThePodsNameKeepsTheRateBound: without COREDNS_POD_NAME there is no workload to
// count: rate alone, said once, and nothing read.
func TestFleetWithoutThePodsNameKeepsTheRateBound(t *testing.T) {
	clk := clocktesting.NewFakeClock(epoch)
	api := newFakeAPI(t, clk)
	pod := podIdentity{ref: corev1.ObjectReference{Kind: "Namespace", APIVersion: "v1", Name: "default"}, verb: verbListPod}
	h := newHarnessOn(t, fleetConfig(0.01, 1), api, clk, pod)
	distinct(h, levelError, 5, clk.Now())
	h.advance(time.Second)
	if c, _ := api.writes(); c != 5 {
		t.Errorf("%d creates, want all 5: rate allows them", c)
	}
	if n := len(reads(api)); n != 0 {
		t.Errorf("%d reads, want none", n)
	}
	if len(h.reports) != 1 || !strings.Contains(h.reports[0].Error(), "COREDNS_POD_NAME or COREDNS_NAMESPACE is not set") {
		t.Errorf("reports %v, want one that says the pod's name is not set", h.reports)
	}
}

// apiAway takes the API server out of reach while *down, as a network that drops the path does:
// the first request after the path is lost goes out on the open connection and is reset (it was
// sent: it may have cost a token), the others find no connection. With timeouts, every request
// reaches the server and its answer is lost.
func apiAway(api *fakeAPI, down *bool, timeouts bool) {
	open := true
	api.setFault(func(apiRequest) fault {
		switch {
		case !*down:
			open = true
			return fault{}
		case timeouts:
			return fault{lost: true}
		case open:
			open = false
			return fault{reset: true}
		}
		return fault{unsent: true}
	})
}

// TestFleetWritesAgainSoonAfterAnOutageThatTookItsReads: the reads of N that an outage cut off
// (reset with the connection, or timed out) do not keep a replica from writing after the API
// server's return: it writes within 82 s plus the herd's window, with its share of N, not the
// floor alone.
func TestFleetWritesAgainSoonAfterAnOutageThatTookItsReads(t *testing.T) {
	for _, timeouts := range []bool{false, true} {
		t.Run(fmt.Sprint("timeouts=", timeouts), func(t *testing.T) {
			h, api, clk := newTestHarness(t, fleetConfig(1, 5))
			addDeployment(api, testRef.Name, 3, intstr.FromInt32(1))
			down, line := true, 0
			apiAway(api, &down, timeouts)
			logFor := func(d time.Duration) { // a new event every 5 s
				for end := clk.Now().Add(d); clk.Now().Before(end); line++ {
					h.observe(ln(levelError, "errors", fmt.Sprint("upstream down ", line), clk.Now()))
					h.advance(5 * time.Second)
				}
			}
			for flap := range 3 { // the network flaps at start: each cut costs a request
				down = true
				logFor(herdMaxWindow + 10*time.Second)
				down = false
				if flap < 2 {
					logFor(time.Second)
				}
			}
			up := clk.Now()
			logFor(82*time.Second + time.Duration(4/herdRate*float64(time.Second)))
			var after []time.Time
			for _, at := range reachedAt(api, levelError.reason()) {
				if !at.Before(up) {
					after = append(after, at)
				}
			}
			if len(after) < 2 || h.s.fleet.n != 4 {
				t.Errorf("%d writes within %v of the API server's return with N %d, want its "+
					"share of N 4 (2.25 at once): reads %q", len(after), clk.Now().Sub(up),
					h.s.fleet.n, reads(api))
			}
		})
	}
}

// TestFleetReadsThatFailArePacedByTheBackoff: through an API server away for a day, reads that
// get no answer give their tokens back and are paced by the backoff, 1 s doubling to a minute:
// at most 7 + T / 60. So are reads answered with an error.
func TestFleetReadsThatFailArePacedByTheBackoff(t *testing.T) {
	now := epoch
	f := newFleet(1, 5, "coredns-0", now)
	r := rand.New(rand.NewPCG(1, 2))
	sent := 0
	const day = 24 * time.Hour
	for end := now.Add(day); now.Before(end); now = now.Add(time.Second) {
		if _, read, _ := f.readDue(now, false); read {
			sent++
			req := f.read(uint64(sent), "kube-system", now)
			res := result{id: req.id, reached: true, err: errors.New("connection reset")}
			_ = f.readDone(req.verb, res, now, r)
		}
	}
	if limit := 7 + int(day/retryMax); sent > limit || sent < int(day/retryMax)*5/6 {
		t.Errorf("%d reads with no answer in a day, want the backoff's pace, at most %d", sent, limit)
	}
	if tokens := f.reads.tokens; tokens != fleetReads {
		t.Errorf("%.1f read tokens, want all %d: no read succeeded", tokens, fleetReads)
	}
	for range fleetReads { // answered with 500 or 429: the backoff paces them, not the bucket
		now = now.Add(2 * retryMax)
		if _, read, _ := f.readDue(now, false); !read {
			t.Fatalf("no read 2 min after a failed one")
		}
		sent++
		req := f.read(uint64(sent), "kube-system", now)
		res := result{id: req.id, reached: true, err: apierrors.NewInternalError(errors.New("etcd"))}
		_ = f.readDone(req.verb, res, now, r)
	}
	if tokens := f.reads.tokens; tokens != fleetReads {
		t.Errorf("%.1f read tokens after reads answered 500, want all %d", tokens, fleetReads)
	}
}
