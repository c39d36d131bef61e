// Package image writes a container image of one static binary, for one or
// more platforms, as a tar archive that `ctr images import`, `docker load`
// and `kind load image-archive` take: an OCI image layout whose index.json
// names one image index (a manifest per platform), with Docker's
// manifest.json beside it for Docker's classic image store. It needs no
// registry and no builder daemon, and the same inputs give the same bytes.
//
// The image is laid out like CoreDNS's own (distroless static, nonroot):
// the binary at ENTRYPOINT with a file capability, CA certificates,
// /etc/passwd and /etc/group with user nonroot (65532), /tmp, and the
// user set to 65532:65532.
package image

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"path"
	"sort"
	"strings"
	"time"
)

// Binary is the binary of one platform.
type Binary struct {
	Platform string // os/arch, e.g. linux/arm64
	Path     string // the static binary built for it
}

// Options say what goes into the image.
type Options struct {
	Binaries   []Binary          // one per platform, in the index's order
	Entrypoint string            // the binary's path in the image, e.g. /coredns
	CACerts    string            // PEM bundle to ship as /etc/ssl/certs/ca-certificates.crt; empty: none
	Ports      []string          // exposed ports, e.g. 53/udp
	Labels     map[string]string // image labels
	Created    time.Time         // timestamp of the image and its files
	// NetBindService gives the binary the file capability
	// cap_net_bind_service=+ep, so that a nonroot user binds port 53.
	NetBindService bool
}

// UID is the nonroot user of distroless images; the image runs as
// UID:UID.
const UID = 65532

// User is the image's user, numeric so that runAsNonRoot can check it.
var User = fmt.Sprintf("%d:%d", UID, UID)

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

// Media types of what the archive holds.
const (
	MediaTypeIndex    = "application/vnd.oci.image.index.v1+json"
	MediaTypeManifest = "application/vnd.oci.image.manifest.v1+json"
	MediaTypeConfig   = "application/vnd.oci.image.config.v1+json"
	MediaTypeLayer    = "application/vnd.oci.image.layer.v1.tar+gzip"
)

// Annotations of index.json's entry that name the image: containerd (and
// so `ctr images import`, kind and Docker's containerd store) takes the
// first; the second is the OCI layout's own, the tag.
const (
	AnnotationImageName = "io.containerd.image.name"
	AnnotationRefName   = "org.opencontainers.image.ref.name"
)

// Image is an image built in memory: its blobs and its index.
type Image struct {
	blobs     map[string][]byte // by digest
	order     []string          // digests in the order they are written
	index     []byte
	manifests []platformManifest
	created   time.Time
}

type platformManifest struct {
	platform string
	config   string // digest
	layer    string // digest
}

// Build builds the image of o's binaries.
func Build(o Options) (*Image, error) {
	if len(o.Binaries) == 0 {
		return nil, errors.New("image: no binaries")
	}
	img := &Image{blobs: map[string][]byte{}, created: o.Created.UTC()}
	exposed := map[string]struct{}{}
	for _, p := range o.Ports {
		exposed[p] = struct{}{}
	}
	created := img.created.Format(time.RFC3339)
	var descs []any
	seen := map[string]bool{}
	for _, b := range o.Binaries {
		goos, arch, ok := strings.Cut(b.Platform, "/")
		if !ok || goos == "" || arch == "" || strings.Contains(arch, "/") {
			return nil, fmt.Errorf("image: platform %q of %s: want os/arch, e.g. linux/amd64", b.Platform, b.Path)
		}
		if seen[b.Platform] {
			return nil, fmt.Errorf("image: platform %q given twice", b.Platform)
		}
		seen[b.Platform] = true
		layer, diffID, err := buildLayer(o, b.Path)
		if err != nil {
			return nil, err
		}
		config, err := json.Marshal(map[string]any{
			"created":      created,
			"architecture": arch,
			"os":           goos,
			"config": map[string]any{
				"User":         User,
				"Entrypoint":   []string{o.Entrypoint},
				"ExposedPorts": exposed,
				"Env":          []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
				"WorkingDir":   "/",
				"Labels":       o.Labels,
			},
			"rootfs":  map[string]any{"type": "layers", "diff_ids": []string{diffID}},
			"history": []map[string]string{{"created": created, "created_by": "k8s_event internal/image"}},
		})
		if err != nil {
			return nil, err
		}
		manifest, err := json.Marshal(map[string]any{
			"schemaVersion": 2,
			"mediaType":     MediaTypeManifest,
			"config":        descriptor(MediaTypeConfig, config, nil),
			"layers":        []any{descriptor(MediaTypeLayer, layer, nil)},
			"annotations":   annotations(o.Labels, created),
		})
		if err != nil {
			return nil, err
		}
		for _, blob := range [][]byte{layer, config, manifest} {
			img.add(blob)
		}
		img.manifests = append(img.manifests, platformManifest{platform: b.Platform, config: digest(config), layer: digest(layer)})
		d := descriptor(MediaTypeManifest, manifest, nil)
		d["platform"] = map[string]string{"os": goos, "architecture": arch}
		descs = append(descs, d)
	}
	index, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     MediaTypeIndex,
		"manifests":     descs,
		"annotations":   annotations(o.Labels, created),
	})
	if err != nil {
		return nil, err
	}
	img.add(index)
	img.index = index
	return img, nil
}

// annotations are the labels that OCI defines as annotations too, so that
// registries and tools that read only manifests and indexes see them.
func annotations(labels map[string]string, created string) map[string]string {
	a := map[string]string{"org.opencontainers.image.created": created}
	for k, v := range labels {
		if strings.HasPrefix(k, "org.opencontainers.image.") {
			a[k] = v
		}
	}
	return a
}

