//go:build fleetbench

package k8s_event

import (
	"bufio"
	"context"
	"fmt"
	"math"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"

	"github.com/dnsops/k8s_event/internal/cluster"
)

// fleetRow is what one scenario of one variant measured.
type fleetRow struct {
	scenario, options string
	level             bool
	lines             int64
	writes            float64 // event writes the API server counted (POST, PATCH, PUT)
	peak              float64 // the most in one second
	tooMany           float64 // of them answered 429
	etcdGrowth        float64 // bytes
	landed            time.Duration
	landedOK          bool
	pending           int64   // lines still pending at the end
	surplus           int64   // lines both in a count and pending: writes applied but unanswered
	bound             float64 // the fleet's bound over the measured time; 0 without fleet
	ledger            string
	ledgerOK          bool
	events            int
	apf               map[string]apfLevel
	idle, during      latencies
	cpuAPI, cpuEtcd   time.Duration
	cpuBench          time.Duration
	took              time.Duration
}

func (r fleetRow) name() string {
	level := "without level"
	if r.level {
		level = "with level"
	}
	opts := r.options
	if opts == "" {
		opts = "defaults"
	}
	return fmt.Sprintf("%s, %s, %s", r.scenario, opts, level)
}

// apfLevel is APF's own account of one priority level over a scenario.
type apfLevel struct {
	dispatched, rejected float64
	meanWait, p99Wait    float64 // seconds, of the requests dispatched
}

// snapshot is what is read before and after a scenario.
type snapshot struct {
	at       time.Time
	metrics  promText
	etcdSize float64
	cpuAPI   time.Duration
	cpuEtcd  time.Duration
	cpuBench time.Duration
	dropped  float64
}

func (f *benchFleet) snapshot(b *testing.B) snapshot {
	ctx := b.Context()
	text, err := f.kube.MetricsText(ctx)
	if err != nil {
		b.Fatal(err)
	}
	etcd, err := f.kube.EtcdMetricsText(ctx)
	if err != nil {
		b.Fatal(err)
	}
	api, etcdPID := f.kube.ControlPlanePIDs()
	s := snapshot{at: time.Now(), metrics: parseProm(text), cpuAPI: procCPU(api), cpuEtcd: procCPU(etcdPID),
		cpuBench: selfCPU()}
	s.etcdSize = parseProm(etcd).sum("etcd_mvcc_db_total_size_in_bytes", nil)
	for r := range numDropReasons {
		s.dropped += testutil.ToFloat64(droppedTotal[r])
	}
	return s
}

// fleetWriteLabels select the series of apiserver_request_total that count event writes.
func fleetWriteLabels(code string) map[string]string {
	m := map[string]string{"resource": "events"}
	if code != "" {
		m["code"] = code
	}
	return m
}

func writeCount(m promText, code string) float64 {
	var n float64
	for _, verb := range []string{"POST", "PATCH", "PUT"} {
		labels := fleetWriteLabels(code)
		labels["verb"] = verb
		n += m.sum("apiserver_request_total", labels)
	}
	return n
}

