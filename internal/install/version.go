package install

import (
	"fmt"

	imageref "github.com/dnsops/k8s_event/internal/image"
)

// release is the CoreDNS release that ref runs, as its tag names it, or
// "unknown". A node-cache image's tag is node-cache's release.
func release(ref string) string {
	if v, ok := imageref.CoreDNSVersion(ref); ok && !isNodeCacheImage(ref) {
		return v.String()
	}
	return "unknown"
}

// releaseOf says which CoreDNS release ref runs, for a message.
func releaseOf(ref string) string {
	if isNodeCacheImage(ref) {
		return "node-cache image " + ref + ", whose tag is node-cache's release, not CoreDNS's"
	}
	if v, ok := imageref.CoreDNSVersion(ref); ok {
		return "CoreDNS " + v.String() + " (image " + ref + ")"
	}
	return "image " + ref + ", whose tag does not name its CoreDNS release"
}

// buildHint says how to build k8s_event on the release ref runs.
func buildHint(ref string) string {
	if isNodeCacheImage(ref) {
		return "docs/install.md, node-local-dns, builds node-cache with k8s_event"
	}
	if v, ok := imageref.CoreDNSVersion(ref); ok {
		return fmt.Sprintf("make image COREDNS_VERSION=%s builds it, and prints its reference", v)
	}
	return "make image COREDNS_VERSION=<that release> builds it, and prints its reference"
}

// checkRelease compares the CoreDNS release of the image the Deployment
// runs with that of Options.Image: it returns why the install must not
// change the release with it, unless forced.
func (pl *planner) checkRelease(t *target, running string) ([]string, error) {
	o, d := pl.o, t.w
	pl.rep.CoreDNSBefore = release(running)
	if o.Image == "" {
		return nil, fmt.Errorf("%w: %s runs %s; name the image of k8s_event on that release (%s)", ErrNoImage, ref(d), releaseOf(running), buildHint(running))
	}
	pl.rep.CoreDNSAfter = release(o.Image)
	if isNodeCacheImage(running) {
		pl.checkNodeCacheRelease(running)
		return nil, nil
	}
	before, after := pl.rep.CoreDNSBefore, pl.rep.CoreDNSAfter
	if before == after && before != "unknown" {
		return nil, nil
	}
	why := fmt.Sprintf("image %s runs %s and %s %s: the install would change the CoreDNS release too (CoreDNS %s -> %s)", o.Image, releaseOf(o.Image), ref(d), releaseOf(running), before, after)
	if before != "unknown" && after != "unknown" && !o.Force {
		return []string{why + "; name the image of k8s_event on the release it runs (" + buildHint(running) + "), or --force to change the release with it"}, nil
	}
	pl.warn(why)
	return nil, nil
}
