package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// archiveDir holds what archives writes; TestMain removes it.
var archiveDir string

func TestMain(m *testing.M) {
	// Built before any test points HOME elsewhere, with the Go caches of
	// the user who runs the tests.
	if _, err := archives(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	if archiveDir != "" {
		os.RemoveAll(archiveDir)
	}
	os.Exit(code)
}

// archives are image archives as `make image` writes them (hack/image of
// the plugin's module), built once for all tests: two of two platforms
// whose binaries differ.
var archives = sync.OnceValues(func() ([2]string, error) {
	var out [2]string
	dir, err := os.MkdirTemp("", "k8s-event-push-test-")
	if err != nil {
		return out, err
	}
	archiveDir = dir
	tool := filepath.Join(dir, "image")
	build := exec.Command("go", "build", "-o", tool, "./hack/image")
	build.Dir = "../.."
	if b, err := build.CombinedOutput(); err != nil {
		return out, fmt.Errorf("build hack/image: %v\n%s", err, b)
	}
	for i := range out {
		var args []string
		for _, p := range []string{"linux/amd64", "linux/arm64"} {
			bin := filepath.Join(dir, fmt.Sprintf("%d-%s", i, strings.ReplaceAll(p, "/", "-")))
			if err := os.WriteFile(bin, []byte(fmt.Sprintf("#!/bin/sh\necho %d %s\n", i, p)), 0o755); err != nil {
				return out, err
			}
			args = append(args, "-binary", p+"="+bin)
		}
		out[i] = filepath.Join(dir, fmt.Sprintf("image-%d.tar", i))
		cmd := exec.Command(tool, append([]string{"-ca-certs", "", "-version", "0.0.0",
			"-coredns", "1.13.1", "-revision", "test", "-out", out[i]}, args...)...)
		if b, err := cmd.CombinedOutput(); err != nil {
			return out, fmt.Errorf("hack/image: %v\n%s", err, b)
		}
	}
	return out, nil
})

func testArchives(t *testing.T) [2]string {
	t.Helper()
	a, err := archives()
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// archiveDigest is the digest of the image index of archive.
func archiveDigest(t *testing.T, archive string) string {
	t.Helper()
	idx, _, err := readArchive(archive, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	d, err := idx.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d.String()
}

// noDockerConfig points the default keychain at an empty home.
func noDockerConfig(t *testing.T) {
	home := t.TempDir()
	t.Setenv("HOME", home)
	t.Setenv("DOCKER_CONFIG", filepath.Join(home, ".docker"))
	t.Setenv("XDG_RUNTIME_DIR", "")
	t.Setenv("XDG_CONFIG_HOME", "")
}

// pushCmd runs the command as `make push` does and returns its stdout.
func pushCmd(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	err := run(context.Background(), append([]string{"push"}, args...), &stdout, &stderr)
	t.Logf("registry push %s: %s%s", strings.Join(args, " "), stderr.String(), stdout.String())
	return strings.TrimSpace(stdout.String()), err
}

func newRegistry(t *testing.T, wrap func(http.Handler) http.Handler) string {
	t.Helper()
	var h http.Handler = registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	if wrap != nil {
		h = wrap(h)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

func TestPushPullsBackTheSameIndexWithBothPlatforms(t *testing.T) {
	noDockerConfig(t)
	a := testArchives(t)
	host := newRegistry(t, nil)
	ref := host + "/dns/coredns-k8s-event:1.13.1-test"
	out, err := pushCmd(t, "-archive", a[0], ref)
	if err != nil {
		t.Fatal(err)
	}
	want := archiveDigest(t, a[0])
	if out != host+"/dns/coredns-k8s-event@"+want {
		t.Errorf("push printed %q, want the repository with the archive's digest %s", out, want)
	}
	tag, err := name.NewTag(ref)
	if err != nil {
		t.Fatal(err)
	}
	idx, err := remote.Index(tag)
	if err != nil {
		t.Fatal(err)
	}
	if d, _ := idx.Digest(); d.String() != want {
		t.Errorf("the registry has %s for the tag, want %s", d, want)
	}
	m, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, d := range m.Manifests {
		got = append(got, d.Platform.String())
		img, err := remote.Image(tag.Context().Digest(d.Digest.String()))
		if err != nil {
			t.Fatalf("%s: %v", d.Platform, err)
		}
		layers, err := img.Layers()
		if err != nil || len(layers) != 1 {
			t.Fatalf("%s: %d layers, %v", d.Platform, len(layers), err)
		}
		// The layer comes back whole: its content hashes to its digest.
		if _, err := layers[0].Uncompressed(); err != nil {
			t.Fatalf("%s: %v", d.Platform, err)
		}
		cfg, err := img.ConfigFile()
		if err != nil || cfg.OS+"/"+cfg.Architecture != d.Platform.String() {
			t.Errorf("%s: config of %s/%s, %v", d.Platform, cfg.OS, cfg.Architecture, err)
		}
	}
	if !slices.Equal(got, []string{"linux/amd64", "linux/arm64"}) {
		t.Errorf("platforms %v, want linux/amd64 and linux/arm64", got)
	}
	// By digest, as a kubelet asks for a pinned image.
	if _, err := remote.Index(tag.Context().Digest(want)); err != nil {
		t.Errorf("by digest: %v", err)
	}

	// The same push again changes nothing.
	if again, err := pushCmd(t, "-archive", a[0], ref); err != nil || again != out {
		t.Errorf("second push of the same archive: %q, %v", again, err)
	}
}

func TestPushRefusesATagOfAnotherImageUnlessOverwrite(t *testing.T) {
	noDockerConfig(t)
	a := testArchives(t)
	ref := newRegistry(t, nil) + "/coredns-k8s-event:v1"
	if _, err := pushCmd(t, "-archive", a[0], ref); err != nil {
		t.Fatal(err)
	}
	first, second := archiveDigest(t, a[0]), archiveDigest(t, a[1])
	_, err := pushCmd(t, "-archive", a[1], ref)
	if err == nil || !strings.Contains(err.Error(), first) || !strings.Contains(err.Error(), second) || !strings.Contains(err.Error(), "-overwrite") {
		t.Fatalf("push of another image to a taken tag: %v; want a refusal naming both digests and -overwrite", err)
	}
	if d := headDigest(t, ref); d != first {
		t.Errorf("after the refusal the tag names %s, want still %s", d, first)
	}
	if _, err := pushCmd(t, "-overwrite", "-archive", a[1], ref); err != nil {
		t.Fatal(err)
	}
	if d := headDigest(t, ref); d != second {
		t.Errorf("after -overwrite the tag names %s, want %s", d, second)
	}
}

func headDigest(t *testing.T, ref string) string {
	t.Helper()
	r, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	d, err := remote.Head(r)
	if err != nil {
		t.Fatal(err)
	}
	return d.Digest.String()
}

func TestPushNeedsATag(t *testing.T) {
	noDockerConfig(t)
	a := testArchives(t)
	host := newRegistry(t, nil)
	for ref, want := range map[string]string{
		host + "/coredns-k8s-event":                                   "has no tag: want REGISTRY/REPO:TAG, e.g. " + host + "/coredns-k8s-event:1.13.1-0.0.0-",
		host + "/coredns-k8s-event@sha256:" + strings.Repeat("0", 64): "names a digest",
		"":                 "no image to push to",
		host + "/Upper:v1": "repository can only contain",
	} {
		if _, err := pushCmd(t, "-archive", a[0], ref); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("push to %q: %v; want an error containing %q", ref, err, want)
		}
	}
	if _, err := pushCmd(t, "-archive", filepath.Join(t.TempDir(), "none.tar"), host+"/x:v1"); err == nil || !strings.Contains(err.Error(), "make image") {
		t.Errorf("push of a missing archive: %v; want it to say to run make image", err)
	}
}

func TestPushSaysWhenTheRegistryRefuses(t *testing.T) {
	noDockerConfig(t)
	a := testArchives(t)
	// A registry that serves pulls and denies every write.
	readOnly := newRegistry(t, func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method != http.MethodGet && r.Method != http.MethodHead {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusForbidden)
				fmt.Fprint(w, `{"errors":[{"code":"DENIED","message":"requested access to the resource is denied"}]}`)
				return
			}
			h.ServeHTTP(w, r)
		})
	})
	_, err := pushCmd(t, "-archive", a[0], readOnly+"/coredns-k8s-event:v1")
	if err == nil || !strings.Contains(err.Error(), "registry "+readOnly+" refused to push to") || !strings.Contains(err.Error(), "DENIED") {
		t.Errorf("push to a registry that denies it: %v", err)
	}

	gone := httptest.NewServer(http.NotFoundHandler())
	gone.Close()
	host := strings.TrimPrefix(gone.URL, "http://")
	_, err = pushCmd(t, "-archive", a[0], host+"/coredns-k8s-event:v1")
	if err == nil || !strings.Contains(err.Error(), "cannot reach registry "+host) {
		t.Errorf("push to a registry that is not there: %v", err)
	}
}

