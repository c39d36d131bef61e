//go:build fleetbench

package k8s_event

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coredns/caddy"
	"github.com/prometheus/client_golang/prometheus/testutil"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"

	"github.com/dnsops/k8s_event/deploy"
	"github.com/dnsops/k8s_event/internal/cluster"
)

// BenchmarkFleet runs a fleet of CoreDNS replicas in one process, each a production pipeline
// (listener, scheduler, writers) with its own pod object and its own client and connection,
// writing as the ServiceAccount kube-system/coredns to a real kube-apiserver and etcd
// (internal/cluster) with API Priority and Fairness on, as it is by default. Scenarios:
//
//	shared: every replica logs the same error line fleet.same times and fleet.names lines
//	        that name a query each, the same names in every replica, within fleet.spread;
//	outage: the same lines, logged while the API server cannot be reached for fleet.outage;
//
// and all along a bystander, the ServiceAccount kube-system/bystander as a CNI agent: it lists
// and watches EndpointSlices and patches a Node every 100 ms. Each runs with and without the
// priority level of deploy/k8s_event/flowcontrol, for each set of k8s_event options in
// fleet.options. It is a measurement, not a test: it writes a table (fleet.out) and fails only
// when the setup does. `make bench-fleet` runs it:
//
//	go test -tags fleetbench -run '^$' -bench '^BenchmarkFleet$' -benchtime 1x -timeout 2h . \
//	    -args -fleet.replicas 1000 -fleet.options '|fleet 10 50' -fleet.out bin/bench-fleet.md
func BenchmarkFleet(b *testing.B) {
	if b.N > 1 {
		b.Skip("one run is the measurement: -benchtime 1x")
	}
	log.SetOutput(io.Discard) // the plugin's own lines about failed writes, a thousand at a time
	f := newBenchFleet(b)
	var rows []fleetRow
	for _, options := range strings.Split(*fleetOptions, "|") {
		for _, level := range fleetLevels(b) {
			for _, sc := range []string{"shared", "outage"} {
				row := f.scenario(b, sc, level, options)
				rows = append(rows, row)
				fmt.Fprintln(os.Stderr, row.markdown())
			}
		}
	}
	report := fleetReport(f, rows)
	fmt.Print(report)
	if *fleetOut != "" {
		if err := os.WriteFile(*fleetOut, []byte(report), 0o644); err != nil {
			b.Fatal(err)
		}
	}
	for _, r := range rows {
		if !r.ledgerOK {
			b.Errorf("%s: the ledger does not balance: %s", r.name(), r.ledger)
		}
		if r.bound > 0 && r.writes > r.bound {
			b.Errorf("%s: %.0f event writes, past the fleet's bound of %.0f", r.name(), r.writes, r.bound)
		}
	}
}

var (
	benchReplicas = flag.Int("fleet.replicas", 1000, "CoreDNS replicas (pipelines), each with its pod and client")
	fleetOptions  = flag.String("fleet.options", "",
		"k8s_event options, one set per variant, '|' between sets and ';' between the lines of one, e.g. '|fleet 10 50'")
	fleetLevel  = flag.String("fleet.level", "both", "the priority level of deploy/k8s_event/flowcontrol: with, without or both")
	fleetSame   = flag.Int("fleet.same", 50, "times every replica logs the same error line")
	fleetNames  = flag.Int("fleet.names", 200, "error lines every replica logs that name one query each")
	fleetSpread = flag.Duration("fleet.spread", 10*time.Second, "the lines of a replica are logged within this time")
	fleetOutage = flag.Duration("fleet.outage", 30*time.Second, "how long the API server cannot be reached")
	fleetSettle = flag.Duration("fleet.settle", 3*time.Minute, "longest wait for every line to be carried or dropped")
	fleetIdle   = flag.Duration("fleet.idle", 5*time.Second, "the bystander's measurement before each scenario")
	fleetOut    = flag.String("fleet.out", "", "also write the report (Markdown) to this file")
)

func fleetLevels(b *testing.B) []bool {
	switch *fleetLevel {
	case "both":
		return []bool{false, true}
	case "with":
		return []bool{true}
	case "without":
		return []bool{false}
	}
	b.Fatalf("-fleet.level %q: want with, without or both", *fleetLevel)
	return nil
}

