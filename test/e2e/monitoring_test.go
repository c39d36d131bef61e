//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/dnsops/k8s_event/internal/cluster"
	"github.com/dnsops/k8s_event/test/plugin/logline"
)

// TestAlertingRules checks the alerts of deploy/monitoring/prometheusrule.yaml
// with Prometheus's own tools: promtool checks the rules and runs their unit
// tests (testdata/prometheusrule-tests.yaml), then a real Prometheus loads the
// rules and scrapes a real CoreDNS whose writes fail, and its alerts must be
// the ones the rules promise, on the series the plugin really exports. The
// same Prometheus scrapes a second CoreDNS that runs a storm, and every
// query of the dashboard deploy/monitoring/grafana-dashboard.json must
// return data from the two.
func TestAlertingRules(t *testing.T) {
	prom, promtool := os.Getenv("PROMETHEUS"), os.Getenv("PROMTOOL")
	if prom == "" || promtool == "" {
		why := "PROMETHEUS and PROMTOOL are not set; hack/tools.sh env sets them where apt-get can fetch Debian's prometheus"
		fmt.Fprintln(os.Stderr, "SKIP TestAlertingRules:", why)
		t.Skip(why)
	}
	dir := t.TempDir()
	rules := filepath.Join(dir, "rules.yaml")
	writeRuleGroups(t, filepath.Join(repoRoot, "deploy/monitoring/prometheusrule.yaml"), rules)
	tests := filepath.Join(dir, "prometheusrule-tests.yaml")
	if err := os.WriteFile(tests, []byte(mustRead(filepath.Join(repoRoot, "test/e2e/testdata/prometheusrule-tests.yaml"))), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"check", "rules", rules}, {"test", "rules", tests}} {
		out, err := exec.CommandContext(t.Context(), promtool, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		t.Logf("promtool %s:\n%s", strings.Join(args, " "), strings.TrimSpace(string(out)))
	}

	// A pod whose namespace does not exist: every write gets 404 and its
	// lines stay pending; a cache of 2 events evicts, and drops, the lines
	// of older ones.
	stormPod := testPod(t)
	pod := stormPod.DeepCopy()
	pod.Namespace = "no-such-namespace-" + strconv.FormatInt(time.Now().UnixNano()%1e6, 36)
	c := startCoreDNS(t, pod, strings.Replace(faultsCorefile, "rate 100 200", "rate 100 200 2", 1))
	// The storm's CoreDNS has small buckets, so that writes wait for tokens.
	storm := startCoreDNS(t, stormPod, strings.Replace(faultsCorefile, "rate 100 200", "rate 2 5", 1))

	port, err := cluster.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	web := "127.0.0.1:" + strconv.Itoa(port)
	config := fmt.Sprintf(`global: {scrape_interval: 1s, evaluation_interval: 1s}
rule_files: [%q]
scrape_configs:
- job_name: coredns
  static_configs:
  - targets: [%q]
    labels: {namespace: %q, pod: %q}
  - targets: [%q]
    labels: {namespace: %q, pod: %q}
`, rules, c.Metrics, pod.Namespace, pod.Name, storm.Metrics, stormPod.Namespace, stormPod.Name)
	configPath := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(configPath, []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	startTool(t, "prometheus", dir, nil, prom,
		"--config.file="+configPath, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+web)

	// Prometheus sees a counter's increase only from its first sample on:
	// the lines come after the first scrape, and one more after the next,
	// for a second 404 (the series of a code is born with its first error).
	waitFor(t, 30*time.Second, "Prometheus's first scrape of CoreDNS", func() bool {
		body, err := cluster.HTTPGet(t.Context(), "http://"+web+"/api/v1/query?query=coredns_k8s_event_pending_lines")
		return err == nil && strings.Contains(body, `"pod":"`+pod.Name+`"`)
	})
	for i := range 6 {
		c.logLine("error", 1, fmt.Sprintf("alerting line %d", i))
	}
	time.Sleep(3 * time.Second)
	c.logLine("error", 1, "alerting line 6")
	// CoreDNSEventsNotDraining fires only after 30 minutes: it may be
	// pending here (when the first scrape already saw a pending line, such
	// as a start-up line waiting for its write), never firing.
	want := map[string]string{
		"CoreDNSEventLinesDropped/cause=evicted": "firing",
		"CoreDNSEventWritesFailing/code=404":     "pending", // for 15m
	}
	var got map[string]string
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(time.Second) {
		got = alerts(t, web, pod.Namespace, pod.Name)
		if got["CoreDNSEventsNotDraining/"] == "pending" {
			delete(got, "CoreDNSEventsNotDraining/")
		}
		if maps.Equal(got, want) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("alerts after a minute: %v, want %v\nplugin metrics:\n%s", got, want, c.metrics())
		}
	}
	t.Logf("alerts: %v; plugin: %s=%v, %s=%v, dropped=%v", got, errors404, c.metric(errors404),
		pendingLines, c.metric(pendingLines), dropped(c.metrics()))

	// The storm: lines of one shape, combined, throttled by a bucket of 5;
	// its events are deleted, as the event TTL would, so that a patch
	// finds its event gone (an expected 404) and creates it anew.
	stormLines := func(from, to int) {
		for i := from; i < to; i++ {
			storm.logLine("error", 1, fmt.Sprintf("2 q%d.example.org. A: read udp 10.0.0.5:%d->10.0.0.2:53: i/o timeout", i, 40000+i))
		}
	}
	// Its lines are distinct: only the combined event is patched, and it
	// comes after the first few lines; the events are deleted until a
	// patch has found one gone.
	stormLines(0, 100)
	waitEventsFor(t, stormPod, time.Minute, "the storm's events", func(evs []corev1.Event) bool { return len(evs) > 0 })
	const gone = `coredns_k8s_event_api_expected_total{code="404",outcome="gone"}`
	for i := 100; storm.metric(gone) == 0; i += 10 {
		if i > 1000 {
			t.Fatalf("%s=0 after the storm's events were deleted\nplugin metrics:\n%s", gone, storm.metrics())
		}
		evs, err := events(t.Context(), stormPod)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range evs {
			err := kube.Clientset.CoreV1().Events(e.Namespace).Delete(t.Context(), e.Name, metav1.DeleteOptions{})
			if err != nil && !apierrors.IsNotFound(err) {
				t.Fatal(err)
			}
		}
		stormLines(i, i+10)
		time.Sleep(time.Second)
	}
	if n := storm.metric(errors404); n != 0 {
		t.Errorf("%s=%v: a patch of a deleted event counted as a failure", errors404, n)
	}
	checkDashboard(t, web, storm)
}

