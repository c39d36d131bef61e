//go:build e2e

package e2e

import (
	"regexp"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/dnsops/k8s_event/test/plugin/logline"

	corev1 "k8s.io/api/core/v1"
)

// specCorefile is the example of the plugin's documentation, with the reload,
// errors and logline plugins to make CoreDNS log.
const specCorefile = `.:{{.DNS}} {
    kubeapi {
        kubeconfig {{.Kubeconfig}}
    }
    k8s_event {
        level info error warning
        rate 0.15 10 1024
    }
    reload 2s
    errors
    logline {{.Logline}}
    prometheus {{.Metrics}}
    whoami
}
`

const reloadLinePrefix = "plugin/reload: Running configuration SHA512 = "

func TestSpecExample(t *testing.T) {
	pod := testPod(t)
	c := startCoreDNS(t, pod, specCorefile)
	c.fail("spec")
	wantError := "plugin/errors: 2 spec.fail.logline. A: logline: injected failure"

	evs := waitEvents(t, pod, "the reload info and the errors error", func(evs []corev1.Event) bool {
		return len(withMessage(evs, reloadLinePrefix)) == 1 && len(withMessage(evs, wantError)) == 1
	})

	t.Run("api", func(t *testing.T) {
		info := withMessage(evs, reloadLinePrefix)[0]
		if !regexp.MustCompile(`^` + regexp.QuoteMeta(reloadLinePrefix) + `[0-9a-f]{128}$`).MatchString(info.Message) {
			t.Errorf("info message %q, want %q followed by a SHA512", info.Message, reloadLinePrefix)
		}
		checkEvent(t, pod, info, "CoreDNSInfo", corev1.EventTypeNormal)
		errEv := withMessage(evs, wantError)[0]
		if errEv.Message != wantError {
			t.Errorf("error message %q, want %q", errEv.Message, wantError)
		}
		checkEvent(t, pod, errEv, "CoreDNSError", corev1.EventTypeWarning)
	})

	t.Run("metrics", func(t *testing.T) {
		// The values, not only the series (which exist from the start): the
		// error line taken and written by one create, the reload's info line
		// written, nothing pending or dropped.
		m := c.metrics()
		if n := metricValue(m, `coredns_k8s_event_writes_total{reason="CoreDNSInfo",verb="create"}`); n < 1 {
			t.Errorf("writes_total of CoreDNSInfo creates = %v, want at least 1", n)
		}
		for series, want := range map[string]float64{
			`coredns_k8s_event_lines_total{level="error"}`:                        1,
			`coredns_k8s_event_writes_total{reason="CoreDNSError",verb="create"}`: 1,
			`coredns_k8s_event_pending_lines`:                                     0,
		} {
			if got := metricValue(m, series); got != want {
				t.Errorf("%s = %v, want %v", series, got, want)
			}
		}
		if d := dropped(m); d != 0 {
			t.Errorf("dropped_total = %v, want 0", d)
		}
		c.ledger(pod)
	})

	t.Run("kubectl get events", func(t *testing.T) {
		out := kubectl(t, "get", "ev", "-n", pod.Namespace)
		// LAST SEEN is an age such as 5s or 2m3s, never <unknown>.
		for _, row := range []string{
			`\d+[smhd]\S*\s+Normal\s+CoreDNSInfo\s+pod/` + pod.Name + `\s+` + regexp.QuoteMeta(reloadLinePrefix) + `[0-9a-f]+`,
			`\d+[smhd]\S*\s+Warning\s+CoreDNSError\s+pod/` + pod.Name + `\s+` + regexp.QuoteMeta(wantError),
		} {
			if !regexp.MustCompile(`(?m)^` + row + `$`).MatchString(out) {
				t.Errorf("kubectl get ev: no row matches %s\n%s", row, out)
			}
		}
		if !regexp.MustCompile(`(?m)^LAST SEEN\s+TYPE\s+REASON\s+OBJECT\s+MESSAGE$`).MatchString(out) {
			t.Errorf("kubectl get ev: unexpected header\n%s", out)
		}
		if strings.Contains(out, "<unknown>") {
			t.Errorf("kubectl get ev shows <unknown>\n%s", out)
		}
	})

	t.Run("kubectl describe pod", func(t *testing.T) {
		out := kubectl(t, "describe", "pod", pod.Name, "-n", pod.Namespace)
		_, events, ok := strings.Cut(out, "\nEvents:")
		if !ok {
			t.Fatalf("kubectl describe pod: no Events section\n%s", out)
		}
		for _, row := range []string{
			// Type, Reason, Age, From (component[, host]), Message
			`Normal\s+CoreDNSInfo\s+.*\bCoreDNS\b.*\s` + regexp.QuoteMeta(reloadLinePrefix),
			`Warning\s+CoreDNSError\s+.*\bCoreDNS\b.*\s` + regexp.QuoteMeta(wantError),
		} {
			if !regexp.MustCompile(row).MatchString(events) {
				t.Errorf("kubectl describe pod: no event matches %s\nEvents:%s", row, events)
			}
		}
	})

	t.Run("kubectl events --for", func(t *testing.T) {
		out := kubectl(t, "events", "--for", "pod/"+pod.Name, "-n", pod.Namespace)
		for _, row := range []string{
			`Normal\s+CoreDNSInfo\s+Pod/` + pod.Name + `\s+` + regexp.QuoteMeta(reloadLinePrefix),
			`Warning\s+CoreDNSError\s+Pod/` + pod.Name + `\s+` + regexp.QuoteMeta(wantError),
		} {
			if !regexp.MustCompile(row).MatchString(out) {
				t.Errorf("kubectl events --for pod/%s: no row matches %s\n%s", pod.Name, row, out)
			}
		}
	})

	t.Run("kubectl get events --field-selector", func(t *testing.T) {
		infoName := "event/" + withMessage(evs, reloadLinePrefix)[0].Name
		errName := "event/" + withMessage(evs, wantError)[0].Name
		for selector, want := range map[string][]string{
			"reason=CoreDNSError":     {errName},
			"reason=CoreDNSInfo":      {infoName},
			"type=Warning":            {errName},
			"type=Normal":             {infoName},
			"involvedObject.kind=Pod": {infoName, errName},
			"involvedObject.name=" + pod.Name + ",involvedObject.uid=" + string(pod.UID): {infoName, errName},
		} {
			out := kubectl(t, "get", "events", "-n", pod.Namespace, "--field-selector", selector, "-o", "name")
			got := strings.Fields(out)
			if len(got) != len(want) || !containsAll(got, want) {
				t.Errorf("--field-selector %s: got %v, want %v", selector, got, want)
			}
		}
	})
}

