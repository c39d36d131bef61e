//go:build e2e

package e2e

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/dnsops/k8s_event/internal/cluster"
)

// faultsCorefile reports the default levels, warning and error, with buckets
// large enough that throttling never hides what a fault does.
const faultsCorefile = `.:{{.DNS}} {
    kubeapi {
        kubeconfig {{.Kubeconfig}}
    }
    k8s_event {
        rate 100 200
    }
    errors
    logline {{.Logline}}
    prometheus {{.Metrics}}
    whoami
}
`

// Metric series of the plugin.
const (
	errorsNoAnswer = `coredns_k8s_event_api_errors_total{code="0"}`
	errors403      = `coredns_k8s_event_api_errors_total{code="403"}`
	errors404      = `coredns_k8s_event_api_errors_total{code="404"}`
	errors422      = `coredns_k8s_event_api_errors_total{code="422"}`
	errors429      = `coredns_k8s_event_api_errors_total{code="429"}`
	pendingLines   = `coredns_k8s_event_pending_lines`
	goroutines     = `go_goroutines`
)

// writeFailure is how the plugin says why a write failed.
const writeFailure = "plugin/k8s_event: writing event: "

// outputs keeps what every CoreDNS of these tests wrote, and the events of
// clusters that are gone, for TestNoSecretsLeak.
var outputs struct {
	sync.Mutex
	logs   map[string]string
	events []string
	tokens []string
}

// startFaults starts CoreDNS as startCoreDNS does and keeps its output once
// it has stopped.
func startFaults(t *testing.T, pod *corev1.Pod, corefile string, opts ...corednsOption) *coreDNS {
	t.Helper()
	c := startCoreDNS(t, pod, corefile, opts...)
	t.Cleanup(func() {
		c.Stop(15 * time.Second)
		outputs.Lock()
		defer outputs.Unlock()
		if outputs.logs == nil {
			outputs.logs = map[string]string{}
		}
		outputs.logs[t.Name()+" "+c.LogPath] = c.Log()
	})
	return c
}

// rememberToken records the bearer token of a kubeconfig so that
// TestNoSecretsLeak can look for it.
func rememberToken(t *testing.T, kubeconfig string) {
	t.Helper()
	cfg, err := clientcmd.LoadFromFile(kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	outputs.Lock()
	defer outputs.Unlock()
	for _, a := range cfg.AuthInfos {
		if a.Token != "" {
			outputs.tokens = append(outputs.tokens, a.Token)
		}
	}
}

// metricValue returns the value of series (name and labels, as exported) in
// the Prometheus text, 0 when absent.
func metricValue(text, series string) float64 {
	for _, l := range strings.Split(text, "\n") {
		if v, ok := strings.CutPrefix(l, series+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err == nil {
				return f
			}
		}
	}
	return 0
}

func (c *coreDNS) metric(series string) float64 {
	c.t.Helper()
	return metricValue(c.metrics(), series)
}

// waitFor polls cond every 100ms until it holds, failing the test after d.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, d, true, func(context.Context) (bool, error) {
		return cond(), nil
	})
	if err != nil {
		t.Fatalf("waiting %v for %s: %v", d, what, err)
	}
}

// counts tells whether evs has exactly one event per message of want, with
// the count that want gives.
func counts(evs []corev1.Event, want map[string]int32) bool {
	for msg, n := range want {
		m := withExactMessage(evs, msg)
		if len(m) != 1 || m[0].Count != n {
			return false
		}
	}
	return true
}

func withExactMessage(evs []corev1.Event, msg string) []corev1.Event {
	var out []corev1.Event
	for _, e := range evs {
		if e.Message == msg {
			out = append(out, e)
		}
	}
	return out
}

// apiserverAddr is host:port of the shared API server.
func apiserverAddr() string {
	return strings.TrimPrefix(kube.RESTConfig.Host, "https://")
}

// latencies sends n queries for name and returns how long each took; a
// query without an answer fails the test. A name under fail.logline. makes
// the errors plugin log, so the query goes through the plugin's listener.
func (c *coreDNS) latencies(n int, name string) []time.Duration {
	c.t.Helper()
	out := make([]time.Duration, 0, n)
	for range n {
		start := time.Now()
		r, err := c.exchange(name, dns.TypeA)
		if err != nil {
			c.t.Fatalf("query %s: %v", name, err)
		}
		out = append(out, time.Since(start))
		want := dns.RcodeSuccess
		if strings.HasSuffix(name, ".fail.logline.") {
			want = dns.RcodeServerFailure
		}
		if r.Rcode != want {
			c.t.Fatalf("query %s: rcode %s", name, dns.RcodeToString[r.Rcode])
		}
	}
	slices.Sort(out)
	return out
}

func p90(ds []time.Duration) time.Duration { return ds[len(ds)*9/10] }