// benchConfig parses options as the lines of a k8s_event block.
func benchConfig(b *testing.B, options string) config {
	corefile := "k8s_event {\n" + strings.ReplaceAll(options, ";", "\n") + "\n}"
	cfg, err := parse(caddy.NewTestController("dns", corefile))
	if err != nil {
		b.Fatalf("-fleet.options %q: %v", options, err)
	}
	return cfg
}

// benchFleet is the cluster, the pods and the clients of the replicas.
type benchFleet struct {
	kube    *cluster.Cluster
	pods    []*corev1.Pod
	clients []kubernetes.Interface
	outage  *outage
	probe   *http.Client // as kube-system/coredns, to see a write's priority level
	server  string
	by      *bystander
	levels  map[string]types.UID // priority level UIDs by name
	want    int                  // N: the Deployment's replicas plus its maxSurge
	started time.Time
}

const fleetNS = "kube-system"

func newBenchFleet(b *testing.B) *benchFleet {
	ctx := b.Context()
	f := &benchFleet{outage: &outage{}, levels: map[string]types.UID{}, started: time.Now()}
	f.kube = cluster.NewForTest(b, cluster.Options{StartTimeout: 3 * time.Minute})
	f.kube.RESTConfig.QPS, f.kube.RESTConfig.Burst = 1000, 2000
	admin, err := kubernetes.NewForConfig(f.kube.RESTConfig)
	if err != nil {
		b.Fatal(err)
	}
	f.kube.Clientset = admin
	f.grant(b)
	f.workload(b)
	path, err := f.kube.ServiceAccountKubeconfig(ctx, fleetNS, "coredns")
	if err != nil {
		b.Fatal(err)
	}
	base, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		b.Fatal(err)
	}
	if f.probe, err = rest.HTTPClientFor(base); err != nil {
		b.Fatal(err)
	}
	f.server = base.Host
	for range f.pods {
		// As the kubeapi plugin makes it: protobuf, client-go's default QPS and burst. A dialer of
		// its own gives each client its own transport and connection, which the outage cuts.
		cfg := rest.CopyConfig(base)
		cfg.ContentType = "application/vnd.kubernetes.protobuf"
		cfg.UserAgent = "coredns-k8s-event-fleet"
		cfg.Dial = f.outage.dial
		client, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			b.Fatal(err)
		}
		f.clients = append(f.clients, client)
	}
	pls, err := admin.FlowcontrolV1().PriorityLevelConfigurations().List(ctx, metav1.ListOptions{})
	if err != nil {
		b.Fatal(err)
	}
	for _, pl := range pls.Items {
		f.levels[pl.Name] = pl.UID
	}
	f.by = startBystander(b, f.kube)
	fmt.Fprintf(os.Stderr, "%s %d pods and clients ready in %s\n", time.Now().UTC().Format(time.TimeOnly),
		len(f.pods), time.Since(f.started).Round(time.Second))
	return f
}

// grant gives kube-system/coredns what k8s_event needs (deploy/k8s_event/component/rbac.yaml),
// CoreDNS's reads, and the reads of its workload that the fleet option may make.
func (f *benchFleet) grant(b *testing.B) {
	ctx := b.Context()
	rbac := f.kube.Clientset.RbacV1()
	sa := []rbacv1.Subject{{Kind: "ServiceAccount", Name: "coredns", Namespace: fleetNS}}
	if _, err := rbac.Roles(fleetNS).Create(ctx, &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "coredns-k8s-event"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"events"},
			Verbs: []string{"create", "patch"}}},
	}, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	if _, err := rbac.RoleBindings(fleetNS).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "coredns-k8s-event"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "coredns-k8s-event"},
		Subjects:   sa,
	}, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	if _, err := rbac.ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "coredns-fleet-reads"},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"endpoints", "services", "pods", "namespaces"},
				Verbs: []string{"get", "list", "watch"}},
			{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"},
				Verbs: []string{"list", "watch"}},
			{APIGroups: []string{"apps"}, Resources: []string{"deployments", "replicasets", "daemonsets"},
				Verbs: []string{"get", "list", "watch"}},
		},
	}, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	if _, err := rbac.ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "coredns-fleet-reads"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "coredns-fleet-reads"},
		Subjects:   sa,
	}, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
}

