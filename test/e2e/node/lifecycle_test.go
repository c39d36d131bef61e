//go:build e2e

package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/strategicpatch"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/yaml"

	"github.com/dnsops/k8s_event/internal/cluster"
	"github.com/dnsops/k8s_event/internal/install"
)

// stockImage is the image kubeadm v1.35 names for CoreDNS. The node has no
// registry: the test makes an image of that name from that CoreDNS
// release's own module, without kubeapi and k8s_event, as the stock image
// is (stock_test.go).
const stockImage = "registry.k8s.io/coredns/coredns:v1.13.1"

// operatorCorefile is a cluster's Corefile as an operator changed it:
// another cluster domain, hosts entries, a stub zone. %d is the DNS port.
const operatorCorefile = `.:%[1]d {
    errors
    health {
       lameduck 5s
    }
    ready
    hosts {
       10.0.0.1 registry.corp.example
       fallthrough
    }
    kubernetes cluster.test in-addr.arpa ip6.arpa {
       pods insecure
       fallthrough in-addr.arpa ip6.arpa
       ttl 30
    }
    prometheus :9153
    forward . /etc/resolv.conf {
       max_concurrent 1000
    }
    cache 30 {
       disable success cluster.test
       disable denial cluster.test
    }
    loop
    reload
    loadbalance
}
corp.example:%[1]d {
    errors
    cache 30
    forward . 10.255.255.1
}
`

// operatorPatches are an operator's changes to the stock Deployment: three
// replicas, a raised memory limit, one more toleration. The node runs the
// rest as it is: pods on the pod network, asked through the layout's
// Service. %[1]s is the Deployment, %[2]s the tolerations the stock layout
// has.
const operatorPatches = `
- target: {kind: Deployment, name: %[1]s}
  patch: |-
    apiVersion: apps/v1
    kind: Deployment
    metadata:
      name: %[1]s
    spec:
      replicas: 3
      template:
        spec:
          tolerations:%[2]s
          - key: dedicated
            operator: Equal
            value: dns
            effect: NoSchedule
          containers:
          - name: coredns
            readinessProbe:
              periodSeconds: 1
              timeoutSeconds: 3
              failureThreshold: 2
            resources:
              limits:
                memory: 300Mi
`

// hostNetworkPatches put a layout's pods on the host's network, for a node
// without a pod network: hostNetwork, no host ports, probes by port
// number, the API server's loopback address, and one user for all (pods
// of the host's network share ports through SO_REUSEPORT, which the
// kernel allows only to sockets of one uid, and the stock image runs as
// root). %[1]s is the Deployment, %[2]d the API port.
const hostNetworkPatches = `
- target: {kind: Deployment, name: %[1]s}
  patch: |-
    - op: add
      path: /spec/template/spec/hostNetwork
      value: true
    - op: remove
      path: /spec/template/spec/containers/0/ports
    - op: replace
      path: /spec/template/spec/containers/0/livenessProbe/httpGet/port
      value: 8080
    - op: replace
      path: /spec/template/spec/containers/0/readinessProbe/httpGet/port
      value: 8181
- target: {kind: Deployment, name: %[1]s}
  patch: |-
    apiVersion: apps/v1
    kind: Deployment
    metadata:
      name: %[1]s
    spec:
      template:
        spec:
          containers:
          - name: coredns
            securityContext:
              runAsUser: 0
            env:
            - name: KUBERNETES_SERVICE_HOST
              value: "127.0.0.1"
            - name: KUBERNETES_SERVICE_PORT
              value: "%[2]d"
`

const kubeadmTolerations = `
          - key: CriticalAddonsOnly
            operator: Exists
          - key: node-role.kubernetes.io/control-plane
            effect: NoSchedule`

// layout is one way CoreDNS is laid out in a cluster.
type layout struct {
	name                   string
	ns, deployment, config string
	service                string // the Service the cluster's clients ask
	selector               string
	port                   int
	hostNetwork            bool                                  // pods on the host's network, asked on 127.0.0.1
	stock                  func(t *testing.T, dir string) string // writes the stock kustomization, returns its directory
}

type lifecycle struct {
	t       *testing.T
	kube    *cluster.Cluster
	ref     string // the k8s_event image
	plugins string // directory of kubectl-k8s_event
	dir     string
	l       layout
	probe   *stepProber
	report  []string
	// kubeconfig, when set, is the one the plugin runs with.
	kubeconfig string
	// stock is the Deployment and ConfigMap as the operator has them.
	stockDep *appsv1.Deployment
	stockCM  *corev1.ConfigMap
}

