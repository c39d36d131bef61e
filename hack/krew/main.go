// Command krew writes the kubectl plugin for each platform it is given as
// an archive that holds the program and the LICENSE, and the krew manifest
// of those archives. `make plugin` runs it; `make release` puts what it
// writes in dist/.
//
// The plugin is coredns-k8s-event: krew links its program as
// kubectl-coredns_k8s_event and kubectl runs it as
// `kubectl coredns-k8s-event` (docs/release.md says why that name).
// The program is built from cmd/kubectl-k8s_event, with VERSION linked in.
package main

import (
	"archive/tar"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

const (
	// plugin is the plugin's name in krew's index.
	plugin = "coredns-k8s-event"
	// program is the program's name: kubectl- and the plugin's name with
	// underscores for its dashes, as krew links it.
	program = "kubectl-coredns_k8s_event"
	pkg     = "./cmd/kubectl-k8s_event"
	// releases is where a release's files are downloaded from.
	releases = "https://github.com/dnsops/k8s_event/releases/download"
)

// platforms is the repeated -platform os/arch flag.
type platforms []string

func (p *platforms) String() string { return strings.Join(*p, " ") }

func (p *platforms) Set(s string) error {
	goos, goarch, ok := strings.Cut(s, "/")
	if !ok || goos == "" || goarch == "" || strings.Contains(goarch, "/") {
		return fmt.Errorf("want os/arch, e.g. linux/amd64; got %q", s)
	}
	*p = append(*p, s)
	return nil
}

// archive is one platform's archive, as the manifest names it.
type archive struct {
	OS, Arch, URI, SHA256, Bin string
}

func main() {
	var plats platforms
	var version, out, root string
	flag.Var(&plats, "platform", "os/arch to build the plugin for; repeat for each platform")
	flag.StringVar(&version, "version", "", "k8s_event version (the VERSION file), without its v")
	flag.StringVar(&out, "out", "", "directory to write the archives and the manifest to")
	flag.StringVar(&root, "root", ".", "the repository's top directory")
	flag.Parse()
	if len(plats) == 0 || version == "" || out == "" || strings.HasPrefix(version, "v") {
		fmt.Fprintln(os.Stderr, "krew: -platform, -out and -version (without its v) are required")
		os.Exit(2)
	}
	if err := write(root, out, version, plats); err != nil {
		fmt.Fprintln(os.Stderr, "krew:", err)
		os.Exit(1)
	}
}

// write builds each platform's archive into out, then the manifest.
func write(root, out, version string, plats []string) error {
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	license, err := os.ReadFile(filepath.Join(root, "LICENSE"))
	if err != nil {
		return err
	}
	var archives []archive
	for _, p := range plats {
		a, err := build(root, out, version, p, license)
		if err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		archives = append(archives, a)
	}
	manifest := filepath.Join(out, plugin+".yaml")
	f, err := os.Create(manifest)
	if err != nil {
		return err
	}
	err = manifestTemplate.Execute(f, map[string]any{
		"Name": plugin, "Version": "v" + version, "Platforms": archives,
	})
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	fmt.Println(manifest)
	return err
}

// build cross-builds the program for platform p and writes its archive.
func build(root, out, version, p string, license []byte) (archive, error) {
	goos, goarch, _ := strings.Cut(p, "/")
	bin := program
	if goos == "windows" {
		bin += ".exe"
	}
	tmp, err := os.MkdirTemp("", "krew-build")
	if err != nil {
		return archive{}, err
	}
	defer os.RemoveAll(tmp)
	exe := filepath.Join(tmp, bin)
	ldflags := "-s -w -X github.com/dnsops/k8s_event/internal/version.version=" + version
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags", ldflags, "-o", exe, pkg)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS="+goos, "GOARCH="+goarch)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return archive{}, fmt.Errorf("go build: %w", err)
	}
	data, err := os.ReadFile(exe)
	if err != nil {
		return archive{}, err
	}
	name := fmt.Sprintf("%s-%s-%s-%s.tar.gz", program, version, goos, goarch)
	sum, err := writeArchive(filepath.Join(out, name), []file{{bin, 0o755, data}, {"LICENSE", 0o644, license}})
	if err != nil {
		return archive{}, err
	}
	return archive{
		OS: goos, Arch: goarch, Bin: bin, SHA256: sum,
		URI: fmt.Sprintf("%s/v%s/%s", releases, version, name),
	}, nil
}

// file is a file of an archive.
type file struct {
	name string
	mode int64
	data []byte
}

// writeArchive writes files as a gzipped tar at path and returns its
// SHA-256. The archive holds nothing of the machine or the hour that made
// it: the same files give the same archive.
func writeArchive(path string, files []file) (string, error) {
	f, err := os.Create(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	zw := gzip.NewWriter(io.MultiWriter(f, h))
	tw := tar.NewWriter(zw)
	for _, fl := range files {
		hdr := &tar.Header{
			Name: fl.name, Mode: fl.mode, Size: int64(len(fl.data)),
			ModTime: time.Unix(0, 0), Typeflag: tar.TypeReg, Format: tar.FormatPAX,
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return "", err
		}
		if _, err := tw.Write(fl.data); err != nil {
			return "", err
		}
	}
	if err := tw.Close(); err != nil {
		return "", err
	}
	if err := zw.Close(); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), f.Close()
}
