// Package image writes a container image of one static binary as a tar
// archive that `docker load`, `ctr images import` and `kind load
// image-archive` take: an OCI image layout with Docker's manifest.json
// beside it, as `docker save` writes. It needs no registry and no builder
// daemon, and the same inputs give the same bytes.
//
// The image is laid out like CoreDNS's own (distroless static, nonroot):
// the binary at /ENTRYPOINT with a file capability, CA certificates,
// /etc/passwd and /etc/group with user nonroot (65532), /tmp, and the
// user set to 65532.
package image

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path"
	"runtime"
	"sort"
	"time"
)

// Options say what goes into the image.
type Options struct {
	Binary     string            // path of the static binary
	Entrypoint string            // its path in the image, e.g. /coredns
	Name       string            // repository, e.g. coredns-k8s-event
	Tag        string            // e.g. 1.15.0-0.2.0
	CACerts    string            // PEM bundle to ship as /etc/ssl/certs/ca-certificates.crt; empty: none
	Ports      []string          // exposed ports, e.g. 53/udp
	Labels     map[string]string // image labels
	Created    time.Time         // timestamp of the image and its files
	// NetBindService gives the binary the file capability
	// cap_net_bind_service=+ep, so that a nonroot user binds port 53.
	NetBindService bool
}

// UID is the nonroot user of distroless images.
const UID = 65532

// CapNetBindService is the security.capability extended attribute of
// cap_net_bind_service=+ep: struct vfs_cap_data, revision 2, effective,
// permitted bit 10 (CAP_NET_BIND_SERVICE).
var CapNetBindService = []byte{
	0x01, 0x00, 0x00, 0x02, // magic_etc: VFS_CAP_REVISION_2 | VFS_CAP_FLAGS_EFFECTIVE
	0x00, 0x04, 0x00, 0x00, // data[0].permitted: 1 << 10
	0x00, 0x00, 0x00, 0x00, // data[0].inheritable
	0x00, 0x00, 0x00, 0x00, // data[1].permitted
	0x00, 0x00, 0x00, 0x00, // data[1].inheritable
}

// XattrCapability is the PAX record that carries the capability in a layer.
const XattrCapability = "SCHILY.xattr.security.capability"

// Write writes the image archive to w.
func Write(w io.Writer, o Options) error {
	layer, err := buildLayer(o)
	if err != nil {
		return err
	}
	layerDigest := digest(layer)

	exposed := map[string]struct{}{}
	for _, p := range o.Ports {
		exposed[p] = struct{}{}
	}
	created := o.Created.UTC().Format(time.RFC3339)
	config, err := json.Marshal(map[string]any{
		"created":      created,
		"architecture": runtime.GOARCH,
		"os":           "linux",
		"config": map[string]any{
			"User":         fmt.Sprintf("%d:%d", UID, UID),
			"Entrypoint":   []string{o.Entrypoint},
			"ExposedPorts": exposed,
			"Env":          []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
			"WorkingDir":   "/",
			"Labels":       o.Labels,
		},
		"rootfs":  map[string]any{"type": "layers", "diff_ids": []string{layerDigest}},
		"history": []map[string]string{{"created": created, "created_by": "k8s_event internal/image"}},
	})
	if err != nil {
		return err
	}
	configDigest := digest(config)

	manifest, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.oci.image.manifest.v1+json",
		"config":        descriptor("application/vnd.oci.image.config.v1+json", config, nil),
		"layers":        []any{descriptor("application/vnd.oci.image.layer.v1.tar", layer, nil)},
		"annotations":   map[string]string{"org.opencontainers.image.created": created},
	})
	if err != nil {
		return err
	}
	ref := o.Name + ":" + o.Tag
	index, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.oci.image.index.v1+json",
		"manifests": []any{descriptor("application/vnd.oci.image.manifest.v1+json", manifest, map[string]string{
			"io.containerd.image.name":          fullName(ref),
			"org.opencontainers.image.ref.name": o.Tag,
		})},
	})
	if err != nil {
		return err
	}
	dockerManifest, err := json.Marshal([]map[string]any{{
		"Config":   blobPath(configDigest),
		"RepoTags": []string{ref},
		"Layers":   []string{blobPath(layerDigest)},
	}})
	if err != nil {
		return err
	}

	tw := tar.NewWriter(w)
	files := []struct {
		name string
		data []byte
	}{
		{"oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)},
		{"index.json", index},
		{"manifest.json", dockerManifest},
		{blobPath(layerDigest), layer},
		{blobPath(configDigest), config},
		{blobPath(digest(manifest)), manifest},
	}
	for _, dir := range []string{"blobs/", "blobs/sha256/"} {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: dir, Mode: 0o755, ModTime: o.Created}); err != nil {
			return err
		}
	}
	for _, f := range files {
		if err := writeFile(tw, &tar.Header{Name: f.name, Mode: 0o644, ModTime: o.Created}, f.data); err != nil {
			return err
		}
	}
	return tw.Close()
}

