//go:build e2e

package e2e

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/dnsops/k8s_event/internal/image"
)

// corednsVersion is the CoreDNS module this repository builds on.
var corednsVersion = sync.OnceValue(func() string {
	cmd := exec.Command("go", "list", "-m", "-f", "{{.Version}}", "github.com/coredns/coredns")
	cmd.Dir = repoRoot
	out, err := cmd.Output()
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(out))
})

// TestImage builds the image as a user does, with `make image`, and looks
// inside: what the overlay names, entrypoint, user, the capability that
// lets user 65532 bind port 53, a static binary, and the version it says.
func TestImage(t *testing.T) {
	archive := filepath.Join(t.TempDir(), "image.tar")
	cmd := exec.CommandContext(t.Context(), "make", "image", "IMAGE_ARCHIVE="+archive)
	cmd.Dir = repoRoot
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("make image: %v\n%s", err, out)
	}
	files := untar(t, archive)

	var manifest []struct {
		Config   string
		RepoTags []string
		Layers   []string
	}
	if err := json.Unmarshal(files["manifest.json"], &manifest); err != nil || len(manifest) != 1 || len(manifest[0].Layers) != 1 {
		t.Fatalf("manifest.json: %v %s", err, files["manifest.json"])
	}
	if want := imageRef(); !slices.Equal(manifest[0].RepoTags, []string{want}) {
		t.Errorf("image %v, want %s, which the overlay names", manifest[0].RepoTags, want)
	}
	var config struct {
		Config struct {
			User       string
			Entrypoint []string
			Labels     map[string]string
		} `json:"config"`
	}
	if err := json.Unmarshal(files[manifest[0].Config], &config); err != nil {
		t.Fatal(err)
	}
	version := strings.TrimSpace(string(must(os.ReadFile(filepath.Join(repoRoot, "VERSION")))))
	c := config.Config
	if c.User != "65532:65532" || !slices.Equal(c.Entrypoint, []string{"/coredns"}) {
		t.Errorf("user %q entrypoint %v, want 65532:65532 and /coredns", c.User, c.Entrypoint)
	}
	if c.Labels["io.coredns.k8s_event.version"] != version || c.Labels["io.coredns.version"] != strings.TrimPrefix(corednsVersion(), "v") {
		t.Errorf("labels %v, want k8s_event %s on CoreDNS %s", c.Labels, version, corednsVersion())
	}
	if _, ok := files["index.json"]; !ok {
		t.Error("no index.json: not an OCI layout")
	}

	layer := tar.NewReader(bytes.NewReader(files[manifest[0].Layers[0]]))
	var binary []byte
	var passwd string
	for {
		h, err := layer.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		switch h.Name {
		case "coredns":
			if got := h.PAXRecords[image.XattrCapability]; got != string(image.CapNetBindService) || h.Mode&0o111 == 0 {
				t.Errorf("/coredns mode %o capability %x, want executable with cap_net_bind_service=+ep", h.Mode, got)
			}
			binary = must(io.ReadAll(layer))
		case "etc/passwd":
			passwd = string(must(io.ReadAll(layer)))
		}
	}
	if !strings.Contains(passwd, "nonroot:x:65532:65532:") {
		t.Errorf("/etc/passwd has no nonroot 65532:\n%s", passwd)
	}
	bin := filepath.Join(t.TempDir(), "coredns")
	if err := os.WriteFile(bin, binary, 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Error("/coredns has an ELF interpreter: not a static binary")
		}
	}
	f.Close()
	out, err := exec.Command(bin, "-version").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "CoreDNS-"+strings.TrimPrefix(corednsVersion(), "v")) || !strings.Contains(string(out), "k8s_event-"+version) {
		t.Errorf("coredns -version: %v\n%s", err, out)
	}
	plugins := strings.Fields(string(must(exec.Command(bin, "-plugins").CombinedOutput())))
	for _, p := range []string{"k8s_event", "kubeapi", "kubernetes"} {
		if !slices.Contains(plugins, p) {
			t.Errorf("coredns -plugins has no %s", p)
		}
	}
	t.Logf("%s (%d bytes): %s", manifest[0].RepoTags[0], len(must(os.ReadFile(archive))), strings.ReplaceAll(strings.TrimSpace(string(out)), "\n", ", "))
}

func untar(t *testing.T, path string) map[string][]byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	files := map[string][]byte{}
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return files
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			files[h.Name] = must(io.ReadAll(tr))
		}
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
