//go:build e2e

package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/dnsops/k8s_event/internal/cluster"
	"github.com/dnsops/k8s_event/test/plugin/logline"
)

// quietCorefile is faultsCorefile with a short quiet time, so that a
// storm's end is said within the test.
var quietCorefile = strings.Replace(faultsCorefile, "rate 100 200", "rate 100 200\n        quiet 3s", 1)

const (
	stormQuiet = 3 * time.Second
	endedError = "CoreDNSErrorEnded"
)

// stormOf logs n distinct lines of one shape from the errors plugin,
// numbered from from: one combined event.
func stormOf(t *testing.T, c *coreDNS, from, n int) {
	t.Helper()
	for i := from; i < from+n; i++ {
		body := fmt.Sprintf("2 q%d.example.net. A: read udp 10.0.0.5:%d->10.0.0.2:53: i/o timeout", i, 40000+i)
		if err := logline.PostAs(t.Context(), c.Logline, "errors", "error", 1, body); err != nil {
			t.Fatal(err)
		}
	}
}

// warnings are the storm's Warning events, ended are the end events.
func warningsIn(evs []corev1.Event) []corev1.Event { return withReason(evs, "CoreDNSError") }
func endedIn(evs []corev1.Event) []corev1.Event    { return withReason(evs, endedError) }

// combinedIn are the combined events: the first lines of a shape are
// events of their own (of count 1, no storm), the rest are one combined
// event, the storm.
func combinedIn(evs []corev1.Event) []corev1.Event {
	return withMessage(warningsIn(evs), "(combined from similar events): ")
}

func total(evs []corev1.Event) (n int32) {
	for _, e := range evs {
		n += e.Count
	}
	return n
}

// stormShape is the shape of stormOf's lines, which an end quotes: what
// the storm was about, never one client's line.
const stormShape = "<n> <name>. <type>: read udp <ip>-><ip>: i/o timeout"

// wantEnd checks an end event against the storm event it ends: a Normal
// event with the storm's labels, about the same pod, and a message that
// names the storm's shape, its lines since it began and its first and last
// time (the times of the combined event's lines of this storm).
func wantEnd(t *testing.T, end, storm corev1.Event, lines int32, from string) {
	t.Helper()
	if end.Type != corev1.EventTypeNormal {
		t.Errorf("end event type %s, want Normal", end.Type)
	}
	for _, l := range []string{"coredns.io/plugin", "coredns.io/level"} {
		if end.Labels[l] != storm.Labels[l] {
			t.Errorf("end event label %s=%q, the storm's %q", l, end.Labels[l], storm.Labels[l])
		}
	}
	if end.InvolvedObject.Name != storm.InvolvedObject.Name || end.InvolvedObject.UID != storm.InvolvedObject.UID {
		t.Errorf("end event about %s/%s, the storm's about %s/%s", end.InvolvedObject.Name, end.InvolvedObject.UID, storm.InvolvedObject.Name, storm.InvolvedObject.UID)
	}
	want := fmt.Sprintf("plugin/errors: %d lines like %q from %s to %s, none since", lines, stormShape,
		from, storm.LastTimestamp.UTC().Format(time.TimeOnly))
	if end.Message != want {
		t.Errorf("end event message\n%s\nwant\n%s", end.Message, want)
	}
}

// endFrom is the first time an end's message names ("from HH:MM:SS").
func endFrom(t *testing.T, end corev1.Event) string {
	t.Helper()
	_, rest, ok := strings.Cut(end.Message, " from ")
	if !ok || len(rest) < len(time.TimeOnly) {
		t.Fatalf("end event message names no first time: %q", end.Message)
	}
	return rest[:len(time.TimeOnly)]
}

