package main

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

type pushOptions struct {
	archive   string
	ref       string // REGISTRY/REPO:TAG
	overwrite bool
	insecure  bool
}

type pushed struct {
	digest    name.Digest // REGISTRY/REPO@sha256:...
	platforms string      // e.g. linux/amd64, linux/arm64
	verb      string      // what happened: pushed, already there, moved
}

// push pushes the image index of o.archive to o.ref.
func push(ctx context.Context, o pushOptions) (pushed, error) {
	var p pushed
	dir, err := os.MkdirTemp("", "k8s-event-push-")
	if err != nil {
		return p, err
	}
	defer os.RemoveAll(dir)
	idx, archiveTag, err := readArchive(o.archive, dir)
	if err != nil {
		return p, err
	}
	tag, err := parseTag(o.ref, archiveTag, o.insecure)
	if err != nil {
		return p, err
	}
	digest, err := idx.Digest()
	if err != nil {
		return p, fmt.Errorf("%s: %w", o.archive, err)
	}
	if p.platforms, err = platforms(idx); err != nil {
		return p, fmt.Errorf("%s: %w", o.archive, err)
	}
	p.digest = tag.Context().Digest(digest.String())
	opts := []remote.Option{remote.WithContext(ctx), remote.WithAuthFromKeychain(authn.DefaultKeychain),
		remote.WithUserAgent("k8s_event-registry")}

	p.verb = "pushed"
	head, err := remote.Head(tag, opts...)
	switch {
	case isNotFound(err):
	case err != nil:
		return p, explain(err, tag, "look up")
	case head.Digest == digest:
		p.verb = "already there:"
		return p, nil
	case !o.overwrite:
		return p, fmt.Errorf("%s names another image in the registry (%s), not this archive's (%s): "+
			"push under another tag, or pass -overwrite (make push OVERWRITE=1) to move the tag", tag, head.Digest, digest)
	default:
		p.verb = fmt.Sprintf("moved from %s:", head.Digest)
	}
	if err := remote.WriteIndex(tag, idx, opts...); err != nil {
		return p, explain(err, tag, "push to")
	}
	return p, nil
}

// parseTag parses ref, which must name a tag: the tag is what a cluster
// asks for, and the digest is what the push gives.
func parseTag(ref, archiveTag string, insecure bool) (name.Tag, error) {
	example := ""
	if archiveTag != "" {
		example = fmt.Sprintf(", e.g. %s:%s (the archive's tag)", strings.TrimSuffix(ref, "/"), archiveTag)
	}
	switch {
	case ref == "":
		return name.Tag{}, fmt.Errorf("no image to push to: want REGISTRY/REPO:TAG (make push IMAGE=registry.example.com/coredns-k8s-event:TAG)")
	case strings.Contains(ref, "@"):
		return name.Tag{}, fmt.Errorf("image %q names a digest: push to a tag, REGISTRY/REPO:TAG%s; the push prints the digest", ref, example)
	case strings.LastIndexByte(ref, ':') <= strings.LastIndexByte(ref, '/'):
		return name.Tag{}, fmt.Errorf("image %q has no tag: want REGISTRY/REPO:TAG%s", ref, example)
	}
	var opts []name.Option
	if insecure {
		opts = append(opts, name.Insecure)
	}
	tag, err := name.NewTag(ref, opts...)
	if err != nil {
		return name.Tag{}, fmt.Errorf("image %q: %w", ref, err)
	}
	return tag, nil
}

// readArchive unpacks archive, an OCI layout in a tar as `make image`
// writes it, into dir and returns the image index that its index.json
// names, and the tag it gives it.
func readArchive(archive, dir string) (v1.ImageIndex, string, error) {
	f, err := os.Open(archive)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, "", fmt.Errorf("%w: run `make image` first, or name the archive with -archive", err)
		}
		return nil, "", err
	}
	defer f.Close()
	if err := untar(f, dir); err != nil {
		return nil, "", fmt.Errorf("%s: %w", archive, err)
	}
	top, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return nil, "", fmt.Errorf("%s is not an OCI image layout: %w", archive, err)
	}
	m, err := top.IndexManifest()
	if err != nil {
		return nil, "", fmt.Errorf("%s: index.json: %w", archive, err)
	}
	if len(m.Manifests) != 1 || m.Manifests[0].MediaType != types.OCIImageIndex {
		return nil, "", fmt.Errorf("%s: index.json names %d entries, want one image index, as `make image` writes", archive, len(m.Manifests))
	}
	idx, err := top.ImageIndex(m.Manifests[0].Digest)
	if err != nil {
		return nil, "", fmt.Errorf("%s: %w", archive, err)
	}
	return idx, m.Manifests[0].Annotations["org.opencontainers.image.ref.name"], nil
}

