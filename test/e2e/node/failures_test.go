//go:build e2e

package node

import (
	"context"
	"fmt"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"time"

	"testing"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/client-go/util/retry"
)

// zoneFile is a zone the chart's layout serves from its ConfigMap.
const zoneFile = `$ORIGIN example.test.
@       3600 IN SOA ns.example.test. admin.example.test. 1 7200 3600 1209600 3600
        3600 IN NS  ns.example.test.
ns      3600 IN A   10.0.0.53
www     3600 IN A   10.0.0.80
`

// failurePaths runs the install's failure paths on the helm chart's
// layout with its rollout defaults (one replica, maxUnavailable 1) and a
// ConfigMap as k3s has it (NodeHosts beside the Corefile), a zone file
// and a binaryData key: an image that never becomes Ready, a GitOps tool
// putting back the Deployment during the wait, two installs at once, the
// source ConfigMap changing; uninstall after each; DNS asked throughout.
func (lc *lifecycle) failurePaths(t *testing.T) {
	lc.t = t
	l := lc.l
	dir := l.stock(t, filepath.Join(lc.dir, "stock"))
	lc.kubectl("apply", "-k", dir)
	ctx := t.Context()
	c := lc.kube.Clientset
	// The chart's defaults, and its ConfigMap as k3s lays it out.
	cm := lc.configMap(l.config)
	// The Corefile as kustomize wrote it ends without a newline.
	cm.Data["Corefile"] = strings.TrimSuffix(cm.Data["Corefile"], "\n") + "\n" + fmt.Sprintf("example.test:%[1]d {\n    file /etc/coredns/db.example.test\n}\nnodes.test:%[1]d {\n    hosts /etc/coredns/NodeHosts\n}\n", l.port)
	cm.Data["db.example.test"] = zoneFile
	cm.Data["NodeHosts"] = "10.0.0.11 node-a.nodes.test\n"
	cm.BinaryData = map[string][]byte{"site.bin": []byte("\x00\x01site\xff\xfe\x00\x02\x03\x04")}
	if _, err := c.CoreV1().ConfigMaps(l.ns).Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		d := lc.deploymentObj()
		d.Spec.Replicas = ptr(int32(1))
		d.Spec.Template.Spec.Volumes[0].ConfigMap.Items = []corev1.KeyToPath{
			{Key: "Corefile", Path: "Corefile"}, {Key: "db.example.test", Path: "db.example.test"},
			{Key: "NodeHosts", Path: "NodeHosts"}, {Key: "site.bin", Path: "site.bin"},
		}
		_, err := c.AppsV1().Deployments(l.ns).Update(ctx, d, metav1.UpdateOptions{})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	lc.waitPods(stockImage)
	lc.stockDep, lc.stockCM = lc.deploymentObj(), lc.configMap(l.config)
	if s := lc.stockDep.Spec.Strategy.RollingUpdate; *lc.stockDep.Spec.Replicas != 1 || s == nil || s.MaxUnavailable.IntValue() != 1 {
		t.Fatalf("not the chart's rollout defaults: %d replicas, %+v", *lc.stockDep.Spec.Replicas, s)
	}
	// The chart's defaults (1 replica, maxUnavailable 1) rolled the pod
	// with no other to answer: wait until the new one is behind the
	// Service.
	lc.waitService("kubernetes.default.svc.cluster.test.")
	lc.probe = startStepProber(lc.dnsAddr(), "kubernetes.default.svc.cluster.test.")
	defer lc.probe.finish()
	lc.expectA("www.example.test.", "10.0.0.80")
	lc.expectA("node-a.nodes.test.", "10.0.0.11")
	args := func(image string, extra ...string) []string {
		// info, so that each new pod writes the reload plugin's line.
		return append(append([]string{"install", "--image", image, "--force", "--option", "level info warning error", "--settle", "2s"}, lc.nsFlags()...), extra...)
	}
	// back checks that the Deployment is the operator's again.
	back := func(what string) {
		t.Helper()
		got := lc.deploymentObj()
		if !reflect.DeepEqual(got.Spec.Template, lc.stockDep.Spec.Template) || !reflect.DeepEqual(got.Spec.Strategy, lc.stockDep.Spec.Strategy) {
			t.Errorf("%s: the Deployment is not the operator's:\n%s", what, lineDiff(comparable(lc.stockDep), comparable(got)))
		}
	}

	lc.do("install an image that never starts", func() {
		out := lc.pluginExit(1, args("localhost/coredns-k8s-event:never-pulled", "--timeout", "25s")...)
		if !strings.Contains(out, "is back as it was") {
			t.Errorf("the failed install does not say the Deployment is back:\n%s", out)
		}
		lc.waitPods(stockImage)
	})
	back("after the image that never starts")

	lc.do("install, put back during the wait", func() {
		// What a GitOps controller does: it puts back its image and
		// volume as soon as it sees them changed.
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
				d, err := c.AppsV1().Deployments(l.ns).Get(ctx, l.deployment, metav1.GetOptions{})
				if err != nil || d.Spec.Template.Spec.Containers[0].Image != lc.ref {
					return false, nil
				}
				patch := fmt.Sprintf(`{"spec":{"template":{"spec":{"containers":[{"name":"coredns","image":%q}],"volumes":[{"name":"config-volume","configMap":{"name":%q}}]}}}}`, stockImage, l.config)
				_, err = c.AppsV1().Deployments(l.ns).Patch(ctx, l.deployment, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{FieldManager: "gitops"})
				return err == nil, nil
			})
		}()
		out := lc.pluginExit(1, args(lc.ref, "--timeout", "90s")...)
		wg.Wait()
		if !strings.Contains(out, "changed during the rollout") || !strings.Contains(out, `"gitops"`) {
			t.Errorf("install does not say the Deployment was changed during the wait, and by whom:\n%s", out)
		}
		lc.waitPods(stockImage)
		if s := lc.pluginExit(4, append([]string{"status"}, lc.nsFlags()...)...); !strings.Contains(s, "partly undone") {
			t.Errorf("status after the revert:\n%s", s)
		}
	})
	lc.do("uninstall after the revert", func() {
		lc.plugin(append([]string{"uninstall", "--settle", "2s"}, lc.nsFlags()...)...)
		lc.waitPods(stockImage)
	})
	back("after uninstall")

	// From here the plugin runs as a ServiceAccount bound to the Role the
	// documentation gives the person who runs it, and nothing more.
	lc.kubeconfig = lc.operatorKubeconfig(t)
	lc.do("install without --force, refused for NodeHosts", func() {
		out := lc.pluginExit(5, append([]string{"install", "--image", lc.ref}, lc.nsFlags()...)...)
		if !strings.Contains(out, "NodeHosts") {
			t.Errorf("install without --force does not name NodeHosts:\n%s", out)
		}
	})
	lc.do("two installs at once", func() {
		codes := make([]int, 2)
		outs := make([]string, 2)
		var wg sync.WaitGroup
		for i := range codes {
			wg.Add(1)
			go func() {
				defer wg.Done()
				outs[i], codes[i] = lc.pluginRun(args(lc.ref)...)
			}()
		}
		wg.Wait()
		ok := 0
		for i, code := range codes {
			switch {
			case code == 0:
				ok++
			case code == 5 && strings.Contains(outs[i], "another kubectl k8s-event run"):
			default:
				t.Errorf("one of two installs at once: exit %d\n%s", code, outs[i])
			}
		}
		if ok == 0 {
			t.Errorf("neither of two installs at once went through")
		}
		lc.waitEvents(lc.waitPods(lc.ref))
	})
	gen := lc.configMap(lc.deploymentObj().Spec.Template.Spec.Volumes[0].ConfigMap.Name)
	if string(gen.BinaryData["site.bin"]) != string(lc.stockCM.BinaryData["site.bin"]) || gen.Data["NodeHosts"] != lc.stockCM.Data["NodeHosts"] || gen.Data["db.example.test"] != zoneFile {
		t.Errorf("the ConfigMap the pods read lost keys: data %v, binaryData %v", keys(gen.Data), gen.BinaryData)
	}
	lc.expectA("www.example.test.", "10.0.0.80")
	lc.expectA("node-a.nodes.test.", "10.0.0.11")
	lc.plugin(append([]string{"status"}, lc.nsFlags()...)...)

	lc.do("NodeHosts changes, status", func() {
		cm := lc.configMap(l.config)
		cm.Data["NodeHosts"] += "10.0.0.12 node-b.nodes.test\n"
		if _, err := c.CoreV1().ConfigMaps(l.ns).Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		if s := lc.pluginExit(4, append([]string{"status"}, lc.nsFlags()...)...); !strings.Contains(s, "changed since the install") {
			t.Errorf("status does not tell the change:\n%s", s)
		}
	})
	lc.do("uninstall", func() {
		lc.plugin(append([]string{"uninstall", "--settle", "2s"}, lc.nsFlags()...)...)
		lc.waitPods(stockImage)
	})
	back("after the last uninstall")
	lc.probe.finish()
	lc.kubectl("delete", "-k", dir, "--wait=true")
}

