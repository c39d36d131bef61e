//go:build e2e && linux

package cluster

import (
	"context"
	"fmt"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
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

	"github.com/dnsops/k8s_event/internal/image"
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
	archive := sleepArchive(t)
	t.Run("host network", func(t *testing.T) { testNode(t, archive, false) })
	t.Run("pod network", func(t *testing.T) { testNode(t, archive, true) })
}

// sleepArchive is the archive of an image of the pause program, named
// localhost/k8s-event-sleep:1, for the node to pull.
func sleepArchive(t *testing.T) string {
	dir := t.TempDir()
	bin := filepath.Join(dir, "sleep")
	build := exec.CommandContext(t.Context(), "go", "build", "-trimpath", "-o", bin, "github.com/dnsops/k8s_event/internal/cluster/pause")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the pause program: %v\n%s", err, out)
	}
	archive := filepath.Join(dir, "sleep.tar")
	f, err := os.Create(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	err = image.Write(f, "localhost/k8s-event-sleep:1", image.Options{
		Binaries:   []image.Binary{{Platform: "linux/" + runtime.GOARCH, Path: bin}},
		Entrypoint: "/pause",
		Created:    time.Unix(0, 0),
	})
	if err != nil {
		t.Fatal(err)
	}
	return archive
}

func testNode(t *testing.T, archive string, podNetwork bool) {
	before := machineView(t)
	start := time.Now()
	c, err := New(t.Context(), Options{Node: &NodeOptions{PodNetwork: podNetwork, Images: []string{archive}}})
	if err != nil {
		t.Fatal(err)
	}
	pushed, ok := c.Image(archive)
	if !ok || !strings.HasPrefix(pushed.Tag, c.node.registry.Host+"/k8s-event-sleep:1") || !strings.Contains(pushed.Digest, "@sha256:") {
		t.Fatalf("the node's registry holds %+v, want %s by tag and by digest", pushed, archive)
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
			// The node pulls each (Always: it asks the registry even
			// for an image it has) from its registry, by tag, by digest,
			// and by the archive's own name through the mirror.
			Containers: []corev1.Container{
				{Name: "by-tag", Image: pushed.Tag, ImagePullPolicy: corev1.PullAlways},
				{Name: "by-digest", Image: pushed.Digest, ImagePullPolicy: corev1.PullAlways},
				{Name: "mirrored", Image: pushed.Name, ImagePullPolicy: corev1.PullAlways},
			},
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
	checkPulled(t, c, pushed)
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

// checkPulled checks that the pause pod's containers run the pushed image:
// their image IDs are its digest.
func checkPulled(t *testing.T, c *Cluster, pushed Pushed) {
	p, err := c.Clientset.CoreV1().Pods("default").Get(t.Context(), "pause", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_, digest, _ := strings.Cut(pushed.Digest, "@")
	if len(p.Status.ContainerStatuses) != 3 {
		t.Errorf("%d container statuses, want 3", len(p.Status.ContainerStatuses))
	}
	for _, s := range p.Status.ContainerStatuses {
		if !strings.HasSuffix(s.ImageID, "@"+digest) {
			t.Errorf("container %s runs %s (%s), want the pushed image %s", s.Name, s.Image, s.ImageID, digest)
		}
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
