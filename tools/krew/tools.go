//go:build tools

// Package krew pins the krew whose commands check the kubectl plugin's
// krew manifest and install it from its archives: validate-krew-manifest
// (krew keeps its validation in an internal package) and krew itself.
package krew

import (
	_ "sigs.k8s.io/krew/cmd/krew"
	_ "sigs.k8s.io/krew/cmd/validate-krew-manifest"
)