// scenario runs one scenario and measures it.
func (f *benchFleet) scenario(b *testing.B, name string, level bool, options string) fleetRow {
	cfg := benchConfig(b, options)
	f.setLevel(b, level)
	f.clearEvents(b)
	row := fleetRow{scenario: name, options: options, level: level}
	fmt.Fprintf(os.Stderr, "%s start %s\n", time.Now().UTC().Format(time.TimeOnly), row.name())
	start := time.Now()
	rs := f.start(cfg)
	idleFrom := time.Now()
	time.Sleep(*fleetIdle)
	row.idle = f.by.between(idleFrom, time.Now())

	before := f.snapshot(b)
	peak := newPeakSampler(b, f.kube)
	from := time.Now()
	logged := make(chan int64, 1)
	if name == "outage" {
		f.outage.set(true)
		go func() { logged <- rs.log(min(*fleetSpread, *fleetOutage)) }()
		time.Sleep(*fleetOutage)
		f.outage.set(false)
		from = time.Now() // the time to land counts from the API server's return
	} else {
		go func() { logged <- rs.log(*fleetSpread) }()
	}
	row.lines = <-logged
	deadline := time.Now().Add(*fleetSettle)
	for !rs.quiet() && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	row.landedOK = rs.quiet()
	row.landed = time.Since(from)
	row.during = f.by.between(before.at, time.Now())
	time.Sleep(2 * time.Second) // the last answers reach the metrics
	after := f.snapshot(b)
	row.peak = peak.stop()
	row.writes = writeCount(after.metrics, "") - writeCount(before.metrics, "")
	row.tooMany = writeCount(after.metrics, "429") - writeCount(before.metrics, "429")
	row.etcdGrowth = after.etcdSize - before.etcdSize
	row.apf = apfLevels(before.metrics, after.metrics)
	row.cpuAPI, row.cpuEtcd, row.cpuBench = after.cpuAPI-before.cpuAPI, after.cpuEtcd-before.cpuEtcd,
		after.cpuBench-before.cpuBench
	var carried, dropped, pending int64
	var still bool
	row.events, carried, dropped, pending, still = f.account(b)
	dropped -= int64(before.dropped)
	// No line lost: each is in a count, dropped or pending. A write that the replica gave up on
	// (its 10 s time-out) while the API server still applied it has its lines in the count and
	// pending until the next write of the event; past an overload, more may be than were logged.
	row.ledgerOK = !still && carried+dropped+pending >= row.lines
	row.surplus = carried + dropped + pending - row.lines
	row.pending = pending
	if cfg.fleetQPS > 0 {
		// README: BURST + N + (QPS + N / 3600) x T over any T, here the time between the readings.
		n := float64(f.want)
		row.bound = float64(cfg.fleetBurst) + n + (cfg.fleetQPS+n/3600)*after.at.Sub(before.at).Seconds()
	}
	row.ledger = fmt.Sprintf("%d lines = %d in counts + %d dropped + %d pending", row.lines, carried, dropped, pending)
	if still {
		row.ledger += ", never without requests in flight"
	}
	rs.stop()
	row.took = time.Since(start)
	return row
}