// checkEvent checks the fields that make an event visible to kubectl.
func checkEvent(t *testing.T, pod *corev1.Pod, e corev1.Event, reason, typ string) {
	t.Helper()
	want := corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, Namespace: pod.Namespace, UID: pod.UID}
	got := e.InvolvedObject
	got.ResourceVersion, got.FieldPath = "", ""
	if got != want {
		t.Errorf("event %s: involvedObject %+v, want %+v", e.Name, e.InvolvedObject, want)
	}
	if e.Namespace != pod.Namespace {
		t.Errorf("event %s: namespace %q, want %q", e.Name, e.Namespace, pod.Namespace)
	}
	if e.Reason != reason || e.Type != typ {
		t.Errorf("event %s: reason %q type %q, want %q %q", e.Name, e.Reason, e.Type, reason, typ)
	}
	if e.Source.Component != "CoreDNS" {
		t.Errorf("event %s: source.component %q, want CoreDNS", e.Name, e.Source.Component)
	}
	if e.Count < 1 || e.FirstTimestamp.IsZero() || e.LastTimestamp.IsZero() {
		t.Errorf("event %s: count %d firstTimestamp %v lastTimestamp %v, want all set", e.Name, e.Count, e.FirstTimestamp, e.LastTimestamp)
	}
	if e.LastTimestamp.Before(&e.FirstTimestamp) {
		t.Errorf("event %s: lastTimestamp %v before firstTimestamp %v", e.Name, e.LastTimestamp, e.FirstTimestamp)
	}
}

func containsAll(got, want []string) bool {
	for _, w := range want {
		found := false
		for _, g := range got {
			found = found || g == w
		}
		if !found {
			return false
		}
	}
	return true
}

// levelsCorefile reports the default levels: no level line.
const levelsCorefile = `.:{{.DNS}} {
    kubeapi {
        kubeconfig {{.Kubeconfig}}
    }
    k8s_event
    reload 2s
    errors
    logline {{.Logline}}
    whoami
}
`

