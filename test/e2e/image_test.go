//go:build e2e

package e2e

import (
	"bytes"
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dnsops/k8s_event/internal/image"
)

// corednsVersion is the CoreDNS the image builds on by default: the one
// cmd/coredns, a module of its own, requires.
var corednsVersion = sync.OnceValue(func() string {
	cmd := exec.Command("go", "list", "-m", "-f", "{{.Version}}", "github.com/coredns/coredns")
	cmd.Dir = filepath.Join(repoRoot, "cmd", "coredns")
	out, err := cmd.Output()
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(out))
})

// TestImage builds the image as a user does, with `make image`, and looks
// inside: a multi-platform index (linux/amd64 and linux/arm64) named by a
// full reference whose tag follows the content, the entrypoint, the
// numeric user, the labels, and for each platform a static binary of its
// architecture with the capability that lets user 65532 bind port 53;
// the host's binary says its version.
func TestImage(t *testing.T) {
	dir := t.TempDir()
	archive := filepath.Join(dir, "image.tar")
	cmd := exec.CommandContext(t.Context(), "make", "image", "IMAGE_ARCHIVE="+archive)
	cmd.Dir = repoRoot
	start := time.Now()
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("make image: %v\n%s", err, out)
	}
	elapsed := time.Since(start)
	a, err := image.Read(archive)
	if err != nil {
		t.Fatal(err)
	}

	version := strings.TrimSpace(string(must(os.ReadFile(filepath.Join(repoRoot, "VERSION")))))
	coredns := strings.TrimPrefix(corednsVersion(), "v")
	prefix := "localhost/coredns-k8s-event:" + coredns + "-" + version + "-"
	if !regexp.MustCompile("^"+regexp.QuoteMeta(prefix)+"[0-9a-f]{12}$").MatchString(a.Ref) || a.Tag != strings.TrimPrefix(a.Ref, "localhost/coredns-k8s-event:") {
		t.Errorf("image %q (tag %q), want %s and 12 hex digits", a.Ref, a.Tag, prefix)
	}
	if !strings.Contains(string(out), a.Ref) {
		t.Errorf("make image did not print %s:\n%s", a.Ref, out)
	}
	if ref := strings.TrimSpace(string(must(os.ReadFile(filepath.Join(dir, "image-ref"))))); ref != a.Ref {
		t.Errorf("image-ref beside the archive says %q, the archive %q", ref, a.Ref)
	}

	machines := map[string]elf.Machine{"linux/amd64": elf.EM_X86_64, "linux/arm64": elf.EM_AARCH64}
	var platforms []string
	var hostBinary []byte
	for _, p := range a.Platforms {
		platforms = append(platforms, p.Platform)
		c := p.Config.Config
		if c.User != "65532:65532" || !slices.Equal(c.Entrypoint, []string{"/coredns"}) || c.WorkingDir != "/" {
			t.Errorf("%s: user %q entrypoint %v workdir %q, want 65532:65532, /coredns and /", p.Platform, c.User, c.Entrypoint, c.WorkingDir)
		}
		for _, port := range []string{"53/tcp", "53/udp", "9153/tcp"} {
			if _, ok := c.ExposedPorts[port]; !ok {
				t.Errorf("%s: port %s not exposed", p.Platform, port)
			}
		}
		wantLabels := map[string]string{
			"io.coredns.k8s_event.version":      version,
			"io.coredns.version":                coredns,
			"org.opencontainers.image.version":  coredns + "-" + version,
			"org.opencontainers.image.source":   "https://github.com/dnsops/k8s_event",
			"org.opencontainers.image.licenses": "Apache-2.0",
			"org.opencontainers.image.title":    "CoreDNS with k8s_event",
		}
		for k, v := range wantLabels {
			if c.Labels[k] != v {
				t.Errorf("%s: label %s %q, want %q", p.Platform, k, c.Labels[k], v)
			}
		}
		if !regexp.MustCompile(`^[0-9a-f]{7,}(-dirty)?$`).MatchString(c.Labels["org.opencontainers.image.revision"]) {
			t.Errorf("%s: label org.opencontainers.image.revision %q, want the git revision", p.Platform, c.Labels["org.opencontainers.image.revision"])
		}
		bin := p.Files["coredns"]
		if bin.Header == nil {
			t.Errorf("%s: no /coredns", p.Platform)
			continue
		}
		if got := bin.Header.PAXRecords[image.XattrCapability]; got != string(image.CapNetBindService) || bin.Header.Mode&0o111 == 0 {
			t.Errorf("%s: /coredns mode %o capability %x, want executable with cap_net_bind_service=+ep", p.Platform, bin.Header.Mode, got)
		}
		f, err := elf.NewFile(bytes.NewReader(bin.Data))
		if err != nil {
			t.Errorf("%s: /coredns: %v", p.Platform, err)
			continue
		}
		if f.Machine != machines[p.Platform] {
			t.Errorf("%s: /coredns is built for %v", p.Platform, f.Machine)
		}
		for _, prog := range f.Progs {
			if prog.Type == elf.PT_INTERP {
				t.Errorf("%s: /coredns has an ELF interpreter: not a static binary", p.Platform)
			}
		}
		if !strings.Contains(string(p.Files["etc/passwd"].Data), "nonroot:x:65532:65532:") {
			t.Errorf("%s: /etc/passwd has no nonroot 65532:\n%s", p.Platform, p.Files["etc/passwd"].Data)
		}
		if p.Platform == "linux/"+runtime.GOARCH {
			hostBinary = bin.Data
		}
	}
	if !slices.Equal(platforms, []string{"linux/amd64", "linux/arm64"}) {
		t.Errorf("platforms %v, want linux/amd64 and linux/arm64", platforms)
	}
	if hostBinary == nil {
		t.Fatalf("no image for linux/%s", runtime.GOARCH)
	}

	bin := filepath.Join(t.TempDir(), "coredns")
	if err := os.WriteFile(bin, hostBinary, 0o755); err != nil {
		t.Fatal(err)
	}
	vout, err := exec.Command(bin, "-version").CombinedOutput()
	if err != nil || !strings.Contains(string(vout), "CoreDNS-"+coredns) || !strings.Contains(string(vout), "k8s_event-"+version) {
		t.Errorf("coredns -version: %v\n%s", err, vout)
	}
	plugins := strings.Fields(string(must(exec.Command(bin, "-plugins").CombinedOutput())))
	for _, p := range []string{"k8s_event", "kubeapi", "kubernetes"} {
		if !slices.Contains(plugins, p) {
			t.Errorf("coredns -plugins has no %s", p)
		}
	}
	t.Logf("%s: %d bytes, make image took %v: %s", a.Ref, len(must(os.ReadFile(archive))), elapsed.Round(time.Second), strings.ReplaceAll(strings.TrimSpace(string(vout)), "\n", ", "))

	// The same code gives the same image and tag.
	again := filepath.Join(t.TempDir(), "image.tar")
	cmd = exec.CommandContext(t.Context(), "make", "image", "IMAGE_ARCHIVE="+again)
	cmd.Dir = repoRoot
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("make image: %v\n%s", err, out)
	}
	if !bytes.Equal(must(os.ReadFile(archive)), must(os.ReadFile(again))) {
		t.Errorf("make image twice on the same code wrote different archives (%s, then %s)", a.Ref, must(image.Ref(again)))
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