// TestLifecycle installs k8s_event into a customised stock CoreDNS, laid
// out as kubeadm does and as the CoreDNS helm chart does, then edits the
// Corefile, rolls back, installs again, lets kubeadm (or helm) rewrite the
// Deployment, recovers, and uninstalls: with a DNS probe asking throughout,
// and after every step the pods Ready with no restart and the objects
// different from the operator's only where k8s_event needs it.
func TestLifecycle(t *testing.T) {
	if err := cluster.NodeSupported(); err != nil {
		fmt.Fprintf(os.Stderr, "SKIP TestLifecycle: %v\n", err)
		t.Skip(err)
	}
	// k8s_event goes onto the stock release: the install keeps CoreDNS's version.
	archive := releaseImage(t, stockRelease(t))
	tmp := t.TempDir()
	stock := stockArchive(t, tmp)
	bin := filepath.Join(tmp, "bin")
	build(t, filepath.Join(bin, "kubectl-k8s_event"), "./cmd/kubectl-k8s_event")
	// kubectl finds its plugins on the PATH.
	t.Setenv("PATH", bin+string(os.PathListSeparator)+os.Getenv("PATH"))

	start := time.Now()
	kube, err := cluster.New(t.Context(), cluster.Options{Node: &cluster.NodeOptions{Images: []string{archive, stock}, PodNetwork: true}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kube.Stop)
	t.Logf("control plane and node Ready in %v", since(start))
	// Installed as users do: from the registry it was pushed to.
	ref := pushedRef(t, kube, archive)

	layouts := []layout{
		{
			name: "kubeadm", ns: "kube-system", deployment: "coredns", config: "coredns", service: "kube-dns", selector: "k8s-app=kube-dns", port: 53,
			stock: func(t *testing.T, dir string) string {
				rel, _ := filepath.Rel(dir, filepath.Join(repoRoot, "deploy/kubeadm"))
				return writeKustomization(t, dir, []string{rel}, "coredns", "coredns", kubeadmTolerations, 53, "")
			},
		},
		helmLayout(kube),
	}
	if _, err := kube.CreateNamespace(t.Context(), "dns"); err != nil {
		t.Fatal(err)
	}
	var report []string
	for _, l := range layouts {
		lc := &lifecycle{t: t, kube: kube, ref: ref, plugins: bin, dir: filepath.Join(tmp, l.name), l: l}
		ok := t.Run(l.name, lc.run)
		report = append(report, lc.report...)
		if !ok {
			break
		}
		if l.name == "helm" {
			// The failure paths, on the chart's layout with its rollout
			// defaults, on the same node.
			fl := l
			fl.name = "chart"
			lc := &lifecycle{t: t, kube: kube, ref: ref, plugins: bin, dir: filepath.Join(tmp, "chart"), l: fl}
			ok = t.Run("chart defaults, failure paths", lc.failurePaths)
			report = append(report, lc.report...)
		}
	}
	t.Logf("per step: failed queries, time\n%s", strings.Join(report, "\n"))
}

// helmLayout is CoreDNS as the helm chart lays it out, in namespace dns.
func helmLayout(kube *cluster.Cluster) layout {
	return layout{
		name: "helm", ns: "dns", deployment: "dns-coredns", config: "dns-coredns", service: "dns-coredns", selector: "app.kubernetes.io/name=coredns", port: 53,
		stock: helmStock(53, ""),
	}
}

// hostNetworkHelmLayout is helmLayout with its pods on the host's network
// of a node without a pod network, serving on port 1053.
func hostNetworkHelmLayout(kube *cluster.Cluster) layout {
	l := helmLayout(kube)
	l.port, l.hostNetwork = 1053, true
	l.stock = helmStock(1053, fmt.Sprintf(hostNetworkPatches, l.deployment, kube.Port()))
	return l
}

// helmStock writes the chart's objects with the operator's changes, the
// Corefile serving on dnsPort, and the extra patches.
func helmStock(dnsPort int, extra string) func(t *testing.T, dir string) string {
	return func(t *testing.T, dir string) string {
		data, err := os.ReadFile(filepath.Join(repoRoot, "test/e2e/node/testdata/helm-coredns.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "chart.yaml"), data, 0o644); err != nil {
			t.Fatal(err)
		}
		return writeKustomization(t, dir, []string{"chart.yaml"}, "dns-coredns", "dns-coredns", "", dnsPort, extra)
	}
}

// writeKustomization writes the stock objects with the operator's changes
// and the extra patches.
func writeKustomization(t *testing.T, dir string, resources []string, deployment, configMap, tolerations string, dnsPort int, extra string) string {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	corefile := fmt.Sprintf(operatorCorefile, dnsPort)
	if err := os.WriteFile(filepath.Join(dir, "Corefile"), []byte(corefile), 0o644); err != nil {
		t.Fatal(err)
	}
	var k strings.Builder
	k.WriteString("resources:\n")
	for _, r := range resources {
		fmt.Fprintf(&k, "- %s\n", r)
	}
	fmt.Fprintf(&k, "patches:%s%s", fmt.Sprintf(operatorPatches, deployment, tolerations), strings.TrimPrefix(extra, "\n"))
	ind := "        " + strings.ReplaceAll(strings.TrimSuffix(corefile, "\n"), "\n", "\n        ")
	fmt.Fprintf(&k, "- target: {kind: ConfigMap, name: %s}\n  patch: |-\n    - op: replace\n      path: /data/Corefile\n      value: |\n%s\n", configMap, ind)
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(k.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

func build(t *testing.T, out, pkg string, env ...string) {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), "go", "build", "-trimpath", "-o", out, pkg)
	cmd.Dir = repoRoot
	cmd.Env = append(append(os.Environ(), "CGO_ENABLED=0"), env...)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v\n%s", pkg, err, b)
	}
}

// stepProber asks the cluster DNS for the kubernetes Service every 20 ms
// (1 s for an answer, then once more, as a resolver does), two ways at
// once: from a fresh socket for each query, as a pod's resolver asks, and
// from one long-lived UDP socket on a fixed source port, as CoreDNS's
// forward and node-local-dns ask; only the second is one conntrack flow,
// which can go on to a pod that is gone. It counts the queries and
// failures of each step, by way.
type stepProber struct {
	ways [2]*probeWay
	stop chan struct{}
	done sync.WaitGroup
	once sync.Once
}

// probeWay is one way of asking, and its counts.
type probeWay struct {
	name                  string
	asked, failed         atomic.Int64
	lastAsked, lastFailed int64
	mu                    sync.Mutex
	failures              []string
}

func startStepProber(addr, name string) *stepProber {
	p := &stepProber{stop: make(chan struct{}), ways: [2]*probeWay{{name: "fresh socket"}, {name: "fixed port"}}}
	fixed, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(netip.MustParseAddrPort(addr)))
	if err != nil {
		panic(err) // an address of the tests' own making
	}
	fresh := func() error {
		m := new(dns.Msg)
		m.SetQuestion(name, dns.TypeA)
		r, _, err := (&dns.Client{Timeout: time.Second}).Exchange(m, addr)
		return rcodeErr(r, err)
	}
	conn := &dns.Conn{Conn: fixed}
	longLived := func() error { return rcodeErr(askOn(conn, name)) }
	for i, ask := range []func() error{fresh, longLived} {
		p.done.Add(1)
		go p.ways[i].run(p.stop, &p.done, ask)
	}
	go func() { p.done.Wait(); fixed.Close() }()
	return p
}