// operatorKubeconfig is a kubeconfig for a ServiceAccount bound to
// deploy/kubectl-k8s-event/role.yaml (its Role in the layout's namespace,
// its ClusterRole cluster-wide), the Role changed
// by the JSON patch edit when one is given.
func (lc *lifecycle) operatorKubeconfig(t *testing.T, edit ...string) string {
	ns := lc.l.ns
	lc.kubectl("-n", ns, "apply", "-f", filepath.Join(repoRoot, "deploy/kubectl-k8s-event/role.yaml"))
	for _, e := range edit {
		lc.kubectl("-n", ns, "patch", "role", "kubectl-k8s-event", "--type=json", "-p", e)
	}
	lc.kubectl("-n", ns, "create", "serviceaccount", "dns-operator")
	lc.kubectl("-n", ns, "create", "rolebinding", "kubectl-k8s-event", "--role", "kubectl-k8s-event", "--serviceaccount", ns+":dns-operator")
	lc.kubectl("create", "clusterrolebinding", "kubectl-k8s-event-"+ns, "--clusterrole", "kubectl-k8s-event", "--serviceaccount", ns+":dns-operator")
	tr, err := lc.kube.Clientset.CoreV1().ServiceAccounts(ns).CreateToken(t.Context(), "dns-operator", &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := clientcmd.LoadFromFile(lc.kube.KubeconfigPath)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range cfg.AuthInfos {
		*a = clientcmdapi.AuthInfo{Token: tr.Status.Token}
	}
	path := filepath.Join(lc.dir, "operator.kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		lc.kube.Kubectl(context.Background(), "-n", ns, "delete", "rolebinding/kubectl-k8s-event", "role/kubectl-k8s-event", "serviceaccount/dns-operator", "--ignore-not-found")
		lc.kube.Kubectl(context.Background(), "delete", "clusterrolebinding/kubectl-k8s-event-"+ns, "--ignore-not-found")
	})
	return path
}

func keys[V any](m map[string]V) []string {
	var k []string
	for x := range m {
		k = append(k, x)
	}
	return k
}

func ptr[T any](v T) *T { return &v }
