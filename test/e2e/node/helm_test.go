//go:build e2e

package node

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dnsops/k8s_event/internal/cluster"
	"github.com/dnsops/k8s_event/internal/image"
)

// helmPatches are, as docs/helm.md advises, two replicas of which none is
// unavailable during a rollout; readiness checked at once.
const helmPatches = `
- target: {kind: Deployment, name: coredns}
  patch: |-
    apiVersion: apps/v1
    kind: Deployment
    metadata:
      name: coredns
    spec:
      replicas: 2
      strategy:
        rollingUpdate:
          maxUnavailable: 0
      template:
        spec:
          containers:
          - name: coredns
            readinessProbe:
              initialDelaySeconds: 0
              periodSeconds: 1
              timeoutSeconds: 3
              failureThreshold: 2
`

// TestHelmValues installs k8s_event through the official chart's values
// (deploy/helm/values.yaml and rbac.yaml), from what helm renders of them
// (testdata/helm-rendered.yaml, made by testdata/render-helm.sh): the
// chart with its default values and the stock image first, then the
// values as `helm upgrade -f` applies them, then the defaults again as
// `helm rollback` does; a DNS probe asks throughout, and every pod of
// k8s_event writes its events.
func TestHelmValues(t *testing.T) {
	if err := cluster.NodeSupported(); err != nil {
		fmt.Fprintf(os.Stderr, "SKIP TestHelmValues: %v\n", err)
		t.Skip(err)
	}
	version := stockRelease(t)
	archive := releaseImage(t, version)
	tmp := t.TempDir()
	stock := stockArchive(t, tmp)
	start := time.Now()
	kube, err := cluster.New(t.Context(), cluster.Options{Node: &cluster.NodeOptions{Images: []string{archive, stock}, PodNetwork: true}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kube.Stop)
	t.Logf("control plane and node Ready in %v", since(start))
	ref := image.ParseReference(pushedRef(t, kube, archive))
	stockRef := image.ParseReference(stockImage)

	// The rendered chart names the images of the values file and of the
	// chart's appVersion; the node has the ones built above.
	write := func(name string, resources []string, images string) string {
		dir := filepath.Join(tmp, name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		var k strings.Builder
		k.WriteString("resources:\n")
		for _, r := range resources {
			data, err := os.ReadFile(filepath.Join(repoRoot, r))
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, filepath.Base(r)), data, 0o644); err != nil {
				t.Fatal(err)
			}
			fmt.Fprintf(&k, "- %s\n", filepath.Base(r))
		}
		k.WriteString(images)
		k.WriteString("patches:" + helmPatches)
		if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(k.String()), 0o644); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	stockImages := fmt.Sprintf("images:\n- name: coredns/coredns\n  newName: %s\n  newTag: %s\n", stockRef.Name, stockRef.Tag)
	stockDir := write("stock", []string{"test/e2e/node/testdata/helm-stock.yaml"}, stockImages)
	valuesDir := write("values", []string{"test/e2e/node/testdata/helm-rendered.yaml", "deploy/helm/rbac.yaml"},
		fmt.Sprintf("images:\n- name: localhost/coredns-k8s-event\n  newName: %s\n  newTag: %s\n", ref.Name, ref.Tag))
	rendered, err := os.ReadFile(filepath.Join(repoRoot, "test/e2e/node/testdata/helm-rendered.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"image: \"localhost/coredns-k8s-event:", "COREDNS_POD_UID", "kubeapi", "k8s_event {"} {
		if !strings.Contains(string(rendered), want) {
			t.Errorf("helm-rendered.yaml does not have %q: render it again (testdata/render-helm.sh)", want)
		}
	}

	lc := &lifecycle{t: t, kube: kube, ref: pushedRef(t, kube, archive), dir: tmp, l: layout{
		name: "helm -f", ns: "kube-system", deployment: "coredns", config: "coredns", service: "coredns",
		selector: "app.kubernetes.io/name=coredns", port: 53,
	}}
	lc.kubectl("apply", "-k", stockDir)
	lc.noEvents(lc.waitPods(stockImage))
	lc.waitService("kubernetes.default.svc.cluster.local.")
	lc.probe = startStepProber(lc.dnsAddr(), "kubernetes.default.svc.cluster.local.")
	defer lc.probe.finish()

	lc.do("helm upgrade -f values.yaml", func() {
		lc.kubectl("apply", "-k", valuesDir)
		lc.waitEvents(lc.waitPods(lc.ref))
	})
	for _, p := range lc.waitPods(lc.ref) {
		if v, ok := image.CoreDNSVersion(p.Spec.Containers[0].Image); !ok || "v"+v.String() != version {
			t.Errorf("pod %s runs %s, not CoreDNS %s", p.Name, p.Spec.Containers[0].Image, version)
		}
		list, err := kube.Clientset.CoreV1().Events("kube-system").List(t.Context(), metav1.ListOptions{FieldSelector: "involvedObject.uid=" + string(p.UID)})
		if err != nil {
			t.Fatal(err)
		}
		evs := withReasonPrefix(list.Items, "CoreDNS")
		t.Logf("pod %s (%s): %d CoreDNS events:\n%s", p.Name, p.Spec.Containers[0].Image, len(evs), cluster.DescribeEvents(evs))
	}
	lc.do("helm rollback", func() {
		lc.kubectl("apply", "-k", stockDir)
		lc.noEvents(lc.waitPods(stockImage))
	})
	lc.probe.finish()
	t.Logf("per step: failed queries, time\n%s", strings.Join(lc.report, "\n"))
}