// askOn asks on conn, skipping late answers to earlier queries.
func askOn(conn *dns.Conn, name string) (*dns.Msg, error) {
	m := new(dns.Msg)
	m.SetQuestion(name, dns.TypeA)
	if err := conn.WriteMsg(m); err != nil {
		return nil, err
	}
	if err := conn.SetReadDeadline(time.Now().Add(time.Second)); err != nil {
		return nil, err
	}
	for {
		r, err := conn.ReadMsg()
		if err != nil || r.Id == m.Id {
			return r, err
		}
	}
}

func rcodeErr(r *dns.Msg, err error) error {
	if err == nil && r.Rcode != dns.RcodeSuccess {
		err = fmt.Errorf("rcode %s", dns.RcodeToString[r.Rcode])
	}
	return err
}

func (w *probeWay) run(stop chan struct{}, done *sync.WaitGroup, ask func() error) {
	defer done.Done()
	for {
		select {
		case <-stop:
			return
		case <-time.After(20 * time.Millisecond):
		}
		w.asked.Add(1)
		var err error
		for range 2 {
			if err = ask(); err == nil {
				break
			}
		}
		if err != nil {
			w.failed.Add(1)
			w.mu.Lock()
			if len(w.failures) < 10 {
				w.failures = append(w.failures, time.Now().Format("15:04:05.000")+" "+err.Error())
			}
			w.mu.Unlock()
		}
	}
}

// step returns the queries and failures of the way since the last call.
func (w *probeWay) step() (asked, failed int64) {
	a, f := w.asked.Load(), w.failed.Load()
	asked, failed = a-w.lastAsked, f-w.lastFailed
	w.lastAsked, w.lastFailed = a, f
	return asked, failed
}

func (p *stepProber) finish() { p.once.Do(func() { close(p.stop); p.done.Wait() }) }

func (lc *lifecycle) kubectl(args ...string) string {
	lc.t.Helper()
	out, _, err := lc.kube.Kubectl(lc.t.Context(), args...)
	if err != nil {
		lc.t.Fatal(err)
	}
	return out
}

// plugin runs `kubectl k8s-event ARGS` as an operator does, and fails
// the test unless it exits 0.
func (lc *lifecycle) plugin(args ...string) string {
	lc.t.Helper()
	return lc.pluginExit(0, args...)
}

