//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/dnsops/k8s_event/test/plugin/logline"
)

// The accounting contract under real faults, at the default rate: one
// token every 300 s per reason, a burst of 25.

// defaultRateCorefile is faultsCorefile without a rate line.
var defaultRateCorefile = strings.Replace(faultsCorefile, "k8s_event {\n        rate 100 200\n    }", "k8s_event {\n        level warning error fatal\n    }", 1)

// maxLanding is how long after the API's return pending events may take to
// land: one maximal backoff (1 min) and its jitter (20%), and a margin for
// a loaded machine.
const maxLanding = 72*time.Second + 15*time.Second

// sumSeries adds up every series of the metric name in the Prometheus text.
func sumSeries(text, name string) float64 {
	var n float64
	for _, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(l, name+"{") || strings.HasPrefix(l, name+" ") {
			n += metricValue(text, l[:strings.LastIndexByte(l, ' ')])
		}
	}
	return n
}

// dropped is dropped_total over every cause.
func dropped(text string) float64 { return sumSeries(text, "coredns_k8s_event_dropped_total") }

// ledger checks the contract on the running CoreDNS once it is quiet: the
// counts of the pod's events (the ends of storms aside), plus the lines pending, plus the lines
// dropped, are exactly the lines captured.
func (c *coreDNS) ledger(pod *corev1.Pod) {
	c.t.Helper()
	var counts, pending, drop, lines float64
	err := wait.PollUntilContextTimeout(c.t.Context(), 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		evs, err := events(ctx, pod)
		if err != nil {
			return false, nil
		}
		m := c.metrics()
		counts = 0
		for _, e := range evs {
			if strings.HasSuffix(e.Reason, "Ended") {
				continue // the end of a storm carries no lines
			}
			counts += float64(e.Count)
		}
		pending, drop, lines = metricValue(m, pendingLines), dropped(m), sumSeries(m, "coredns_k8s_event_lines_total")
		return counts+pending+drop == lines, nil
	})
	c.t.Logf("ledger: counts in the API %v + pending_lines %v + dropped_total %v = %v; lines_total %v", counts, pending, drop, counts+pending+drop, lines)
	if err != nil {
		c.t.Errorf("the ledger never balanced: counts %v + pending %v + dropped %v != lines %v", counts, pending, drop, lines)
	}
}

// TestOutageAtDefaultRate: CoreDNS runs at the default rate while the API
// server refuses connections for over a minute; one line is logged 20
// times and 5 distinct lines come along. When the API server is back,
// every line lands with its true count within one maximal backoff.
func TestOutageAtDefaultRate(t *testing.T) {
	t.Parallel()
	pod := testPod(t)
	px := newFaultProxy(t, apiserverAddr(), proxyRefuse)
	c := startFaults(t, pod, defaultRateCorefile, withKubeconfig(kubeconfigVia(t, kube.KubeconfigPath, px.addr())))

	const repeated = "logged over and over while the API server is down"
	want := map[string]int32{"plugin/logline: " + repeated: 20}
	start := time.Now()
	for i := range 20 {
		c.logLine("warning", 1, repeated)
		if i%4 == 0 {
			line := fmt.Sprintf("distinct line %d while down", i/4)
			c.logLine("error", 1, line)
			want["plugin/logline: "+line] = 1
		}
		time.Sleep(3 * time.Second)
	}
	if evs, err := events(t.Context(), pod); err != nil || len(evs) != 0 {
		t.Fatalf("events while the API server is unreachable (%v):\n%s", err, describe(evs))
	}
	outage := time.Since(start)
	px.setMode(proxyForward)
	back := time.Now()
	evs := waitEventsFor(t, pod, maxLanding, "every line with its true count", func(evs []corev1.Event) bool {
		return counts(evs, want) && len(evs) == len(want)
	})
	t.Logf("outage %v, %d connections refused, 25 lines of %d messages; all landed %v after the API server came back:\n%s",
		outage.Round(time.Second), px.connections(), len(want), time.Since(back).Round(100*time.Millisecond), describe(evs))
	c.ledger(pod)
}

// TestStopRightAfterOutage: lines wait out their backoff behind an outage;
// the API server comes back and CoreDNS gets SIGTERM at once. The flush
// writes every pending event (the buckets are full: failed connections
// cost no token) before CoreDNS exits, within the flush time.
func TestStopRightAfterOutage(t *testing.T) {
	t.Parallel()
	pod := testPod(t)
	px := newFaultProxy(t, apiserverAddr(), proxyRefuse)
	c := startFaults(t, pod, defaultRateCorefile, withKubeconfig(kubeconfigVia(t, kube.KubeconfigPath, px.addr())))

	want := map[string]int32{}
	for i := range 6 {
		line := fmt.Sprintf("pending at shutdown %d", i)
		c.logLine("warning", i+1, line)
		want["plugin/logline: "+line] = int32(i + 1)
	}
	time.Sleep(20 * time.Second) // the writers back off: 1, 2, 4, 8, 16 s
	if evs, err := events(t.Context(), pod); err != nil || len(evs) != 0 {
		t.Fatalf("events while the API server is unreachable (%v):\n%s", err, describe(evs))
	}
	px.setMode(proxyForward)
	start := time.Now()
	c.Stop(15 * time.Second)
	took := time.Since(start)
	evs, err := events(t.Context(), pod)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("CoreDNS exited %v after SIGTERM (exit code %d); events:\n%s", took.Round(10*time.Millisecond), c.ExitCode(), describe(evs))
	if took > 6*time.Second {
		t.Errorf("CoreDNS took %v to exit, flush time 5 s", took)
	}
	if !counts(evs, want) || len(evs) != len(want) {
		t.Errorf("%d events after the stop, want %d with their counts %v", len(evs), len(want), want)
	}
}

// TestFatalBlackholedAPI: without COREDNS_POD_UID and with an API server
// that takes connections and never answers, a writer is stuck reading the
// pod; a fatal line must not wait for it: CoreDNS exits within 4 s.
func TestFatalBlackholedAPI(t *testing.T) {
	t.Parallel()
	pod := testPod(t)
	px := newFaultProxy(t, apiserverAddr(), proxyBlackhole)
	c := startFaults(t, pod, defaultRateCorefile, withoutUID(), withKubeconfig(kubeconfigVia(t, kube.KubeconfigPath, px.addr())))
	c.logLine("warning", 1, "a writer now waits for the pod's UID")
	time.Sleep(time.Second)
	start := time.Now()
	// CoreDNS exits while it logs: the request gets no answer.
	_ = logline.Post(t.Context(), c.Logline, "fatal", 1, "the end, with the API server silent")
	if err := c.Wait(10 * time.Second); !c.Exited() || c.ExitCode() != 1 {
		t.Fatalf("after a fatal line: %v, exit code %d", err, c.ExitCode())
	}
	took := time.Since(start)
	t.Logf("CoreDNS exited %v after the fatal line (exit code %d), %d connections held by the silent API server", took.Round(10*time.Millisecond), c.ExitCode(), px.connections())
	if took > 4*time.Second {
		t.Errorf("CoreDNS took %v to exit after a fatal line, want at most 4 s", took)
	}
	if !c.LogContains("the end, with the API server silent") {
		t.Errorf("CoreDNS's own FATAL line is missing:\n%s", c.LogTail(20))
	}
}
