// Package version is the version of k8s_event that its programs show: the
// one in the repository's VERSION file, which a release's tag (vVERSION)
// repeats.
//
// `make` links it in (-X github.com/dnsops/k8s_event/internal/version.version=VERSION).
// A program built by `go install …@vVERSION` has no link flags: it reads
// the module's version from its build information instead, which for a tag
// is that tag and for a commit a pseudo-version naming it.
package version

import (
	"runtime/debug"
	"strings"
)

// Module is the path of the module whose version this is.
const Module = "github.com/dnsops/k8s_event"

// version is set by the linker; empty when it was not.
var version string

// String returns the version without its v, e.g. 0.3.0, or "devel" for a
// build with neither link flags nor a module version (`go build` in a
// clone).
func String() string {
	if version != "" {
		return version
	}
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "devel"
	}
	return fromBuildInfo(info)
}

// fromBuildInfo returns the version of Module that info names: the main
// module's when the program is in Module, else the dependency's.
func fromBuildInfo(info *debug.BuildInfo) string {
	m := &info.Main
	if m.Path != Module {
		m = nil
		for _, d := range info.Deps {
			if d.Path == Module {
				m = d
				break
			}
		}
	}
	if m == nil || m.Version == "" || m.Version == "(devel)" {
		return "devel"
	}
	return strings.TrimPrefix(m.Version, "v")
}
