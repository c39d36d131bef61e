//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/wait"
)

// lameduckCorefile has the health plugin hold the servers for a lameduck
// after SIGTERM, while they still answer and log.
const lameduckCorefile = `.:{{.DNS}} {
    kubeapi {
        kubeconfig {{.Kubeconfig}}
    }
    k8s_event {
        rate 100 200
    }
    health {{freeAddr}} {
        lameduck 4s
    }
    errors
    logline {{.Logline}}
    prometheus {{.Metrics}}
    whoami
}
`

// TestSIGUSR1ThenLameduck: caddy's SIGUSR1 handler purges the event hooks
// before its restart. After such a reload, SIGTERM must still keep
// k8s_event listening through the lameduck: every line logged then becomes
// an event, written as CoreDNS exits.
func TestSIGUSR1ThenLameduck(t *testing.T) {
	t.Parallel()
	pod := testPod(t)
	c := startFaults(t, pod, lameduckCorefile)

	c.fail("before-reload")
	want := map[string]int32{failLine("before-reload"): 1}
	waitEvents(t, pod, "the line before the reload", func(evs []corev1.Event) bool { return counts(evs, want) })

	if err := syscall.Kill(c.Pid(), syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	err := wait.PollUntilContextTimeout(t.Context(), 50*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		return c.LogContains("Reloading complete"), nil
	})
	if err != nil {
		t.Fatalf("no SIGUSR1 reload: %v\n%s", err, c.LogTail(50))
	}
	c.fail("after-reload")
	want[failLine("after-reload")] = 1
	waitEvents(t, pod, "the line after the reload", func(evs []corev1.Event) bool { return counts(evs, want) })

	// SIGTERM, then failing queries through the lameduck.
	if err := syscall.Kill(c.Pid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	err = wait.PollUntilContextTimeout(t.Context(), 20*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		return c.LogContains("Going into lameduck mode"), nil
	})
	if err != nil {
		t.Fatalf("no lameduck after SIGTERM: %v\n%s", err, c.LogTail(50))
	}
	const during = 5
	for i := range during {
		name := fmt.Sprintf("lameduck-%d", i)
		if r, err := c.exchange(name+".fail.logline.", dns.TypeA); err != nil || r == nil {
			t.Fatalf("query %d during the lameduck: %v", i, err)
		}
		want[failLine(name)] = 1
	}
	_ = c.Wait(20 * time.Second) // its exit status is not under test
	if !c.Exited() {
		t.Fatal("CoreDNS did not exit within 20 s of SIGTERM")
	}
	evs, err := events(t.Context(), pod)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("after SIGUSR1 and SIGTERM, CoreDNS exited (code %d); events:\n%s", c.ExitCode(), describe(evs))
	if !counts(evs, want) {
		var missing []string
		for m := range want {
			if len(withMessage(evs, m)) == 0 {
				missing = append(missing, m)
			}
		}
		t.Errorf("lines logged during the lameduck are not events: missing %s", strings.Join(missing, "; "))
	}
}
