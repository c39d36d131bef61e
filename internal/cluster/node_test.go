//go:build e2e && linux

package cluster

import (
	"context"
	"fmt"
	"maps"
	"net"
	"os"
	"os/exec"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
)

// machineView is what a node may change on the machine, as text, so that
// before and after compare.
func machineView(t *testing.T) string {
	t.Helper()
	var b strings.Builder
	for _, s := range append(append([]string{}, kernelTunables...), networkTunables...) {
		v, _ := os.ReadFile("/proc/sys/" + s)
		fmt.Fprintf(&b, "sysctl %s=%s", s, v)
	}
	for _, d := range machineDirs {
		_, err := os.Lstat(d)
		fmt.Fprintf(&b, "dir %s exists=%v\n", d, err == nil)
	}
	for _, cmd := range iptablesCommands() {
		rules, err := iptablesRules(cmd)
		if err != nil {
			t.Fatal(err)
		}
		var lines []string
		for l := range rules {
			lines = append(lines, l)
		}
		sort.Strings(lines)
		fmt.Fprintf(&b, "%s:\n  %s\n", cmd, strings.Join(lines, "\n  "))
	}
	m, err := snapshotMachine()
	if err != nil {
		t.Fatal(err)
	}
	var cgroups []string
	for d := range m.cgroups {
		cgroups = append(cgroups, d)
	}
	sort.Strings(cgroups)
	fmt.Fprintf(&b, "cgroups: %s\n", strings.Join(cgroups, " "))
	links, netns, loAddrs, err := networkState()
	if err != nil {
		t.Fatal(err)
	}
	for _, set := range []map[string]bool{links, netns, loAddrs} {
		fmt.Fprintf(&b, "network: %s\n", strings.Join(slices.Sorted(maps.Keys(set)), " "))
	}
	mounts, err := mountInfo()
	if err != nil {
		t.Fatal(err)
	}
	for _, mt := range mounts {
		fmt.Fprintf(&b, "mount %s %s\n", mt.point, mt.fsType)
	}
	return b.String()
}

// TestNode runs a Pod on a node, on the host's network and on a pod
// network, and checks that stopping the node leaves the machine as it was:
// no process, mount, cgroup, directory, sysctl, iptables rule, network
// interface or namespace, or address of the node's is left.
func TestNode(t *testing.T) {
	if err := NodeSupported(); err != nil {
		fmt.Fprintf(os.Stderr, "SKIP TestNode: %v\n", err)
		t.Skip(err)
	}
	t.Run("host network", func(t *testing.T) { testNode(t, false) })
	t.Run("pod network", func(t *testing.T) { testNode(t, true) })
}

func testNode(t *testing.T, podNetwork bool) {
	before := machineView(t)
	start := time.Now()
	c, err := New(t.Context(), Options{Node: &NodeOptions{PodNetwork: podNetwork}})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("control plane and node Ready in %v", time.Since(start).Round(time.Millisecond))
	stopped := false
	defer func() {
		if !stopped {
			c.Stop()
		}
	}()
	ctx := t.Context()

	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "pause", Namespace: "default"},
		Spec: corev1.PodSpec{
			HostNetwork:                   !podNetwork,
			TerminationGracePeriodSeconds: ptr.To[int64](5),
			Containers: []corev1.Container{{
				Name:            "pause",
				Image:           PauseImage,
				ImagePullPolicy: corev1.PullNever,
			}},
		},
	}
	// The controller manager makes the namespace's ServiceAccount soon
	// after it starts; admission needs it.
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := c.Clientset.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{})
		return err == nil, nil
	})
	if err != nil {
		t.Fatalf("create pod: %v", err)
	}
	start = time.Now()
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		p, err := c.Clientset.CoreV1().Pods("default").Get(ctx, "pause", metav1.GetOptions{})
		return err == nil && p.Status.Phase == corev1.PodRunning, nil
	})
	if err != nil {
		out, _, _ := c.Kubectl(ctx, "describe", "pod", "pause")
		t.Fatalf("pod not running: %v\n%s\n--- kubelet ---\n%s", err, out, c.KubeletLog(40))
	}
	t.Logf("pod Running %v after it was created", time.Since(start).Round(time.Millisecond))
	if podNetwork {
		checkPodNetwork(t, c)
	}

	shim := c.node.bins.shim
	start = time.Now()
	c.Stop()
	stopped = true
	t.Logf("stopped in %v", time.Since(start).Round(time.Millisecond))
	if out, _ := exec.Command("pgrep", "-f", shim).Output(); len(out) > 0 {
		t.Errorf("shims still running: %s", out)
	}
	if after := machineView(t); after != before {
		t.Errorf("the machine changed:\n--- before ---\n%s\n--- after ---\n%s", before, after)
	}
}

// checkPodNetwork checks that the pause pod has an address of PodCIDR, the
// node PodCIDR as its share, and that the host reaches the API server
// through the kubernetes Service, as kube-proxy programs it from the
// endpoint the API server keeps.
func checkPodNetwork(t *testing.T, c *Cluster) {
	ctx := t.Context()
	p, err := c.Clientset.CoreV1().Pods("default").Get(ctx, "pause", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_, cidr, _ := net.ParseCIDR(PodCIDR)
	if ip := net.ParseIP(p.Status.PodIP); ip == nil || !cidr.Contains(ip) {
		t.Errorf("pod IP %q, want one of %s", p.Status.PodIP, PodCIDR)
	}
	node, err := c.Clientset.CoreV1().Nodes().Get(ctx, c.NodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if node.Spec.PodCIDR != PodCIDR {
		t.Errorf("node's podCIDR %q, want %s", node.Spec.PodCIDR, PodCIDR)
	}
	cfg := rest.CopyConfig(c.RESTConfig)
	cfg.Host = "https://" + apiServiceIP + ":443"
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var last error
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		_, last = client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		return last == nil, nil
	})
	if err != nil {
		t.Errorf("the API server through the kubernetes Service %s: %v\n--- kube-proxy ---\n%s", cfg.Host, last, c.KubeProxyLog(30))
	}
}
