package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/google/go-containerregistry/pkg/registry"
)

// serve runs a registry on addr until ctx ends. It prints the address it
// serves on first, so that a caller that asked for port 0 learns the port.
func serve(ctx context.Context, addr, dir string, stdout, stderr io.Writer) error {
	opts := []registry.Option{registry.Logger(log.New(stderr, "", log.LstdFlags))}
	if dir != "" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		opts = append(opts, registry.WithBlobHandler(registry.NewDiskBlobHandler(dir)))
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: registry.New(opts...), ReadHeaderTimeout: 10 * time.Second}
	fmt.Fprintf(stdout, "serving on %s\n", l.Addr())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(l) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdown); err != nil {
		return err
	}
	if err := <-done; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
