package main

import (
	"fmt"
	"io"

	"github.com/dnsops/k8s_event/internal/version"
)

// name is how kubectl runs this program: krew links it as
// kubectl-coredns_k8s_event, for the plugin coredns-k8s-event.
const name = "kubectl coredns-k8s-event"

// printVersion says the version of this program: VERSION for a build of
// make, the module's version for `go install …@vVERSION`.
func printVersion(args []string, stdout io.Writer, usageErr func(error) error) error {
	if len(args) > 0 {
		return usageErr(fmt.Errorf("version: unexpected arguments %q", args))
	}
	_, err := fmt.Fprintln(stdout, name, version.String())
	return err
}