// workload makes the Deployment coredns of fleet.replicas replicas, its ReplicaSet and its pods,
// as objects only: nothing runs them.
func (f *benchFleet) workload(b *testing.B) {
	ctx := b.Context()
	cs := f.kube.Clientset
	n := int32(*benchReplicas)
	labels := map[string]string{"k8s-app": "kube-dns"}
	spec := corev1.PodSpec{
		ServiceAccountName:           "coredns",
		AutomountServiceAccountToken: ptr.To(false),
		Containers:                   []corev1.Container{{Name: "coredns", Image: "localhost/coredns-k8s-event:fleet"}},
	}
	if _, err := cs.CoreV1().ServiceAccounts(fleetNS).Create(ctx, &corev1.ServiceAccount{
		ObjectMeta: metav1.ObjectMeta{Name: "coredns"},
	}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		b.Fatal(err)
	}
	d, err := cs.AppsV1().Deployments(fleetNS).Create(ctx, &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "coredns", Labels: labels},
		Spec: appsv1.DeploymentSpec{
			Replicas: &n,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: spec},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		b.Fatal(err)
	}
	surge := 0
	if u := d.Spec.Strategy.RollingUpdate; u != nil && u.MaxSurge != nil { // defaulted: 25%
		surge, _ = intstr.GetScaledValueFromIntOrPercent(u.MaxSurge, int(n), true)
	}
	f.want = int(n) + surge
	rs, err := cs.AppsV1().ReplicaSets(fleetNS).Create(ctx, &appsv1.ReplicaSet{
		ObjectMeta: metav1.ObjectMeta{Name: "coredns-fleet", Labels: labels, OwnerReferences: []metav1.OwnerReference{{
			APIVersion: "apps/v1", Kind: "Deployment", Name: d.Name, UID: d.UID, Controller: ptr.To(true)}}},
		Spec: appsv1.ReplicaSetSpec{
			Replicas: &n,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: spec},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		b.Fatal(err)
	}
	f.pods = make([]*corev1.Pod, n)
	errs := make(chan error, n)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	for i := range f.pods {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			pod, err := cs.CoreV1().Pods(fleetNS).Create(ctx, &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("coredns-fleet-%05d", i), Labels: labels,
					OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet",
						Name: rs.Name, UID: rs.UID, Controller: ptr.To(true)}}},
				Spec: spec,
			}, metav1.CreateOptions{})
			if err != nil {
				errs <- err
				return
			}
			f.pods[i] = pod
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		b.Fatal(err)
	}
}

// outage makes the API server unreachable for the replicas: it closes their connections, and
// their dials fail, until it ends.
type outage struct {
	mu    sync.Mutex
	down  bool
	conns map[net.Conn]struct{}
}

func (o *outage) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	o.mu.Lock()
	down := o.down
	o.mu.Unlock()
	if down {
		return nil, fmt.Errorf("dial %s: connection refused (outage)", addr)
	}
	c, err := (&net.Dialer{Timeout: 5 * time.Second}).DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.conns == nil {
		o.conns = map[net.Conn]struct{}{}
	}
	o.conns[c] = struct{}{}
	return c, nil
}

func (o *outage) set(down bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.down = down
	if down {
		for c := range o.conns {
			c.Close()
		}
		o.conns = nil
	}
}

// replicas are the pipelines of one scenario.
type replicas []*pipeline

func (f *benchFleet) start(cfg config) replicas {
	rs := make(replicas, len(f.pods))
	for i, pod := range f.pods {
		id := podIdentity{
			ref: corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name,
				Namespace: pod.Namespace, UID: pod.UID},
			node: fmt.Sprintf("node-%05d", i),
			verb: verbListPod,
		}
		rs[i] = newPipeline(cfg, f.clients[i], id, clock.RealClock{})
		rs[i].start()
	}
	return rs
}

// sameLine is the upstream's failure, which every replica logs alike.
const sameLine = "2 . NS: read udp 10.244.0.5:41234->10.96.0.1:53: i/o timeout"

