// Command coredns is the CoreDNS of cmd/coredns plus logline, a plugin that
// logs on demand, for the end-to-end tests, benchmarks and the demo. It is
// part of the plugin's own module, so it builds on the CoreDNS the plugin's
// go.mod requires (its floor), where cmd/coredns builds on the image's.
package main

import (
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/core/plugin"
	_ "github.com/coredns/kubeapi"
	_ "github.com/dnsops/k8s_event"
	"github.com/dnsops/k8s_event/internal/directives"
	_ "github.com/dnsops/k8s_event/test/plugin/logline"
)

func init() {
	directives.Standard()
	directives.InsertBefore("logline", "template")
}

func main() { coremain.Run() }
