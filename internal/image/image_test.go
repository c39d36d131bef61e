package image

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func testOptions(t *testing.T, amd64, arm64 string) Options {
	dir := t.TempDir()
	write := func(name, data string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(data), 0o755); err != nil {
			t.Fatal(err)
		}
		return p
	}
	return Options{
		Binaries:       []Binary{{"linux/amd64", write("amd64", amd64)}, {"linux/arm64", write("arm64", arm64)}},
		Entrypoint:     "/coredns",
		Ports:          []string{"53/udp"},
		Labels:         map[string]string{"org.opencontainers.image.version": "1.0", "io.example": "x"},
		Created:        time.Unix(0, 0),
		NetBindService: true,
	}
}

func archive(t *testing.T, o Options, ref string) (string, []byte) {
	t.Helper()
	img, err := Build(o)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := img.Write(&buf, ref); err != nil {
		t.Fatal(err)
	}
	return img.ContentTag("1.0"), buf.Bytes()
}

func TestContentTag(t *testing.T) {
	const ref = "localhost/x:t"
	tag1, a1 := archive(t, testOptions(t, "amd64 binary", "arm64 binary"), ref)
	tag2, a2 := archive(t, testOptions(t, "amd64 binary", "arm64 binary"), ref)
	if tag1 != tag2 || !bytes.Equal(a1, a2) {
		t.Errorf("the same inputs gave tags %s and %s, archives equal: %v", tag1, tag2, bytes.Equal(a1, a2))
	}
	if !strings.HasPrefix(tag1, "1.0-") || len(tag1) != len("1.0-")+12 {
		t.Errorf("tag %s, want 1.0- and 12 hex digits", tag1)
	}
	tag3, _ := archive(t, testOptions(t, "amd64 binary", "arm64 binary, changed"), ref)
	if tag3 == tag1 {
		t.Errorf("another arm64 binary kept the tag %s", tag1)
	}
	o := testOptions(t, "amd64 binary", "arm64 binary")
	o.Labels["org.opencontainers.image.revision"] = "abc"
	if tag4, _ := archive(t, o, ref); tag4 == tag1 {
		t.Errorf("another label kept the tag %s", tag1)
	}
}

func TestWriteRead(t *testing.T) {
	const ref = "localhost/coredns-k8s-event:1.0-0123456789ab"
	_, data := archive(t, testOptions(t, "amd64 binary", "arm64 binary"), ref)
	p := filepath.Join(t.TempDir(), "image.tar")
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := Ref(p)
	if err != nil || got != ref {
		t.Fatalf("Ref: %q %v, want %q", got, err, ref)
	}
	a, err := Read(p)
	if err != nil {
		t.Fatal(err)
	}
	if a.Tag != "1.0-0123456789ab" {
		t.Errorf("ref.name %q, want the tag", a.Tag)
	}
	if len(a.Platforms) != 2 {
		t.Fatalf("%d platforms, want 2", len(a.Platforms))
	}
	for i, want := range []string{"linux/amd64", "linux/arm64"} {
		p := a.Platforms[i]
		arch := strings.TrimPrefix(want, "linux/")
		if p.Platform != want || p.Config.OS != "linux" || p.Config.Architecture != arch {
			t.Errorf("platform %d: %s, config %s/%s, want %s", i, p.Platform, p.Config.OS, p.Config.Architecture, want)
		}
		c := p.Config.Config
		if c.User != "65532:65532" || c.WorkingDir != "/" || len(c.Entrypoint) != 1 || c.Entrypoint[0] != "/coredns" {
			t.Errorf("%s: user %q workdir %q entrypoint %v", want, c.User, c.WorkingDir, c.Entrypoint)
		}
		bin := p.Files["coredns"]
		if bin.Header == nil || string(bin.Data) != arch+" binary" || bin.Header.PAXRecords[XattrCapability] != string(CapNetBindService) {
			t.Errorf("%s: /coredns %q, header %+v", want, bin.Data, bin.Header)
		}
		if !strings.Contains(string(p.Files["etc/passwd"].Data), "nonroot:x:65532:65532:") {
			t.Errorf("%s: /etc/passwd %q", want, p.Files["etc/passwd"].Data)
		}
	}
	if a.Index.Annotations["org.opencontainers.image.version"] != "1.0" || a.Index.Annotations["io.example"] != "" {
		t.Errorf("index annotations %v, want the org.opencontainers.image labels", a.Index.Annotations)
	}
}

func TestWriteRefs(t *testing.T) {
	img, err := Build(testOptions(t, "a", "b"))
	if err != nil {
		t.Fatal(err)
	}
	for _, ref := range []string{"coredns-k8s-event:1", "localhost/coredns-k8s-event", "example/coredns:1", "localhost/x:"} {
		if err := img.Write(&bytes.Buffer{}, ref); err == nil || !strings.Contains(err.Error(), ref) {
			t.Errorf("Write(%q): %v, want an error naming it", ref, err)
		}
	}
	for _, ref := range []string{"localhost/x:1", "registry.example.com:5000/team/x:1", "docker.io/library/x:1"} {
		if err := img.Write(&bytes.Buffer{}, ref); err != nil {
			t.Errorf("Write(%q): %v", ref, err)
		}
	}
	o := testOptions(t, "a", "b")
	o.Binaries[1].Platform = "arm64"
	if _, err := Build(o); err == nil || !strings.Contains(err.Error(), `"arm64"`) {
		t.Errorf("Build with platform arm64: %v, want an error naming it", err)
	}
}