// TestStormEnds: a storm of one shape goes quiet, and after quiet exactly
// one CoreDNSErrorEnded event says so, with the storm's shape, total,
// times and labels; the storm comes back on the same Warning object, whose
// count goes on, and ends a second time, the end speaking of the second
// storm's lines alone.
func TestStormEnds(t *testing.T) {
	pod := testPod(t)
	c := startFaults(t, pod, quietCorefile)

	stormOf(t, c, 0, 40)
	evs := waitEventsFor(t, pod, time.Minute, "the storm's 40 lines, then its end", func(evs []corev1.Event) bool {
		return total(warningsIn(evs)) == 40 && len(endedIn(evs)) == 1
	})
	first := combinedIn(evs)
	if len(first) != 1 {
		t.Fatalf("%d combined events for a storm of one shape, want 1:\n%s", len(first), describe(evs))
	}
	firstEnd := endedIn(evs)[0]
	wantEnd(t, firstEnd, first[0], first[0].Count, first[0].FirstTimestamp.UTC().Format(time.TimeOnly))
	// Exactly one: no second end while nothing happens.
	settle(t, pod, 2*stormQuiet, "one end event while the storm stays quiet", func(evs []corev1.Event) bool {
		return len(endedIn(evs)) == 1 && total(warningsIn(evs)) == 40
	})
	if n := c.metric(`coredns_k8s_event_ended_total{reason="CoreDNSErrorEnded"}`); n != 1 {
		t.Errorf("ended_total=%v after one end, want 1", n)
	}

	// The storm comes back: its lines count on the same combined event.
	stormOf(t, c, 1000, 25)
	evs = waitEventsFor(t, pod, time.Minute, "the second storm's 25 lines on the same combined event, then its end", func(evs []corev1.Event) bool {
		return len(combinedIn(evs)) == 1 && total(warningsIn(evs)) == 65 && len(endedIn(evs)) == 2
	})
	storm := combinedIn(evs)[0]
	if storm.Name != first[0].Name || storm.Count != first[0].Count+25 {
		t.Errorf("the storm came back as %s count %d, want %s count %d", storm.Name, storm.Count, first[0].Name, first[0].Count+25)
	}
	var second corev1.Event
	for _, e := range endedIn(evs) {
		if e.Name != firstEnd.Name {
			second = e
		}
	}
	wantEnd(t, second, storm, 25, endFrom(t, second))
	if n := c.metric(`coredns_k8s_event_ended_total{reason="CoreDNSErrorEnded"}`); n != 2 {
		t.Errorf("ended_total=%v after two ends, want 2", n)
	}
	// The dashboard's ended storms panel has data now.
	if out := c.metrics(); !strings.Contains(out, `coredns_k8s_event_writes_total{reason="CoreDNSErrorEnded",verb="create"} 2`) {
		t.Errorf("writes_total of the end events, want 2 creates:\n%s", out)
	}
}

// TestStormEndsOff: with quiet off, a storm that goes quiet says nothing.
func TestStormEndsOff(t *testing.T) {
	pod := testPod(t)
	c := startFaults(t, pod, strings.Replace(quietCorefile, "quiet 3s", "quiet off", 1))
	stormOf(t, c, 0, 40)
	waitEventsFor(t, pod, time.Minute, "the storm's 40 lines", func(evs []corev1.Event) bool {
		return total(warningsIn(evs)) == 40
	})
	settle(t, pod, 3*stormQuiet, "no end event with quiet off", func(evs []corev1.Event) bool {
		return len(endedIn(evs)) == 0
	})
}

// TestQuietRefused: a bad quiet value stops CoreDNS with an error that
// names the option and the value.
func TestQuietRefused(t *testing.T) {
	pod := testPod(t)
	for _, tc := range []struct{ value, want string }{
		{"5", `quiet must be a duration such as 5m, or off: "5"`},
		{"0s", "quiet must be in range [1s, 24h0m0s], or off: 0s"},
		{"48h", "quiet must be in range [1s, 24h0m0s], or off: 48h"},
		{"soon", `quiet must be a duration such as 5m, or off: "soon"`},
	} {
		t.Run(tc.value, func(t *testing.T) {
			dir := t.TempDir()
			port, err := cluster.FreeDNSPort()
			if err != nil {
				t.Fatal(err)
			}
			conf := filepath.Join(dir, "Corefile")
			corefile := ".:" + strconv.Itoa(port) + " {\nkubeapi {\n kubeconfig " + kube.KubeconfigPath + "\n}\nk8s_event {\n quiet " + tc.value + "\n}\nwhoami\n}\n"
			if err := os.WriteFile(conf, []byte(corefile), 0o644); err != nil {
				t.Fatal(err)
			}
			p, err := cluster.StartProcess("coredns", filepath.Join(dir, "coredns.log"), podEnv(pod), corednsBin, "-conf", conf)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { p.Stop(5 * time.Second) })
			_ = p.Wait(timeout)
			if !p.Exited() {
				t.Fatalf("CoreDNS did not exit:\n%s", p.LogTail(20))
			}
			if p.ExitCode() == 0 {
				t.Errorf("exit code 0 for %q", corefile)
			}
			if !strings.Contains(p.Log(), tc.want) {
				t.Errorf("log lacks %q:\n%s", tc.want, p.LogTail(20))
			}
		})
	}
}
