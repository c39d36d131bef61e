package image

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"
)

// Ref is the full reference of the image in archive, as
// `ctr images import` names it: the io.containerd.image.name annotation of
// its index.json. Tests and scripts read it here rather than recomputing
// the tag.
func Ref(archive string) (string, error) {
	a, err := Read(archive)
	if err != nil {
		return "", err
	}
	return a.Ref, nil
}

// Archive is what Read finds in an archive that Write wrote.
type Archive struct {
	Ref       string            // io.containerd.image.name of index.json's entry
	Tag       string            // its org.opencontainers.image.ref.name
	Files     map[string][]byte // every regular file by name
	Index     Index             // the image index that index.json names
	Platforms []Platform        // one per manifest of the index, in its order
}

// Descriptor is an OCI content descriptor.
type Descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Annotations map[string]string `json:"annotations,omitempty"`
	Platform    *struct {
		OS           string `json:"os"`
		Architecture string `json:"architecture"`
	} `json:"platform,omitempty"`
}

// Index is an OCI image index.
type Index struct {
	MediaType   string            `json:"mediaType"`
	Manifests   []Descriptor      `json:"manifests"`
	Annotations map[string]string `json:"annotations"`
}

// Config is the part of an image configuration that Read decodes.
type Config struct {
	OS           string `json:"os"`
	Architecture string `json:"architecture"`
	Config       struct {
		User         string
		Entrypoint   []string
		ExposedPorts map[string]struct{}
		WorkingDir   string
		Labels       map[string]string
	} `json:"config"`
	RootFS struct {
		DiffIDs []string `json:"diff_ids"`
	} `json:"rootfs"`
}

// Platform is the image of one platform.
type Platform struct {
	Platform string // os/arch, from the index
	Config   Config
	Files    map[string]File // the layer's files by name, e.g. coredns, etc/passwd
}

// File is a file of a layer.
type File struct {
	Header *tar.Header
	Data   []byte
}

// Read reads archive and checks that it is what Write writes: an OCI
// layout whose index.json names one image index, each of whose manifests
// has one layer whose digests match.
func Read(archive string) (*Archive, error) {
	f, err := os.Open(archive)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	a := &Archive{Files: map[string][]byte{}}
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", archive, err)
		}
		if h.Typeflag == tar.TypeReg {
			b, err := io.ReadAll(tr)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", archive, err)
			}
			a.Files[path.Clean(h.Name)] = b
		}
	}
	if err := a.decode(); err != nil {
		return nil, fmt.Errorf("%s: %w", archive, err)
	}
	return a, nil
}

func (a *Archive) blob(d Descriptor, v any) ([]byte, error) {
	b, ok := a.Files[blobPath(d.Digest)]
	if !ok {
		return nil, fmt.Errorf("no blob %s", d.Digest)
	}
	if digest(b) != d.Digest || int64(len(b)) != d.Size {
		return nil, fmt.Errorf("blob %s: digest or size does not match its descriptor", d.Digest)
	}
	if v != nil {
		if err := json.Unmarshal(b, v); err != nil {
			return nil, fmt.Errorf("blob %s: %w", d.Digest, err)
		}
	}
	return b, nil
}

func (a *Archive) decode() error {
	if _, ok := a.Files["oci-layout"]; !ok {
		return errors.New("no oci-layout: not an OCI image layout")
	}
	var top Index
	if err := json.Unmarshal(a.Files["index.json"], &top); err != nil {
		return fmt.Errorf("index.json: %w", err)
	}
	if len(top.Manifests) != 1 || top.Manifests[0].MediaType != MediaTypeIndex {
		return fmt.Errorf("index.json names %d entries, want one image index", len(top.Manifests))
	}
	entry := top.Manifests[0]
	a.Ref, a.Tag = entry.Annotations[AnnotationImageName], entry.Annotations[AnnotationRefName]
	if a.Ref == "" {
		return fmt.Errorf("index.json: no %s annotation", AnnotationImageName)
	}
	if _, err := a.blob(entry, &a.Index); err != nil {
		return err
	}
	for _, m := range a.Index.Manifests {
		if m.Platform == nil {
			return fmt.Errorf("manifest %s has no platform", m.Digest)
		}
		var manifest struct {
			Config Descriptor   `json:"config"`
			Layers []Descriptor `json:"layers"`
		}
		if _, err := a.blob(m, &manifest); err != nil {
			return err
		}
		p := Platform{Platform: m.Platform.OS + "/" + m.Platform.Architecture, Files: map[string]File{}}
		if _, err := a.blob(manifest.Config, &p.Config); err != nil {
			return err
		}
		if len(manifest.Layers) != 1 || len(p.Config.RootFS.DiffIDs) != 1 {
			return fmt.Errorf("%s: %d layers, want one", p.Platform, len(manifest.Layers))
		}
		layer, err := a.blob(manifest.Layers[0], nil)
		if err != nil {
			return err
		}
		if err := p.readLayer(layer, p.Config.RootFS.DiffIDs[0]); err != nil {
			return fmt.Errorf("%s: %w", p.Platform, err)
		}
		a.Platforms = append(a.Platforms, p)
	}
	return nil
}

func (p *Platform) readLayer(layer []byte, diffID string) error {
	gz, err := gzip.NewReader(bytes.NewReader(layer))
	if err != nil {
		return err
	}
	var raw bytes.Buffer
	if _, err := io.Copy(&raw, gz); err != nil {
		return err
	}
	if digest(raw.Bytes()) != diffID {
		return fmt.Errorf("layer's diff ID is not %s", diffID)
	}
	tr := tar.NewReader(&raw)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			return err
		}
		p.Files[strings.TrimSuffix(h.Name, "/")] = File{Header: h, Data: b}
	}
}
