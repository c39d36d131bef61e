package install

import (
	"bytes"
	"context"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Uninstall gives the pods back the operator's ConfigMap: when it is gone,
// the pods would not start, so uninstall (and its dry run) refuses unless
// forced, and says why.
func TestUninstallRefusesToPointThePodsAtAConfigMapThatIsGone(t *testing.T) {
	ctx := context.Background()
	c := newClient(deployment(), configMap())
	if err := Install(ctx, c, Options{Image: image, Wait: 0, Force: true}); err != nil {
		t.Fatal(err)
	}
	if err := c.CoreV1().ConfigMaps("kube-system").Delete(ctx, "coredns", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, dry := range []bool{true, false} {
		var out bytes.Buffer
		err := Uninstall(ctx, c, Options{DryRun: dry, Out: &out, Wait: 0, Force: false})
		if !IsRefused(err) || !strings.Contains(err.Error(), "configmap kube-system/coredns") || !strings.Contains(err.Error(), "--force") {
			t.Errorf("uninstall (dry run %v): %v, want it refused, naming the ConfigMap and --force\n%s", dry, err, out.String())
		}
	}
	if _, ok := get(t, c).Spec.Template.Annotations[Annotation]; !ok {
		t.Fatalf("the refused uninstall changed the Deployment")
	}
	var out bytes.Buffer
	if err := Uninstall(ctx, c, Options{Out: &out, Force: true}); err != nil {
		t.Fatalf("uninstall --force: %v", err)
	}
	if !strings.Contains(out.String(), "warning: --force: configmap kube-system/coredns") {
		t.Errorf("uninstall --force does not say what it went on despite:\n%s", out.String())
	}
}
