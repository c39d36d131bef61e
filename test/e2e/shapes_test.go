//go:build e2e

package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// shapeOf tells the two shapes of TestStormByShape apart by what the line
// says, as a reader would.
func shapeOf(msg string) string {
	switch {
	case regexp.MustCompile(`^plugin/logline: 2 q\d+\.example\.org\. A: read udp 10\.0\.0\.5:\d+->10\.0\.0\.2:53: i/o timeout$`).MatchString(msg):
		return "timeout"
	case regexp.MustCompile(`^plugin/logline: 2 r\d+\.example\.net\. AAAA: read udp 10\.0\.0\.5:\d+->10\.0\.0\.3:53: read: connection refused$`).MatchString(msg):
		return "refused"
	}
	return "other: " + msg
}

// TestStormByShape logs 200 distinct lines of one shape and 200 of
// another from one plugin, and a few from another plugin: the events of
// each shape add up to 200, none mixes the two, every message is a real
// line, and the plugin label selects each plugin's events, as the recipes
// of docs/monitoring.md do.
func TestStormByShape(t *testing.T) {
	pod := testPod(t)
	c := startFaults(t, pod, faultsCorefile)
	for i := range 200 {
		c.logLine("error", 1, fmt.Sprintf("2 q%d.example.org. A: read udp 10.0.0.5:%d->10.0.0.2:53: i/o timeout", i, 40000+i))
		c.logLine("error", 1, fmt.Sprintf("2 r%d.example.net. AAAA: read udp 10.0.0.5:%d->10.0.0.3:53: read: connection refused", i, 50000+i))
	}
	for i := range 3 {
		c.fail(fmt.Sprintf("storm%d", i))
	}
	evs := waitEventsFor(t, pod, 90*time.Second, "403 lines in events", func(evs []corev1.Event) bool {
		var n int32
		for _, e := range evs {
			n += e.Count
		}
		return n == 403
	})
	perShape := map[string]int32{}
	objects := map[string]int{}
	for _, e := range evs {
		msg := strings.Replace(e.Message, "(combined from similar events): ", "", 1)
		if e.Labels["coredns.io/plugin"] == "errors" {
			continue
		}
		s := shapeOf(msg)
		perShape[s] += e.Count
		objects[s]++
		if e.Labels["coredns.io/plugin"] != "logline" || e.Labels["coredns.io/level"] != "error" {
			t.Errorf("event %s labels %v", e.Name, e.Labels)
		}
	}
	t.Logf("counts by shape %v in %v objects:\n%s", perShape, objects, describe(evs))
	if perShape["timeout"] != 200 || perShape["refused"] != 200 || len(perShape) != 2 {
		t.Errorf("counts by shape %v, want 200 and 200 and nothing else", perShape)
	}
	if objects["timeout"]+objects["refused"] != 10+2 {
		t.Errorf("%v objects, want 10 of their own and one combined per shape", objects)
	}

	// Recipes of docs/monitoring.md.
	names := func(args ...string) []string {
		out := kubectl(t, append([]string{"get", "events", "-n", pod.Namespace, "-o", "jsonpath={.items[*].metadata.name}"}, args...)...)
		f := strings.Fields(out)
		slices.Sort(f)
		return f
	}
	var all, fromErrors, fromLogline []string
	for _, e := range evs {
		all = append(all, e.Name)
		switch e.Labels["coredns.io/plugin"] {
		case "errors":
			fromErrors = append(fromErrors, e.Name)
		case "logline":
			fromLogline = append(fromLogline, e.Name)
		}
	}
	slices.Sort(all)
	slices.Sort(fromErrors)
	slices.Sort(fromLogline)
	for _, check := range []struct {
		args []string
		want []string
	}{
		{[]string{"-l", "coredns.io/plugin=errors"}, fromErrors},
		{[]string{"-l", "coredns.io/plugin=logline"}, fromLogline},
		{[]string{"-l", "coredns.io/plugin=logline,coredns.io/level=error"}, fromLogline},
		{[]string{"-l", "coredns.io/level=warning"}, nil},
		{[]string{"--field-selector", "reason=CoreDNSError,type=Warning"}, all},
		{[]string{"--field-selector", "involvedObject.kind=Pod,involvedObject.name=" + pod.Name}, all},
	} {
		if got := names(check.args...); !slices.Equal(got, check.want) {
			t.Errorf("kubectl get events %s: %d events, want %d", strings.Join(check.args, " "), len(got), len(check.want))
		}
	}
	out := kubectl(t, "events", "-n", pod.Namespace, "--for", "pod/"+pod.Name)
	if n := strings.Count(out, "CoreDNSError"); n != len(all) {
		t.Errorf("kubectl events --for pod/%s lists %d CoreDNSError events, want %d:\n%s", pod.Name, n, len(all), out)
	}
	c.ledger(pod)

	// The alerts of deploy/monitoring name metrics that the plugin defines
	// (a labelled counter has no series until it counts: api_errors_total
	// appears with the first failure).
	rule, err := os.ReadFile(filepath.Join(repoRoot, "deploy", "monitoring", "prometheusrule.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	defs, err := os.ReadFile(filepath.Join(repoRoot, "metrics.go"))
	if err != nil {
		t.Fatal(err)
	}
	defined := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?:Name:\s+|counterVec\(|opts\(|subsystem, )"([a-z_]+)"`).FindAllStringSubmatch(string(defs), -1) {
		defined["coredns_k8s_event_"+m[1]] = true
	}
	exported := c.metrics()
	for _, name := range regexp.MustCompile(`coredns_k8s_event_[a-z_]+`).FindAllString(string(rule), -1) {
		if !defined[name] {
			t.Errorf("prometheusrule.yaml uses %s, which the plugin does not define", name)
		}
		if name != "coredns_k8s_event_api_errors_total" && !strings.Contains(exported, "\n"+name) {
			t.Errorf("prometheusrule.yaml uses %s, which CoreDNS does not export", name)
		}
	}
}
