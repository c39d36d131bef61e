//go:build e2e

package e2e

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/dnsops/k8s_event/internal/cluster"
)

// TestAlertingRules checks the alerts of deploy/monitoring/prometheusrule.yaml
// with Prometheus's own tools: promtool checks the rules and runs their unit
// tests (testdata/prometheusrule-tests.yaml), then a real Prometheus loads the
// rules and scrapes a real CoreDNS whose writes fail, and its alerts must be
// the ones the rules promise, on the series the plugin really exports.
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
	pod := testPod(t).DeepCopy()
	pod.Namespace = "no-such-namespace-" + strconv.FormatInt(time.Now().UnixNano()%1e6, 36)
	c := startCoreDNS(t, pod, strings.Replace(faultsCorefile, "rate 100 200", "rate 100 200 2", 1))

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
`, rules, c.Metrics, pod.Namespace, pod.Name)
	configPath := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(configPath, []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	p, err := cluster.StartProcess("prometheus", filepath.Join(dir, "prometheus.log"), nil, prom,
		"--config.file="+configPath, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+web)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.Stop(5 * time.Second)
		if t.Failed() {
			t.Logf("prometheus log:\n%s", p.LogTail(30))
		}
	})

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
	want := map[string]string{
		"CoreDNSEventLinesDropped/cause=evicted": "firing",
		"CoreDNSEventWritesFailing/code=404":     "pending", // for 15m
		"CoreDNSEventsNotDraining/":              "pending", // for 30m
	}
	var got map[string]string
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(time.Second) {
		got = alerts(t, web, pod.Namespace, pod.Name)
		if maps.Equal(got, want) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("alerts after a minute: %v, want %v\nplugin metrics:\n%s", got, want, c.metrics())
		}
	}
	t.Logf("alerts: %v; plugin: %s=%v, %s=%v, dropped=%v", got, errors404, c.metric(errors404),
		pendingLines, c.metric(pendingLines), dropped(c.metrics()))
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