// checkDashboard runs the query of every panel of the Grafana dashboard,
// and of its variables, against Prometheus: each must return data, the
// ended storms' only once CoreDNS has written end events.
func checkDashboard(t *testing.T, web string, storm *coreDNS) {
	t.Helper()
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Name       string `json:"name"`
				Definition string `json:"definition"`
			} `json:"list"`
		} `json:"templating"`
	}
	path := filepath.Join(repoRoot, "deploy/monitoring/grafana-dashboard.json")
	if err := json.Unmarshal([]byte(mustRead(path)), &dash); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	// Grafana's variables, as with "All" chosen and a short range.
	grafana := strings.NewReplacer("$namespace", ".+", "$pod", ".+", "$__rate_interval", "1m")
	query := func(expr string) (int, error) {
		body, err := cluster.HTTPGet(t.Context(), "http://"+web+"/api/v1/query?query="+url.QueryEscape(expr))
		if err != nil {
			return 0, err
		}
		var resp struct {
			Status string
			Error  string
			Data   struct{ Result []json.RawMessage }
		}
		if err := json.Unmarshal([]byte(body), &resp); err != nil {
			return 0, fmt.Errorf("%v: %s", err, body)
		}
		if resp.Status != "success" {
			return 0, fmt.Errorf("%s: %s", resp.Status, resp.Error)
		}
		return len(resp.Data.Result), nil
	}
	type check struct{ what, expr string }
	var checks []check
	for _, p := range dash.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			checks = append(checks, check{"panel " + strconv.Quote(p.Title), grafana.Replace(tg.Expr)})
		}
	}
	// label_values(METRIC, LABEL) is the values of LABEL among METRIC's series.
	labelValues := regexp.MustCompile(`^label_values\((.+), *([a-z_]+)\)$`)
	for _, v := range dash.Templating.List {
		if m := labelValues.FindStringSubmatch(v.Definition); m != nil {
			checks = append(checks, check{"variable " + v.Name, "count by (" + m[2] + ") (" + grafana.Replace(m[1]) + ")"})
		}
	}
	if len(checks) < 9 {
		t.Fatalf("%d queries in %s, want at least the 9 panels", len(checks), path)
	}
	// End events are written by a storm that ended; this storm has not.
	ended := func(expr string) bool { return strings.Contains(expr, "Ended") }
	var missing []string
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(time.Second) {
		missing = missing[:0]
		for _, c := range checks {
			n, err := query(c.expr)
			if err != nil {
				t.Fatalf("%s: %s: %v", c.what, c.expr, err)
			}
			if n == 0 && !ended(c.expr) {
				missing = append(missing, c.what+": "+c.expr)
			}
		}
		if len(missing) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after a minute, no data for:\n%s\nstorm's metrics:\n%s", strings.Join(missing, "\n"), storm.metrics())
		}
	}
	t.Logf("the dashboard's %d queries return data", len(checks))
}

