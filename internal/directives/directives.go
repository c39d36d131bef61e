// Package directives places external plugins in CoreDNS's directive list,
// which orders both setup and the plugin chain.
package directives

import (
	"fmt"
	"slices"
	"sync"

	"github.com/coredns/coredns/core/dnsserver"
)

// InsertBefore puts name just before the directive next, once. It changes
// dnsserver.Directives, which CoreDNS reads without a lock: call it from
// main or an init, before any server starts.
func InsertBefore(name, next string) {
	dnsserver.Directives = insertBefore(dnsserver.Directives, name, next)
}

// insertBefore is list with name just before next; list itself when it
// has name.
func insertBefore(list []string, name, next string) []string {
	if slices.Contains(list, name) {
		return list
	}
	i := slices.Index(list, next)
	if i < 0 {
		panic(fmt.Sprintf("directive %q not found", next))
	}
	return slices.Insert(list, i, name)
}

// Standard adds kubeapi and k8s_event where plugin.cfg.example puts them:
// both before kubernetes, kubeapi first. Like InsertBefore, it is for
// main or an init; a program that only reads the list calls Known.
func Standard() {
	dnsserver.Directives = standard(dnsserver.Directives)
}

func standard(list []string) []string {
	list = insertBefore(list, "kubeapi", "k8s_external")
	return insertBefore(list, "k8s_event", "k8s_external")
}

// Known is CoreDNS's directives with kubeapi and k8s_event where Standard
// puts them: the directives of the CoreDNS built with k8s_event. It is
// worked out once, on a copy, and never changes dnsserver.Directives, so
// that any number of goroutines may call it (the installer's runs).
var Known = sync.OnceValue(func() []string {
	return standard(slices.Clone(dnsserver.Directives))
})
