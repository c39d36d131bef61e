// Command image writes the k8s_event CoreDNS image as an archive that
// `docker load`, `ctr -n k8s.io images import` and `kind load
// image-archive` take, with no registry and no builder daemon. `make image`
// runs it on the static build of cmd/coredns.
package main

import (
	"bufio"
	"flag"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/dnsops/k8s_event/internal/image"
)

func main() {
	var o image.Options
	var out, version, revision, coredns string
	flag.StringVar(&o.Binary, "binary", "bin/static/coredns", "static CoreDNS binary")
	flag.StringVar(&o.Name, "name", "coredns-k8s-event", "image repository")
	flag.StringVar(&o.Tag, "tag", "", "image tag")
	flag.StringVar(&o.CACerts, "ca-certs", "/etc/ssl/certs/ca-certificates.crt", "CA bundle to ship; empty for none")
	flag.StringVar(&out, "out", "", "archive to write")
	flag.StringVar(&version, "version", "", "k8s_event version")
	flag.StringVar(&revision, "revision", "", "source revision")
	flag.StringVar(&coredns, "coredns", "", "CoreDNS version")
	flag.Parse()
	if o.Tag == "" || out == "" || version == "" {
		fmt.Fprintln(os.Stderr, "image: -tag, -out and -version are required")
		os.Exit(2)
	}
	o.Entrypoint = "/coredns"
	o.Ports = []string{"53/tcp", "53/udp", "9153/tcp"}
	o.NetBindService = true
	o.Created = time.Unix(0, 0).UTC()
	if s := os.Getenv("SOURCE_DATE_EPOCH"); s != "" {
		if sec, err := strconv.ParseInt(s, 10, 64); err == nil {
			o.Created = time.Unix(sec, 0).UTC()
		}
	}
	o.Labels = map[string]string{
		"org.opencontainers.image.title":       "CoreDNS with k8s_event",
		"org.opencontainers.image.description": "CoreDNS " + coredns + " with every in-tree plugin, kubeapi and k8s_event " + version,
		"org.opencontainers.image.version":     o.Tag,
		"org.opencontainers.image.revision":    revision,
		"org.opencontainers.image.source":      "https://github.com/dnsops/k8s_event",
		"org.opencontainers.image.licenses":    "Apache-2.0",
		"io.coredns.version":                   coredns,
		"io.coredns.k8s_event.version":         version,
	}
	if err := write(out, o); err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
	fmt.Printf("%s:%s -> %s\n", o.Name, o.Tag, out)
}

func write(path string, o image.Options) error {
	tmp := path + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	w := bufio.NewWriter(f)
	if err := image.Write(w, o); err != nil {
		f.Close()
		return err
	}
	if err := w.Flush(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
