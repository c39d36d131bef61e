package image

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// Version is a CoreDNS release, e.g. 1.13.1.
type Version struct{ Major, Minor, Patch int }

func (v Version) String() string { return fmt.Sprintf("%d.%d.%d", v.Major, v.Minor, v.Patch) }

// Less tells whether v is an older release than w.
func (v Version) Less(w Version) bool {
	if v.Major != w.Major {
		return v.Major < w.Major
	}
	if v.Minor != w.Minor {
		return v.Minor < w.Minor
	}
	return v.Patch < w.Patch
}

// ParseVersion parses a CoreDNS release, with or without its v: 1.13.1,
// v1.13.1.
func ParseVersion(s string) (Version, error) {
	m := versionRE.FindStringSubmatch(s)
	if m == nil || m[0] != s {
		return Version{}, fmt.Errorf("CoreDNS version %q: want MAJOR.MINOR.PATCH, e.g. 1.13.1", s)
	}
	return versionOf(m), nil
}

// versionRE is a release at the start of a tag: an optional v, then
// MAJOR.MINOR.PATCH.
var versionRE = regexp.MustCompile(`^v?(\d+)\.(\d+)\.(\d+)`)

func versionOf(m []string) Version {
	var n [3]int
	for i := range n {
		n[i], _ = strconv.Atoi(m[i+1])
	}
	return Version{n[0], n[1], n[2]}
}

// Reference is an image reference taken apart: NAME[:TAG][@DIGEST].
type Reference struct {
	Name   string // registry and repository, e.g. registry.k8s.io/coredns/coredns
	Tag    string // empty when the reference has none
	Digest string // e.g. sha256:..., empty when the reference has none
}

// ParseReference takes an image reference apart. A port in the registry
// (localhost:5000/coredns) is not a tag.
func ParseReference(ref string) Reference {
	var r Reference
	ref, r.Digest, _ = strings.Cut(ref, "@")
	r.Name = ref
	if i := strings.LastIndexByte(ref, ':'); i > strings.LastIndexByte(ref, '/') {
		r.Name, r.Tag = ref[:i], ref[i+1:]
	}
	return r
}

// CoreDNSVersion is the CoreDNS release an image runs, read from its tag
// the way kubeadm reads it: the stock images' tags are the release
// (registry.k8s.io/coredns/coredns:v1.13.1, coredns/coredns:1.13.1) or
// start with it (managed offerings' builds, e.g. v1.11.3-eksbuild.1), and
// k8s_event's images' tags start with it too (1.13.1-0.2.0-3f2a9c01d4e5:
// CoreDNS, k8s_event, content). ok is false when the tag says nothing of
// the version: no tag, only a digest, or latest.
func CoreDNSVersion(ref string) (v Version, ok bool) {
	m := versionRE.FindStringSubmatch(ParseReference(ref).Tag)
	if m == nil {
		return Version{}, false
	}
	return versionOf(m), true
}
