package k8s_event

import (
	"errors"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// The fault models run some of their configurations with fleet (faultConfigs): the fake API
// holds the pod's workload, a Deployment (its ReplicaSet and the pod) or a DaemonSet, or none,
// so that the reads of N meet the model's faults as the writes do, and the Retry-After, the
// bound of each bucket, the floor, the herd spread and the bounds on a line's wait are checked
// with them.

// withFleet is cfg with fleet qps burst.
func withFleet(cfg config, qps float64, burst int) config {
	cfg.fleetQPS, cfg.fleetBurst, cfg.fleetSet = qps, burst, true
	return cfg
}

// modelFleet is what the model knows of the fleet of a run.
type modelFleet struct {
	n, least, most int     // the pods the workload in the fake API wants now, and the least and most of the run; 1 without one
	fleetQPS       float64 // the most of the option's QPS and BURST over the run's configurations
	fleetBurst     int
	burst          float64 // the most of a replica's share of BURST, floor included, over the run's configurations and N
	qps            float64 // the most of its share of QPS
	off            bool    // a configuration of the run had no fleet: rate alone bounded some writes
	scale          func()  // draws N and sets it in the fake API; nil: the pod's workload has no N to change
}

// addWorkload stores the pod's workload in the fake API, a third of the time a Deployment, a
// third a DaemonSet, and notes N. Otherwise the pod has no controller (N is 1), or is not
// stored (N cannot be read).
func (m *model) addWorkload() {
	m.fleet = &modelFleet{n: 1}
	switch m.rng.IntN(3) {
	case 1:
		replicas, surge := 1+m.rng.IntN(4), m.rng.IntN(2)
		addDeployment(m.api, testRef.Name, int32(replicas), intstr.FromInt32(int32(surge)))
		m.fleet.n = replicas + surge
		m.fleet.scale = m.scaler(1+surge, 4+surge, func(n int) { // the Deployment and its ReplicaSet
			addDeployment(m.api, testRef.Name, int32(n-surge), intstr.FromInt32(int32(surge)))
		})
	case 2:
		daemons := func(n int) {
			m.api.addApp("daemonsets", &appsv1.DaemonSet{
				ObjectMeta: metav1.ObjectMeta{Name: "node-local-dns", Namespace: testRef.Namespace},
				Status:     appsv1.DaemonSetStatus{DesiredNumberScheduled: int32(n)},
			})
		}
		m.fleet.n = 2 + m.rng.IntN(60)
		daemons(m.fleet.n)
		m.api.addPod(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: testRef.Name, Namespace: testRef.Namespace,
			UID: testRef.UID, OwnerReferences: controlledBy("DaemonSet", "node-local-dns")}})
		m.fleet.scale = m.scaler(2, 61, daemons) // nodes join and leave
	}
	m.fleet.least, m.fleet.most = m.fleet.n, m.fleet.n
}

// scaler is a scale that draws N between lo and hi and sets it with set.
func (m *model) scaler(lo, hi int, set func(n int)) func() {
	return func() {
		f := m.fleet
		f.n = lo + m.rng.IntN(hi-lo+1)
		f.least, f.most = min(f.least, f.n), max(f.most, f.n)
		set(f.n)
		f.share()
	}
}

// scaled scales the pod's workload (or its nodes), if it has one: the replica reads the new N
// within fleetStale, and until then writes by the old one. The shares checked are the largest,
// those of the least N; the waits, the longest, those of the most.
func (m *model) scaled() {
	f := m.fleet
	if f == nil || f.scale == nil {
		return
	}
	f.scale()
	m.api.mu.Lock() // the faults count theirs under it, in the writers' goroutines
	m.stats.injected["workload scaled"]++
	m.api.mu.Unlock()
	qps := m.qps
	if !f.off && f.fleetQPS > 0 {
		qps = min(qps, f.fleetQPS/float64(f.most)+1/fleetFloor.Seconds())
	}
	m.qps = qps
	for _, l := range m.firsts {
		l.qps = min(l.qps, qps)
	}
}

// configured notes a configuration the run takes, at start or by a reload.
func (m *model) configured(cfg config) {
	f := m.fleet
	if cfg.fleetQPS == 0 {
		f.off = true
		return
	}
	f.fleetQPS, f.fleetBurst = max(f.fleetQPS, cfg.fleetQPS), max(f.fleetBurst, cfg.fleetBurst)
	f.share()
}

