//go:build e2e

package cluster

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dnsops/k8s_event/internal/image"
)

// TestRegistryServesWhatItWasPushed pushes an archive to the shared
// registry as a node's start does, then asks for it as containerd does:
// the index by tag and by digest, over plain HTTP on loopback.
func TestRegistryServesWhatItWasPushed(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "tool")
	if err := os.WriteFile(bin, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	archive := filepath.Join(dir, "image.tar")
	f, err := os.Create(archive)
	if err != nil {
		t.Fatal(err)
	}
	err = image.Write(f, "registry.example.com/dns/tool:v1", image.Options{
		Binaries:   []image.Binary{{Platform: "linux/amd64", Path: bin}, {Platform: "linux/arm64", Path: bin}},
		Entrypoint: "/tool",
		Created:    time.Unix(0, 0),
	})
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
	r, err := SharedRegistry(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	p, err := r.Push(t.Context(), archive)
	if err != nil {
		t.Fatal(err)
	}
	if p.Name != "registry.example.com/dns/tool:v1" || p.Tag != r.Host+"/dns/tool:v1" || !strings.HasPrefix(p.Digest, r.Host+"/dns/tool@sha256:") {
		t.Fatalf("pushed %+v", p)
	}
	_, digest, _ := strings.Cut(p.Digest, "@")
	for _, ref := range []string{"v1", digest} {
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodHead, "http://"+r.Host+"/v2/dns/tool/manifests/"+ref, nil)
		req.Header.Set("Accept", image.MediaTypeIndex)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || resp.Header.Get("Docker-Content-Digest") != digest || resp.Header.Get("Content-Type") != image.MediaTypeIndex {
			t.Errorf("HEAD manifests/%s: %s, digest %q, type %q; want 200, %s, %s", ref, resp.Status,
				resp.Header.Get("Docker-Content-Digest"), resp.Header.Get("Content-Type"), digest, image.MediaTypeIndex)
		}
	}
	if again, err := r.Push(t.Context(), archive); err != nil || again != p {
		t.Errorf("the same push again: %+v, %v", again, err)
	}
	if got, ok := r.Image(archive); !ok || got != p {
		t.Errorf("Image(%s) = %+v, %v", archive, got, ok)
	}
}
