//go:build e2e

package node

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/dnsops/k8s_event/internal/cluster"
)

// The fleet's bound of the test: small, so that three replicas logging all along would pass it
// without `fleet` (each may write 25 at once by `rate`'s defaults).
const (
	nodeFleetQPS   = 1.0
	nodeFleetBurst = 5
)

// fleetNodeKustomization is deploy/kubeadm with the component of k8s_event, its priority level
// (deploy/k8s_event/flowcontrol) and the fleet's reads (deploy/k8s_event/fleet), three replicas.
const fleetNodeKustomization = `resources:
- %[1]s/deploy/kubeadm
components:
- %[1]s/deploy/k8s_event/component
- %[1]s/deploy/k8s_event/flowcontrol
- %[1]s/deploy/k8s_event/fleet
configMapGenerator:
- name: coredns-k8s-event
  namespace: kube-system
  files:
  - Corefile
replicas:
- name: coredns
  count: 3
`

// TestFleetWritesStayWithinTheFleetBoundThroughAnAPIOutage runs three CoreDNS replicas of the
// image with `fleet` and the priority level on the node. Each logs error lines all along: 10 s
// before, 30 s while the pods cannot reach the API server, and after. Every event write of the
// ServiceAccount coredns (the audit log) stays within the README's bound over every window, none
// reaches the API server during the outage, every replica writes again after it with its share
// of N (not the floor alone), and API Priority and Fairness dispatched (or rejected) each one in
// the level k8s-event.
func TestFleetWritesStayWithinTheFleetBoundThroughAnAPIOutage(t *testing.T) {
	if err := cluster.NodeSupported(); err != nil {
		fmt.Fprintf(os.Stderr, "SKIP TestFleetWritesStayWithinTheFleetBoundThroughAnAPIOutage: %v\n", err)
		t.Skip(err)
	}
	archive := nodeImage(t)
	start := time.Now()
	kube, err := cluster.New(t.Context(), cluster.Options{
		AuditPolicy: eventAudit,
		Node:        &cluster.NodeOptions{Images: []string{archive}, PodNetwork: true},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kube.Stop)
	t.Logf("control plane and node Ready in %v", since(start))
	e := &nodeEnv{t: t, kube: kube, dir: t.TempDir(), ref: pushedRef(t, kube, archive)}
	e.writeFleetKustomization(t)
	e.rollout(t, "node")
	pods := e.pods(t)
	if len(pods) != 3 {
		t.Fatalf("%d kube-dns pods run, want 3", len(pods))
	}
	n := e.fleetN(t)

	// Each pod is asked directly, over its pod address, for five names that fail: five lines
	// that repeat, one per answer.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for _, p := range pods {
		addr := net.JoinHostPort(p.Status.PodIP, "53")
		wg.Go(func() {
			c := &dns.Client{Timeout: 2 * time.Second}
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				case <-time.After(50 * time.Millisecond):
				}
				m := new(dns.Msg)
				m.SetQuestion(fmt.Sprintf("n%d.fleet.fail.test.", i%5), dns.TypeA)
				_, _, _ = c.Exchange(m, addr)
			}
		})
	}
	defer func() { close(stop); wg.Wait() }()
	time.Sleep(10 * time.Second)

	// The outage: the pods' packets to the API server are answered with a reset, for 30 s.
	rule := []string{"INPUT", "-s", cluster.ClusterCIDR, "-d", cluster.APIHostAddress, "-p", "tcp",
		"--dport", strconv.Itoa(kube.Port()), "-j", "REJECT", "--reject-with", "tcp-reset"}
	iptables(t, append([]string{"-I"}, rule...)...)
	down := time.Now()
	removed := false
	t.Cleanup(func() {
		if !removed {
			_ = exec.Command("iptables", append([]string{"-D"}, rule...)...).Run()
		}
	})
	time.Sleep(30 * time.Second)
	iptables(t, append([]string{"-D"}, rule...)...)
	removed = true
	up := time.Now()
	t.Logf("API server out of the pods' reach from %s to %s", down.Format(time.TimeOnly), up.Format(time.TimeOnly))

	// Every replica writes again after the outage: within the recovery bound, 82 s plus the
	// herd's window.
	window := min(time.Duration(float64(n)/20*float64(time.Second)), 30*time.Second)
	var writes []fleetWrite
	deadline := up.Add(82*time.Second + window)
	for {
		writes = e.fleetWrites(t)
		after := map[string]bool{}
		for _, w := range writes {
			if w.at.After(up) {
				after[w.pod] = true
			}
		}
		if len(after) == len(pods) {
			t.Logf("every replica wrote again %v after the outage", since(up))
			break
		}
		if time.Now().After(deadline) {
			e.dumpFleet(t, pods, writes)
			t.Fatalf("after the outage only %d of %d replicas wrote within %v", len(after), len(pods), deadline.Sub(up))
		}
		time.Sleep(time.Second)
	}
	time.Sleep(5 * time.Second) // a few more writes at the share's rate
	writes = e.fleetWrites(t)
	afterUp := map[string]int{}
	for _, w := range writes {
		if w.at.After(up) {
			afterUp[w.pod]++
		}
	}
	for _, p := range pods { // the floor alone would allow one write an hour
		if afterUp[p.Name] < 2 {
			e.dumpFleet(t, pods, writes)
			t.Errorf("pod %s wrote %d times after the outage, want its share of N %d: 2 at least", p.Name, afterUp[p.Name], n)
		}
	}

	// The bound over every window of the writes: BURST + N + (QPS + N / 3600) x T.
	perPod := map[string]int{}
	for i, w := range writes {
		perPod[w.pod]++
		if w.at.After(down.Add(time.Second)) && w.at.Before(up) {
			t.Errorf("write %s of %s reached the API server at %s, during the outage", w.verb, w.pod, w.at.Format(time.TimeOnly))
		}
		for j := i; j < len(writes); j++ {
			T := writes[j].at.Sub(w.at).Seconds() + 0.1 // the time a request takes to arrive
			bound := nodeFleetBurst + float64(n) + (nodeFleetQPS+float64(n)/3600)*T
			if got := j - i + 1; float64(got) > bound {
				t.Errorf("%d event writes in %.1f s from %s, past the fleet's bound of %.1f (N %d)",
					got, T, w.at.Format(time.TimeOnly), bound, n)
			}
		}
	}
	if len(writes) == 0 {
		t.Fatal("no event write by the ServiceAccount coredns in the audit log")
	}
	total := writes[len(writes)-1].at.Sub(writes[0].at).Seconds()
	t.Logf("%d event writes by the replicas over %.0f s (bound %.0f, N %d), per pod %v", len(writes), total,
		nodeFleetBurst+float64(n)+(nodeFleetQPS+float64(n)/3600)*total, n, perPod)

	// Dispatched in the level of their own: APF's count of the level is the writes that the
	// audit log saw answered other than 429, and its rejections those answered 429.
	text, err := kube.MetricsText(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	var answered, tooMany float64
	for _, w := range writes {
		if w.code == 429 {
			tooMany++
		} else {
			answered++
		}
	}
	dispatched := metricSum(text, "apiserver_flowcontrol_dispatched_requests_total", `priority_level="k8s-event"`)
	rejected := metricSum(text, "apiserver_flowcontrol_rejected_requests_total", `priority_level="k8s-event"`)
	t.Logf("level k8s-event: %.0f dispatched, %.0f rejected; audit log: %.0f answered, %.0f answered 429",
		dispatched, rejected, answered, tooMany)
	if dispatched != answered || rejected != tooMany {
		t.Errorf("level k8s-event dispatched %.0f and rejected %.0f, want the %.0f event writes and %.0f 429s of the audit log",
			dispatched, rejected, answered, tooMany)
	}
}

