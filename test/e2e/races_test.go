//go:build e2e

package e2e

import "testing"

// TestCaddyHookRace: the race of caddy's signal goroutine with a setup that
// registered a shutdown callback is caddy's; a race in k8s_event's own
// state is not.
func TestCaddyHookRace(t *testing.T) {
	caddys := `Read at 0x00c0000017b0 by goroutine 87:
  github.com/coredns/caddy.(*Instance).ShutdownCallbacks()
  github.com/coredns/caddy.allShutdownCallbacks()
  github.com/coredns/caddy.trapSignalsPosix.func1.executeShutdownCallbacks.3()
Previous write at 0x00c0000017b0 by main goroutine:
  github.com/coredns/caddy.(*Controller).OnShutdown()
  github.com/dnsops/k8s_event.setup()
  github.com/coredns/caddy.executeDirectives()`
	ours := `Read at 0x00c000123456 by goroutine 12:
  github.com/dnsops/k8s_event.(*pipeline).take()
Previous write at 0x00c000123456 by goroutine 40:
  github.com/dnsops/k8s_event.(*pipeline).apply()`
	if !caddyHookRace(caddys) {
		t.Error("caddy's hook race not told")
	}
	if caddyHookRace(ours) {
		t.Error("a race in k8s_event's state taken for caddy's")
	}
}
