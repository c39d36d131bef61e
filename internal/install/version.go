package install

import (
	"fmt"

	imageref "github.com/dnsops/k8s_event/internal/image"
)

// release is the CoreDNS release that ref runs, as its tag names it, or
// "unknown".
func release(ref string) string {
	if v, ok := imageref.CoreDNSVersion(ref); ok {
		return v.String()
	}
	return "unknown"
}

// releaseOf says which CoreDNS release ref runs, for a message.
func releaseOf(ref string) string {
	if v, ok := imageref.CoreDNSVersion(ref); ok {
		return "CoreDNS " + v.String() + " (image " + ref + ")"
	}
	return "image " + ref + ", whose tag does not name its CoreDNS release"
}

// buildHint says how to build k8s_event on the release ref runs.
func buildHint(ref string) string {
	if v, ok := imageref.CoreDNSVersion(ref); ok {
		return fmt.Sprintf("make image COREDNS_VERSION=%s builds it, and prints its reference", v)
	}
	return "make image COREDNS_VERSION=<that release> builds it, and prints its reference"
}
