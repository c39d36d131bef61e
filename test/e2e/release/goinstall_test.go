//go:build e2e

package release

import (
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/mod/module"
	"golang.org/x/mod/zip"
)

// TestGoInstall builds the kubectl plugin as `go install
// github.com/dnsops/k8s_event/cmd/kubectl-k8s_event@vVERSION` does on a
// user's machine: from the module's zip, made of the files a tag would
// hold, served by a file proxy that stands before the module cache's own
// download directory (so nothing is fetched or rebuilt that need not be),
// outside any module. The program says VERSION, read from its build
// information: no link flag sets it. The checksum database is off: the
// module is not published, and its dependencies' sums are those the
// module cache holds (docs/release.md checks the published tag).
func TestGoInstall(t *testing.T) {
	root := repoRoot(t)
	v := version(t, root)
	mod := module.Version{Path: "github.com/dnsops/k8s_event", Version: "v" + v}
	proxy := t.TempDir()
	serveModule(t, root, proxy, mod)

	gomodcache := goEnv(t, "GOMODCACHE")
	gobin := t.TempDir()
	cmd := exec.CommandContext(t.Context(), "go", "install", mod.Path+"/cmd/kubectl-k8s_event@"+mod.Version)
	cmd.Dir = t.TempDir()
	cmd.Env = append(os.Environ(),
		"GOPROXY=file://"+proxy+",file://"+filepath.Join(gomodcache, "cache", "download"),
		"GOSUMDB=off", "GOFLAGS=-mod=mod", "GOWORK=off", "GOTOOLCHAIN=local", "GOBIN="+gobin)
	start := time.Now()
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go install %s@%s: %v\n%s", mod.Path+"/cmd/kubectl-k8s_event", mod.Version, err, out)
	}
	t.Logf("go install took %v", time.Since(start).Round(time.Second))

	out, err := exec.Command(filepath.Join(gobin, "kubectl-k8s_event"), "version").CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl-k8s_event version: %v\n%s", err, out)
	}
	if got, want := strings.TrimSpace(string(out)), "kubectl coredns-k8s-event "+v; got != want {
		t.Errorf("the installed program says %q, want %q", got, want)
	}
}

// serveModule writes mod's zip, go.mod and info into the file proxy at
// dir, the zip made of the repository's files that git tracks or would
// (ignored ones, such as bin and dist, left out).
func serveModule(t *testing.T, root, dir string, mod module.Version) {
	t.Helper()
	escaped, err := module.EscapePath(mod.Path)
	if err != nil {
		t.Fatal(err)
	}
	at := filepath.Join(dir, escaped, "@v")
	if err := os.MkdirAll(at, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("git", "ls-files", "-z", "--cached", "--others", "--exclude-standard")
	cmd.Dir = root
	list, err := cmd.Output()
	if err != nil {
		t.Fatalf("git ls-files: %v", err)
	}
	var files []zip.File
	for _, name := range strings.Split(strings.TrimRight(string(list), "\x00"), "\x00") {
		if _, err := os.Lstat(filepath.Join(root, name)); err == nil {
			files = append(files, repoFile{root, name})
		}
	}
	z, err := os.Create(filepath.Join(at, mod.Version+".zip"))
	if err != nil {
		t.Fatal(err)
	}
	if err := zip.Create(z, mod, files); err != nil {
		t.Fatalf("module zip: %v", err)
	}
	if err := z.Close(); err != nil {
		t.Fatal(err)
	}
	gomod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	info, _ := json.Marshal(map[string]any{"Version": mod.Version, "Time": time.Now().UTC()})
	for name, data := range map[string][]byte{
		"list": []byte(mod.Version + "\n"), mod.Version + ".mod": gomod, mod.Version + ".info": info,
	} {
		if err := os.WriteFile(filepath.Join(at, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// repoFile is a file of the repository, as zip.Create takes it.
type repoFile struct{ root, name string }

func (f repoFile) Path() string                 { return filepath.ToSlash(f.name) }
func (f repoFile) Lstat() (os.FileInfo, error)  { return os.Lstat(filepath.Join(f.root, f.name)) }
func (f repoFile) Open() (io.ReadCloser, error) { return os.Open(filepath.Join(f.root, f.name)) }

func goEnv(t *testing.T, name string) string {
	t.Helper()
	out, err := exec.Command("go", "env", name).Output()
	if err != nil {
		t.Fatalf("go env %s: %v", name, err)
	}
	return strings.TrimSpace(string(out))
}
