//go:build e2e

// Package e2e runs CoreDNS with the k8s_event plugin against a real
// kube-apiserver and checks the events it writes with client-go and kubectl.
//
// TestMain builds the CoreDNS of test/cmd/coredns (with the race detector)
// and starts one control plane that all tests share; each test works in its
// own namespace.
package e2e

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"text/template"
	"time"
	"unicode"

	"github.com/dnsops/k8s_event/test/plugin/logline"

	"github.com/miekg/dns"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/dnsops/k8s_event/internal/cluster"
)

var (
	// kube is the control plane that all tests share.
	kube *cluster.Cluster
	// corednsBin is the CoreDNS of test/cmd/coredns, built with -race.
	corednsBin string
	// repoRoot is the root of the repository.
	repoRoot string
)

func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()

	dir, err := os.MkdirTemp("", "k8s_event-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)

	out, err := exec.CommandContext(ctx, "go", "list", "-m", "-f", "{{.Dir}}").Output()
	if err != nil {
		fmt.Fprintln(os.Stderr, "find the module root:", err)
		return 1
	}
	repoRoot = strings.TrimSpace(string(out))

	corednsBin = filepath.Join(dir, "coredns")
	build := exec.CommandContext(ctx, "go", "build", "-race", "-o", corednsBin, "./test/cmd/coredns")
	build.Dir = repoRoot
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build test/cmd/coredns: %v\n%s", err, out)
		return 1
	}

	kube, err = cluster.New(ctx, cluster.Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, "start the control plane:", err)
		return 1
	}
	defer kube.Stop()
	return m.Run()
}

// timeout bounds every wait for an event. Writes are asynchronous but on
// loopback they land within milliseconds; the margin is for a loaded CI
// machine running the race detector.
const timeout = 30 * time.Second

// testPod creates a namespace named after the test and a Pod in it that the
// CoreDNS under test reports for.
func testPod(t *testing.T) *corev1.Pod {
	t.Helper()
	ns := namespaceFor(t)
	if _, err := kube.CreateNamespace(t.Context(), ns); err != nil {
		t.Fatal(err)
	}
	pod, err := kube.CreatePod(t.Context(), ns, "coredns-"+strconv.FormatInt(time.Now().UnixNano()%1e6, 36))
	if err != nil {
		t.Fatal(err)
	}
	return pod
}

// namespaceFor turns a test name into a namespace name.
func namespaceFor(t *testing.T) string {
	name := strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9':
			return r
		case r >= 'A' && r <= 'Z':
			return unicode.ToLower(r)
		}
		return '-'
	}, t.Name())
	name = strings.Trim(name, "-")
	if len(name) > 50 {
		name = name[:50]
	}
	return strings.Trim(name, "-") + "-" + strconv.FormatInt(time.Now().UnixNano()%1e6, 36)
}

// ports are the addresses a Corefile template can use.
type ports struct {
	DNS        int    // DNS port, TCP and UDP, on 127.0.0.1
	Logline    string // host:port of logline's HTTP server
	Metrics    string // host:port of the prometheus plugin
	Kubeconfig string // kubeconfig for kubeapi
}

// coreDNS is a CoreDNS process under test.
type coreDNS struct {
	*cluster.Process
	ports
	t    *testing.T
	pod  *corev1.Pod
	conf string // path of the Corefile
	tmpl *template.Template
}

type corednsOption func(*corednsConfig)

type corednsConfig struct {
	kubeconfig string
	noUID      bool
}

// withoutUID leaves COREDNS_POD_UID out of the environment.
func withoutUID() corednsOption {
	return func(c *corednsConfig) { c.noUID = true }
}

// withKubeconfig makes kubeapi use another kubeconfig than the admin one.
func withKubeconfig(path string) corednsOption {
	return func(c *corednsConfig) { c.kubeconfig = path }
}

// podEnv is what the downward API gives the CoreDNS container of pod.
func podEnv(pod *corev1.Pod) []string {
	return []string{
		"COREDNS_POD_NAME=" + pod.Name,
		"COREDNS_NAMESPACE=" + pod.Namespace,
		"COREDNS_POD_UID=" + string(pod.UID),
		"COREDNS_NODE_NAME=node-e2e",
	}
}