// pluginExit runs `kubectl k8s-event ARGS` and fails the test unless it
// exits with code.
func (lc *lifecycle) pluginExit(code int, args ...string) string {
	lc.t.Helper()
	out, got := lc.pluginRun(args...)
	if got != code {
		lc.t.Fatalf("kubectl k8s-event %s: exit %d, want %d", strings.Join(args, " "), got, code)
	}
	return out
}

// pluginRun runs `kubectl k8s-event ARGS` and returns its output and exit
// code; it may run beside other calls.
func (lc *lifecycle) pluginRun(args ...string) (string, int) {
	cmd := exec.CommandContext(lc.t.Context(), os.Getenv("KUBECTL"), append([]string{"k8s-event"}, args...)...)
	kubeconfig := lc.kube.KubeconfigPath
	if lc.kubeconfig != "" {
		kubeconfig = lc.kubeconfig
	}
	cmd.Env = append(os.Environ(), "KUBECONFIG="+kubeconfig)
	out, err := cmd.CombinedOutput()
	lc.t.Logf("kubectl k8s-event %s: %v\n%s", strings.Join(args, " "), err, out)
	code := 0
	if err != nil {
		var exit *exec.ExitError
		if !errors.As(err, &exit) {
			lc.t.Errorf("kubectl k8s-event %s: %v", strings.Join(args, " "), err)
			return string(out), -1
		}
		code = exit.ExitCode()
	}
	return string(out), code
}

func (lc *lifecycle) nsFlags() []string {
	return []string{"--namespace", lc.l.ns}
}

func (lc *lifecycle) deploymentObj() *appsv1.Deployment {
	lc.t.Helper()
	d, err := lc.kube.Clientset.AppsV1().Deployments(lc.l.ns).Get(lc.t.Context(), lc.l.deployment, metav1.GetOptions{})
	if err != nil {
		lc.t.Fatal(err)
	}
	return d
}

func (lc *lifecycle) configMap(name string) *corev1.ConfigMap {
	lc.t.Helper()
	cm, err := lc.kube.Clientset.CoreV1().ConfigMaps(lc.l.ns).Get(lc.t.Context(), name, metav1.GetOptions{})
	if err != nil {
		lc.t.Fatal(err)
	}
	return cm
}

