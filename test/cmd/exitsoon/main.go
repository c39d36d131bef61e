// Command exitsoon stands in for a CoreDNS image that starts, passes its
// readiness probe and exits within seconds: it answers /ready and /health
// on CoreDNS's ports (8181, 8080) for -for, then exits 1. It takes, and
// ignores, CoreDNS's flags. Where those ports are taken (pods that share
// the node's network with a CoreDNS that does not share its ports), the
// CoreDNS there answers the probe in its place, as it does on such nodes.
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"syscall"
	"time"
)

func main() {
	fs := flag.NewFlagSet("exitsoon", flag.ContinueOnError)
	life := fs.Duration("for", 3*time.Second, "how long to answer before exiting 1")
	_ = fs.String("conf", "", "ignored: CoreDNS's Corefile")
	_ = fs.Parse(os.Args[1:])
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		if err := c.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, soReusePort, 1) }); err != nil {
			return err
		}
		return serr
	}}
	ok := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "OK") })
	for _, addr := range []string{":8181", ":8080"} {
		l, err := lc.Listen(context.Background(), "tcp", addr)
		if err != nil {
			fmt.Fprintf(os.Stderr, "listen %s: %v\n", addr, err)
			continue
		}
		go func() { _ = http.Serve(l, ok) }()
	}
	fmt.Println("exitsoon: ready; exiting in", *life)
	time.Sleep(*life)
	fmt.Println("exitsoon: exiting 1")
	os.Exit(1)
}

// soReusePort is SO_REUSEPORT on Linux, which the syscall package does not name.
const soReusePort = 0xf