// fullName is the name containerd gives a short reference.
func fullName(ref string) string {
	if bytes.ContainsRune([]byte(ref), '/') {
		return ref
	}
	return "docker.io/library/" + ref
}

func buildLayer(o Options) ([]byte, error) {
	bin, err := os.ReadFile(o.Binary)
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dirs := []struct {
		name string
		mode int64
		uid  int
	}{
		{"etc/", 0o755, 0}, {"etc/ssl/", 0o755, 0}, {"etc/ssl/certs/", 0o755, 0},
		{"home/", 0o755, 0}, {"home/nonroot/", 0o700, UID}, {"tmp/", 0o1777, 0},
	}
	for _, d := range dirs {
		h := &tar.Header{Typeflag: tar.TypeDir, Name: d.name, Mode: d.mode, Uid: d.uid, Gid: d.uid, ModTime: o.Created, Format: tar.FormatPAX}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
	}
	etc := map[string]string{
		"etc/passwd":        fmt.Sprintf("root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\nnonroot:x:%d:%d:nonroot:/home/nonroot:/sbin/nologin\n", UID, UID),
		"etc/group":         fmt.Sprintf("root:x:0:\nnobody:x:65534:\nnonroot:x:%d:\n", UID),
		"etc/nsswitch.conf": "hosts: files dns\n",
	}
	if o.CACerts != "" {
		pem, err := os.ReadFile(o.CACerts)
		if err != nil {
			return nil, err
		}
		etc["etc/ssl/certs/ca-certificates.crt"] = string(pem)
	}
	names := make([]string, 0, len(etc))
	for n := range etc {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		if err := writeFile(tw, &tar.Header{Name: n, Mode: 0o644, ModTime: o.Created, Format: tar.FormatPAX}, []byte(etc[n])); err != nil {
			return nil, err
		}
	}
	h := &tar.Header{Name: path.Clean(o.Entrypoint)[1:], Mode: 0o755, ModTime: o.Created, Format: tar.FormatPAX}
	if o.NetBindService {
		h.PAXRecords = map[string]string{XattrCapability: string(CapNetBindService)}
	}
	if err := writeFile(tw, h, bin); err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func writeFile(tw *tar.Writer, h *tar.Header, data []byte) error {
	h.Typeflag = tar.TypeReg
	h.Size = int64(len(data))
	if err := tw.WriteHeader(h); err != nil {
		return err
	}
	_, err := tw.Write(data)
	return err
}

func digest(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

func blobPath(d string) string { return "blobs/sha256/" + d[len("sha256:"):] }

func descriptor(mediaType string, b []byte, annotations map[string]string) map[string]any {
	d := map[string]any{"mediaType": mediaType, "digest": digest(b), "size": len(b)}
	if annotations != nil {
		d["annotations"] = annotations
	}
	return d
}
