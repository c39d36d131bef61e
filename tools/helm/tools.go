//go:build tools

// Package helm pins the helm that renders deploy/helm/values.yaml over the
// official CoreDNS chart for the node's end-to-end test data, built from
// source.
package helm

import _ "helm.sh/helm/v3/cmd/helm"
