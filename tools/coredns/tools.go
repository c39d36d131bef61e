//go:build tools

// Package coredns pins the stock CoreDNS that the node's lifecycle test
// starts from: the release kubeadm v1.35 installs, built from that
// release's own module (its own requirements, no kubeapi, no k8s_event),
// as registry.k8s.io/coredns/coredns is.
package coredns

import _ "github.com/coredns/coredns"