func TestDefaultLevels(t *testing.T) {
	pod := testPod(t)
	c := startCoreDNS(t, pod, levelsCorefile)
	c.logLine("info", 1, "info-line")
	c.logLine("debug", 1, "debug-line")
	c.logLine("warning", 1, "warning-line")
	c.fail("levels")

	waitEvents(t, pod, "the warning and the error", func(evs []corev1.Event) bool {
		return len(withReason(evs, "CoreDNSWarning")) == 1 && len(withReason(evs, "CoreDNSError")) == 1
	})
	// The info and debug lines came first; give them time to show up all the
	// same if the plugin were to send them.
	settle(t, pod, 2*time.Second, "only warning and error are reported by default", func(evs []corev1.Event) bool {
		return len(evs) == 2
	})
}

func TestRepeatedLine(t *testing.T) {
	pod := testPod(t)
	c := startCoreDNS(t, pod, levelsCorefile)
	const line = "the same line fifty times"
	c.logLine("error", 50, line)

	waitEvents(t, pod, "one event with count 50", func(evs []corev1.Event) bool {
		evs = withMessage(evs, line)
		return len(evs) == 1 && evs[0].Count == 50
	})
	settle(t, pod, time.Second, "a single event with count 50", func(evs []corev1.Event) bool {
		evs = withMessage(evs, line)
		return len(evs) == 1 && evs[0].Count == 50
	})
}

const twoBlocksCorefile = `.:{{.DNS}} {
    kubeapi {
        kubeconfig {{.Kubeconfig}}
    }
    k8s_event {
        level info warning error
    }
    reload 2s
    errors
    logline {{.Logline}}
    whoami
}

example.org:{{.DNS}} {
    kubeapi {
        kubeconfig {{.Kubeconfig}}
    }
    k8s_event {
        level info warning error
    }
    errors
    logline
    whoami
}
`

func TestTwoServerBlocks(t *testing.T) {
	pod := testPod(t)
	c := startCoreDNS(t, pod, twoBlocksCorefile)
	const line = "one line, two server blocks"
	c.logLine("warning", 1, line)
	c.fail("blocks")

	waitEvents(t, pod, "the line, the error and the reload info", func(evs []corev1.Event) bool {
		return len(withMessage(evs, line)) == 1 && len(withReason(evs, "CoreDNSError")) == 1 &&
			len(withMessage(evs, reloadLinePrefix)) == 1
	})
	settle(t, pod, 2*time.Second, "each line once, count 1", func(evs []corev1.Event) bool {
		for _, e := range evs {
			if e.Count != 1 {
				return false
			}
		}
		return len(evs) == 3
	})
}

func TestReload(t *testing.T) {
	pod := testPod(t)
	c := startCoreDNS(t, pod, specCorefile)
	lineA, lineB, lineC := "before the reload", "after the reload", "after the failed reload"
	c.logLine("warning", 1, lineA)
	waitEvents(t, pod, "the first line", func(evs []corev1.Event) bool {
		return len(withMessage(evs, lineA)) == 1
	})

	// The reload plugin hashes the parsed Corefile: a comment is not a
	// change, a new rate is.
	c.reload(strings.Replace(specCorefile, "rate 0.15 10 1024", "rate 0.15 11 1024", 1))
	waitEvents(t, pod, "the reload info of the new configuration", func(evs []corev1.Event) bool {
		return len(withMessage(evs, reloadLinePrefix)) == 2
	})
	c.logLine("warning", 1, lineB)
	c.logLine("warning", 1, lineA)
	waitEvents(t, pod, "the second line once and the first line again", func(evs []corev1.Event) bool {
		a, b := withMessage(evs, lineA), withMessage(evs, lineB)
		return len(b) == 1 && len(a) == 1 && a[0].Count == 2
	})
	settle(t, pod, 2*time.Second, "no duplicates after a reload", func(evs []corev1.Event) bool {
		a, b := withMessage(evs, lineA), withMessage(evs, lineB)
		return len(b) == 1 && b[0].Count == 1 && len(a) == 1 && a[0].Count == 2
	})

	// A Corefile that parses but fails setup: the reload fails and the
	// running configuration stays.
	c.reload(strings.Replace(specCorefile, "level info error warning", "level info error nosuchlevel", 1))
	waitEvents(t, pod, "the failed reload error", func(evs []corev1.Event) bool {
		return len(withMessage(evs, "plugin/reload: Corefile changed but reload failed")) == 1
	})
	c.logLine("warning", 1, lineC)
	c.fail("after-failed-reload")
	waitEvents(t, pod, "events after a failed reload", func(evs []corev1.Event) bool {
		return len(withMessage(evs, lineC)) == 1 && len(withMessage(evs, "after-failed-reload.fail.logline.")) == 1
	})
	settle(t, pod, 2*time.Second, "no duplicates after a failed reload", func(evs []corev1.Event) bool {
		c := withMessage(evs, lineC)
		return len(c) == 1 && c[0].Count == 1
	})
}

