// Package release checks what a user takes of a release: the root go.mod
// that `go install …@version` reads, the kubectl plugin built the way
// `go install` builds it, and its krew archives and manifest installed by
// krew and run through kubectl. The last two are end-to-end tests (tag
// e2e).
package release

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/mod/modfile"
)

// repoRoot is the repository's top directory.
func repoRoot(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}").Output()
	if err != nil {
		t.Fatalf("go list -m: %v", err)
	}
	return strings.TrimSpace(string(out))
}

// version is the version in VERSION, without its v.
func version(t *testing.T, root string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "VERSION"))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// `go install …@version` refuses a module whose go.mod has a replace or
// an exclude directive: the root go.mod must have none.
func TestGoModHasNoReplace(t *testing.T) {
	path := filepath.Join(repoRoot(t), "go.mod")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	f, err := modfile.Parse(path, b, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range f.Replace {
		t.Errorf("go.mod:%d: replace %s: `go install github.com/dnsops/k8s_event/cmd/kubectl-k8s_event@VERSION` would refuse the module",
			r.Syntax.Start.Line, r.Old.Path)
	}
	for _, e := range f.Exclude {
		t.Errorf("go.mod:%d: exclude %s: `go install github.com/dnsops/k8s_event/cmd/kubectl-k8s_event@VERSION` would refuse the module",
			e.Syntax.Start.Line, e.Mod.Path)
	}
}