// startCoreDNS writes corefile, a text/template over ports, and runs CoreDNS
// with it for pod until the test ends. It returns once CoreDNS answers on its
// DNS port.
func startCoreDNS(t *testing.T, pod *corev1.Pod, corefile string, opts ...corednsOption) *coreDNS {
	t.Helper()
	cfg := corednsConfig{kubeconfig: kube.KubeconfigPath}
	for _, o := range opts {
		o(&cfg)
	}
	c := &coreDNS{t: t, pod: pod, tmpl: parseCorefile(t, corefile)}
	c.Kubeconfig = cfg.kubeconfig
	var err error
	if c.DNS, err = cluster.FreeDNSPort(); err != nil {
		t.Fatal(err)
	}
	c.Logline, c.Metrics = freeAddr(t), freeAddr(t)

	dir := t.TempDir()
	c.conf = filepath.Join(dir, "Corefile")
	c.writeCorefile()
	env := podEnv(pod)
	if cfg.noUID {
		env = slices.DeleteFunc(env, func(v string) bool { return strings.HasPrefix(v, "COREDNS_POD_UID=") })
	}
	c.Process, err = cluster.StartProcess("coredns", filepath.Join(dir, "coredns.log"), env, corednsBin, "-conf", c.conf)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.cleanup)
	c.waitUp()
	return c
}

func freeAddr(t *testing.T) string {
	t.Helper()
	port, err := cluster.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
}

// parseCorefile parses a Corefile template. Besides the fields of ports it
// has freeAddr, a new free 127.0.0.1:PORT on each call.
func parseCorefile(t *testing.T, corefile string) *template.Template {
	t.Helper()
	tmpl, err := template.New("Corefile").Option("missingkey=error").
		Funcs(template.FuncMap{"freeAddr": func() string { return freeAddr(t) }}).
		Parse(corefile)
	if err != nil {
		t.Fatal(err)
	}
	return tmpl
}

func (c *coreDNS) writeCorefile() {
	c.t.Helper()
	var b bytes.Buffer
	if err := c.tmpl.Execute(&b, c.ports); err != nil {
		c.t.Fatal(err)
	}
	if err := os.WriteFile(c.conf, b.Bytes(), 0o644); err != nil {
		c.t.Fatal(err)
	}
}

// reload writes a new Corefile template; the reload plugin picks it up.
func (c *coreDNS) reload(corefile string) {
	c.t.Helper()
	c.tmpl = parseCorefile(c.t, corefile)
	c.writeCorefile()
}

// waitUp waits until CoreDNS listens on its DNS port. It sends no query: a
// Corefile that forwards must not send traffic anywhere.
func (c *coreDNS) waitUp() {
	c.t.Helper()
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(c.DNS))
	err := wait.PollUntilContextTimeout(c.t.Context(), 50*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		if c.Exited() {
			return false, fmt.Errorf("coredns exited with code %d", c.ExitCode())
		}
		conn, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			return false, nil
		}
		conn.Close()
		return true, nil
	})
	if err != nil {
		c.t.Fatalf("coredns did not come up: %v\n%s", err, c.LogTail(50))
	}
}

func (c *coreDNS) exchange(name string, qtype uint16) (*dns.Msg, error) {
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), qtype)
	cl := &dns.Client{Timeout: 2 * time.Second}
	r, _, err := cl.Exchange(m, net.JoinHostPort("127.0.0.1", strconv.Itoa(c.DNS)))
	return r, err
}

// query sends a DNS query and fails the test when there is no answer.
func (c *coreDNS) query(name string, qtype uint16) *dns.Msg {
	c.t.Helper()
	r, err := c.exchange(name, qtype)
	if err != nil {
		c.t.Fatalf("query %s: %v", name, err)
	}
	return r
}

// fail sends a query that logline answers with SERVFAIL and an error, which
// the errors plugin logs.
func (c *coreDNS) fail(name string) {
	c.t.Helper()
	if r := c.query(name+".fail.logline.", dns.TypeA); r.Rcode != dns.RcodeServerFailure {
		c.t.Fatalf("query %s.fail.logline.: rcode %s, want SERVFAIL", name, dns.RcodeToString[r.Rcode])
	}
}

// logLine makes CoreDNS log body count times at level through logline.
func (c *coreDNS) logLine(level string, count int, body string) {
	c.t.Helper()
	if err := logline.Post(c.t.Context(), c.Logline, level, count, body); err != nil {
		c.t.Fatal(err)
	}
}

// cleanup stops CoreDNS and fails the test when it raced or panicked. On
// failure it shows the log.
func (c *coreDNS) cleanup() {
	c.Stop(15 * time.Second)
	log := c.Log()
	for _, bad := range []string{"panic: ", "fatal error: "} {
		if strings.Contains(log, bad) {
			c.t.Errorf("coredns log has %q", bad)
		}
	}
	for _, race := range races(log) {
		if strings.Contains(race, pluginPackage) && !caddyHookRace(race) {
			c.t.Errorf("coredns log has a data race in k8s_event:\n%s", race)
		} else {
			c.t.Logf("a data race in CoreDNS or caddy, without k8s_event in it:\n%s", race)
		}
	}
	if c.t.Failed() {
		c.t.Logf("--- Corefile ---\n%s", mustRead(c.conf))
		c.t.Logf("--- coredns log (%s) ---\n%s", c.LogPath, tail(log, 200))
	}
}