func (img *Image) add(b []byte) {
	d := digest(b)
	if _, ok := img.blobs[d]; !ok {
		img.blobs[d] = b
		img.order = append(img.order, d)
	}
}

// Digest is the digest of the image index, sha256:<hex>: it changes with
// any byte of any platform's binary, configuration or labels.
func (img *Image) Digest() string { return digest(img.index) }

// ContentTag is version and the first 12 hex digits of the index's digest,
// e.g. 1.15.0-0.2.0-3f2a9c01d4e5: the same code gives the same tag, and
// any change gives another.
func (img *Image) ContentTag(version string) string {
	return version + "-" + strings.TrimPrefix(img.Digest(), "sha256:")[:12]
}

// Write writes the image as an archive named ref, a full reference
// (registry/repository:tag, e.g. localhost/coredns-k8s-event:1.15.0-0.2.0-3f2a9c01d4e5).
func (img *Image) Write(w io.Writer, ref string) error {
	tag, err := refTag(ref)
	if err != nil {
		return err
	}
	index, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     MediaTypeIndex,
		"manifests": []any{descriptor(MediaTypeIndex, img.index, map[string]string{
			AnnotationImageName: ref,
			AnnotationRefName:   tag,
		})},
	})
	if err != nil {
		return err
	}
	// Docker's classic store reads manifest.json, one image per tag: it
	// gets the first platform's. Docker's containerd store reads index.json.
	first := img.manifests[0]
	dockerManifest, err := json.Marshal([]map[string]any{{
		"Config":   blobPath(first.config),
		"RepoTags": []string{dockerRef(ref)},
		"Layers":   []string{blobPath(first.layer)},
	}})
	if err != nil {
		return err
	}

	tw := tar.NewWriter(w)
	for _, dir := range []string{"blobs/", "blobs/sha256/"} {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: dir, Mode: 0o755, ModTime: img.created}); err != nil {
			return err
		}
	}
	files := []struct {
		name string
		data []byte
	}{
		{"oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)},
		{"index.json", index},
		{"manifest.json", dockerManifest},
	}
	for _, d := range img.order {
		files = append(files, struct {
			name string
			data []byte
		}{blobPath(d), img.blobs[d]})
	}
	for _, f := range files {
		if err := writeFile(tw, &tar.Header{Name: f.name, Mode: 0o644, ModTime: img.created}, f.data); err != nil {
			return err
		}
	}
	return tw.Close()
}

// refTag is the tag of ref, which must be repository:tag with a domain
// (a name containing a dot or a colon, or localhost), as containerd and
// the kubelet name images.
func refTag(ref string) (string, error) {
	slash := strings.LastIndex(ref, "/")
	colon := strings.LastIndex(ref, ":")
	if slash < 0 || colon < slash {
		return "", fmt.Errorf("image reference %q: want a full reference, registry/repository:tag (e.g. localhost/name:tag)", ref)
	}
	domain := ref[:strings.Index(ref, "/")]
	if domain != "localhost" && !strings.ContainsAny(domain, ".:") {
		return "", fmt.Errorf("image reference %q: want a registry before the first slash (e.g. localhost/ or registry.example.com/)", ref)
	}
	tag := ref[colon+1:]
	if tag == "" {
		return "", fmt.Errorf("image reference %q: empty tag", ref)
	}
	return tag, nil
}

// dockerRef is ref as Docker's classic store names it: docker.io is
// implied there.
func dockerRef(ref string) string {
	if r, ok := strings.CutPrefix(ref, "docker.io/"); ok {
		return strings.TrimPrefix(r, "library/")
	}
	return ref
}

// Write builds the image of o and writes it as an archive named ref.
func Write(w io.Writer, ref string, o Options) error {
	img, err := Build(o)
	if err != nil {
		return err
	}
	return img.Write(w, ref)
}

// buildLayer is the gzipped layer of binary and the digest of its
// uncompressed tar, the layer's diff ID.
func buildLayer(o Options, binary string) (layer []byte, diffID string, err error) {
	bin, err := os.ReadFile(binary)
	if err != nil {
		return nil, "", err
	}
	var buf bytes.Buffer
	gz, err := gzip.NewWriterLevel(&buf, gzip.DefaultCompression)
	if err != nil {
		return nil, "", err
	}
	sum := sha256.New()
	tw := tar.NewWriter(io.MultiWriter(gz, sum))
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
			return nil, "", err
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
			return nil, "", err
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
			return nil, "", err
		}
	}
	h := &tar.Header{Name: path.Clean(o.Entrypoint)[1:], Mode: 0o755, ModTime: o.Created, Format: tar.FormatPAX}
	if o.NetBindService {
		h.PAXRecords = map[string]string{XattrCapability: string(CapNetBindService)}
	}
	if err := writeFile(tw, h, bin); err != nil {
		return nil, "", err
	}
	if err := tw.Close(); err != nil {
		return nil, "", err
	}
	if err := gz.Close(); err != nil {
		return nil, "", err
	}
	return buf.Bytes(), hashDigest(sum), nil
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

func hashDigest(h hash.Hash) string { return "sha256:" + hex.EncodeToString(h.Sum(nil)) }

func blobPath(d string) string { return "blobs/sha256/" + strings.TrimPrefix(d, "sha256:") }

func descriptor(mediaType string, b []byte, annotations map[string]string) map[string]any {
	d := map[string]any{"mediaType": mediaType, "digest": digest(b), "size": len(b)}
	if annotations != nil {
		d["annotations"] = annotations
	}
	return d
}