// untar writes the regular files and directories of r under dir.
func untar(r io.Reader, dir string) error {
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		clean := filepath.Clean(h.Name)
		if !filepath.IsLocal(clean) {
			return fmt.Errorf("entry %q leaves the archive", h.Name)
		}
		p := filepath.Join(dir, clean)
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(p, 0o755); err != nil {
				return err
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				return err
			}
			out, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
			if err != nil {
				return err
			}
			_, err = io.Copy(out, tr)
			if cerr := out.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
		}
	}
}

// platforms lists the platforms of idx's manifests; each must have one.
func platforms(idx v1.ImageIndex) (string, error) {
	m, err := idx.IndexManifest()
	if err != nil {
		return "", err
	}
	var ps []string
	for _, d := range m.Manifests {
		if d.Platform == nil {
			return "", fmt.Errorf("manifest %s has no platform", d.Digest)
		}
		ps = append(ps, d.Platform.String())
	}
	if len(ps) == 0 {
		return "", errors.New("the image index has no manifest")
	}
	return strings.Join(ps, ", "), nil
}

func isNotFound(err error) bool {
	var terr *transport.Error
	return errors.As(err, &terr) && terr.StatusCode == http.StatusNotFound
}

// explain turns what the registry or the network said into what the user
// can act on.
func explain(err error, tag name.Tag, what string) error {
	reg := tag.RegistryStr()
	var terr *transport.Error
	if errors.As(err, &terr) {
		switch {
		case terr.StatusCode == http.StatusUnauthorized || hasCode(terr, transport.UnauthorizedErrorCode):
			return fmt.Errorf("registry %s rejected the credentials for %s (%s): "+
				"log in with `docker login %s`, or fix its entry in the docker config (%s)",
				reg, tag.Context(), credentials(tag), reg, dockerConfig())
		case terr.StatusCode == http.StatusForbidden || hasCode(terr, transport.DeniedErrorCode):
			return fmt.Errorf("registry %s refused to %s %s (HTTP %d, %s) with %s: "+
				"may that account push to the repository?", reg, what, tag, terr.StatusCode, detail(terr), credentials(tag))
		}
		return fmt.Errorf("registry %s refused to %s %s: HTTP %d, %s", reg, what, tag, terr.StatusCode, detail(terr))
	}
	var nerr net.Error
	if errors.As(err, &nerr) || strings.Contains(err.Error(), "connection refused") {
		return fmt.Errorf("cannot reach registry %s to %s %s: %w", reg, what, tag, err)
	}
	return fmt.Errorf("%s %s: %w", what, tag, err)
}

func hasCode(terr *transport.Error, code transport.ErrorCode) bool {
	for _, d := range terr.Errors {
		if d.Code == code {
			return true
		}
	}
	return false
}

func detail(terr *transport.Error) string {
	var parts []string
	for _, d := range terr.Errors {
		parts = append(parts, strings.TrimSpace(string(d.Code)+" "+d.Message))
	}
	if len(parts) == 0 {
		return "no detail"
	}
	return strings.Join(parts, "; ")
}

// credentials says whose credentials were sent to tag's registry.
func credentials(tag name.Tag) string {
	a, err := authn.DefaultKeychain.Resolve(tag.Context())
	if err != nil {
		return "the docker config: " + err.Error()
	}
	if a == authn.Anonymous {
		return "no credentials for it in the docker config, so anonymous"
	}
	if c, err := a.Authorization(); err == nil && c.Username != "" {
		return "user " + c.Username + " of the docker config"
	}
	return "the docker config's credentials"
}

// dockerConfig is the file the default keychain takes credentials from:
// $DOCKER_CONFIG/config.json when DOCKER_CONFIG is set, else ~/.docker/config.json.
func dockerConfig() string {
	if dir := os.Getenv("DOCKER_CONFIG"); dir != "" {
		return filepath.Join(dir, "config.json") // the keychain reads this one alone when it is set
	}
	home, _ := os.UserHomeDir()
	return filepath.Join(home, ".docker", "config.json")
}
