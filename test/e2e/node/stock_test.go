//go:build e2e

package node

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dnsops/k8s_event/internal/image"
)

// stockVersion is the stock CoreDNS release the node's tests start from:
// the one tools/coredns/go.mod requires, which is the one kubeadm (of
// tools/go.mod) pins, so that kubeadm's addon phase names the same image.
var stockVersion = sync.OnceValues(func() (string, error) {
	cmd := exec.Command("go", "list", "-m", "-f", "{{.Version}}", "github.com/coredns/coredns")
	cmd.Dir = filepath.Join(repoRoot, "tools", "coredns")
	out, err := cmd.Output()
	return strings.TrimSpace(string(out)), err
})

func stockRelease(t *testing.T) string {
	t.Helper()
	v, err := stockVersion()
	if err != nil {
		t.Fatalf("the stock CoreDNS release of tools/coredns: %v", err)
	}
	if want := ":" + v; !strings.HasSuffix(stockImage, want) {
		t.Fatalf("tools/coredns builds CoreDNS %s, but the stock image is %s: keep them the release kubeadm pins", v, stockImage)
	}
	return v
}

// stockArchive writes an image archive of CoreDNS as it is released,
// without kubeapi and k8s_event, under the name kubeadm gives it: built
// from that release's own module (tools/coredns), with that release's
// own requirements, and laid out as CoreDNS's images are (user 65532,
// capability to bind port 53). $COREDNS_STOCK (hack/tools.sh env node)
// is the binary when set.
func stockArchive(t *testing.T, dir string) string {
	t.Helper()
	version := stockRelease(t)
	bin := os.Getenv("COREDNS_STOCK")
	if bin == "" {
		bin = filepath.Join(dir, "coredns-stock")
		cmd := exec.CommandContext(t.Context(), "go", "build", "-C", filepath.Join(repoRoot, "tools", "coredns"),
			"-trimpath", "-ldflags", "-s -w", "-o", bin, "github.com/coredns/coredns")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go build github.com/coredns/coredns@%s: %v\n%s", version, err, out)
		}
	}
	out, err := exec.Command(bin, "-version").Output()
	if err != nil || !strings.HasPrefix(string(out), "CoreDNS-"+strings.TrimPrefix(version, "v")+"\n") {
		t.Fatalf("%s -version: %v %q, want CoreDNS-%s", bin, err, out, strings.TrimPrefix(version, "v"))
	}
	if plugins, _ := exec.Command(bin, "-plugins").Output(); strings.Contains(string(plugins), "k8s_event") {
		t.Fatalf("%s, the stock CoreDNS, has k8s_event", bin)
	}
	img, err := image.Build(image.Options{
		Binaries:       []image.Binary{{Platform: "linux/" + runtime.GOARCH, Path: bin}},
		Entrypoint:     "/coredns",
		Ports:          []string{"53/tcp", "53/udp", "9153/tcp"},
		NetBindService: true,
		Created:        time.Unix(0, 0),
	})
	if err != nil {
		t.Fatal(err)
	}
	archive := filepath.Join(dir, "coredns-stock.tar")
	f, err := os.Create(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	w := bufio.NewWriter(f)
	if err := img.Write(w, stockImage); err != nil {
		t.Fatal(err)
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	return archive
}

// releaseImage is an archive of the k8s_event image on CoreDNS release
// version (v1.13.1): $K8S_EVENT_STOCK_IMAGE when set, or else one that
// `make image COREDNS_VERSION=...` writes now for this machine's platform.
// Its tag starts with the release.
func releaseImage(t *testing.T, version string) string {
	t.Helper()
	archive := os.Getenv("K8S_EVENT_STOCK_IMAGE")
	if archive == "" {
		archive = filepath.Join(t.TempDir(), "image.tar")
		cmd := exec.CommandContext(t.Context(), "make", "image", "COREDNS_VERSION="+strings.TrimPrefix(version, "v"),
			"PLATFORMS=linux/"+runtime.GOARCH, "IMAGE_ARCHIVE="+archive)
		cmd.Dir = repoRoot
		start := time.Now()
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("make image COREDNS_VERSION=%s: %v\n%s", version, err, out)
		}
		t.Logf("make image COREDNS_VERSION=%s in %v", version, since(start))
	} else if !filepath.IsAbs(archive) {
		archive = filepath.Join(repoRoot, archive)
	}
	ref := archiveRef(t, archive)
	if v, ok := image.CoreDNSVersion(ref); !ok || "v"+v.String() != version {
		t.Fatalf("image %s is not on CoreDNS %s", ref, version)
	}
	return archive
}