// waitPods waits until the Deployment has rolled out and its pods are
// exactly its replicas, all Ready, all running image.
func (lc *lifecycle) waitPods(image string) []corev1.Pod {
	t := lc.t
	t.Helper()
	var pods []corev1.Pod
	var why string
	err := wait.PollUntilContextTimeout(t.Context(), 250*time.Millisecond, 4*time.Minute, true, func(ctx context.Context) (bool, error) {
		d, err := lc.kube.Clientset.AppsV1().Deployments(lc.l.ns).Get(ctx, lc.l.deployment, metav1.GetOptions{})
		if err != nil {
			why = err.Error()
			return false, nil
		}
		if !install.RolledOut(d) {
			why = fmt.Sprintf("rolling out: %d updated, %d available of %d", d.Status.UpdatedReplicas, d.Status.AvailableReplicas, *d.Spec.Replicas)
			return false, nil
		}
		list, err := lc.kube.Clientset.CoreV1().Pods(lc.l.ns).List(ctx, metav1.ListOptions{LabelSelector: lc.l.selector})
		if err != nil {
			why = err.Error()
			return false, nil
		}
		pods = list.Items
		if len(pods) != int(*d.Spec.Replicas) {
			why = fmt.Sprintf("%d pods, want %d (old ones in their lameduck)", len(pods), *d.Spec.Replicas)
			return false, nil
		}
		for _, p := range pods {
			if p.Spec.Containers[0].Image != image || !podReady(&p) {
				why = fmt.Sprintf("pod %s: image %s, ready %v", p.Name, p.Spec.Containers[0].Image, podReady(&p))
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		describe, _, _ := lc.kube.Kubectl(t.Context(), "-n", lc.l.ns, "describe", "pods", "-l", lc.l.selector)
		logs, _, _ := lc.kube.Kubectl(t.Context(), "-n", lc.l.ns, "logs", "-l", lc.l.selector, "--previous", "--tail=20")
		t.Fatalf("pods of %s/%s: %v: %s\n%s\nlogs of the previous containers:\n%s", lc.l.ns, lc.l.deployment, err, why, describe, logs)
	}
	for _, p := range pods {
		for _, s := range p.Status.ContainerStatuses {
			if s.RestartCount != 0 {
				logs, _, _ := lc.kube.Kubectl(t.Context(), "-n", lc.l.ns, "logs", p.Name, "--previous")
				t.Errorf("pod %s: container %s restarted %d times:\n%s", p.Name, s.Name, s.RestartCount, logs)
			}
		}
	}
	return pods
}

func podReady(p *corev1.Pod) bool {
	if p.DeletionTimestamp != nil {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// waitEvents waits until each pod has its k8s_event start-up event.
func (lc *lifecycle) waitEvents(pods []corev1.Pod) {
	t := lc.t
	t.Helper()
	for _, p := range pods {
		var last []corev1.Event
		err := wait.PollUntilContextTimeout(t.Context(), 250*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
			list, err := lc.kube.Clientset.CoreV1().Events(lc.l.ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.uid=" + string(p.UID)})
			if err != nil {
				return false, nil
			}
			last = list.Items
			return len(cluster.EventsWith(last, "CoreDNSInfo", "Running configuration SHA512")) > 0, nil
		})
		if err != nil {
			logs, _, _ := lc.kube.Kubectl(t.Context(), "-n", lc.l.ns, "logs", p.Name, "--tail=20")
			t.Fatalf("pod %s: no CoreDNSInfo event: %v\n%s\n%s", p.Name, err, cluster.DescribeEvents(last), logs)
		}
	}
}

// noEvents checks that stock pods wrote no CoreDNS events.
func (lc *lifecycle) noEvents(pods []corev1.Pod) {
	for _, p := range pods {
		list, err := lc.kube.Clientset.CoreV1().Events(lc.l.ns).List(lc.t.Context(), metav1.ListOptions{FieldSelector: "involvedObject.uid=" + string(p.UID)})
		if err != nil {
			lc.t.Fatal(err)
		}
		if evs := withReasonPrefix(list.Items, "CoreDNS"); len(evs) > 0 {
			lc.t.Errorf("stock pod %s wrote CoreDNS events:\n%s", p.Name, cluster.DescribeEvents(evs))
		}
	}
}

// comparable is the part of a Deployment an operator sets, with the
// fields k8s_event needs taken out.
func comparable(d *appsv1.Deployment) string {
	d = d.DeepCopy()
	spec := &d.Spec.Template.Spec
	c := &spec.Containers[0]
	c.Image = ""
	var env []corev1.EnvVar
	for _, e := range c.Env {
		if !strings.HasPrefix(e.Name, "COREDNS_") {
			env = append(env, e)
		}
	}
	c.Env = env
	for i := range spec.Volumes {
		if spec.Volumes[i].ConfigMap != nil {
			spec.Volumes[i].ConfigMap.Name = ""
		}
	}
	delete(d.Spec.Template.Annotations, install.Annotation)
	if len(d.Spec.Template.Annotations) == 0 {
		d.Spec.Template.Annotations = nil
	}
	b, _ := json.Marshal(struct {
		Labels map[string]string
		Spec   appsv1.DeploymentSpec
	}{d.Labels, d.Spec})
	return string(b)
}

// check compares the live objects with the operator's: they differ only
// in what k8s_event needs, and installed says whether they have it.
func (lc *lifecycle) check(installed bool) {
	t := lc.t
	t.Helper()
	d := lc.deploymentObj()
	if got, want := comparable(d), comparable(lc.stockDep); got != want {
		t.Errorf("the Deployment differs from the operator's in more than k8s_event's fields:\n%s", lineDiff(want, got))
	}
	if cm := lc.configMap(lc.l.config); !reflect.DeepEqual(cm.Data, lc.stockCM.Data) {
		t.Errorf("the operator's ConfigMap %s changed:\n%s", lc.l.config, lineDiff(lc.stockCM.Data["Corefile"], cm.Data["Corefile"]))
	}
	c := d.Spec.Template.Spec.Containers[0]
	vol := d.Spec.Template.Spec.Volumes[0].ConfigMap.Name
	_, roleErr := lc.kube.Clientset.RbacV1().Roles(lc.l.ns).Get(t.Context(), lc.l.deployment+"-k8s-event", metav1.GetOptions{})
	if installed {
		if c.Image != lc.ref || !strings.HasPrefix(vol, lc.l.config+"-k8s-event-") || len(c.Env) != len(lc.stockDep.Spec.Template.Spec.Containers[0].Env)+4 {
			t.Errorf("k8s_event is not installed: image %s, configmap %s, env %v", c.Image, vol, c.Env)
		}
		corefile := lc.configMap(vol).Data["Corefile"]
		if !install.HasPlugins(corefile) || !strings.Contains(corefile, "kubeapi") {
			t.Errorf("the Corefile the pods read has no k8s_event:\n%s", corefile)
		}
		for _, want := range []string{"corp.example:", "cluster.test in-addr.arpa", "10.0.0.1 registry.corp.example"} {
			if !strings.Contains(corefile, want) {
				t.Errorf("the Corefile the pods read lost %q:\n%s", want, corefile)
			}
		}
		if roleErr != nil {
			t.Errorf("the Role: %v", roleErr)
		}
	} else {
		sc := lc.stockDep.Spec.Template.Spec.Containers[0]
		if c.Image != sc.Image || vol != lc.l.config || !reflect.DeepEqual(c.Env, sc.Env) {
			t.Errorf("not the operator's: image %s, configmap %s, env %v", c.Image, vol, c.Env)
		}
	}
}

func lineDiff(a, b string) string { return install.Diff(a, b) }

// do runs one step and records, for each way of asking, the queries it
// saw fail, and its time.
func (lc *lifecycle) do(name string, f func()) {
	t := lc.t
	t.Helper()
	for _, w := range lc.probe.ways {
		w.step()
	}
	start := time.Now()
	f()
	took := time.Since(start)
	for _, w := range lc.probe.ways {
		asked, failed := w.step()
		line := fmt.Sprintf("%-8s %-34s %-12s %3d failed of %5d queries (%.1f/s), %v", lc.l.name, name, w.name, failed, asked, float64(asked)/took.Seconds(), took.Round(100*time.Millisecond))
		lc.report = append(lc.report, line)
		t.Log(line)
		if failed > 0 {
			w.mu.Lock()
			t.Errorf("%s: %d queries failed (%s): %v\n%s", name, failed, w.name, w.failures, lc.probeEvents())
			w.mu.Unlock()
		}
		if float64(asked)/took.Seconds() < 5 {
			t.Errorf("%s: the probe asked only %d times in %v (%s)", name, asked, took, w.name)
		}
	}
}

func (lc *lifecycle) run(t *testing.T) {
	lc.t = t
	l := lc.l
	dir := l.stock(t, filepath.Join(lc.dir, "stock"))
	lc.kubectl("apply", "-k", dir)
	pods := lc.waitPods(stockImage)
	lc.stockDep, lc.stockCM = lc.deploymentObj(), lc.configMap(l.config)
	name := "kubernetes.default.svc.cluster.test."
	lc.waitService(name)
	lc.probe = startStepProber(lc.dnsAddr(), name)
	defer lc.probe.finish()
	lc.noEvents(pods)

	installArgs := append([]string{"install", "--image", lc.ref, "--option", "level info warning error", "--settle", "2s"}, lc.nsFlags()...)
	if l.name == "helm" {
		// The release owns the Deployment: install refuses unless told.
		lc.pluginExit(5, installArgs...)
		installArgs = append(installArgs, "--force")
	}
	dry := lc.plugin(append(installArgs, "--dry-run")...)
	for _, want := range []string{"+     kubeapi", "create role " + l.ns + "/" + l.deployment + "-k8s-event", "image: " + lc.ref, "COREDNS_POD_UID"} {
		if !strings.Contains(dry, want) {
			t.Errorf("the dry run does not say %q", want)
		}
	}
	lc.check(false)

	lc.do("install", func() {
		lc.plugin(installArgs...)
		lc.waitEvents(lc.waitPods(lc.ref))
	})
	lc.check(true)
	status := lc.plugin(append([]string{"status"}, lc.nsFlags()...)...)
	if !strings.Contains(status, "k8s_event installed") {
		t.Errorf("status after install:\n%s", status)
	}

	lc.do("edit the Corefile, install", func() {
		cm := lc.configMap(l.config)
		cm.Data["Corefile"] = strings.Replace(cm.Data["Corefile"], "10.0.0.1 registry.corp.example", "10.0.0.1 registry.corp.example\n       10.0.0.2 edited.hosts.test", 1)
		if _, err := lc.kube.Clientset.CoreV1().ConfigMaps(l.ns).Update(t.Context(), cm, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		lc.stockCM = cm
		lc.plugin(installArgs...)
		lc.waitEvents(lc.waitPods(lc.ref))
	})
	lc.check(true)
	lc.expectA("edited.hosts.test.", "10.0.0.2")

	// Back to the first install: its Corefile is still there.
	lc.do("kubectl rollout undo", func() {
		lc.kubectl("-n", l.ns, "rollout", "undo", "deployment/"+l.deployment)
		lc.waitEvents(lc.waitPods(lc.ref))
	})
	lc.check(true)
	if vol := lc.deploymentObj().Spec.Template.Spec.Volumes[0].ConfigMap.Name; strings.Contains(lc.configMap(vol).Data["Corefile"], "edited.hosts.test") {
		t.Errorf("after the undo the pods read %s, the edited Corefile", vol)
	}
	// Back to the stock CoreDNS: it parses the operator's Corefile.
	lc.do("kubectl rollout undo --to-revision=1", func() {
		lc.kubectl("-n", l.ns, "rollout", "undo", "deployment/"+l.deployment, "--to-revision=1")
		lc.noEvents(lc.waitPods(stockImage))
	})
	lc.check(false)

	lc.do("install again", func() {
		lc.plugin(installArgs...)
		lc.waitEvents(lc.waitPods(lc.ref))
	})
	lc.check(true)

	switch l.name {
	case "kubeadm":
		lc.kubeadm(installArgs)
	case "helm":
		lc.helmUpgrade(installArgs)
	}

	lc.do("uninstall", func() {
		lc.plugin(append([]string{"uninstall", "--settle", "2s"}, lc.nsFlags()...)...)
		lc.noEvents(lc.waitPods(stockImage))
	})
	lc.check(false)
	if got, want := lc.deploymentObj().Spec, lc.stockDep.Spec; !reflect.DeepEqual(got, want) {
		g, _ := json.Marshal(got)
		w, _ := json.Marshal(want)
		t.Errorf("after uninstall the Deployment is not the operator's:\n%s", lineDiff(string(w), string(g)))
	}
	for _, get := range []func() error{
		func() error {
			_, err := lc.kube.Clientset.RbacV1().Roles(l.ns).Get(t.Context(), l.deployment+"-k8s-event", metav1.GetOptions{})
			return err
		},
		func() error {
			_, err := lc.kube.Clientset.RbacV1().RoleBindings(l.ns).Get(t.Context(), l.deployment+"-k8s-event", metav1.GetOptions{})
			return err
		},
	} {
		if err := get(); !apierrors.IsNotFound(err) {
			t.Errorf("after uninstall the Role or RoleBinding is there: %v", err)
		}
	}
	lc.probe.finish()
	lc.kubectl("delete", "-k", dir, "--wait=true")
	// The next layout starts on a node without these pods.
	err := wait.PollUntilContextTimeout(t.Context(), 250*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		list, err := lc.kube.Clientset.CoreV1().Pods(l.ns).List(ctx, metav1.ListOptions{LabelSelector: l.selector})
		return err == nil && len(list.Items) == 0, nil
	})
	if err != nil {
		t.Fatalf("the pods of %s did not go: %v", l.name, err)
	}
}

// waitService waits until the layout's Service answers name: the pods
// are Ready, and kube-proxy has their endpoints.
func (lc *lifecycle) waitService(name string) {
	t := lc.t
	t.Helper()
	addr := lc.dnsAddr()
	var last error
	err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		m := new(dns.Msg)
		m.SetQuestion(name, dns.TypeA)
		r, _, err := (&dns.Client{Timeout: time.Second}).Exchange(m, addr)
		last = rcodeErr(r, err)
		return last == nil, nil
	})
	if err != nil {
		t.Fatalf("the Service %s does not answer %s: %v (last: %v)", addr, name, err, last)
	}
}

// probeEvents lists the layout's warning events (failed probes, kills)
// for a step that lost queries.
func (lc *lifecycle) probeEvents() string {
	out, _, _ := lc.kube.Kubectl(lc.t.Context(), "-n", lc.l.ns, "get", "events", "--field-selector=type=Warning", "--sort-by=.lastTimestamp")
	return out
}

// dnsAddr is the ClusterIP and port of the layout's Service, which the
// host reaches through kube-proxy's rules as the cluster's pods do; on
// the host's network, the loopback address and the pods' port.
func (lc *lifecycle) dnsAddr() string {
	lc.t.Helper()
	if lc.l.hostNetwork {
		return net.JoinHostPort("127.0.0.1", strconv.Itoa(lc.l.port))
	}
	svc, err := lc.kube.Clientset.CoreV1().Services(lc.l.ns).Get(lc.t.Context(), lc.l.service, metav1.GetOptions{})
	if err != nil {
		lc.t.Fatal(err)
	}
	return net.JoinHostPort(svc.Spec.ClusterIP, strconv.Itoa(lc.l.port))
}

func (lc *lifecycle) expectA(name, ip string) {
	lc.t.Helper()
	m := new(dns.Msg)
	m.SetQuestion(name, dns.TypeA)
	r, _, err := (&dns.Client{Timeout: 2 * time.Second}).Exchange(m, lc.dnsAddr())
	if err != nil || len(r.Answer) != 1 || r.Answer[0].(*dns.A).A.String() != ip {
		lc.t.Errorf("%s: %v %v, want %s", name, r, err, ip)
	}
}

// kubeadm runs kubeadm's CoreDNS addon phase, the one `kubeadm init` and
// `kubeadm upgrade apply` run, against the node: with k8s_event installed
// it stops before it writes anything; the documented recovery is to
// uninstall, let kubeadm run with the operator's changes as --patches, and
// install again.
func (lc *lifecycle) kubeadm(installArgs []string) {
	t := lc.t
	kubeadm := os.Getenv("KUBEADM")
	if kubeadm == "" {
		t.Fatal("KUBEADM is not set: hack/tools.sh env node builds it")
	}
	patches := filepath.Join(lc.dir, "kubeadm-patches")
	if err := os.MkdirAll(patches, 0o755); err != nil {
		t.Fatal(err)
	}
	// The operator's changes to kubeadm's Deployment, as a kubeadm patch.
	if err := os.WriteFile(filepath.Join(patches, "corednsdeployment+strategic.yaml"), []byte(fmt.Sprintf(`spec:
  template:
    spec:
      tolerations:%s
      - key: dedicated
        operator: Equal
        value: dns
        effect: NoSchedule
      containers:
      - name: coredns
        readinessProbe:
          periodSeconds: 1
          timeoutSeconds: 3
          failureThreshold: 2
        resources:
          limits:
            memory: 300Mi
`, strings.ReplaceAll(kubeadmTolerations, "\n    ", "\n"))), 0o644); err != nil {
		t.Fatal(err)
	}
	config := filepath.Join(lc.dir, "kubeadm.yaml")
	if err := os.WriteFile(config, []byte(fmt.Sprintf(`apiVersion: kubeadm.k8s.io/v1beta4
kind: InitConfiguration
nodeRegistration:
  name: %s
  criSocket: unix:///run/containerd/containerd.sock
patches:
  directory: %s
---
apiVersion: kubeadm.k8s.io/v1beta4
kind: ClusterConfiguration
kubernetesVersion: v1.35.4
networking:
  dnsDomain: cluster.test
  serviceSubnet: 10.96.0.0/12
`, lc.kube.NodeName, patches)), 0o644); err != nil {
		t.Fatal(err)
	}
	run := func() (string, error) {
		cmd := exec.CommandContext(t.Context(), kubeadm, "init", "phase", "addon", "coredns", "--config", config, "--kubeconfig", lc.kube.KubeconfigPath)
		out, err := cmd.CombinedOutput()
		t.Logf("kubeadm init phase addon coredns: %v\n%s", err, out)
		return string(out), err
	}

	before := lc.deploymentObj()
	lc.do("kubeadm addon phase, installed", func() {
		out, err := run()
		if err == nil || !strings.Contains(out, "not supported") {
			t.Errorf("kubeadm's addon phase with k8s_event installed: %v, want it to refuse the image tag", err)
		}
		lc.waitPods(lc.ref)
	})
	if after := lc.deploymentObj(); after.Generation != before.Generation {
		t.Errorf("kubeadm changed the Deployment before it failed: generation %d, was %d", after.Generation, before.Generation)
	}
	lc.check(true)

	lc.do("recovery: uninstall", func() {
		lc.plugin(append([]string{"uninstall", "--settle", "2s"}, lc.nsFlags()...)...)
		lc.noEvents(lc.waitPods(stockImage))
	})
	lc.check(false)
	lc.do("recovery: kubeadm addon phase", func() {
		if _, err := run(); err != nil {
			t.Fatalf("kubeadm's addon phase on the stock CoreDNS: %v", err)
		}
		lc.noEvents(lc.waitPods(stockImage))
	})
	// kubeadm kept the operator's Corefile and replicas, and its patches
	// carried the rest: the Deployment is the operator's.
	lc.check(false)
	lc.stockDep = lc.deploymentObj()
	lc.do("recovery: install", func() {
		lc.plugin(installArgs...)
		lc.waitEvents(lc.waitPods(lc.ref))
	})
	lc.check(true)
}

// helmUpgrade does to the objects what `helm upgrade` of the unchanged
// chart does (helm 3's three-way strategic merge of the old manifest, the
// new manifest and the live object), then the documented recovery.
func (lc *lifecycle) helmUpgrade(installArgs []string) {
	t := lc.t
	rendered := lc.kubectl("kustomize", filepath.Join(lc.dir, "stock"))
	var manifest []byte
	for _, doc := range strings.Split(rendered, "\n---\n") {
		if strings.Contains(doc, "kind: Deployment") {
			j, err := yaml.YAMLToJSON([]byte(doc))
			if err != nil {
				t.Fatal(err)
			}
			manifest = j
		}
	}
	lc.do("helm upgrade", func() {
		live, err := json.Marshal(lc.deploymentObj())
		if err != nil {
			t.Fatal(err)
		}
		meta, err := strategicpatch.NewPatchMetaFromStruct(appsv1.Deployment{})
		if err != nil {
			t.Fatal(err)
		}
		patch, err := strategicpatch.CreateThreeWayMergePatch(manifest, manifest, live, meta, true)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("helm upgrade's patch: %s", patch)
		if _, err := lc.kube.Clientset.AppsV1().Deployments(lc.l.ns).Patch(t.Context(), lc.l.deployment, types.StrategicMergePatchType, patch, metav1.PatchOptions{FieldManager: "helm"}); err != nil {
			t.Fatal(err)
		}
		lc.waitPods(stockImage)
	})
	status := lc.pluginExit(4, append([]string{"status"}, lc.nsFlags()...)...)
	if !strings.Contains(status, "partly undone") {
		t.Errorf("status after helm upgrade:\n%s", status)
	}
	lc.do("recovery: install", func() {
		lc.plugin(installArgs...)
		lc.waitEvents(lc.waitPods(lc.ref))
	})
	lc.check(true)
}
