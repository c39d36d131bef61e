//go:build e2e

package node

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/util/retry"

	"github.com/dnsops/k8s_event/internal/cluster"
	"github.com/dnsops/k8s_event/internal/image"
	"github.com/dnsops/k8s_event/internal/install"
)

// exitsoonImage is an image that starts, passes its readiness probe and
// exits 1 within seconds (test/cmd/exitsoon), on the stock release's tag.
const exitsoonImage = "localhost/coredns-exitsoon:v1.13.1"

// TestInstallSafety runs, on the helm chart's layout on the host's network with its rollout
// defaults (one replica, maxUnavailable 1), the install's paths that must
// cost no query and leave the cluster as it was: an install without the
// right to create RoleBindings, an install killed (SIGKILL) during its wait
// and the run after it, and ten installs of an image that passes
// readiness and exits within seconds, each reported as failed and put
// back. A DNS probe asks throughout.
func TestInstallSafety(t *testing.T) {
	if err := cluster.NodeSupported(); err != nil {
		fmt.Fprintf(os.Stderr, "SKIP TestInstallSafety: %v\n", err)
		t.Skip(err)
	}
	archive := releaseImage(t, stockRelease(t))
	tmp := t.TempDir()
	stock := stockArchive(t, tmp)
	exits := exitsoonArchive(t, tmp)
	bin := filepath.Join(tmp, "bin")
	build(t, filepath.Join(bin, "kubectl-k8s_event"), "./cmd/kubectl-k8s_event")
	t.Setenv("PATH", bin+string(os.PathListSeparator)+os.Getenv("PATH"))
	start := time.Now()
	// The host's network, not the pod network the other node tests ask
	// through a Service: it measures the install's settle rule where it
	// is hardest (the old pod answers the new pod's readiness probe on the
	// shared port), and no Service sends new flows to a pod that passed
	// readiness and then exits, which would cost queries no install can
	// save.
	kube, err := cluster.New(t.Context(), cluster.Options{Node: &cluster.NodeOptions{Images: []string{archive, stock, exits}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kube.Stop)
	t.Logf("control plane and node Ready in %v", since(start))
	if _, err := kube.CreateNamespace(t.Context(), "dns"); err != nil {
		t.Fatal(err)
	}
	l := hostNetworkHelmLayout(kube)
	l.name = "safety"
	lc := &lifecycle{t: t, kube: kube, ref: pushedRef(t, kube, archive), plugins: bin, dir: filepath.Join(tmp, "safety"), l: l}
	lc.safety(t)
	t.Logf("per step: failed queries, time\n%s", strings.Join(lc.report, "\n"))
}

// exitsoonArchive writes the image archive of test/cmd/exitsoon.
func exitsoonArchive(t *testing.T, dir string) string {
	t.Helper()
	bin := filepath.Join(dir, "exitsoon")
	build(t, bin, "./test/cmd/exitsoon")
	img, err := image.Build(image.Options{
		Binaries:   []image.Binary{{Platform: "linux/" + runtime.GOARCH, Path: bin}},
		Entrypoint: "/coredns",
		Created:    time.Unix(0, 0),
	})
	if err != nil {
		t.Fatal(err)
	}
	archive := filepath.Join(dir, "exitsoon.tar")
	f, err := os.Create(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	w := bufio.NewWriter(f)
	if err := img.Write(w, exitsoonImage); err != nil {
		t.Fatal(err)
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	return archive
}

func (lc *lifecycle) safety(t *testing.T) {
	lc.t = t
	l := lc.l
	dir := l.stock(t, filepath.Join(lc.dir, "stock"))
	lc.kubectl("apply", "-k", dir)
	c := lc.kube.Clientset
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		d := lc.deploymentObj()
		d.Spec.Replicas = ptr(int32(1))
		_, err := c.AppsV1().Deployments(l.ns).Update(t.Context(), d, metav1.UpdateOptions{})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	lc.waitPods(stockImage)
	lc.stockDep, lc.stockCM = lc.deploymentObj(), lc.configMap(l.config)
	if s := lc.stockDep.Spec.Strategy.RollingUpdate; s == nil || s.MaxUnavailable.IntValue() != 1 {
		t.Fatalf("not the chart's rollout defaults: %+v", s)
	}
	lc.waitService("kubernetes.default.svc.cluster.test.")
	lc.probe = startStepProber(lc.dnsAddr(), "kubernetes.default.svc.cluster.test.")
	defer lc.probe.finish()
	asIs := func(what string) {
		t.Helper()
		got := lc.deploymentObj()
		if !reflect.DeepEqual(got.Spec.Template, lc.stockDep.Spec.Template) || !reflect.DeepEqual(got.Spec.Strategy, lc.stockDep.Spec.Strategy) || got.Annotations[install.StrategyAnnotation] != "" {
			t.Errorf("%s: the Deployment is not the operator's:\n%s", what, lineDiff(comparable(lc.stockDep), comparable(got)))
		}
		for _, kind := range []string{"role", "rolebinding"} {
			if out, _, _ := lc.kube.Kubectl(t.Context(), "-n", l.ns, "get", kind, l.deployment+"-k8s-event", "--ignore-not-found", "-o", "name"); strings.TrimSpace(out) != "" {
				t.Errorf("%s: %s is there", what, strings.TrimSpace(out))
			}
		}
	}
	installArgs := func(image string, extra ...string) []string {
		return append(append([]string{"install", "--image", image, "--force"}, lc.nsFlags()...), extra...)
	}
	lc.forbiddenPartWay(installArgs(lc.ref))
	asIs("after the install without the right to create RoleBindings")
	lc.killedDuringTheWait(installArgs)
	asIs("after the killed install, the next one and uninstall")
	for i := range 10 {
		lc.do(fmt.Sprintf("exits within seconds, run %d of 10", i+1), func() {
			out := lc.pluginExit(1, installArgs(exitsoonImage, "--timeout", "40s")...)
			if !strings.Contains(out, "is back as it was") || strings.Contains(out, "rolled out\n") {
				t.Errorf("run %d: the install of an image that exits within seconds is not reported failed and put back:\n%s", i+1, out)
			}
			lc.waitPods(stockImage)
		})
		asIs(fmt.Sprintf("after the image that exits within seconds, run %d", i+1))
	}
	lc.probe.finish()
	lc.kubectl("delete", "-k", dir, "--wait=true")
}

// forbiddenPartWay installs as an operator whose Role lets it create
// Roles but not RoleBindings: the run is refused before its first write.
func (lc *lifecycle) forbiddenPartWay(args []string) {
	t := lc.t
	admin := lc.kubeconfig
	// rules[5] is roles and rolebindings: roles keep every verb,
	// rolebindings lose create.
	lc.kubeconfig = lc.operatorKubeconfig(t, `[{"op":"replace","path":"/rules/5/resources","value":["roles"]},`+
		`{"op":"add","path":"/rules/-","value":{"apiGroups":["rbac.authorization.k8s.io"],"resources":["rolebindings"],"verbs":["get","update","delete"]}}]`)
	defer func() { lc.kubeconfig = admin }()
	lc.do("install without create on rolebindings", func() {
		out := lc.pluginExit(5, args...)
		if !strings.Contains(out, "create rolebindings.rbac.authorization.k8s.io") {
			t.Errorf("the refusal does not name the right missing:\n%s", out)
		}
		cms, err := lc.kube.Clientset.CoreV1().ConfigMaps(lc.l.ns).List(t.Context(), metav1.ListOptions{LabelSelector: install.DeploymentLabel})
		if err != nil || len(cms.Items) != 0 {
			t.Errorf("the refused install made configmaps: %v", err)
		}
	})
}

// killedDuringTheWait kills an install (SIGKILL) once its patch is in and
// the rollout waits; status then says what it left, the next install
// finishes it, and uninstall gives back the operator's Deployment.
func (lc *lifecycle) killedDuringTheWait(installArgs func(string, ...string) []string) {
	t := lc.t
	l := lc.l
	lc.do("install killed during its wait", func() {
		cmd := exec.CommandContext(t.Context(), os.Getenv("KUBECTL"), append([]string{"k8s-event"}, installArgs("localhost/coredns-k8s-event:never-pulled", "--timeout", "2m")...)...)
		cmd.Env = append(os.Environ(), "KUBECONFIG="+lc.kube.KubeconfigPath)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
			d, err := lc.kube.Clientset.AppsV1().Deployments(l.ns).Get(ctx, l.deployment, metav1.GetOptions{})
			return err == nil && strings.HasSuffix(d.Spec.Template.Spec.Containers[0].Image, ":never-pulled"), nil
		})
		time.Sleep(2 * time.Second)
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if err != nil {
			t.Fatalf("the install's patch: %v", err)
		}
		d := lc.deploymentObj()
		if d.Annotations[install.StrategyAnnotation] == "" {
			t.Errorf("the killed run left no record of the operator's strategy: %v", d.Annotations)
		}
		if s := lc.pluginExit(4, append([]string{"status"}, lc.nsFlags()...)...); !strings.Contains(s, "cut off during its rollout") {
			t.Errorf("status does not say a run was cut off:\n%s", s)
		}
	})
	lc.do("the next install finishes it", func() {
		lc.plugin(installArgs(lc.ref, "--settle", "5s")...)
		d := lc.deploymentObj()
		if !reflect.DeepEqual(d.Spec.Strategy, lc.stockDep.Spec.Strategy) || d.Annotations[install.StrategyAnnotation] != "" {
			t.Errorf("after the next install: strategy %+v, annotations %v; want the operator's", d.Spec.Strategy, d.Annotations)
		}
		lc.waitPods(lc.ref)
	})
	lc.do("uninstall", func() {
		lc.plugin(append([]string{"uninstall", "--settle", "5s"}, lc.nsFlags()...)...)
		lc.waitPods(stockImage)
	})
	if _, err := lc.kube.Clientset.CoordinationV1().Leases(l.ns).Get(t.Context(), l.deployment+"-k8s-event", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the lease after the last run: %v", err)
	}
}
