package install

import (
	"bytes"
	"context"
	"testing"

	"k8s.io/client-go/kubernetes"
)

// statusText is status's text, and whether it found nothing wrong.
func statusText(t *testing.T, c kubernetes.Interface) (string, bool) {
	t.Helper()
	var out bytes.Buffer
	s, err := Status(context.Background(), c, Options{Out: &out})
	if err != nil {
		t.Fatal(err)
	}
	return out.String(), s.Healthy()
}

func withForce(o Options) Options {
	o.Force = true
	return o
}