// promptly checks that DNS answers during a fault about as fast as in the
// baseline measured the same way: the fault must not reach the query path.
func promptly(t *testing.T, fault, baseline []time.Duration) {
	t.Helper()
	limit := 5*p90(baseline) + 100*time.Millisecond
	t.Logf("DNS p90: %v during the fault, %v baseline (limit %v)", p90(fault), p90(baseline), limit)
	if p90(fault) > limit {
		t.Errorf("DNS p90 %v during the fault, baseline %v: want at most %v", p90(fault), p90(baseline), limit)
	}
}

// cpuTicks is the user and system time of pid, in clock ticks.
func cpuTicks(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	// The fields after the command name, which may hold spaces.
	s := string(b)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	// fields[0] is field 3 (state): utime is field 14, stime field 15.
	utime, err1 := strconv.ParseInt(fields[11], 10, 64)
	stime, err2 := strconv.ParseInt(fields[12], 10, 64)
	if err1 != nil || err2 != nil {
		t.Fatalf("parse /proc/%d/stat: %q", pid, s)
	}
	return utime + stime
}

// clockTicks is USER_HZ, 100 on every Linux architecture Go supports.
const clockTicks = 100

// accounted waits until every line captured at level is pending: the API
// refused them, which drops none, and returns the figures.
func accounted(t *testing.T, c *coreDNS, level string) (lines, pending float64) {
	t.Helper()
	series := `coredns_k8s_event_lines_total{level="` + level + `"}`
	err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 5*time.Second, true, func(context.Context) (bool, error) {
		m := c.metrics()
		lines, pending = metricValue(m, series), metricValue(m, pendingLines)
		return lines > 0 && lines == pending && dropped(m) == 0, nil
	})
	if err != nil {
		t.Errorf("%s=%v, want pending_lines (%v), and no line dropped (%v)", series, lines, pending, dropped(c.metrics()))
	}
	return lines, pending
}

// failureLines returns the lines where the plugin says why writes fail.
func failureLines(c *coreDNS) []string {
	var out []string
	for _, l := range strings.Split(c.Log(), "\n") {
		if strings.Contains(l, writeFailure) {
			out = append(out, l)
		}
	}
	return out
}

// readmeRulesWithout returns the rules that README.md grants, less verb.
func readmeRulesWithout(t *testing.T, verb string) []rbacv1.PolicyRule {
	t.Helper()
	var out []rbacv1.PolicyRule
	for _, r := range readmeRules(t) {
		r := *r.DeepCopy()
		r.Verbs = slices.DeleteFunc(r.Verbs, func(v string) bool { return v == verb })
		if len(r.Verbs) > 0 {
			out = append(out, r)
		}
	}
	return out
}

// allows tells whether rules let verb core/v1 events.
func allows(rules []rbacv1.PolicyRule, verb string) bool {
	for _, r := range rules {
		if slices.Contains(r.APIGroups, "") && slices.Contains(r.Resources, "events") &&
			(slices.Contains(r.Verbs, verb) || slices.Contains(r.Verbs, "*")) {
			return true
		}
	}
	return false
}

// setEventRules gives the ServiceAccount ns/sa exactly rules in ns through a
// Role and RoleBinding, and waits until the authorizer agrees on create and
// patch of events.
func setEventRules(t *testing.T, ns, sa string, rules []rbacv1.PolicyRule) {
	t.Helper()
	ctx := t.Context()
	role := &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "coredns-events", Namespace: ns},
		Rules:      rules,
	}
	roles := kube.Clientset.RbacV1().Roles(ns)
	if _, err := roles.Create(ctx, role, metav1.CreateOptions{}); apierrors.IsAlreadyExists(err) {
		if _, err := roles.Update(ctx, role, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	} else if err != nil {
		t.Fatal(err)
	}
	_, err := kube.Clientset.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "coredns-events", Namespace: ns},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "coredns-events"},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: sa, Namespace: ns}},
	}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	for _, verb := range []string{"create", "patch"} {
		want := allows(rules, verb)
		waitFor(t, 10*time.Second, fmt.Sprintf("%s on events allowed=%v", verb, want), func() bool {
			return canI(t, ns, sa, verb) == want
		})
	}
}

