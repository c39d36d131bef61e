//go:build e2e

package release

import (
	"bufio"
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"
)

// plugin is the kubectl plugin's name in krew's index, and program the
// name krew links its program as.
const (
	plugin  = "coredns-k8s-event"
	program = "kubectl-coredns_k8s_event"
)

// manifest is what the test reads of the krew manifest.
type manifest struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name string `json:"name"`
	} `json:"metadata"`
	Spec struct {
		Version   string `json:"version"`
		Platforms []struct {
			Selector struct {
				MatchLabels map[string]string `json:"matchLabels"`
			} `json:"selector"`
			URI    string `json:"uri"`
			SHA256 string `json:"sha256"`
			Bin    string `json:"bin"`
		} `json:"platforms"`
	} `json:"spec"`
}

// TestKrewPlugin makes the kubectl plugin's archives and krew manifest
// with `make plugin`, as `make release` does, and checks them with krew
// v0.4.3's own commands: validate-krew-manifest (-skip-install) validates
// the manifest; for each platform, `krew install --manifest --archive`
// into a KREW_ROOT of its own, with KREW_OS and KREW_ARCH set, installs
// the archive the manifest names with its sum, extracts the LICENSE and
// links the program as kubectl-coredns_k8s_event. The host's program then
// runs through kubectl as `kubectl coredns-k8s-event`, and says VERSION;
// darwin's and windows' are cross-built and installed, not run.
func TestKrewPlugin(t *testing.T) {
	root := repoRoot(t)
	v := version(t, root)
	tools := krewTools(t, root)
	dir := t.TempDir()
	start := time.Now()
	run(t, root, nil, "make", "plugin", "PLUGIN_DIR="+dir)
	t.Logf("make plugin took %v", time.Since(start).Round(time.Second))

	file := filepath.Join(dir, plugin+".yaml")
	var m manifest
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, &m); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	if m.APIVersion != "krew.googlecontainertools.github.com/v1alpha2" || m.Kind != "Plugin" {
		t.Errorf("manifest is a %s %s, want krew.googlecontainertools.github.com/v1alpha2 Plugin", m.APIVersion, m.Kind)
	}
	if m.Metadata.Name != plugin || m.Spec.Version != "v"+v {
		t.Errorf("manifest names %s %s, want %s v%s", m.Metadata.Name, m.Spec.Version, plugin, v)
	}
	run(t, root, nil, tools["VALIDATE_KREW_MANIFEST"], "-manifest", file, "-skip-install")

	want := map[string]bool{
		"linux/amd64": true, "linux/arm64": true, "darwin/amd64": true, "darwin/arm64": true, "windows/amd64": true,
	}
	for _, p := range m.Spec.Platforms {
		goos, goarch := p.Selector.MatchLabels["os"], p.Selector.MatchLabels["arch"]
		delete(want, goos+"/"+goarch)
		archive := filepath.Join(dir, path.Base(p.URI))
		if !strings.HasPrefix(p.URI, "https://github.com/dnsops/k8s_event/releases/download/v"+v+"/") {
			t.Errorf("%s/%s: uri %s is not a download of the release v%s", goos, goarch, p.URI, v)
		}
		t.Run(goos+"-"+goarch, func(t *testing.T) {
			krewRoot := t.TempDir()
			env := []string{"KREW_ROOT=" + krewRoot, "KREW_OS=" + goos, "KREW_ARCH=" + goarch, "KREW_NO_UPGRADE_CHECK=1"}
			run(t, root, env, tools["KREW"], "install", "--manifest="+file, "--archive="+archive)
			store := filepath.Join(krewRoot, "store", plugin, "v"+v)
			if _, err := os.Stat(filepath.Join(store, "LICENSE")); err != nil {
				t.Errorf("the LICENSE is not installed: %v", err)
			}
			checkLink(t, filepath.Join(krewRoot, "bin", strings.TrimSuffix(p.Bin, ".exe")), goos, filepath.Join(store, p.Bin))
			if goos == runtime.GOOS && goarch == runtime.GOARCH {
				runThroughKubectl(t, filepath.Join(krewRoot, "bin"), v)
			}
		})
	}
	for p := range want {
		t.Errorf("the manifest has no platform %s", p)
	}
}

// checkLink checks that krew made the program kubectl finds: a link to
// the program in its store, or on windows a copy of it with .exe.
func checkLink(t *testing.T, link, goos, target string) {
	t.Helper()
	if !strings.HasSuffix(target, program) && !strings.HasSuffix(target, program+".exe") {
		t.Errorf("the manifest's bin is %s, want %s", filepath.Base(target), program)
	}
	if goos == "windows" {
		if _, err := os.Stat(link + ".exe"); err != nil {
			t.Errorf("krew made no %s.exe: %v", filepath.Base(link), err)
		}
		return
	}
	got, err := os.Readlink(link)
	if err != nil {
		t.Fatalf("krew made no link %s: %v", link, err)
	}
	if got != target {
		t.Errorf("%s links to %s, want %s", link, got, target)
	}
}

// runThroughKubectl runs the installed program as kubectl does, with
// krew's bin directory on the PATH: its version, and its usage, which
// names it as kubectl runs it.
func runThroughKubectl(t *testing.T, bin, v string) {
	t.Helper()
	kubectl := os.Getenv("KUBECTL")
	if kubectl == "" {
		var err error
		if kubectl, err = exec.LookPath("kubectl"); err != nil {
			t.Fatal("KUBECTL is not set and no kubectl is on the PATH: run through make test-e2e, or set what hack/tools.sh env prints")
		}
	}
	env := append(os.Environ(), "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"))
	cmd := exec.Command(kubectl, plugin, "version")
	cmd.Env = env
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl %s version: %v\n%s", plugin, err, out)
	}
	if got, want := strings.TrimSpace(string(out)), "kubectl "+plugin+" "+v; got != want {
		t.Errorf("kubectl %s version says %q, want %q", plugin, got, want)
	}
	cmd = exec.Command(kubectl, plugin)
	cmd.Env = env
	out, err = cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 2 {
		t.Errorf("kubectl %s with no command: %v, want exit 2", plugin, err)
	}
	if first, _, _ := bytes.Cut(out, []byte("\n")); !strings.HasPrefix(string(first), "Usage: kubectl "+plugin+" ") {
		t.Errorf("kubectl %s's usage begins %q, want the name kubectl runs it by", plugin, first)
	}
}

// krewTools builds (or finds in the cache) krew and
// validate-krew-manifest with hack/tools.sh and returns their paths.
func krewTools(t *testing.T, root string) map[string]string {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), filepath.Join(root, "hack", "tools.sh"), "krew")
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("hack/tools.sh krew: %v", err)
	}
	tools := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), "="); ok {
			tools[k] = v
		}
	}
	if tools["KREW"] == "" || tools["VALIDATE_KREW_MANIFEST"] == "" {
		t.Fatalf("hack/tools.sh krew printed no KREW= and VALIDATE_KREW_MANIFEST=:\n%s", out)
	}
	return tools
}

// run runs a command in dir with env added, and fails the test when it
// fails.
func run(t *testing.T, dir string, env []string, name string, args ...string) {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v\n%s", filepath.Base(name), strings.Join(args, " "), err, out)
	}
}
