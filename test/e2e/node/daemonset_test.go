//go:build e2e

package node

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/dnsops/k8s_event/internal/cluster"
	"github.com/dnsops/k8s_event/internal/install"
)

// TestDaemonSetLifecycle runs CoreDNS as a DaemonSet (kubeadm's pods, with
// the operator's changes, under a DaemonSet coredns with the operator's
// updateStrategy: maxSurge 1, maxUnavailable 0), and installs the
// plugin's image into it with --workload daemonset/coredns, edits the
// Corefile and installs again, rolls back with kubectl rollout undo, and
// uninstalls: with a DNS probe asking through the kube-dns Service
// throughout, no query may fail, and after the uninstall the DaemonSet's
// spec is the operator's, updateStrategy and minReadySeconds included.
func TestDaemonSetLifecycle(t *testing.T) {
	if err := cluster.NodeSupported(); err != nil {
		fmt.Fprintf(os.Stderr, "SKIP TestDaemonSetLifecycle: %v\n", err)
		t.Skip(err)
	}
	archive := nodeImage(t)
	tmp := t.TempDir()
	stock := stockArchive(t, tmp)
	bin := filepath.Join(tmp, "bin")
	build(t, filepath.Join(bin, "kubectl-k8s_event"), "./cmd/kubectl-k8s_event")
	t.Setenv("PATH", bin+string(os.PathListSeparator)+os.Getenv("PATH"))
	start := time.Now()
	kube, err := cluster.New(t.Context(), cluster.Options{Node: &cluster.NodeOptions{Images: []string{archive, stock}, PodNetwork: true}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kube.Stop)
	t.Logf("control plane and node Ready in %v", since(start))
	l := layout{
		name: "daemonset", ns: "kube-system", deployment: "coredns", config: "coredns", service: "kube-dns", selector: "k8s-app=kube-dns", port: 53,
		stock: func(t *testing.T, dir string) string {
			rel, _ := filepath.Rel(dir, filepath.Join(repoRoot, "deploy/kubeadm"))
			return writeKustomization(t, dir, []string{rel}, "coredns", "coredns", kubeadmTolerations, 53, "")
		},
	}
	lc := &lifecycle{t: t, kube: kube, ref: pushedRef(t, kube, archive), plugins: bin, dir: filepath.Join(tmp, l.name), l: l}
	lc.daemonSet(t)
	t.Logf("per step: failed queries, time\n%s", strings.Join(lc.report, "\n"))
}

func (lc *lifecycle) daemonSet(t *testing.T) {
	lc.t = t
	l := lc.l
	stock := lc.stockDaemonSet()
	name := "kubernetes.default.svc.cluster.test."
	lc.waitService(name)
	lc.stockCM = lc.configMap(l.config)
	lc.probe = startStepProber(lc.dnsAddr(), name)
	defer lc.probe.finish()
	// The image is the plugin's own, on the CoreDNS release it is built
	// on, which need not be the stock one: --force goes past that.
	installArgs := append([]string{"install", "--workload", "daemonset/coredns", "--image", lc.ref, "--option", "level info warning error", "--settle", "2s", "--force"}, lc.nsFlags()...)
	dry := lc.plugin(append(installArgs, "--dry-run")...)
	if !strings.Contains(dry, "a canary first (RollingUpdate, maxSurge 1, maxUnavailable 0") {
		t.Errorf("the dry run does not say the canary:\n%s", dry)
	}
	var installed []corev1.Pod
	lc.do("install", func() {
		lc.plugin(installArgs...)
		installed = lc.waitDaemonSet(lc.ref)
		lc.waitEvents(installed)
	})
	lc.fleetCounted(installed)
	if status := lc.plugin(append([]string{"status", "--workload", "daemonset/coredns"}, lc.nsFlags()...)...); !strings.Contains(status, "daemonset kube-system/coredns") || !strings.Contains(status, "k8s_event installed") {
		t.Errorf("status after install:\n%s", status)
	}
	lc.checkDaemonSet(stock, true)
	lc.do("edit the Corefile, install", func() {
		cm := lc.configMap(l.config)
		cm.Data["Corefile"] = strings.Replace(cm.Data["Corefile"], "10.0.0.1 registry.corp.example", "10.0.0.1 registry.corp.example\n       10.0.0.2 edited.hosts.test", 1)
		if _, err := lc.kube.Clientset.CoreV1().ConfigMaps(l.ns).Update(t.Context(), cm, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		lc.plugin(installArgs...)
		lc.waitEvents(lc.waitDaemonSet(lc.ref))
	})
	lc.expectA("edited.hosts.test.", "10.0.0.2")
	lc.checkDaemonSet(stock, true)
	lc.do("kubectl rollout undo", func() {
		lc.kubectl("-n", l.ns, "rollout", "undo", "daemonset/coredns")
		lc.waitEvents(lc.waitDaemonSet(lc.ref))
	})
	if vol := lc.daemonSetObj().Spec.Template.Spec.Volumes[0].ConfigMap.Name; strings.Contains(lc.configMap(vol).Data["Corefile"], "edited.hosts.test") {
		t.Errorf("after the undo the pods read %s, the edited Corefile", vol)
	}
	lc.do("uninstall", func() {
		lc.plugin(append([]string{"uninstall", "--workload", "daemonset/coredns", "--settle", "2s"}, lc.nsFlags()...)...)
		lc.noEvents(lc.waitDaemonSet(stockImage))
	})
	lc.checkDaemonSet(stock, false)
}

// stockDaemonSet applies kubeadm's CoreDNS with the operator's changes
// and runs its pods under a DaemonSet in place of the Deployment.
func (lc *lifecycle) stockDaemonSet() *appsv1.DaemonSet {
	t, l := lc.t, lc.l
	dir := l.stock(t, filepath.Join(lc.dir, "stock"))
	lc.kubectl("apply", "-k", dir)
	d := lc.deploymentObj()
	ds := &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Name: d.Name, Namespace: d.Namespace, Labels: d.Labels},
		Spec: appsv1.DaemonSetSpec{Selector: d.Spec.Selector, Template: d.Spec.Template, UpdateStrategy: appsv1.DaemonSetUpdateStrategy{
			Type: appsv1.RollingUpdateDaemonSetStrategyType,
			RollingUpdate: &appsv1.RollingUpdateDaemonSet{
				MaxUnavailable: ptr(intstr.FromInt32(0)), MaxSurge: ptr(intstr.FromInt32(1)),
			},
		}},
	}
	c := lc.kube.Clientset
	if err := c.AppsV1().Deployments(l.ns).Delete(t.Context(), d.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.AppsV1().DaemonSets(l.ns).Create(t.Context(), ds, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	lc.noEvents(lc.waitDaemonSet(stockImage))
	return lc.daemonSetObj()
}

func (lc *lifecycle) daemonSetObj() *appsv1.DaemonSet {
	lc.t.Helper()
	d, err := lc.kube.Clientset.AppsV1().DaemonSets(lc.l.ns).Get(lc.t.Context(), lc.l.deployment, metav1.GetOptions{})
	if err != nil {
		lc.t.Fatal(err)
	}
	return d
}

// waitDaemonSet waits until the DaemonSet has rolled out and its pods are
// one a node, all Ready, all running image, none restarted.
func (lc *lifecycle) waitDaemonSet(image string) []corev1.Pod {
	t := lc.t
	t.Helper()
	var pods []corev1.Pod
	var why string
	err := wait.PollUntilContextTimeout(t.Context(), 250*time.Millisecond, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		d, err := lc.kube.Clientset.AppsV1().DaemonSets(lc.l.ns).Get(ctx, lc.l.deployment, metav1.GetOptions{})
		if err != nil {
			why = err.Error()
			return false, nil
		}
		s := d.Status
		if s.ObservedGeneration < d.Generation || s.DesiredNumberScheduled == 0 || s.UpdatedNumberScheduled != s.DesiredNumberScheduled || s.NumberAvailable != s.DesiredNumberScheduled {
			why = fmt.Sprintf("rolling out: %d updated, %d available of %d", s.UpdatedNumberScheduled, s.NumberAvailable, s.DesiredNumberScheduled)
			return false, nil
		}
		list, err := lc.kube.Clientset.CoreV1().Pods(lc.l.ns).List(ctx, metav1.ListOptions{LabelSelector: lc.l.selector})
		if err != nil {
			why = err.Error()
			return false, nil
		}
		pods = list.Items
		if len(pods) != int(s.DesiredNumberScheduled) {
			why = fmt.Sprintf("%d pods, want %d (old ones in their lameduck)", len(pods), s.DesiredNumberScheduled)
			return false, nil
		}
		for _, p := range pods {
			if p.Spec.Containers[0].Image != image || !podReady(&p) {
				why = fmt.Sprintf("pod %s: image %s, ready %v", p.Name, p.Spec.Containers[0].Image, podReady(&p))
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		describe, _, _ := lc.kube.Kubectl(t.Context(), "-n", lc.l.ns, "describe", "pods", "-l", lc.l.selector)
		t.Fatalf("pods of daemonset %s/%s: %v: %s\n%s", lc.l.ns, lc.l.deployment, err, why, describe)
	}
	for _, p := range pods {
		for _, s := range p.Status.ContainerStatuses {
			if s.RestartCount != 0 {
				t.Errorf("pod %s: container %s restarted %d times", p.Name, s.Name, s.RestartCount)
			}
		}
	}
	return pods
}

// fleetCounted checks that the install turned fleet on for the DaemonSet, and that each pod
// counted N from it: its metric of the replicas is the DaemonSet's desiredNumberScheduled.
func (lc *lifecycle) fleetCounted(pods []corev1.Pod) {
	t := lc.t
	t.Helper()
	d := lc.daemonSetObj()
	if cf := lc.configMap(d.Spec.Template.Spec.Volumes[0].ConfigMap.Name).Data["Corefile"]; !strings.Contains(cf, "fleet 0.1 100") {
		t.Errorf("the installed Corefile has no fleet 0.1 100:\n%s", cf)
	}
	want := fmt.Sprintf("coredns_k8s_event_fleet_replicas %d", d.Status.DesiredNumberScheduled)
	for _, p := range pods {
		url := "http://" + net.JoinHostPort(p.Status.PodIP, "9153") + "/metrics"
		var got string
		err := wait.PollUntilContextTimeout(t.Context(), 250*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			got = metricLines(ctx, url, "coredns_k8s_event_fleet_")
			return strings.Contains(got, want+"\n") && strings.Contains(got, "coredns_k8s_event_fleet_uncounted 0\n"), nil
		})
		if err != nil {
			t.Errorf("pod %s: want %q and fleet_uncounted 0, metrics:\n%s", p.Name, want, got)
		}
	}
}

// metricLines are the lines of the Prometheus text at url that begin with prefix, "" when it
// cannot be read.
func metricLines(ctx context.Context, url, prefix string) string {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return ""
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var out strings.Builder
	for _, line := range strings.Split(string(body), "\n") {
		if strings.HasPrefix(line, prefix) {
			out.WriteString(line + "\n")
		}
	}
	return out.String()
}

// checkDaemonSet compares the live DaemonSet with the operator's: with
// k8s_event installed, its rollout settings are the operator's and no
// record of them is left; uninstalled, its whole spec is the operator's,
// and the Role and RoleBinding are gone.
func (lc *lifecycle) checkDaemonSet(stock *appsv1.DaemonSet, installed bool) {
	t := lc.t
	t.Helper()
	d := lc.daemonSetObj()
	if !reflect.DeepEqual(d.Spec.UpdateStrategy, stock.Spec.UpdateStrategy) || d.Spec.MinReadySeconds != stock.Spec.MinReadySeconds || d.Annotations[install.StrategyAnnotation] != "" {
		t.Errorf("updateStrategy %+v, minReadySeconds %d, record %q: want the operator's", d.Spec.UpdateStrategy, d.Spec.MinReadySeconds, d.Annotations[install.StrategyAnnotation])
	}
	if cm := lc.configMap(lc.l.config); installed && !reflect.DeepEqual(cm.Data, lc.stockCM.Data) && !strings.Contains(cm.Data["Corefile"], "edited.hosts.test") {
		t.Errorf("the operator's ConfigMap changed:\n%s", lineDiff(lc.stockCM.Data["Corefile"], cm.Data["Corefile"]))
	}
	c := d.Spec.Template.Spec.Containers[0]
	if installed {
		if c.Image != lc.ref || !strings.HasPrefix(d.Spec.Template.Spec.Volumes[0].ConfigMap.Name, lc.l.config+"-k8s-event-") {
			t.Errorf("k8s_event is not installed: image %s, volume %+v", c.Image, d.Spec.Template.Spec.Volumes[0])
		}
		return
	}
	if got, want := d.Spec, stock.Spec; !reflect.DeepEqual(got, want) {
		g, _ := json.Marshal(got)
		w, _ := json.Marshal(want)
		t.Errorf("after uninstall the DaemonSet is not the operator's:\n%s", lineDiff(string(w), string(g)))
	}
	for _, kind := range []string{"role", "rolebinding"} {
		var err error
		if kind == "role" {
			_, err = lc.kube.Clientset.RbacV1().Roles(lc.l.ns).Get(t.Context(), "coredns-k8s-event", metav1.GetOptions{})
		} else {
			_, err = lc.kube.Clientset.RbacV1().RoleBindings(lc.l.ns).Get(t.Context(), "coredns-k8s-event", metav1.GetOptions{})
		}
		if !apierrors.IsNotFound(err) {
			t.Errorf("after uninstall the %s is there: %v", kind, err)
		}
	}
}