// canI asks the authorizer whether ns/sa may verb events in ns.
func canI(t *testing.T, ns, sa, verb string) bool {
	t.Helper()
	r, err := kube.Clientset.AuthorizationV1().SubjectAccessReviews().Create(t.Context(), &authorizationv1.SubjectAccessReview{
		Spec: authorizationv1.SubjectAccessReviewSpec{
			User:   "system:serviceaccount:" + ns + ":" + sa,
			Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"},
			ResourceAttributes: &authorizationv1.ResourceAttributes{
				Namespace: ns, Verb: verb, Group: "", Resource: "events",
			},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return r.Status.Allowed
}

// TestAPIUnreachable starts CoreDNS while the API server cannot be reached,
// then lets it through; later the connection is cut while events flow.
func TestAPIUnreachable(t *testing.T) {
	pod := testPod(t)
	px := newFaultProxy(t, apiserverAddr(), proxyRefuse)
	c := startFaults(t, pod, faultsCorefile, withKubeconfig(kubeconfigVia(t, kube.KubeconfigPath, px.addr())))

	const repeated = "written while the API server is unreachable"
	c.logLine("warning", 20, repeated)
	distinct := []string{"unreachable one", "unreachable two", "unreachable three"}
	for _, l := range distinct {
		c.logLine("warning", 1, l)
	}
	down := c.latencies(30, "example.org.")
	downFail := c.latencies(10, "down.fail.logline.")
	waitFor(t, 10*time.Second, "failed writes without an answer", func() bool {
		return c.metric(errorsNoAnswer) >= 1
	})
	if px.connections() == 0 {
		t.Fatal("the plugin never tried the API server")
	}
	if evs, err := events(t.Context(), pod); err != nil || len(evs) != 0 {
		t.Fatalf("events while the API server is unreachable (%v):\n%s", err, describe(evs))
	}
	t.Logf("unreachable: %v failed writes without an answer over %d connections", c.metric(errorsNoAnswer), px.connections())

	px.setMode(proxyForward)
	want := map[string]int32{
		"plugin/logline: " + repeated:                                      20,
		"plugin/errors: 2 down.fail.logline. A: logline: injected failure": 10,
	}
	for _, l := range distinct {
		want["plugin/logline: "+l] = 1
	}
	waitEventsFor(t, pod, 40*time.Second, "the lines logged while unreachable, with their counts", func(evs []corev1.Event) bool {
		return counts(evs, want)
	})
	base := c.latencies(30, "example.org.")
	baseFail := c.latencies(10, "up.fail.logline.")
	want["plugin/errors: 2 up.fail.logline. A: logline: injected failure"] = 10
	promptly(t, down, base)
	promptly(t, downFail, baseFail)

	// Gone mid-run: the connection in use is cut and nothing more gets
	// through; lines keep coming, new ones and repeats.
	before := c.metric(errorsNoAnswer)
	px.setMode(proxyRefuse)
	px.cut()
	const during = "written while the connection is cut"
	c.logLine("warning", 7, during)
	c.logLine("warning", 5, repeated)
	waitFor(t, 10*time.Second, "failed writes after the cut", func() bool {
		return c.metric(errorsNoAnswer) > before
	})
	t.Logf("cut: %v failed writes without an answer", c.metric(errorsNoAnswer)-before)
	px.setMode(proxyForward)
	want["plugin/logline: "+during] = 7
	want["plugin/logline: "+repeated] = 25
	evs := waitEventsFor(t, pod, 40*time.Second, "the lines logged during the cut, with the totals", func(evs []corev1.Event) bool {
		return counts(evs, want)
	})
	settle(t, pod, time.Second, "one event per line, totals unchanged", func(evs []corev1.Event) bool {
		return len(evs) == len(want) && counts(evs, want)
	})
	t.Logf("events:\n%s", describe(evs))

	// Both outages within seconds: said once, with the promise to retry.
	lines := failureLines(c)
	t.Logf("failure lines:\n%s", strings.Join(lines, "\n"))
	if len(lines) != 1 || !strings.HasSuffix(lines[0], ": will retry") {
		t.Errorf("%d failure lines, want one that ends in %q", len(lines), ": will retry")
	}
}

// TestForbidden runs CoreDNS as a ServiceAccount that may not write events:
// writes are refused, said so at most once a minute, and cost nothing while
// lines keep coming; once the RBAC of the README is granted, events land.
func TestForbidden(t *testing.T) {
	pod := testPod(t)
	const sa = "coredns-no-rbac"
	kc, err := kube.ServiceAccountKubeconfig(t.Context(), pod.Namespace, sa)
	if err != nil {
		t.Fatal(err)
	}
	rememberToken(t, kc)
	c := startFaults(t, pod, faultsCorefile, withKubeconfig(kc))
	base := c.latencies(20, "example.org.")

	// 200 lines of 5 messages over 30s.
	const rounds, perRound, window = 40, 5, 30 * time.Second
	ticker := time.NewTicker(window / rounds)
	defer ticker.Stop()
	start, cpu0 := time.Now(), cpuTicks(t, c.Pid())
	var during []time.Duration
	for i := range rounds {
		for j := range perRound {
			c.logLine("warning", 1, fmt.Sprintf("refused line %d", j))
		}
		if i%4 == 0 {
			during = append(during, c.latencies(2, "example.org.")...)
		}
		<-ticker.C
	}
	elapsed, cpu := time.Since(start), cpuTicks(t, c.Pid())-cpu0
	share := float64(cpu) / clockTicks / elapsed.Seconds()
	t.Logf("%d lines over %v: %d ticks of CPU, %.2f%% of one core", rounds*perRound, elapsed.Round(time.Millisecond), cpu, 100*share)
	if share > 0.05 {
		t.Errorf("CoreDNS used %.1f%% of one core while writes were refused, want under 5%%", 100*share)
	}
	slices.Sort(during)
	promptly(t, during, base)

	lines := failureLines(c)
	t.Logf("failure lines:\n%s", strings.Join(lines, "\n"))
	if len(lines) == 0 {
		t.Fatalf("no %q line in the log:\n%s", writeFailure, c.LogTail(30))
	}
	if len(lines) > 2 {
		t.Errorf("%d failure lines within %v, want at most one a minute", len(lines), elapsed.Round(time.Second))
	}
	for _, want := range []string{`cannot create resource "events"`, "grant create and patch on events"} {
		if !strings.Contains(lines[0], want) {
			t.Errorf("failure line does not say %q: %s", want, lines[0])
		}
	}
	forbidden := c.metric(errors403)
	t.Logf("api_errors{403}=%v", forbidden)
	if forbidden < 1 {
		t.Errorf("api_errors{403}=%v, want above 0", forbidden)
	}
	// A refused event waits a minute: one write per message, no storm.
	if forbidden > perRound {
		t.Errorf("api_errors{403}=%v for %d messages within %v, want one write each", forbidden, perRound, elapsed.Round(time.Second))
	}
	if evs, err := events(t.Context(), pod); err != nil || len(evs) != 0 {
		t.Errorf("events without permission (%v):\n%s", err, describe(evs))
	}
	total, pending := accounted(t, c, "warning")
	t.Logf("lines_total=%v: pending_lines=%v", total, pending)

	// Once allowed, the refused lines land with the new ones, after the
	// pause of a refused event, each line counted once.
	setEventRules(t, pod.Namespace, sa, readmeRules(t))
	granted := time.Now()
	const fresh = "written once allowed"
	c.logLine("warning", 3, fresh)
	want := map[string]int32{"plugin/logline: " + fresh: 3}
	for j := range perRound {
		want[fmt.Sprintf("plugin/logline: refused line %d", j)] = rounds
	}
	evs := waitEventsFor(t, pod, 90*time.Second, "every line, refused ones included, with its count", func(evs []corev1.Event) bool {
		return counts(evs, want)
	})
	t.Logf("%d events %v after RBAC was granted:\n%s", len(evs), time.Since(granted).Round(time.Second), describe(evs))
	c.ledger(pod)
}

// TestTooManyRequests runs CoreDNS against an API server whose
// EventRateLimit admission allows fewer events than CoreDNS sends: the 429s
// are retried until every event is there with its count.
func TestTooManyRequests(t *testing.T) {
	limited := cluster.NewForTest(t, cluster.EventRateLimit(1, 2))
	ctx := t.Context()
	ns := namespaceFor(t)
	if _, err := limited.CreateNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	pod, err := limited.CreatePod(ctx, ns, "coredns-limited")
	if err != nil {
		t.Fatal(err)
	}
	c := startFaults(t, pod, faultsCorefile, withKubeconfig(limited.KubeconfigPath))

	want := map[string]int32{}
	for i := range 6 {
		line := fmt.Sprintf("rate limited line %d", i)
		c.logLine("warning", i+1, line)
		want["plugin/logline: "+line] = int32(i + 1)
	}
	list := func() []corev1.Event {
		l, err := limited.Clientset.CoreV1().Events(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return l.Items
	}
	var evs []corev1.Event
	waitFor(t, 60*time.Second, "every line's event with its count", func() bool {
		evs = list()
		return len(evs) == len(want) && counts(evs, want)
	})
	tooMany := c.metric(errors429)
	t.Logf("api_errors{429}=%v; events:\n%s", tooMany, describe(evs))
	if tooMany < 1 {
		t.Errorf("api_errors{429}=%v, want above 0: the API server's limit was never hit", tooMany)
	}
	b, _ := json.Marshal(evs)
	outputs.Lock()
	outputs.events = append(outputs.events, string(b))
	outputs.Unlock()
}

// TestNamespaceMissing reports for a pod whose namespace does not exist:
// writes get 404, are given up and said so, and are not retried in a storm.
func TestNamespaceMissing(t *testing.T) {
	pod := testPod(t).DeepCopy()
	pod.Namespace = "no-such-namespace-" + strconv.FormatInt(time.Now().UnixNano()%1e6, 36)
	c := startFaults(t, pod, strings.Replace(faultsCorefile, "rate 100 200", "rate 1 5", 1))

	const keys, window = 4, 20 * time.Second
	ticker := time.NewTicker(500 * time.Millisecond)
	defer ticker.Stop()
	start, sent := time.Now(), 0
	for time.Since(start) < window {
		for j := range keys {
			c.logLine("error", 1, fmt.Sprintf("no namespace line %d", j))
			sent++
		}
		<-ticker.C
	}
	elapsed := time.Since(start)
	notFound := c.metric(errors404)
	t.Logf("%d lines of %d messages over %v: api_errors{404}=%v", sent, keys, elapsed.Round(time.Millisecond), notFound)
	if notFound < 1 {
		t.Errorf("api_errors{404}=%v, want above 0", notFound)
	}
	// The buckets allow 5 + 1/s·T writes; a refused event waits a minute, so
	// each message is written once.
	if bound := 5 + elapsed.Seconds(); notFound > bound || notFound > keys {
		t.Errorf("api_errors{404}=%v over %v for %d messages, want at most %d (bucket bound %.0f)", notFound, elapsed.Round(time.Second), keys, keys, bound)
	}
	total, pending := accounted(t, c, "error")
	t.Logf("lines_total=%v: pending_lines=%v", total, pending)
	lines := failureLines(c)
	t.Logf("failure lines:\n%s", strings.Join(lines, "\n"))
	if len(lines) < 1 || len(lines) > 2 {
		t.Fatalf("%d failure lines within %v, want one", len(lines), elapsed.Round(time.Second))
	}
	if want := fmt.Sprintf("does the namespace %q exist?", pod.Namespace); !strings.Contains(lines[0], want) {
		t.Errorf("failure line does not ask %q: %s", want, lines[0])
	}
	c.latencies(10, "example.org.")
}

// TestInvalidEvent reports for a pod whose name the API server does not take
// in an event name: writes get 422 and are given up.
func TestInvalidEvent(t *testing.T) {
	pod := testPod(t).DeepCopy()
	pod.Name = "coredns%invalid"
	c := startFaults(t, pod, faultsCorefile)
	c.logLine("warning", 3, "an event the API server refuses")
	waitFor(t, 10*time.Second, "a refused write", func() bool {
		return c.metric(errors422) >= 1
	})
	m := c.metrics()
	t.Logf("api_errors{422}=%v pending_lines=%v", metricValue(m, errors422), metricValue(m, pendingLines))
	if metricValue(m, errors422) < 1 {
		t.Errorf("api_errors{422}=%v, want above 0:\n%s", metricValue(m, errors422), strings.Join(failureLines(c), "\n"))
	}
	waitFor(t, 5*time.Second, "the failure line", func() bool { return len(failureLines(c)) > 0 })
	if l := failureLines(c)[0]; !strings.Contains(l, "the event was refused as invalid") {
		t.Errorf("failure line does not say the event is invalid: %s", l)
	}
}

// TestSlowAPI holds back the API server's answers for longer than the
// plugin's write timeout: DNS is not slowed down, writes time out, and once
// answers come fast again every line's event has its count.
func TestSlowAPI(t *testing.T) {
	pod, _ := slowAPI(t)
	evs := settle(t, pod, 2*time.Second, "no more events", func([]corev1.Event) bool { return true })
	t.Logf("events:\n%s", describe(evs))
}

// TestSlowAPICreatedOnce is TestSlowAPI, then each line must be in exactly
// one event: a create that timed out may have been applied by the API server.
func TestSlowAPICreatedOnce(t *testing.T) {
	pod, want := slowAPI(t)
	evs := settle(t, pod, 2*time.Second, "no more events", func([]corev1.Event) bool { return true })
	for msg := range want {
		if m := withExactMessage(evs, msg); len(m) != 1 {
			t.Errorf("%d events with message %q, want one:\n%s", len(m), msg, describe(m))
		}
	}
}

// slowAPI delays every answer of the API server by 15s while CoreDNS logs,
// checks that DNS answers as fast as before and that writes time out, then
// lets answers through and waits until the latest event of every line has
// the line's count. It returns the pod and the counts.
func slowAPI(t *testing.T) (*corev1.Pod, map[string]int32) {
	t.Helper()
	pod := testPod(t)
	px := newFaultProxy(t, apiserverAddr(), proxyForward)
	c := startFaults(t, pod, faultsCorefile, withKubeconfig(kubeconfigVia(t, kube.KubeconfigPath, px.addr())))

	const early, slow = "written before the slowdown", "written during the slowdown"
	c.logLine("warning", 1, early)
	want := map[string]int32{"plugin/logline: " + early: 1}
	// The connection to the API server is up before answers slow down.
	waitEvents(t, pod, "the first line", func(evs []corev1.Event) bool { return counts(evs, want) })
	base := c.latencies(30, "example.org.")
	baseFail := c.latencies(10, "fast.fail.logline.")
	want["plugin/errors: 2 fast.fail.logline. A: logline: injected failure"] = 10
	waitEvents(t, pod, "the errors of the baseline", func(evs []corev1.Event) bool { return counts(evs, want) })

	px.setDelay(15 * time.Second)
	c.logLine("warning", 3, slow)
	c.logLine("warning", 2, early)
	slowDNS := c.latencies(30, "example.org.")
	slowFail := c.latencies(10, "slow.fail.logline.")
	waitFor(t, 25*time.Second, "writes that time out", func() bool {
		return c.metric(errorsNoAnswer) >= 1
	})
	t.Logf("api_errors{0}=%v after the write timeout", c.metric(errorsNoAnswer))
	promptly(t, slowDNS, base)
	promptly(t, slowFail, baseFail)

	px.setDelay(0)
	want["plugin/logline: "+slow] = 3
	want["plugin/logline: "+early] = 3
	want["plugin/errors: 2 slow.fail.logline. A: logline: injected failure"] = 10
	waitEventsFor(t, pod, 40*time.Second, "the latest event of every line with its count", func(evs []corev1.Event) bool {
		for msg, n := range want {
			m := withExactMessage(evs, msg)
			slices.SortFunc(m, func(a, b corev1.Event) int { return strings.Compare(a.Name, b.Name) })
			if len(m) == 0 || m[len(m)-1].Count != n {
				return false
			}
		}
		return true
	})
	return pod, want
}

// reloadCorefile checks for a new Corefile every 2s, give or take the 1s of
// jitter that CoreDNS 1.12 (the floor) takes at the least. Its
// lines come from queries only: an HTTP server of logline would be started
// by the new configuration before the old one lets go of its port.
const reloadCorefile = `.:{{.DNS}} {
    kubeapi {
        kubeconfig {{.Kubeconfig}}
    }
    k8s_event {
        rate 100 200
    }
    reload 2s 1s
    errors
    logline
    prometheus {{.Metrics}}
    whoami
}
`

// failLine is what the errors plugin logs for a query of name under
// fail.logline.
func failLine(name string) string {
	return "plugin/errors: 2 " + name + ".fail.logline. A: logline: injected failure"
}

// TestReloadStorm reloads CoreDNS ten times through the reload plugin while
// lines flow: no line is posted twice or lost, and no goroutine is left
// behind. Then a reload into a broken Corefile fails and the old settings
// keep posting.
func TestReloadStorm(t *testing.T) {
	pod := testPod(t)
	c := startFaults(t, pod, reloadCorefile)
	reloads := func() int { return strings.Count(c.Log(), reloadLinePrefix) }

	c.fail("warm")
	want := map[string]int32{failLine("warm"): 1}
	waitEvents(t, pod, "the first line", func(evs []corev1.Event) bool { return counts(evs, want) })
	goroutinesBefore := c.metric(goroutines)

	// Lines flow from failing queries of five names. A query that got no
	// answer may or may not have been logged.
	names := []string{"storm-a", "storm-b", "storm-c", "storm-d", "storm-e"}
	answered, lost := make([]int32, len(names)), make([]int32, len(names))
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		ticker := time.NewTicker(50 * time.Millisecond)
		defer ticker.Stop()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-ticker.C:
			}
			j := i % len(names)
			if r, err := c.exchange(names[j]+".fail.logline.", dns.TypeA); err != nil || r.Rcode != dns.RcodeServerFailure {
				lost[j]++
				continue
			}
			answered[j]++
		}
	}()
	stopFlow := sync.OnceFunc(func() { close(stop); <-done })
	t.Cleanup(stopFlow)

	start := time.Now()
	for i := range 10 {
		n := reloads()
		rate := "rate 100 200"
		if i%2 == 0 {
			rate = "rate 100 201"
		}
		c.reload(strings.Replace(reloadCorefile, "rate 100 200", rate, 1))
		waitFor(t, 10*time.Second, fmt.Sprintf("reload %d", i+1), func() bool { return reloads() > n })
	}
	stopFlow()
	t.Logf("10 reloads in %v; %d queries answered %v, %d lost %v", time.Since(start).Round(time.Millisecond), sum(answered), answered, sum(lost), lost)
	if c.LogContains("reload failed") {
		t.Fatalf("a reload failed:\n%s", c.LogTail(30))
	}

	for i, name := range names {
		want[failLine(name)] = answered[i]
	}
	// Each name in one event whose count is the answered queries, plus at
	// most the lost ones.
	inOne := func(evs []corev1.Event) bool {
		for i, name := range names {
			m := withExactMessage(evs, failLine(name))
			if len(m) != 1 || m[0].Count < answered[i] || m[0].Count > answered[i]+lost[i] {
				return false
			}
		}
		return len(evs) == len(want) && counts(evs, map[string]int32{failLine("warm"): 1})
	}
	waitEventsFor(t, pod, 30*time.Second, "each line in one event with its count", inOne)
	evs := settle(t, pod, 2*time.Second, "no line posted twice", inOne)
	t.Logf("events:\n%s", describe(evs))
	for i, name := range names {
		want[failLine(name)] = withExactMessage(evs, failLine(name))[0].Count
		if lost[i] == 0 && want[failLine(name)] != answered[i] {
			t.Errorf("%s: count %d, want %d", name, want[failLine(name)], answered[i])
		}
	}

	var goroutinesAfter float64
	waitFor(t, 20*time.Second, "the goroutines of the old servers to end", func() bool {
		goroutinesAfter = c.metric(goroutines)
		return goroutinesAfter <= goroutinesBefore+10
	})
	t.Logf("goroutines: %v before the reloads, %v after", goroutinesBefore, goroutinesAfter)

	// A Corefile that does not parse: the reload fails, the old settings stay.
	const failed = "plugin/reload: Corefile changed but reload failed"
	c.reload(strings.Replace(reloadCorefile, "rate 100 200", "rate 0", 1))
	waitFor(t, 10*time.Second, "the failed reload", func() bool { return c.LogContains(failed) })
	c.fail("after")
	c.fail("after")
	c.fail("storm-a")
	want[failLine("after")] = 2
	want[failLine("storm-a")]++
	evs = waitEvents(t, pod, "the lines after the failed reload", func(evs []corev1.Event) bool {
		return counts(evs, want) && len(withMessage(evs, failed)) == 1
	})
	t.Logf("after the failed reload: %q", withMessage(evs, failed)[0].Message)
}

func sum(ns []int32) (s int32) {
	for _, n := range ns {
		s += n
	}
	return s
}

// TestLeastPrivilege runs CoreDNS as a ServiceAccount with the README's
// RBAC, create and patch on events: new lines and repeats land. Without
// create, a new line gets no event; without patch, a repeat's count stays.
func TestLeastPrivilege(t *testing.T) {
	pod := testPod(t)
	ns, sa := pod.Namespace, "coredns-least"
	kc, err := kube.ServiceAccountKubeconfig(t.Context(), ns, sa)
	if err != nil {
		t.Fatal(err)
	}
	rememberToken(t, kc)
	if !allows(readmeRules(t), "create") || !allows(readmeRules(t), "patch") {
		t.Fatalf("README.md does not grant create and patch on events: %v", readmeRules(t))
	}
	setEventRules(t, ns, sa, readmeRules(t))
	c := startFaults(t, pod, faultsCorefile, withKubeconfig(kc))

	const repeated, fresh = "created, then patched", "a new line"
	want := map[string]int32{"plugin/logline: " + repeated: 1}
	c.logLine("warning", 1, repeated)
	waitEvents(t, pod, "the created event", func(evs []corev1.Event) bool { return counts(evs, want) })
	c.logLine("warning", 2, repeated)
	c.logLine("warning", 1, fresh)
	want["plugin/logline: "+repeated] = 3
	want["plugin/logline: "+fresh] = 1
	waitEvents(t, pod, "the patched event and a new one", func(evs []corev1.Event) bool { return counts(evs, want) })
	if n := c.metric(errors403); n != 0 {
		t.Fatalf("api_errors{403}=%v with create and patch", n)
	}

	t.Run("without create", func(t *testing.T) {
		setEventRules(t, ns, sa, readmeRulesWithout(t, "create"))
		f := c.metric(errors403)
		const refused = "a new line without create"
		c.logLine("warning", 1, refused)
		c.logLine("warning", 1, repeated)
		want["plugin/logline: "+repeated]++
		waitEvents(t, pod, "the repeat, patched", func(evs []corev1.Event) bool { return counts(evs, want) })
		waitFor(t, 10*time.Second, "a 403", func() bool { return c.metric(errors403) > f })
		settle(t, pod, 2*time.Second, "no event for the new line", func(evs []corev1.Event) bool {
			return len(withMessage(evs, refused)) == 0 && counts(evs, want)
		})
		t.Logf("api_errors{403}=%v", c.metric(errors403))
	})

	t.Run("without patch", func(t *testing.T) {
		setEventRules(t, ns, sa, readmeRulesWithout(t, "patch"))
		const created = "created without patch"
		c.logLine("warning", 1, created)
		want["plugin/logline: "+created] = 1
		waitEvents(t, pod, "the created event", func(evs []corev1.Event) bool { return counts(evs, want) })
		f := c.metric(errors403)
		c.logLine("warning", 2, created)
		waitFor(t, 10*time.Second, "a 403", func() bool { return c.metric(errors403) > f })
		settle(t, pod, 2*time.Second, "the repeat's count stays at the first write", func(evs []corev1.Event) bool {
			return counts(evs, want)
		})
		t.Logf("api_errors{403}=%v", c.metric(errors403))
	})
}

// TestNoSecretsLeak looks through every event and every CoreDNS output of
// this run for credentials: tokens, certificates, keys, kubeconfig content.
// It makes its own writes fail with a token first, so it has something to
// look at when it runs alone.
func TestNoSecretsLeak(t *testing.T) {
	pod := testPod(t)
	kc, err := kube.ServiceAccountKubeconfig(t.Context(), pod.Namespace, "coredns-no-rbac")
	if err != nil {
		t.Fatal(err)
	}
	rememberToken(t, kc)
	c := startFaults(t, pod, faultsCorefile, withKubeconfig(kc))
	c.logLine("warning", 1, "a line that cannot be written")
	waitFor(t, 10*time.Second, "the failure line", func() bool { return len(failureLines(c)) > 0 })
	c.Stop(15 * time.Second)
	own := c.Log()

	admin, err := clientcmd.LoadFromFile(kube.KubeconfigPath)
	if err != nil {
		t.Fatal(err)
	}
	secrets := map[string]string{
		"a certificate":             "BEGIN CERTIFICATE",
		"a private key":             "PRIVATE KEY",
		"a bearer token":            "Bearer ",
		"a JWT":                     "eyJhbGciOi",
		"kubeconfig content":        "client-key-data",
		"kubeconfig content (cert)": "client-certificate-data",
		"kubeconfig content (CA)":   "certificate-authority-data",
		"kubeconfig content (ctx)":  "current-context",
	}
	for name, a := range admin.AuthInfos {
		secrets["the client key of "+name] = strings.TrimSpace(string(a.ClientKeyData))
		secrets["the client key of "+name+" in base64"] = base64.StdEncoding.EncodeToString(a.ClientKeyData)
	}
	outputs.Lock()
	for i, tok := range outputs.tokens {
		secrets[fmt.Sprintf("service account token %d", i)] = tok
		// Part of a token is as bad as all of it.
		secrets[fmt.Sprintf("the signature of service account token %d", i)] = tok[strings.LastIndexByte(tok, '.')+1:]
	}
	texts := map[string]string{"the output of this test's CoreDNS": own}
	outs := 1 + len(outputs.logs)
	for name, log := range outputs.logs {
		texts["the output of CoreDNS of "+name] = log
	}
	for i, evs := range outputs.events {
		texts[fmt.Sprintf("the events of stopped cluster %d", i)] = evs
	}
	outputs.Unlock()
	all, err := kube.Clientset.CoreV1().Events(metav1.NamespaceAll).List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(all.Items)
	if err != nil {
		t.Fatal(err)
	}
	texts["the events of the API server"] = string(b)

	for where, text := range texts {
		for what, secret := range secrets {
			if secret != "" && strings.Contains(text, secret) {
				t.Errorf("%s has %s", where, what)
			}
		}
	}
	t.Logf("looked for %d secrets in %d texts: %d events, %d CoreDNS outputs", len(secrets), len(texts), len(all.Items), outs)
}

const signalReloadCorefile = `.:{{.DNS}} {
    kubeapi {
        kubeconfig {{.Kubeconfig}}
    }
    k8s_event {
        rate 100 200
    }
    errors
    logline
    prometheus {{.Metrics}}
    whoami
}
`

// TestHundredReloads restarts CoreDNS 100 times with SIGUSR1, the same
// in-process restart the reload plugin does, while lines flow: every line is
// in exactly one event and the goroutine count returns to its baseline.
func TestHundredReloads(t *testing.T) {
	pod := testPod(t)
	c := startFaults(t, pod, signalReloadCorefile)
	const reloaded = "[INFO] Reloading complete"
	reloads := func() int { return strings.Count(c.Log(), reloaded) }

	c.fail("warm")
	waitEvents(t, pod, "the first line", func(evs []corev1.Event) bool {
		return counts(evs, map[string]int32{failLine("warm"): 1})
	})
	before := c.metric(goroutines)

	var answered, lost int32
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			case <-time.After(10 * time.Millisecond):
			}
			if r, err := c.exchange("hundred.fail.logline.", dns.TypeA); err != nil || r.Rcode != dns.RcodeServerFailure {
				lost++
				continue
			}
			answered++
		}
	}()
	stopFlow := sync.OnceFunc(func() { close(stop); <-done })
	t.Cleanup(stopFlow)

	start := time.Now()
	for i := range 100 {
		n := reloads()
		if err := syscall.Kill(c.Pid(), syscall.SIGUSR1); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 10*time.Second, fmt.Sprintf("reload %d", i+1), func() bool { return reloads() > n })
	}
	stopFlow()
	t.Logf("100 reloads in %v; %d queries answered, %d lost", time.Since(start).Round(time.Millisecond), answered, lost)

	inOne := func(evs []corev1.Event) bool {
		m := withExactMessage(evs, failLine("hundred"))
		return len(m) == 1 && m[0].Count >= answered && m[0].Count <= answered+lost
	}
	waitEventsFor(t, pod, 30*time.Second, "the line in one event with its count", inOne)
	evs := settle(t, pod, 2*time.Second, "no line posted twice", inOne)
	if len(evs) != 2 {
		t.Errorf("%d events, want 2:\n%s", len(evs), describe(evs))
	}

	var after float64
	waitFor(t, 20*time.Second, "goroutines back to their baseline", func() bool {
		after = c.metric(goroutines)
		return after <= before+5
	})
	t.Logf("goroutines: %v before the reloads, %v after", before, after)
}
