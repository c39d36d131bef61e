//go:build e2e

package cluster

import (
	"os"
	"testing"
)

// TestMain stops the registry that the node tests share: it outlives each
// node, as a cluster's registry does.
func TestMain(m *testing.M) {
	code := m.Run()
	StopSharedRegistry()
	os.Exit(code)
}
