//go:build !linux

package cluster

import (
	"context"
	"errors"
	"os"
	"time"
)

// machine is what a node changes on the machine; nodes run on Linux only.
type machine struct{}

var errNoNode = errors.New("a node needs Linux")

func snapshotMachine() (*machine, error)                      { return nil, errNoNode }
func (m *machine) killContainers(timeout time.Duration) error { return errNoNode }
func (m *machine) restore(dir string) error                   { return errNoNode }
func killShims(shim, socket string)                           {}
func preparePodNetwork(addr string) error                     { return errNoNode }
func bridgeNetfilter() error                                  { return errNoNode }

func lockMachine(ctx context.Context) (*os.File, error) { return nil, errNoNode }
