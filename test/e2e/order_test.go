//go:build e2e

package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/dnsops/k8s_event/test/plugin/logline"

	corev1 "k8s.io/api/core/v1"
)

// slowRateCorefile refills each bucket every 5 s, one token at most.
const slowRateCorefile = `.:{{.DNS}} {
    kubeapi {
        kubeconfig {{.Kubeconfig}}
    }
    k8s_event {
        rate 0.2 1
    }
    errors
    logline {{.Logline}}
    whoami
}
`

// TestNewLineOfAnotherPluginIsWrittenWithinOneRefill: one plugin's
// backlog of distinct error lines, which takes minutes to write at
// `rate 0.2 1`, holds back another plugin's first error line by no more
// than the next refill (5 s) and its write.
func TestNewLineOfAnotherPluginIsWrittenWithinOneRefill(t *testing.T) {
	pod := testPod(t)
	c := startCoreDNS(t, pod, slowRateCorefile)
	for i := range 40 {
		c.logLine("error", 1, fmt.Sprintf("2 q%d.example.net. A: read udp 10.0.0.5:%d->10.0.0.2:53: i/o timeout", i, 40000+i))
	}
	waitEvents(t, pod, "the first line of the backlog", func(evs []corev1.Event) bool { return len(evs) > 0 })
	const line = "Corefile changed but reload failed"
	logged := time.Now()
	if err := logline.PostAs(t.Context(), c.Logline, "reload", "error", 1, line); err != nil {
		t.Fatal(err)
	}
	const bound = 5*time.Second + 4*time.Second // one refill, and a few seconds for the write and the poll
	evs := waitEventsFor(t, pod, bound, "the reload line within one refill", func(evs []corev1.Event) bool {
		return len(withMessage(evs, "plugin/reload: "+line)) == 1
	})
	backlog := 0
	for _, ev := range evs {
		if strings.HasPrefix(ev.Message, "plugin/logline: ") || strings.HasPrefix(ev.Message, "plugin/errors: ") {
			backlog++
		}
	}
	t.Logf("the reload line was an event %v after it was logged, %d events of the backlog written meanwhile", time.Since(logged).Round(100*time.Millisecond), backlog)
}