// writeFleetKustomization writes the kustomization "node": fleetNodeKustomization with the
// overlay's Corefile, k8s_event at level error with the fleet's bound, and a zone that fails.
func (e *nodeEnv) writeFleetKustomization(t *testing.T) {
	base := filepath.Join(e.dir, "fleet")
	if err := os.MkdirAll(base, 0o755); err != nil {
		t.Fatal(err)
	}
	rel, err := filepath.Rel(base, repoRoot)
	if err != nil {
		t.Fatal(err)
	}
	corefile, err := os.ReadFile(filepath.Join(repoRoot, "deploy/k8s_event/Corefile"))
	if err != nil {
		t.Fatal(err)
	}
	old := "k8s_event {\n       level info warning error\n    }"
	if !strings.Contains(string(corefile), old) {
		t.Fatalf("deploy/k8s_event/Corefile has no %q", old)
	}
	block := fmt.Sprintf("k8s_event {\n       level error\n       fleet %g %d\n    }", nodeFleetQPS, nodeFleetBurst)
	cf := strings.Replace(string(corefile), old, block, 1) + failZone
	files := map[string]string{"kustomization.yaml": fmt.Sprintf(fleetNodeKustomization, rel), "Corefile": cf}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(base, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.kube.WriteNodeKustomization(filepath.Join(e.dir, "node"), base, e.ref); err != nil {
		t.Fatal(err)
	}
}

// fleetN is N as the replicas count it: the Deployment's replicas plus its maxSurge.
func (e *nodeEnv) fleetN(t *testing.T) int {
	d, err := e.kube.Clientset.AppsV1().Deployments("kube-system").Get(t.Context(), "coredns", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n := int(*d.Spec.Replicas)
	surge := 0
	if u := d.Spec.Strategy.RollingUpdate; u != nil && u.MaxSurge != nil {
		surge, _ = intstr.GetScaledValueFromIntOrPercent(u.MaxSurge, n, true)
	}
	return n + surge
}

// fleetWrite is an event write of the ServiceAccount coredns, as the audit log has it.
type fleetWrite struct {
	at   time.Time
	pod  string
	verb string
	code int
}

// fleetWrites are the event writes of the ServiceAccount coredns in the audit log, in the order
// the API server received them.
func (e *nodeEnv) fleetWrites(t *testing.T) []fleetWrite {
	t.Helper()
	f, err := os.Open(e.kube.AuditLogPath)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []fleetWrite
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var r struct {
			auditRecord
			RequestReceivedTimestamp metav1.MicroTime
		}
		if json.Unmarshal(sc.Bytes(), &r) != nil || r.ObjectRef.Resource != "events" ||
			r.User.Username != "system:serviceaccount:kube-system:coredns" {
			continue
		}
		switch r.Verb {
		case "create", "patch", "update":
		default:
			continue
		}
		pod := strings.Join(r.User.Extra["authentication.kubernetes.io/pod-name"], ",")
		out = append(out, fleetWrite{at: r.RequestReceivedTimestamp.Time, pod: pod, verb: r.Verb, code: r.ResponseStatus.Code})
	}
	slices.SortFunc(out, func(a, b fleetWrite) int { return a.at.Compare(b.at) })
	return out
}

// dumpFleet logs what each replica wrote, its plugin's metrics and the end of its log.
func (e *nodeEnv) dumpFleet(t *testing.T, pods []corev1.Pod, writes []fleetWrite) {
	t.Helper()
	for _, w := range writes {
		t.Logf("write %s %s %s %d", w.at.Format("15:04:05.000"), w.pod, w.verb, w.code)
	}
	for _, p := range pods {
		metrics := metricLines(t.Context(), "http://"+net.JoinHostPort(p.Status.PodIP, "9153")+"/metrics", "coredns_k8s_event_")
		logs, _, _ := e.kube.Kubectl(t.Context(), "-n", "kube-system", "logs", "--tail=60", p.Name)
		t.Logf("--- %s metrics ---\n%s--- %s log ---\n%s", p.Name, metrics, p.Name, logs)
	}
}

func iptables(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command("iptables", args...).CombinedOutput(); err != nil {
		t.Fatalf("iptables %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// metricSum adds the samples of name in a Prometheus text whose labels contain label.
func metricSum(text, name, label string) float64 {
	var n float64
	for _, line := range strings.Split(text, "\n") {
		if !strings.HasPrefix(line, name+"{") || !strings.Contains(line, label) {
			continue
		}
		if v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64); err == nil {
			n += v
		}
	}
	return n
}
