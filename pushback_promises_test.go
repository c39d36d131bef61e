package k8s_event

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestTooManyRequestsAddsAtMostItsHoldAndGapsToALinesWait: "A 429 adds its hold and at most
// 2.4 s of gaps to every bound on a line's wait". After a 429, the gap halves only with writes
// that succeed: writes refused for good (422) keep it at a second, and a new line of a quiet
// plugin, whose turn comes after the plugins waiting before it, waits a second for each.
func TestTooManyRequestsAddsAtMostItsHoldAndGapsToALinesWait(t *testing.T) {
	const qps, plugins = 100.0, 30
	h, api, clk := newTestHarness(t, testConfig(all, qps, 1000, 256))
	first := true
	api.setFault(func(r apiRequest) fault {
		switch {
		case r.resource != "events":
			return fault{}
		case first:
			first = false
			return fault{code: http.StatusTooManyRequests, retryAfter: 2}
		case strings.Contains(sending(h), "bad"):
			return fault{code: http.StatusUnprocessableEntity}
		}
		return fault{}
	})
	h.observe(ln(levelError, "bad0", "trigger", clk.Now()))
	drain(h) // 429, Retry-After 2 s
	until := h.s.push.until
	for i := 1; i <= plugins; i++ {
		h.observe(ln(levelError, fmt.Sprint("bad", i), "refused", clk.Now()))
	}
	h.advance(until.Sub(clk.Now()))
	logged := clk.Now()
	h.observe(ln(levelError, "fresh", "upstream down", logged))
	h.advance(2 * time.Minute)
	var wrote time.Time
	api.mu.Lock()
	for _, r := range api.requests {
		if strings.Contains(r.plugin, "fresh") {
			wrote = r.at
			break
		}
	}
	api.mu.Unlock()
	// (1 + the plugins before it) refills, its write's time (10 s), and at most 2.4 s of gaps
	bound := time.Duration(float64(1+plugins+1)/qps*float64(time.Second)) + writeTimeout +
		2400*time.Millisecond
	if wrote.IsZero() || wrote.Sub(logged) > bound {
		t.Errorf("the fresh line logged at the hold's end was written after %v, want within %v",
			wrote.Sub(logged), bound)
	}
}

// sending is the plugin of the event of the latest request the scheduler handed out: the one
// being sent, in the stepped harness.
func sending(h *harness) string {
	var last uint64
	plugin := ""
	for id, f := range h.s.flights {
		if id > last && f.j != nil {
			last, plugin = id, f.j.key.plugin
		}
	}
	return plugin
}
