package version

import (
	"runtime/debug"
	"testing"
)

func TestFromBuildInfo(t *testing.T) {
	for _, tc := range []struct {
		name string
		info debug.BuildInfo
		want string
	}{
		{"go install at a tag", debug.BuildInfo{Main: debug.Module{Path: Module, Version: "v0.3.0"}}, "0.3.0"},
		{
			"go install at a commit",
			debug.BuildInfo{Main: debug.Module{Path: Module, Version: "v0.3.1-0.20261128010203-0123456789ab"}},
			"0.3.1-0.20261128010203-0123456789ab",
		},
		{"go build in a clone", debug.BuildInfo{Main: debug.Module{Path: Module, Version: "(devel)"}}, "devel"},
		{
			"a program of another module that requires it",
			debug.BuildInfo{
				Main: debug.Module{Path: Module + "/cmd/coredns", Version: "(devel)"},
				Deps: []*debug.Module{{Path: "k8s.io/client-go", Version: "v0.35.0"}, {Path: Module, Version: "v0.3.0"}},
			},
			"0.3.0",
		},
		{"a program that does not hold it", debug.BuildInfo{Main: debug.Module{Path: "example.com/other", Version: "v1.0.0"}}, "devel"},
	} {
		if got := fromBuildInfo(&tc.info); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}

func TestLinkedVersionWins(t *testing.T) {
	defer func(v string) { version = v }(version)
	version = "0.3.0"
	if got := String(); got != "0.3.0" {
		t.Errorf("String() = %q with version linked as 0.3.0", got)
	}
}