func TestPushTakesTheDockerConfigsCredentials(t *testing.T) {
	a := testArchives(t)
	host := newRegistry(t, func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if u, p, ok := r.BasicAuth(); !ok || u != "pusher" || p != "s3cret" {
				w.Header().Set("WWW-Authenticate", `Basic realm="test"`)
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusUnauthorized)
				fmt.Fprint(w, `{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}`)
				return
			}
			h.ServeHTTP(w, r)
		})
	})
	ref := host + "/coredns-k8s-event:v1"
	login := func(user, password string) {
		noDockerConfig(t)
		dir := filepath.Join(os.Getenv("HOME"), ".docker")
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		auth := base64.StdEncoding.EncodeToString([]byte(user + ":" + password))
		config := fmt.Sprintf(`{"auths": {%q: {"auth": %q}}}`, host, auth)
		if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(config), 0o600); err != nil {
			t.Fatal(err)
		}
	}

	noDockerConfig(t)
	_, err := pushCmd(t, "-archive", a[0], ref)
	if err == nil || !strings.Contains(err.Error(), "rejected the credentials") || !strings.Contains(err.Error(), "anonymous") {
		t.Errorf("push without credentials: %v", err)
	}
	login("pusher", "wrong")
	_, err = pushCmd(t, "-archive", a[0], ref)
	if err == nil || !strings.Contains(err.Error(), "rejected the credentials") || !strings.Contains(err.Error(), "user pusher") ||
		!strings.Contains(err.Error(), "docker login "+host) {
		t.Errorf("push with a wrong password: %v", err)
	}
	login("pusher", "s3cret")
	out, err := pushCmd(t, "-archive", a[0], ref)
	if err != nil || !strings.HasSuffix(out, archiveDigest(t, a[0])) {
		t.Errorf("push with the docker config's credentials: %q, %v", out, err)
	}
}