// account lists the scenario's events and reads the replicas' dropped and pending lines at a
// moment when no request is in flight, and none starts or ends meanwhile: a write in flight has
// its lines both in the API's counts (once applied) and pending (until its answer). still tells
// that no such moment came within a minute; the last reading is returned.
func (f *benchFleet) account(b *testing.B) (events int, carried, dropped, pending int64, still bool) {
	for deadline := time.Now().Add(time.Minute); ; {
		idle := testutil.ToFloat64(requestsInFlight) == 0
		done, pend := requestsDone(), testutil.ToFloat64(pendingLines)
		events, carried = f.landed(b)
		dropped, pending = 0, int64(testutil.ToFloat64(pendingLines))
		for r := range numDropReasons {
			dropped += int64(testutil.ToFloat64(droppedTotal[r]))
		}
		quiet := idle && testutil.ToFloat64(requestsInFlight) == 0 && requestsDone() == done &&
			float64(pending) == pend
		if quiet || time.Now().After(deadline) {
			return events, carried, dropped, pending, !quiet
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// requestsDone is the count of requests the replicas made that were answered or timed out.
func requestsDone() uint64 {
	var n uint64
	for _, v := range []string{"create", "patch", "list", "get"} {
		var m dto.Metric
		if requestSeconds.WithLabelValues(v).(prometheus.Histogram).Write(&m) == nil {
			n += m.GetHistogram().GetSampleCount()
		}
	}
	return n
}

// apfLevels gives, per priority level, what APF dispatched and rejected between two readings.
func apfLevels(before, after promText) map[string]apfLevel {
	out := map[string]apfLevel{}
	for _, pl := range after.values("apiserver_flowcontrol_request_wait_duration_seconds_count", "priority_level") {
		sel := map[string]string{"priority_level": pl, "execute": "true"}
		l := apfLevel{
			dispatched: after.sum("apiserver_flowcontrol_request_wait_duration_seconds_count", sel) -
				before.sum("apiserver_flowcontrol_request_wait_duration_seconds_count", sel),
			rejected: after.sum("apiserver_flowcontrol_rejected_requests_total", map[string]string{"priority_level": pl}) -
				before.sum("apiserver_flowcontrol_rejected_requests_total", map[string]string{"priority_level": pl}),
		}
		if l.dispatched > 0 {
			l.meanWait = (after.sum("apiserver_flowcontrol_request_wait_duration_seconds_sum", sel) -
				before.sum("apiserver_flowcontrol_request_wait_duration_seconds_sum", sel)) / l.dispatched
			l.p99Wait = quantile(0.99, before, after, "apiserver_flowcontrol_request_wait_duration_seconds_bucket", sel)
		}
		out[pl] = l
	}
	return out
}

// quantile estimates a quantile from the growth of a histogram's buckets: the upper bound of the
// first bucket that holds it.
func quantile(q float64, before, after promText, name string, sel map[string]string) float64 {
	type bucket struct{ le, n float64 }
	var bs []bucket
	for _, le := range after.values(name, "le") {
		s := map[string]string{"le": le}
		for k, v := range sel {
			s[k] = v
		}
		bound, _ := strconv.ParseFloat(le, 64)
		bs = append(bs, bucket{bound, after.sum(name, s) - before.sum(name, s)})
	}
	slices.SortFunc(bs, func(a, b bucket) int { return cmpFloat(a.le, b.le) })
	if len(bs) == 0 || bs[len(bs)-1].n == 0 {
		return 0
	}
	total := bs[len(bs)-1].n
	for _, x := range bs {
		if x.n >= q*total {
			return x.le
		}
	}
	return math.Inf(1)
}

func cmpFloat(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// promText is the samples of a Prometheus text exposition.
type promText []promSample

type promSample struct {
	name   string
	labels map[string]string
	value  float64
}

func parseProm(text string) promText {
	var out promText
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		sp := strings.LastIndexByte(line, ' ')
		if sp < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[sp+1:], 64)
		if err != nil {
			continue
		}
		s := promSample{name: line[:sp], labels: map[string]string{}, value: v}
		if i := strings.IndexByte(line[:sp], '{'); i >= 0 {
			s.name = line[:i]
			for _, kv := range strings.Split(strings.TrimSuffix(line[i+1:sp], "}"), "\",") {
				k, v, ok := strings.Cut(kv, "=\"")
				if ok {
					s.labels[k] = strings.TrimSuffix(v, "\"")
				}
			}
		}
		out = append(out, s)
	}
	return out
}

// sum adds the samples of name whose labels include sel.
func (p promText) sum(name string, sel map[string]string) float64 {
	var n float64
	for _, s := range p {
		if s.name != name {
			continue
		}
		match := true
		for k, v := range sel {
			match = match && s.labels[k] == v
		}
		if match {
			n += s.value
		}
	}
	return n
}

// values lists the values a label takes in the samples of name.
func (p promText) values(name, label string) []string {
	var out []string
	for _, s := range p {
		if v, ok := s.labels[label]; ok && s.name == name && !slices.Contains(out, v) {
			out = append(out, v)
		}
	}
	return out
}

// peakSampler reads the event writes the API server counted once a second, for the peak.
type peakSampler struct {
	done chan struct{}
	peak chan float64
}

func newPeakSampler(b *testing.B, kube *cluster.Cluster) *peakSampler {
	p := &peakSampler{done: make(chan struct{}), peak: make(chan float64, 1)}
	go func() {
		// A reading is dated halfway through its scrape, and a rate is taken over at least a
		// second, from the latest reading a second or more before: scrapes that an overloaded
		// API server answers late, close together, would otherwise divide by a sliver of time.
		type reading struct {
			at time.Time
			n  float64
		}
		var best float64
		var readings []reading
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			t0 := time.Now()
			text, err := kube.MetricsText(context.Background())
			if err == nil {
				now := reading{t0.Add(time.Since(t0) / 2), writeCount(filterProm(text, "apiserver_request_total{"), "")}
				for i := len(readings) - 1; i >= 0; i-- {
					if d := now.at.Sub(readings[i].at); d >= time.Second {
						best = max(best, (now.n-readings[i].n)/d.Seconds())
						break
					}
				}
				readings = append(readings, now)
			}
			select {
			case <-p.done:
				p.peak <- best
				return
			case <-tick.C:
			}
		}
	}()
	return p
}

func (p *peakSampler) stop() float64 { close(p.done); return <-p.peak }

// filterProm parses only the lines that start with prefix: a scrape a second stays cheap.
func filterProm(text, prefix string) promText {
	var b strings.Builder
	for line := range strings.SplitSeq(text, "\n") {
		if strings.HasPrefix(line, prefix) {
			b.WriteString(line)
			b.WriteByte('\n')
		}
	}
	return parseProm(b.String())
}

// procCPU is the CPU time a process used, user and system.
func procCPU(pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(b)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	if len(fields) < 13 {
		return 0
	}
	utime, _ := strconv.ParseInt(fields[11], 10, 64)
	stime, _ := strconv.ParseInt(fields[12], 10, 64)
	return time.Duration(utime+stime) * time.Second / 100 // USER_HZ
}

func selfCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// bystander is a CNI agent in kube-system: it lists and watches EndpointSlices, and patches its
// Node every 100 ms. Its requests fall in kube-system-service-accounts, level workload-high.
type bystander struct {
	mu      sync.Mutex
	samples []sample
}

type sample struct {
	at      time.Time
	took    time.Duration
	isPatch bool
}

// latencies are a bystander's p50 and p99 over a window, of patches and of lists.
type latencies struct {
	patch50, patch99, list50, list99 time.Duration
	n                                int
}

func startBystander(b *testing.B, kube *cluster.Cluster) *bystander {
	ctx := b.Context()
	cs := kube.Clientset
	name := "bystander"
	if _, err := cs.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: []string{"list", "watch"}},
			{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get", "patch"}},
		},
	}, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	if _, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: name, Namespace: fleetNS}},
	}, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	node := "fleet-bystander"
	if _, err := cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}},
		metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	for i := range 50 {
		if _, err := cs.DiscoveryV1().EndpointSlices(fleetNS).Create(ctx, &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Name: fmt.Sprintf("fleet-%02d", i), Labels: map[string]string{"kubernetes.io/service-name": "fleet"}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{fmt.Sprintf("10.244.%d.1", i)}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}}},
		}, metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
	}
	path, err := kube.ServiceAccountKubeconfig(ctx, fleetNS, name)
	if err != nil {
		b.Fatal(err)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		b.Fatal(err)
	}
	cfg.QPS, cfg.Burst = 100, 100
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		b.Fatal(err)
	}
	by := &bystander{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	b.Cleanup(func() { cancel(); <-done })
	go func() {
		defer close(done)
		w, err := client.DiscoveryV1().EndpointSlices("").Watch(ctx, metav1.ListOptions{})
		if err == nil {
			go func() {
				for range w.ResultChan() {
				}
			}()
			defer w.Stop()
		}
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for i := 0; ctx.Err() == nil; i++ {
			t0 := time.Now()
			patch := fmt.Sprintf(`{"metadata":{"annotations":{"fleet.k8s-event/beat":"%d"}}}`, i)
			if _, err := client.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, []byte(patch),
				metav1.PatchOptions{}); err == nil {
				by.add(sample{at: t0, took: time.Since(t0), isPatch: true})
			}
			if i%10 == 0 {
				t0 = time.Now()
				if _, err := client.DiscoveryV1().EndpointSlices("").List(ctx, metav1.ListOptions{}); err == nil {
					by.add(sample{at: t0, took: time.Since(t0)})
				}
			}
			select {
			case <-ctx.Done():
			case <-tick.C:
			}
		}
	}()
	return by
}

