// Command pause is the sandbox process of the node's pods: it holds their
// namespaces and sleeps until SIGTERM or SIGINT. The node packs it into an
// image of its own, since no image registry is reachable.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
}
