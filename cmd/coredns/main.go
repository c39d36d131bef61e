// Command coredns is CoreDNS with every in-tree plugin plus kubeapi and k8s_event.
package main

import (
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/core/plugin" // every in-tree plugin
	_ "github.com/coredns/kubeapi"
	_ "github.com/dnsops/k8s_event"
	"github.com/dnsops/k8s_event/internal/directives"
)

func init() { directives.Standard() }

func main() { coremain.Run() }
