package directives

import (
	"slices"
	"sync"
	"testing"

	"github.com/coredns/coredns/core/dnsserver"
)

func TestStandard(t *testing.T) {
	saved := slices.Clone(dnsserver.Directives)
	t.Cleanup(func() { dnsserver.Directives = saved })

	Standard()
	Standard() // idempotent
	at := func(name string) int {
		i := slices.Index(dnsserver.Directives, name)
		if i < 0 {
			t.Fatalf("%s missing from %v", name, dnsserver.Directives)
		}
		return i
	}
	if !(at("kubeapi") < at("k8s_event") && at("k8s_event") < at("k8s_external") && at("k8s_external") < at("kubernetes")) {
		t.Errorf("order: %v", dnsserver.Directives)
	}
	if len(dnsserver.Directives) != len(saved)+2 {
		t.Errorf("%d directives, want %d", len(dnsserver.Directives), len(saved)+2)
	}
}

func TestInsertBeforeUnknown(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("no panic for an unknown directive")
		}
	}()
	InsertBefore("x", "no-such-directive")
}

// Known is the standard list, and leaves CoreDNS's own alone: goroutines
// that call it while others read CoreDNS's list do not race.
func TestKnownLeavesCoreDNSsListAlone(t *testing.T) {
	saved := slices.Clone(dnsserver.Directives)
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(2)
		go func() {
			defer wg.Done()
			known := Known()
			if !(slices.Index(known, "kubeapi") < slices.Index(known, "k8s_event") && slices.Index(known, "kubeapi") >= 0) {
				t.Errorf("known: %v", known)
			}
		}()
		go func() {
			defer wg.Done()
			_ = slices.Contains(dnsserver.Directives, "kubeapi")
		}()
	}
	wg.Wait()
	if !slices.Equal(dnsserver.Directives, saved) {
		t.Errorf("CoreDNS's list changed: %v", dnsserver.Directives)
	}
	if len(Known()) != len(saved)+2 {
		t.Errorf("%d known, want %d", len(Known()), len(saved)+2)
	}
}
