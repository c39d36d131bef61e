// Package directives places external plugins in CoreDNS's directive list,
// which orders both setup and the plugin chain.
package directives

import (
	"fmt"
	"slices"

	"github.com/coredns/coredns/core/dnsserver"
)

// InsertBefore puts name just before the directive next, once.
func InsertBefore(name, next string) {
	if slices.Contains(dnsserver.Directives, name) {
		return
	}
	i := slices.Index(dnsserver.Directives, next)
	if i < 0 {
		panic(fmt.Sprintf("directive %q not found", next))
	}
	dnsserver.Directives = slices.Insert(dnsserver.Directives, i, name)
}

// Standard adds kubeapi and k8s_event where plugin.cfg.example puts them:
// both before kubernetes, kubeapi first.
func Standard() {
	InsertBefore("kubeapi", "k8s_external")
	InsertBefore("k8s_event", "k8s_external")
}