// log has every replica log the scenario's lines, evenly within spread, and returns how many.
func (rs replicas) log(spread time.Duration) int64 {
	total := *fleetSame + *fleetNames
	every := total // the same line comes every so many lines
	if *fleetSame > 0 {
		every = total / *fleetSame
	}
	tick := time.NewTicker(spread / time.Duration(max(total, 1)))
	defer tick.Stop()
	for i := range total {
		<-tick.C
		same := i%every == 0 && i/every < *fleetSame
		for _, p := range rs {
			if same {
				p.listener.Error("plugin/errors: ", sameLine)
			} else {
				p.listener.Errorf("plugin/errors: ", "2 q%d.example.org. A: read udp 10.244.0.5:41234->10.96.0.1:53: i/o timeout", i)
			}
		}
	}
	return int64(total) * int64(len(rs))
}

// quiet reports whether every line logged is carried or dropped.
func (rs replicas) quiet() bool {
	for _, p := range rs {
		if len(p.listener.lines) > 0 {
			return false
		}
	}
	return testutil.ToFloat64(pendingLines) == 0
}

func (rs replicas) stop() {
	var wg sync.WaitGroup
	for _, p := range rs {
		wg.Go(func() { p.stop(time.Second) })
	}
	wg.Wait()
}

// setLevel applies or deletes the priority level and its FlowSchema, and waits until an event
// write as kube-system/coredns is dispatched in the level it should be.
func (f *benchFleet) setLevel(b *testing.B, on bool) {
	ctx := b.Context()
	fc := f.kube.Clientset.FlowcontrolV1()
	pl, fs, err := deploy.FlowControl(fleetNS, "coredns")
	if err != nil {
		b.Fatal(err)
	}
	want := f.levels["workload-high"]
	if on {
		got, err := fc.PriorityLevelConfigurations().Create(ctx, pl, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			b.Fatal(err)
		}
		if err == nil {
			f.levels[pl.Name] = got.UID
		}
		if _, err := fc.FlowSchemas().Create(ctx, fs, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			b.Fatal(err)
		}
		want = f.levels[pl.Name]
	} else {
		fc.FlowSchemas().Delete(ctx, fs.Name, metav1.DeleteOptions{})
		fc.PriorityLevelConfigurations().Delete(ctx, pl.Name, metav1.DeleteOptions{})
	}
	body := `{"apiVersion":"v1","kind":"Event","metadata":{"generateName":"fleet-probe-"},"reason":"Probe",` +
		`"type":"Normal","message":"probe","involvedObject":{"kind":"Pod","namespace":"kube-system","name":"probe"}}`
	for deadline := time.Now().Add(time.Minute); ; {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, f.server+"/api/v1/namespaces/kube-system/events",
			strings.NewReader(body))
		if err != nil {
			b.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := f.probe.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if types.UID(resp.Header.Get("X-Kubernetes-PF-PriorityLevel-UID")) == want {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("an event write as kube-system/coredns is not dispatched in level %s after a minute", want)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// clearEvents deletes every event of the namespace, so that a scenario counts only its own. Tens
// of thousands of events take longer than one request may: it deletes again until none is left.
func (f *benchFleet) clearEvents(b *testing.B) {
	events := f.kube.Clientset.CoreV1().Events(fleetNS)
	for deadline := time.Now().Add(10 * time.Minute); ; {
		err := events.DeleteCollection(b.Context(), metav1.DeleteOptions{}, metav1.ListOptions{})
		list, lerr := events.List(b.Context(), metav1.ListOptions{Limit: 1})
		if err == nil && lerr == nil && len(list.Items) == 0 {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("the events of %s are still there after 10 minutes: %v, %v", fleetNS, err, lerr)
		}
		time.Sleep(time.Second)
	}
}

// landed sums the counts of the scenario's events in the API: the lines they carry.
func (f *benchFleet) landed(b *testing.B) (events int, lines int64) {
	opts := metav1.ListOptions{Limit: 5000}
	for {
		list, err := f.kube.Clientset.CoreV1().Events(fleetNS).List(b.Context(), opts)
		if err != nil {
			b.Fatal(err)
		}
		for _, ev := range list.Items {
			if ev.Source.Component != "" && strings.HasPrefix(ev.InvolvedObject.Name, "coredns-fleet-") &&
				ev.Reason == levelError.reason() {
				events++
				lines += int64(ev.Count)
			}
		}
		if opts.Continue = list.Continue; opts.Continue == "" {
			return events, lines
		}
	}
}
