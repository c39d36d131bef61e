//go:build tools

// Package containerd pins the container runtime that the node of the tests
// runs: containerd, its runc shim and ctr, built from source. It is a module
// of its own because containerd's exclude directives keep `go install
// module@version` from building it.
package containerd

import (
	_ "github.com/containerd/containerd/v2/cmd/containerd"
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
	_ "github.com/containerd/containerd/v2/cmd/ctr"
)