// pluginPackage names k8s_event's frames in a race report.
const pluginPackage = "github.com/dnsops/k8s_event"

// caddyHookRace tells a race of caddy's own: its signal goroutine reads an
// instance's shutdown callbacks with no synchronisation with the setup
// that registered them through the Controller (every plugin's setup does,
// k8s_event's too), so a SIGTERM can race any plugin's setup.
func caddyHookRace(race string) bool {
	return strings.Contains(race, "github.com/coredns/caddy.allShutdownCallbacks()") &&
		caddyRegistration.MatchString(race)
}

var caddyRegistration = regexp.MustCompile(`github\.com/coredns/caddy\.\(\*Controller\)\.On[A-Za-z]+\(\)`)

// races are the race detector's reports in a log. CoreDNS v1.15.0 has one
// of its own: a SIGTERM runs forward's OnShutdown on caddy's signal
// goroutine with no happens-before edge to the setup that wrote the
// proxies; k8s_event answers only for reports with its own frames.
func races(log string) []string {
	var out []string
	for _, part := range strings.Split(log, "WARNING: DATA RACE")[1:] {
		report, _, _ := strings.Cut(part, "==================")
		out = append(out, report)
	}
	return out
}

func mustRead(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	return string(b)
}

func tail(s string, n int) string {
	lines := strings.SplitAfter(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "")
}

// metrics returns what the prometheus plugin exports.
func (c *coreDNS) metrics() string {
	c.t.Helper()
	body, err := cluster.HTTPGet(c.t.Context(), "http://"+c.Metrics+"/metrics")
	if err != nil {
		c.t.Fatal(err)
	}
	return body
}

// events lists the events whose involved object is pod.
func events(ctx context.Context, pod *corev1.Pod) ([]corev1.Event, error) {
	list, err := kube.Clientset.CoreV1().Events(pod.Namespace).List(ctx, metav1.ListOptions{
		FieldSelector: "involvedObject.uid=" + string(pod.UID),
	})
	if err != nil {
		return nil, err
	}
	return list.Items, nil
}

// waitEvents polls the events of pod until done accepts them and returns
// them. On timeout it fails the test and shows the events it saw last.
func waitEvents(t *testing.T, pod *corev1.Pod, what string, done func([]corev1.Event) bool) []corev1.Event {
	t.Helper()
	return waitEventsFor(t, pod, timeout, what, done)
}

// waitEventsFor is waitEvents with a deadline of its own.
func waitEventsFor(t *testing.T, pod *corev1.Pod, d time.Duration, what string, done func([]corev1.Event) bool) []corev1.Event {
	t.Helper()
	var last []corev1.Event
	var listErr error
	err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, d, true, func(ctx context.Context) (bool, error) {
		evs, err := events(ctx, pod)
		if err != nil {
			listErr = err
			return false, nil
		}
		last = evs
		return done(evs), nil
	})
	if err != nil {
		t.Fatalf("waiting %v for %s: %v (last list error: %v); events:\n%s", d, what, err, listErr, describe(last))
	}
	return last
}

// settle checks that the events of pod stay as check wants for d: nothing
// more arrives that should not.
func settle(t *testing.T, pod *corev1.Pod, d time.Duration, what string, check func([]corev1.Event) bool) []corev1.Event {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		evs, err := events(t.Context(), pod)
		if err != nil {
			t.Fatal(err)
		}
		if !check(evs) {
			t.Fatalf("%s; events:\n%s", what, describe(evs))
		}
		if time.Now().After(deadline) {
			return evs
		}
		time.Sleep(200 * time.Millisecond)
	}
}

var describe = cluster.DescribeEvents

// withReason returns the events with that reason.
func withReason(evs []corev1.Event, reason string) []corev1.Event {
	return cluster.EventsWith(evs, reason, "")
}

// withMessage returns the events whose message contains s.
func withMessage(evs []corev1.Event, s string) []corev1.Event {
	return cluster.EventsWith(evs, "", s)
}

// kubectl runs kubectl as admin and fails the test on error.
func kubectl(t *testing.T, args ...string) string {
	t.Helper()
	out, _, err := kube.Kubectl(t.Context(), args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}
