package cluster

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/dnsops/k8s_event/internal/image"
)

// Registry is an OCI registry on loopback, plain HTTP on 127.0.0.1:PORT:
// the `serve` of the project's registry tool (hack/registry, a module of
// its own, go-containerregistry's registry). A node's containerd pulls
// from it what NodeOptions.Images hold, pushed by the tool's `push` as
// `make push` pushes, the way a cluster's nodes pull from theirs.
type Registry struct {
	Host string // 127.0.0.1:PORT

	tool string // the registry tool's binary
	dir  string // its blobs, its binary and its log
	proc *Process
	mu   sync.Mutex
	// pushed are the images pushed so far, by archive.
	pushed map[string]Pushed
}

// Pushed is an image that a Registry holds.
type Pushed struct {
	// Archive is the archive it was pushed from.
	Archive string
	// Name is the archive's own reference (image.Ref), e.g.
	// localhost/coredns-k8s-event:TAG or registry.k8s.io/coredns/coredns:v1.13.1:
	// a node pulls it too, from the Registry as the mirror of its registry.
	Name string
	// Tag is the image in the Registry by tag: Host/REPO:TAG, REPO being
	// Name's repository, e.g. 127.0.0.1:5000/coredns-k8s-event:TAG.
	Tag string
	// Digest is the image in the Registry by digest: Host/REPO@sha256:....
	Digest string
}

// StartRegistry builds the registry tool and starts a registry on a free
// port of 127.0.0.1, with its files in a new temporary directory that Stop
// removes.
func StartRegistry(ctx context.Context) (*Registry, error) {
	dir, err := os.MkdirTemp("", "k8s-event-registry-")
	if err != nil {
		return nil, err
	}
	r := &Registry{dir: dir, tool: filepath.Join(dir, "registry"), pushed: map[string]Pushed{}}
	if err := r.start(ctx); err != nil {
		r.Stop()
		return nil, err
	}
	return r, nil
}

func (r *Registry) start(ctx context.Context) error {
	root, err := exec.CommandContext(ctx, "go", "list", "-m", "-f", "{{.Dir}}", "github.com/dnsops/k8s_event").Output()
	if err != nil {
		return fmt.Errorf("find the module github.com/dnsops/k8s_event (run from a clone): %w", err)
	}
	build := exec.CommandContext(ctx, "go", "build", "-C", filepath.Join(strings.TrimSpace(string(root)), "hack", "registry"),
		"-o", r.tool, ".")
	if out, err := build.CombinedOutput(); err != nil {
		return fmt.Errorf("build the registry tool (hack/registry): %w: %s", err, out)
	}
	for try := 0; ; try++ {
		port, err := FreePort()
		if err != nil {
			return err
		}
		r.Host = fmt.Sprintf("127.0.0.1:%d", port)
		r.proc, err = StartProcess("registry", filepath.Join(r.dir, "registry.log"), nil, r.tool,
			"serve", "-addr", r.Host, "-dir", filepath.Join(r.dir, "blobs"))
		if err != nil {
			return err
		}
		err = r.waitReady(ctx)
		if err == nil || try == 3 || !strings.Contains(r.proc.Log(), "address already in use") {
			return err
		}
		r.proc.Stop(time.Second)
	}
}

func (r *Registry) waitReady(ctx context.Context) error {
	client := &http.Client{Timeout: time.Second}
	var last error
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); {
		if r.proc.Exited() {
			return fmt.Errorf("registry exited: %s", r.proc.LogTail(10))
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+r.Host+"/v2/", nil)
		if err != nil {
			return err
		}
		resp, err := client.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("GET /v2/: %s", resp.Status)
		}
		last = err
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return fmt.Errorf("registry on %s not ready: %v\n%s", r.Host, last, r.proc.LogTail(10))
}

// Push pushes archive under its own repository and tag (the names of
// image.Ref, without the registry), as `make push` does, moving the tag
// if it named another image.
func (r *Registry) Push(ctx context.Context, archive string) (Pushed, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	name, err := image.Ref(archive)
	if err != nil {
		return Pushed{}, err
	}
	repo, tag := image.ParseReference(name).Name, image.ParseReference(name).Tag
	if i := strings.IndexByte(repo, '/'); i >= 0 {
		repo = repo[i+1:]
	}
	p := Pushed{Archive: archive, Name: name, Tag: r.Host + "/" + repo + ":" + tag}
	cmd := exec.CommandContext(ctx, r.tool, "push", "-overwrite", "-archive", archive, p.Tag)
	out, err := cmd.Output()
	if err != nil {
		var stderr []byte
		if e := (*exec.ExitError)(nil); errors.As(err, &e) {
			stderr = e.Stderr
		}
		return Pushed{}, fmt.Errorf("push %s to %s: %w: %s", archive, p.Tag, err, stderr)
	}
	p.Digest = strings.TrimSpace(string(out))
	r.pushed[archive] = p
	return p, nil
}

// Image is what Push pushed of archive.
func (r *Registry) Image(archive string) (Pushed, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	p, ok := r.pushed[archive]
	return p, ok
}

// Stop stops the registry and removes its files.
func (r *Registry) Stop() {
	if r.proc != nil {
		r.proc.Stop(5 * time.Second)
	}
	os.RemoveAll(r.dir)
}

// The shared registry serves every node that a process starts without a
// registry of its own: it outlives them, so that what one pushed the next
// finds, until StopSharedRegistry.
var shared struct {
	sync.Mutex
	r *Registry
}

// SharedRegistry is the process's registry, started by its first call.
func SharedRegistry(ctx context.Context) (*Registry, error) {
	shared.Lock()
	defer shared.Unlock()
	if shared.r != nil && !shared.r.proc.Exited() {
		return shared.r, nil
	}
	r, err := StartRegistry(ctx)
	if err != nil {
		return nil, err
	}
	shared.r = r
	return r, nil
}

// StopSharedRegistry stops the shared registry, if it runs. A test binary
// whose tests start nodes calls it from TestMain after m.Run.
func StopSharedRegistry() {
	shared.Lock()
	defer shared.Unlock()
	if shared.r != nil {
		shared.r.Stop()
		shared.r = nil
	}
}

// Image is where the node's registry holds archive, one of
// NodeOptions.Images; ok is false without a node or for another archive.
func (c *Cluster) Image(archive string) (p Pushed, ok bool) {
	if c.node == nil || c.node.registry == nil {
		return Pushed{}, false
	}
	return c.node.registry.Image(archive)
}
