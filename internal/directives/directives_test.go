package directives

import (
	"slices"
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