// share sets the largest share of the run: the most of the option over the least N.
func (f *modelFleet) share() {
	if f.fleetQPS == 0 {
		return
	}
	n := float64(f.least)
	f.burst = float64(f.fleetBurst)/n + 1
	f.qps = f.fleetQPS/n + 1/fleetFloor.Seconds()
}

// rateOf is the least refill rate of a bucket under cfg: rate's, or the replica's share.
func (m *model) rateOf(cfg config) float64 {
	if cfg.fleetQPS == 0 {
		return cfg.qps
	}
	return min(cfg.qps, cfg.fleetQPS/float64(m.fleet.most)+1/fleetFloor.Seconds())
}

// fleetWait is what fleet adds to a line's wait under cfg: the herd's window, and the reads of
// N (three at most), each a refill of rate and its time, as the pod's reads take.
func fleetWait(cfg config) time.Duration {
	if cfg.fleetQPS == 0 {
		return 0
	}
	read := time.Duration(float64(time.Second)/cfg.qps) + writeTimeout
	return herdMaxWindow + fleetReads*read
}

// uncounted tells whether the scheduler said that N cannot be read: rate alone is in force.
func uncounted(reports []error) bool {
	for _, err := range reports {
		var no errNoFleet
		if errors.As(err, &no) {
			return true
		}
	}
	return false
}

// checkShare: while fleet is in force all along, the writes of one bucket that reached the API
// over any interval T are at most the replica's share, BURST/N + 1 + (QPS/N + 1/3600) x T.
func (m *model) checkShare(reports []error) error {
	f := m.fleet
	if f == nil || f.off || f.qps == 0 || uncounted(reports) {
		return nil
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
	m.api.mu.Unlock()
	for reason, at := range byBucket {
		sort.Slice(at, func(i, j int) bool { return at[i].Before(at[j]) })
		for i := range at {
			for j := i; j < len(at); j++ {
				if bound := f.burst + f.qps*at[j].Sub(at[i]).Seconds(); float64(j-i+1) > bound+1e-9 {
					return fmt.Errorf("fleet: %d %s writes from %v to %v, the share of N=%d bounds them at %.2f",
						j-i+1, reason, at[i], at[j], f.least, bound)
				}
			}
		}
	}
	return nil
}

// herd is the most the herd spread adds to the recovery after an outage: its window, when a
// configuration of the run has fleet.
func (m *model) herd() time.Duration {
	if m.fleet != nil && m.fleet.qps > 0 {
		return herdMaxWindow
	}
	return 0
}

// workloadRead tells a read of the pod's workload: its ReplicaSet, Deployment or DaemonSet.
func workloadRead(r apiRequest) bool {
	switch r.resource {
	case "replicasets", "deployments", "daemonsets":
		return true
	}
	return false
}

// TestFaultModelsCheckTheRetryAfterWithFleet: the fault models check that no request leaves
// within a Retry-After, the reads of N included; they can only if some of their configurations
// set fleet and the fake API holds a workload, so that the reads of N, the floor and the herd
// spread meet the faults. The stepped model's first seeds read the workload, and those reads
// meet a 429, with every check of the model passing. (TestFaultModel, over its seeds, asks a 429
// with a Retry-After and a 5xx of them.)
func TestFaultModelsCheckTheRetryAfterWithFleet(t *testing.T) {
	fleets := 0
	for _, cfg := range faultConfigs {
		if cfg.fleetQPS > 0 {
			fleets++
		}
	}
	if fleets == 0 {
		t.Fatalf("none of the fault models' %d configurations sets fleet: the reads of N, the "+
			"floor and the herd spread never meet a fault there", len(faultConfigs))
	}
	stats := faultStats{injected: map[string]int{}, workload: map[string]int{}}
	const most = 100
	for seed := uint64(1); seed <= most; seed++ {
		if err := runFaultModel(seed, &stats); err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
		if stats.workload["429"]+stats.workload["429+Retry-After"] > 0 {
			t.Logf("%d seeds: reads of the workload met %v", seed, stats.workload)
			return
		}
	}
	t.Errorf("in %d seeds the reads of the workload met %v: no 429", most, stats.workload)
}

// workloadFaults says what the reads of the workload did not meet over many seeds: a 429 with
// a Retry-After and a 5xx.
func workloadFaults(stats *faultStats) error {
	if stats.workload["429+Retry-After"] == 0 || stats.workload["503"]+stats.workload["503+applied"] == 0 {
		return fmt.Errorf("over %d seeds the reads of the workload met %v: no 429 with a "+
			"Retry-After, or no 503", stats.seeds, stats.workload)
	}
	return nil
}
