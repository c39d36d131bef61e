// Command image writes the k8s_event CoreDNS image, for every platform it
// is given a binary of, as an OCI archive that `ctr -n k8s.io images
// import`, `kind load image-archive` and `docker load` take, with no
// registry and no builder daemon. `make image` runs it on the static
// builds of cmd/coredns for linux/amd64 and linux/arm64.
//
// Unless -tag is given, the tag is -version followed by the first 12 hex
// digits of the image index's digest, so the same code always gives the
// same tag and other code another. It prints the full reference and, with
// -ref-file, writes it there; the archive's index.json names it too
// (image.Ref reads it back).
package main

import (
	"bufio"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/dnsops/k8s_event/internal/image"
)

// binaries is the repeated -binary os/arch=path flag.
type binaries []image.Binary

func (b *binaries) String() string { return fmt.Sprint(*b) }

func (b *binaries) Set(s string) error {
	platform, p, ok := strings.Cut(s, "=")
	if !ok || platform == "" || p == "" {
		return fmt.Errorf("want os/arch=path, e.g. linux/amd64=bin/linux-amd64/coredns; got %q", s)
	}
	*b = append(*b, image.Binary{Platform: platform, Path: p})
	return nil
}

// settings are what the image holds besides its binaries; the Dockerfile
// sets the same (see dockerfile_test.go).
func settings(version, revision, coredns string) image.Options {
	return image.Options{
		Entrypoint:     "/coredns",
		Ports:          []string{"53/tcp", "53/udp", "9153/tcp"},
		NetBindService: true,
		Labels: map[string]string{
			"org.opencontainers.image.title":       "CoreDNS with k8s_event",
			"org.opencontainers.image.description": "CoreDNS " + coredns + " with every in-tree plugin, kubeapi and k8s_event " + version,
			"org.opencontainers.image.version":     coredns + "-" + version,
			"org.opencontainers.image.revision":    revision,
			"org.opencontainers.image.source":      "https://github.com/dnsops/k8s_event",
			"org.opencontainers.image.url":         "https://github.com/dnsops/k8s_event",
			"org.opencontainers.image.licenses":    "Apache-2.0",
			"io.coredns.version":                   coredns,
			"io.coredns.k8s_event.version":         version,
		},
	}
}

func main() {
	var bins binaries
	var name, tag, out, refFile, version, revision, coredns, caCerts string
	flag.Var(&bins, "binary", "os/arch=path of a static CoreDNS binary; repeat for each platform")
	flag.StringVar(&name, "name", "localhost/coredns-k8s-event", "image name, with its registry")
	flag.StringVar(&tag, "tag", "", "image tag; empty: CoreDNS version-k8s_event version-content digest")
	flag.StringVar(&caCerts, "ca-certs", "/etc/ssl/certs/ca-certificates.crt", "CA bundle to ship; empty for none")
	flag.StringVar(&out, "out", "", "archive to write")
	flag.StringVar(&refFile, "ref-file", "", "file to write the image's full reference to")
	flag.StringVar(&version, "version", "", "k8s_event version")
	flag.StringVar(&revision, "revision", "", "source revision")
	flag.StringVar(&coredns, "coredns", "", "CoreDNS version")
	flag.Parse()
	if len(bins) == 0 || out == "" || version == "" || coredns == "" {
		fmt.Fprintln(os.Stderr, "image: -binary, -out, -version and -coredns are required")
		os.Exit(2)
	}
	o := settings(version, revision, coredns)
	o.Binaries = bins
	o.CACerts = caCerts
	o.Created = time.Unix(0, 0).UTC()
	if s := os.Getenv("SOURCE_DATE_EPOCH"); s != "" {
		sec, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			fmt.Fprintf(os.Stderr, "image: SOURCE_DATE_EPOCH %q: want seconds since 1970\n", s)
			os.Exit(2)
		}
		o.Created = time.Unix(sec, 0).UTC()
	}
	img, err := image.Build(o)
	if err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
	if tag == "" {
		tag = img.ContentTag(coredns + "-" + version)
	}
	ref := name + ":" + tag
	if err := write(out, func(f *bufio.Writer) error { return img.Write(f, ref) }); err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
	if refFile != "" {
		if err := write(refFile, func(f *bufio.Writer) error { _, err := fmt.Fprintln(f, ref); return err }); err != nil {
			fmt.Fprintln(os.Stderr, "image:", err)
			os.Exit(1)
		}
	}
	platforms := make([]string, len(bins))
	for i, b := range bins {
		platforms[i] = b.Platform
	}
	fmt.Printf("%s (%s) -> %s\n", ref, strings.Join(platforms, ", "), out)
}

// write writes path through a temporary file renamed into place.
func write(path string, fill func(*bufio.Writer) error) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	tmp := path + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	w := bufio.NewWriter(f)
	err = fill(w)
	if err == nil {
		err = w.Flush()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(tmp)
		return err
	}
	return os.Rename(tmp, path)
}
