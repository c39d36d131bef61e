package install

import (
	"bytes"
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The dry run says the prune the real run makes.
func TestInstallDryRunSaysThePrune(t *testing.T) {
	ctx := context.Background()
	stale := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "coredns-k8s-event-0123456789", Namespace: "kube-system",
		Labels: map[string]string{DeploymentLabel: "coredns", "app.kubernetes.io/managed-by": FieldManager}}}
	c := newClient(deployment(), configMap(), stale)
	var out bytes.Buffer
	if err := Install(ctx, c, Options{Image: image, DryRun: true, Out: &out}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "delete configmap kube-system/coredns-k8s-event-0123456789") {
		t.Errorf("the dry run does not say the prune:\n%s", out.String())
	}
	out.Reset()
	if err := Install(ctx, c, Options{Image: image, Out: &out}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "delete configmap kube-system/coredns-k8s-event-0123456789") {
		t.Errorf("the run does not prune:\n%s", out.String())
	}
}