func TestFatal(t *testing.T) {
	pod := testPod(t)
	// fatal is not among the default levels.
	c := startCoreDNS(t, pod, strings.Replace(levelsCorefile, "k8s_event\n", "k8s_event {\n        level warning error fatal\n    }\n", 1))
	const line = "the end is near"
	// CoreDNS exits while it logs: the request gets no answer.
	_ = logline.Post(t.Context(), c.Logline, "fatal", 1, line)
	if err := c.Wait(timeout); err == nil || c.ExitCode() != 1 {
		t.Fatalf("after a fatal line: exit code %d (%v), want 1", c.ExitCode(), err)
	}
	evs := waitEvents(t, pod, "the fatal event", func(evs []corev1.Event) bool {
		return len(withReason(evs, "CoreDNSFatal")) == 1
	})
	e := withReason(evs, "CoreDNSFatal")[0]
	if want := "plugin/logline: " + line; e.Message != want {
		t.Errorf("fatal message %q, want %q", e.Message, want)
	}
	checkEvent(t, pod, e, "CoreDNSFatal", corev1.EventTypeWarning)
}

func TestMessageVerbatim(t *testing.T) {
	pod := testPod(t)
	c := startCoreDNS(t, pod, levelsCorefile)

	t.Run("percent", func(t *testing.T) {
		const line = "100%d done %s %!x %%"
		c.logLine("warning", 1, line)
		evs := waitEvents(t, pod, "the line with verbs", func(evs []corev1.Event) bool {
			return len(withMessage(evs, "done")) == 1
		})
		if got, want := withMessage(evs, "done")[0].Message, "plugin/logline: "+line; got != want {
			t.Errorf("message %q, want %q", got, want)
		}
	})

	for _, tc := range []struct{ name, line string }{
		{"two-byte runes", "a" + strings.Repeat("é", 2500)},
		{"three-byte runes", "b" + strings.Repeat("日", 1700)},
		{"four-byte runes", "cc" + strings.Repeat("🙂", 1300)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			full := "plugin/logline: " + tc.line
			c.logLine("warning", 1, tc.line)
			evs := waitEvents(t, pod, "the long line", func(evs []corev1.Event) bool {
				return len(withMessage(evs, "plugin/logline: "+tc.line[:1])) == 1
			})
			got := withMessage(evs, "plugin/logline: "+tc.line[:1])[0].Message
			if !utf8.ValidString(got) {
				t.Fatalf("message is not valid UTF-8 (%d bytes): ...%q", len(got), got[max(0, len(got)-32):])
			}
			if len(got) > 1024 {
				t.Errorf("message has %d bytes, want at most 1024", len(got))
			}
			// The line is cut in its middle, on rune boundaries: its start
			// and its end are kept, with a short marker between them.
			head := commonPrefix(got, full)
			tail := commonSuffix(got[len(head):], full)
			if marker := got[len(head) : len(got)-len(tail)]; len(marker) > 32 {
				t.Errorf("message departs from the line after %d bytes and before its last %d: %q", len(head), len(tail), marker)
			}
			if len(head) < 400 || len(tail) < 400 {
				t.Errorf("message keeps %d bytes of the line's start and %d of its end, want the start and the end", len(head), len(tail))
			}
			if kept := len(head) + len(tail); kept < 1024-32-2*utf8.UTFMax {
				t.Errorf("message keeps %d bytes of the line, cut too short", kept)
			}
		})
	}
}

// commonSuffix returns the longest suffix of a that b shares, moved forward
// to a rune boundary of a.
func commonSuffix(a, b string) string {
	n := 0
	for n < len(a) && n < len(b) && a[len(a)-1-n] == b[len(b)-1-n] {
		n++
	}
	for n > 0 && !utf8.RuneStart(a[len(a)-n]) {
		n--
	}
	return a[len(a)-n:]
}

// commonPrefix returns the longest prefix of a that b shares, cut back to a
// rune boundary of a.
func commonPrefix(a, b string) string {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	for n > 0 && n < len(a) && !utf8.RuneStart(a[n]) {
		n--
	}
	return a[:n]
}