func (by *bystander) add(s sample) {
	by.mu.Lock()
	by.samples = append(by.samples, s)
	by.mu.Unlock()
}

func (by *bystander) between(from, to time.Time) latencies {
	by.mu.Lock()
	defer by.mu.Unlock()
	var patches, lists []time.Duration
	for _, s := range by.samples {
		if s.at.Before(from) || s.at.After(to) {
			continue
		}
		if s.isPatch {
			patches = append(patches, s.took)
		} else {
			lists = append(lists, s.took)
		}
	}
	return latencies{patch50: pct(patches, 0.5), patch99: pct(patches, 0.99),
		list50: pct(lists, 0.5), list99: pct(lists, 0.99), n: len(patches) + len(lists)}
}

func pct(d []time.Duration, q float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	slices.Sort(d)
	return d[min(len(d)-1, int(math.Ceil(q*float64(len(d))))-1)]
}

func ms(d time.Duration) string {
	return strconv.FormatFloat(float64(d.Microseconds())/1000, 'f', 1, 64)
}

func (r fleetRow) markdown() string {
	landed := fmt.Sprintf("%.1f s", r.landed.Seconds())
	if !r.landedOK {
		landed = fmt.Sprintf("not within %.0f s (%d pending)", r.landed.Seconds(), r.pending)
	}
	bound := "-"
	if r.bound > 0 {
		bound = fmt.Sprintf("%.0f, within", r.bound)
		if r.writes > r.bound {
			bound = fmt.Sprintf("%.0f, EXCEEDED", r.bound)
		}
	}
	ledger := "ok"
	switch {
	case !r.ledgerOK:
		ledger = "FAIL: " + r.ledger
	case r.surplus > 0:
		ledger = fmt.Sprintf("none lost; %d also pending", r.surplus)
	}
	ours, high := r.apf["k8s-event"], r.apf["workload-high"]
	return fmt.Sprintf("| %s | %d | %.0f | %s | %.0f | %.0f | %.1f | %s | %d | %s | %.0f / %.0f / %.3f | %.0f / %.0f / %.3f | %s / %s → %s / %s | %s / %s → %s / %s | %.1f / %.1f / %.1f | %.0f |",
		r.name(), r.lines, r.writes, bound, r.peak, r.tooMany, r.etcdGrowth/(1<<20), landed, r.events, ledger,
		ours.dispatched, ours.rejected, ours.p99Wait, high.dispatched, high.rejected, high.p99Wait,
		ms(r.idle.patch50), ms(r.idle.patch99), ms(r.during.patch50), ms(r.during.patch99),
		ms(r.idle.list50), ms(r.idle.list99), ms(r.during.list50), ms(r.during.list99),
		r.cpuAPI.Seconds(), r.cpuEtcd.Seconds(), r.cpuBench.Seconds(), r.took.Seconds())
}