// startTool starts a program the test talks to, logging to dir/NAME.log;
// it is stopped when the test ends, and its log shown if the test failed.
func startTool(t *testing.T, name, dir string, env []string, path string, args ...string) *cluster.Process {
	t.Helper()
	p, err := cluster.StartProcess(name, filepath.Join(dir, name+".log"), env, path, args...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.Stop(5 * time.Second)
		if t.Failed() {
			t.Logf("%s log:\n%s", name, p.LogTail(40))
		}
	})
	return p
}

// writeRuleGroups writes the groups of a PrometheusRule as a Prometheus
// rule file.
func writeRuleGroups(t *testing.T, from, to string) {
	t.Helper()
	var rule struct {
		Kind string `json:"kind"`
		Spec struct {
			Groups []json.RawMessage `json:"groups"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal([]byte(mustRead(from)), &rule); err != nil {
		t.Fatalf("%s: %v", from, err)
	}
	if rule.Kind != "PrometheusRule" || len(rule.Spec.Groups) == 0 {
		t.Fatalf("%s: kind %q with %d groups, want a PrometheusRule with groups", from, rule.Kind, len(rule.Spec.Groups))
	}
	out, err := yaml.Marshal(map[string]any{"groups": rule.Spec.Groups})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, out, 0o644); err != nil {
		t.Fatal(err)
	}
}

// alerts returns Prometheus's alerts for one pod: alertname/label=value
// (the label that tells the alerts of a rule apart) to state.
func alerts(t *testing.T, web, namespace, pod string) map[string]string {
	body, err := cluster.HTTPGet(t.Context(), "http://"+web+"/api/v1/alerts")
	if err != nil {
		return nil
	}
	var resp struct {
		Data struct {
			Alerts []struct {
				Labels map[string]string `json:"labels"`
				State  string            `json:"state"`
			} `json:"alerts"`
		} `json:"data"`
	}
	if err := json.Unmarshal([]byte(body), &resp); err != nil {
		t.Fatalf("prometheus alerts: %v: %s", err, body)
	}
	got := map[string]string{}
	for _, a := range resp.Data.Alerts {
		if a.Labels["namespace"] != namespace || a.Labels["pod"] != pod {
			continue
		}
		key := a.Labels["alertname"] + "/"
		for _, l := range []string{"cause", "code"} {
			if v, ok := a.Labels[l]; ok {
				key += l + "=" + v
			}
		}
		got[key] = a.State
	}
	return got
}

// TestEventRouting runs the OpenTelemetry Collector recipe of docs/monitoring.md,
// deploy/monitoring/otelcol-events.yaml, against the API server: its
// receivers and pipelines as shipped, with file exporters in place of the
// OTLP ones and the test's kubeconfig in place of the ServiceAccount. Each
// route must get exactly the events its label selector names, new ones and
// count updates alike.
func TestEventRouting(t *testing.T) {
	otelcol := os.Getenv("OTELCOL")
	if otelcol == "" {
		t.Fatal("OTELCOL is not set: run through make test-e2e, or set what hack/tools.sh env prints")
	}
	// docs/monitoring.md shows the file as it is, but its comments.
	recipe := filepath.Join(repoRoot, "deploy/monitoring/otelcol-events.yaml")
	var body strings.Builder
	for _, l := range strings.SplitAfter(mustRead(recipe), "\n") {
		if !strings.HasPrefix(l, "#") {
			body.WriteString(l)
		}
	}
	if !strings.Contains(mustRead(filepath.Join(repoRoot, "docs", "monitoring.md")), "~~~ yaml\n"+body.String()+"~~~\n") {
		t.Errorf("docs/monitoring.md does not show %s as it is:\n%s", recipe, body.String())
	}

	// The recipe watches kube-system, where the cluster's DNS runs. Info
	// lines are events too here, to show that neither route takes them
	// (debug lines go as info ones: CoreDNS logs them only with its debug
	// plugin).
	pod, err := kube.CreatePod(t.Context(), "kube-system", "coredns-"+strconv.FormatInt(time.Now().UnixNano()%1e6, 36))
	if err != nil {
		t.Fatal(err)
	}
	c := startCoreDNS(t, pod, strings.Replace(faultsCorefile, "rate 100 200", "level debug info warning error\n        rate 100 200", 1))

	// The collector runs as the ServiceAccount that deploy/monitoring
	// ships, with the Role that it ships: applied to the API server, the
	// Deployment and its ConfigMap too.
	kustomization := filepath.Join(repoRoot, "deploy/monitoring")
	t.Logf("kubectl apply -k deploy/monitoring:\n%s", kubectl(t, "apply", "-k", kustomization))
	t.Cleanup(func() {
		if _, stderr, err := kube.Kubectl(context.Background(), "delete", "-k", kustomization); err != nil {
			t.Logf("kubectl delete -k deploy/monitoring: %v: %s", err, stderr)
		}
	})
	if got := kubectl(t, "get", "deployment", "-n", "kube-system", "otelcol-events", "-o", "jsonpath={.spec.replicas}/{.spec.strategy.type}"); got != "1/Recreate" {
		t.Errorf("the collector's Deployment: replicas/strategy %s, want 1/Recreate", got)
	}
	saKubeconfig, err := kube.ServiceAccountKubeconfig(t.Context(), "kube-system", "otelcol-events")
	if err != nil {
		t.Fatal(err)
	}

	dir := t.TempDir()
	upstream, errs := filepath.Join(dir, "dns-upstream.json"), filepath.Join(dir, "dns-errors.json")
	override := fmt.Sprintf(`receivers:
  k8sobjects/dns-upstream: {auth_type: kubeConfig}
  k8sobjects/dns-errors: {auth_type: kubeConfig}
exporters:
  file/oncall: {path: %q}
  file/logs: {path: %q}
service:
  telemetry: {metrics: {level: none}}
  pipelines:
    logs/dns-upstream: {exporters: [file/oncall]}
    logs/dns-errors: {exporters: [file/logs]}
`, upstream, errs)
	overridePath := filepath.Join(dir, "test-exporters.yaml")
	if err := os.WriteFile(overridePath, []byte(override), 0o644); err != nil {
		t.Fatal(err)
	}
	startTool(t, "otelcol", dir, []string{"KUBECONFIG=" + saKubeconfig}, otelcol,
		"--config=file:"+recipe, "--config=file:"+overridePath)
	post := func(plugin, level, body string) {
		t.Helper()
		if err := logline.PostAs(t.Context(), c.Logline, plugin, level, 1, body); err != nil {
			t.Fatal(err)
		}
	}
	// The watches are up once a probe line of each route has come out of
	// it; repeats of a probe make MODIFIED notices until then.
	waitFor(t, time.Minute, "both routes to pass a probe line on", func() bool {
		post("forward", "error", routingProbe)
		post("probe", "error", routingProbe)
		time.Sleep(500 * time.Millisecond)
		return !slices.ContainsFunc([]string{upstream, errs}, func(path string) bool {
			return !strings.Contains(readIfThere(path), routingProbe)
		})
	})
	// A repeat of a line raises the count of its event: a MODIFIED. The
	// repeat comes once the event is in the API, so that it is not counted
	// in its create.
	post("forward", "error", "no healthy upstream for 10.0.0.2:53")
	waitEventsFor(t, pod, 30*time.Second, "the event of the first line", func(evs []corev1.Event) bool {
		return slices.ContainsFunc(evs, func(e corev1.Event) bool {
			return strings.HasSuffix(e.Message, "no healthy upstream for 10.0.0.2:53")
		})
	})
	post("forward", "error", "no healthy upstream for 10.0.0.2:53")
	post("forward", "warning", "upstream 10.0.0.2:53 answered slowly")
	post("errors", "error", "2 a.example.org. A: read udp 10.0.0.5:41234->10.0.0.2:53: i/o timeout")
	post("kubernetes", "error", "failed to list *v1.Namespace: i/o timeout")
	post("reload", "warning", "Corefile changed but reload failed")
	post("health", "info", "going into lameduck mode for 5s")
	post("forward", "info", "upstream 10.0.0.2:53 is healthy again")

	// Every line is in the API first, so that a notice routed where it
	// should not be has had time to arrive.
	waitEventsFor(t, pod, 30*time.Second, "7 events, one of count 2, besides the probes", func(evs []corev1.Event) bool {
		var n int32
		evs = slices.DeleteFunc(evs, func(e corev1.Event) bool { return strings.HasSuffix(e.Message, routingProbe) })
		for _, e := range evs {
			n += e.Count
		}
		return len(evs) == 7 && n == 8
	})
	time.Sleep(time.Second)
	want := map[string]map[string]string{
		upstream: {
			"forward/error/ADDED/1":    "plugin/forward: no healthy upstream for 10.0.0.2:53",
			"forward/error/MODIFIED/2": "plugin/forward: no healthy upstream for 10.0.0.2:53",
			"forward/warning/ADDED/1":  "plugin/forward: upstream 10.0.0.2:53 answered slowly",
		},
		errs: {
			"errors/error/ADDED/1":     "plugin/errors: 2 a.example.org. A: read udp 10.0.0.5:41234->10.0.0.2:53: i/o timeout",
			"kubernetes/error/ADDED/1": "plugin/kubernetes: failed to list *v1.Namespace: i/o timeout",
		},
	}
	routed := func(what string) {
		t.Helper()
		got := map[string]map[string]string{}
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(500 * time.Millisecond) {
			for path := range want {
				got[path] = exported(t, path, pod.Name)
			}
			if maps.EqualFunc(got, want, maps.Equal) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: routed:\n%v\nwant:\n%v\nevents: %s", what, got, want, describeOrErr(t, pod))
			}
		}
		t.Logf("%s: routed: %v", what, got)
	}
	routed("before removals")

	// The event TTL removes events: the watches see DELETED, which the
	// recipe does not pass on. A notice comes after every notice before
	// it on the same watch: once a later probe has come out of each
	// route, a DELETED of the events removed before would have too.
	evs, err := events(t.Context(), pod)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range evs {
		if err := kube.Clientset.CoreV1().Events(e.Namespace).Delete(t.Context(), e.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	const afterProbe = "routing probe after the removals"
	waitFor(t, time.Minute, "both routes to pass a probe line after the removals", func() bool {
		post("forward", "error", afterProbe)
		post("probe", "error", afterProbe)
		time.Sleep(500 * time.Millisecond)
		return !slices.ContainsFunc([]string{upstream, errs}, func(path string) bool {
			return !strings.Contains(readIfThere(path), afterProbe)
		})
	})
	routed("after removals")
	for _, path := range []string{upstream, errs} {
		if n := strings.Count(readIfThere(path), `"DELETED"`); n != 0 {
			t.Errorf("%s: %d DELETED notices passed on", filepath.Base(path), n)
		}
	}
}

// routingProbe is the line that tells when the collector's watches are up.
const routingProbe = "routing probe"

// readIfThere is the content of a file, or "" while it is not there.
func readIfThere(path string) string {
	b, _ := os.ReadFile(path)
	return string(b)
}

// exported reads what a file exporter wrote, one OTLP/JSON batch a line, and
// returns the watch notices of events about pod as
// plugin/level/TYPE/count to message.
func exported(t *testing.T, path, pod string) map[string]string {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	out := map[string]string{}
	// The last line may be still being written.
	lines := strings.Split(string(data), "\n")
	for _, line := range lines[:len(lines)-1] {
		var batch struct {
			ResourceLogs []struct {
				ScopeLogs []struct {
					LogRecords []struct {
						Body json.RawMessage `json:"body"`
					} `json:"logRecords"`
				} `json:"scopeLogs"`
			} `json:"resourceLogs"`
		}
		if err := json.Unmarshal([]byte(line), &batch); err != nil {
			t.Fatalf("%s: %v: %s", path, err, line)
		}
		for _, rl := range batch.ResourceLogs {
			for _, sl := range rl.ScopeLogs {
				for _, r := range sl.LogRecords {
					notice, _ := anyValue(t, r.Body).(map[string]any)
					ev, _ := notice["object"].(map[string]any)
					involved, _ := ev["involvedObject"].(map[string]any)
					meta, _ := ev["metadata"].(map[string]any)
					labels, _ := meta["labels"].(map[string]any)
					if involved["name"] != pod {
						continue
					}
					if strings.Contains(fmt.Sprint(ev["message"]), routingProbe) {
						continue
					}
					key := fmt.Sprintf("%v/%v/%v/%v", labels["coredns.io/plugin"], labels["coredns.io/level"], notice["type"], ev["count"])
					out[key] = fmt.Sprint(ev["message"])
				}
			}
		}
	}
	return out
}

// anyValue turns an OTLP/JSON AnyValue into strings, numbers, maps and slices.
func anyValue(t *testing.T, raw json.RawMessage) any {
	var v struct {
		String *string      `json:"stringValue"`
		Int    *json.Number `json:"intValue"`
		Double *float64     `json:"doubleValue"`
		Bool   *bool        `json:"boolValue"`
		KV     *struct {
			Values []struct {
				Key   string
				Value json.RawMessage
			}
		} `json:"kvlistValue"`
		Array *struct{ Values []json.RawMessage } `json:"arrayValue"`
	}
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatalf("an OTLP value: %v: %s", err, raw)
	}
	switch {
	case v.String != nil:
		return *v.String
	case v.Int != nil:
		return v.Int.String()
	case v.Double != nil:
		return *v.Double
	case v.Bool != nil:
		return *v.Bool
	case v.KV != nil:
		m := map[string]any{}
		for _, kv := range v.KV.Values {
			m[kv.Key] = anyValue(t, kv.Value)
		}
		return m
	case v.Array != nil:
		a := make([]any, len(v.Array.Values))
		for i, e := range v.Array.Values {
			a[i] = anyValue(t, e)
		}
		return a
	}
	return nil
}

// describeOrErr lists pod's events for a failure message.
func describeOrErr(t *testing.T, pod *corev1.Pod) string {
	evs, err := events(t.Context(), pod)
	if err != nil {
		return err.Error()
	}
	return describe(evs)
}
