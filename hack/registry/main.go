// Command registry puts the image that `make image` writes into a
// registry, and serves a registry on loopback for the test node.
//
//	registry push [-archive bin/coredns-k8s-event.tar] [-overwrite] [-insecure] REGISTRY/REPO:TAG
//	registry serve [-addr 127.0.0.1:0] [-dir DIR]
//
// push sends the archive's image index, every platform of it, with the
// credentials of the user's docker config (as `docker login` writes them),
// and prints the pushed reference with its digest. It refuses a tag that
// names another image unless -overwrite is given. `make push IMAGE=...`
// runs it.
//
// serve runs an OCI registry (go-containerregistry's) on plain HTTP until
// SIGTERM or SIGINT, with its blobs under -dir (in memory without it). It
// prints the address it serves on, then a line per request.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "registry:", err)
		if errors.Is(err, errUsage) {
			os.Exit(2)
		}
		os.Exit(1)
	}
}

var errUsage = errors.New("usage: registry push [-archive FILE] [-overwrite] [-insecure] REGISTRY/REPO:TAG | registry serve [-addr HOST:PORT] [-dir DIR]")

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return errUsage
	}
	fs := flag.NewFlagSet("registry "+args[0], flag.ContinueOnError)
	fs.SetOutput(stderr)
	switch args[0] {
	case "push":
		var o pushOptions
		fs.StringVar(&o.archive, "archive", "bin/coredns-k8s-event.tar", "the image archive that `make image` writes")
		fs.BoolVar(&o.overwrite, "overwrite", false, "move the tag when it names another image")
		fs.BoolVar(&o.insecure, "insecure", false, "plain HTTP to the registry (it is used anyway for loopback and private addresses)")
		if err := fs.Parse(args[1:]); err != nil {
			return fmt.Errorf("%w: %v", errUsage, err)
		}
		if fs.NArg() != 1 {
			return fmt.Errorf("push takes one image reference, REGISTRY/REPO:TAG (make push IMAGE=...): %w", errUsage)
		}
		o.ref = fs.Arg(0)
		r, err := push(ctx, o)
		if err != nil {
			return err
		}
		fmt.Fprintf(stderr, "%s %s (%s)\n", r.verb, o.ref, r.platforms)
		fmt.Fprintln(stdout, r.digest)
		return nil
	case "serve":
		addr := fs.String("addr", "127.0.0.1:0", "address to serve on")
		dir := fs.String("dir", "", "directory of the blobs; empty: in memory")
		if err := fs.Parse(args[1:]); err != nil {
			return fmt.Errorf("%w: %v", errUsage, err)
		}
		return serve(ctx, *addr, *dir, stdout, stderr)
	}
	return errUsage
}