func fleetReport(f *benchFleet, rows []fleetRow) string {
	var b strings.Builder
	fmt.Fprintf(&b, "\nFleet of %d replicas (N = %d: replicas + maxSurge), %d + %d error lines each within %s; "+
		"outage %s; settle at most %s; GOMAXPROCS %d, %d CPUs.\n\n",
		len(f.pods), f.want, *fleetSame, *fleetNames, *fleetSpread, *fleetOutage, *fleetSettle,
		runtime.GOMAXPROCS(0), runtime.NumCPU())
	b.WriteString("| scenario | lines | event writes | fleet bound | peak/s | 429 | etcd +MiB | all landed after | events | ledger | " +
		"k8s-event: dispatched / rejected / p99 wait s | workload-high: dispatched / rejected / p99 wait s | " +
		"bystander patch p50 / p99 ms, idle → during | bystander list p50 / p99 ms, idle → during | " +
		"CPU s: apiserver / etcd / fleet | run s |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---|---|---|---|---:|\n")
	for _, r := range rows {
		b.WriteString(r.markdown() + "\n")
	}
	b.WriteString("\nAPF per level (dispatched / rejected / mean wait s / p99 wait s):\n\n")
	for _, r := range rows {
		var levels []string
		for name, l := range r.apf {
			if l.dispatched > 0 || l.rejected > 0 {
				levels = append(levels, fmt.Sprintf("%s %.0f / %.0f / %.4f / %.3f", name, l.dispatched, l.rejected, l.meanWait, l.p99Wait))
			}
		}
		slices.Sort(levels)
		fmt.Fprintf(&b, "- %s: %s\n", r.name(), strings.Join(levels, "; "))
	}
	return b.String()
}
