//go:build e2e

package node

import (
	"os"
	"testing"

	"github.com/dnsops/k8s_event/internal/cluster"
)

// TestMain stops the image registry that the nodes of the tests pull
// from: one for the whole run, it outlives each node, as a cluster's
// registry outlives its nodes.
func TestMain(m *testing.M) {
	code := m.Run()
	cluster.StopSharedRegistry()
	os.Exit(code)
}
