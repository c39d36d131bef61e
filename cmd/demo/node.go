package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/miekg/dns"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/dnsops/k8s_event/internal/cluster"
)

// clusterDNS is where the cluster's clients ask: the kube-dns Service's
// ClusterIP, which kube-proxy's rules take to the CoreDNS pods.
var clusterDNS = net.JoinHostPort(cluster.DNSServiceIP, "53")

// failZone is a server block whose upstream refuses every query, so that
// each query logs an error line. Over TCP the line of a name is the same
// for each query, and its events add up; over UDP it would carry the
// local port of each try, a new event each time.
const failZone = `
fail.test:53 {
    errors
    forward . 127.0.0.1:9 {
        force_tcp
    }
}
`

// runNode is the demo on a real node: CoreDNS as the cluster's DNS, from
// its image, installed through the overlay.
func runNode(ctx context.Context, archive, ref, deploy string) error {
	step("starting an image registry on loopback, etcd, kube-apiserver, containerd, kubelet, kube-proxy,\n" +
		"    controller manager and scheduler; pushing the image to the registry")
	start := time.Now()
	defer cluster.StopSharedRegistry()
	kube, err := cluster.New(ctx, cluster.Options{Node: &cluster.NodeOptions{Images: []string{archive}, PodNetwork: true}})
	if err != nil {
		return err
	}
	defer kube.Stop()
	fmt.Printf("  node %s Ready in %v\n", kube.NodeName, time.Since(start).Round(100*time.Millisecond))
	// The node pulls the image from the registry, as a cluster's nodes do.
	if pushed, ok := kube.Image(archive); ok {
		fmt.Printf("  %s pushed as %s\n  (%s)\n", ref, pushed.Tag, pushed.Digest)
		ref = pushed.Tag
	}

	if err := applyDNS(ctx, kube, deploy, ref); err != nil {
		return err
	}

	if err := addFailZone(ctx, kube); err != nil {
		return err
	}

	step("asking for names in it: each failure is an error line, and an event")
	for _, name := range []string{"db.fail.test.", "api.fail.test.", "db.fail.test."} {
		rcode, err := query(name, clusterDNS)
		if err != nil {
			return err
		}
		fmt.Printf("  %-16s %s\n", name, dns.RcodeToString[rcode])
	}

	var out string
	pod, err := podWithEvents(ctx, kube)
	if err != nil {
		return err
	}
	step("kubectl -n kube-system get events -l coredns.io/plugin=errors")
	if out, _, err = kube.Kubectl(ctx, "-n", "kube-system", "get", "events", "-l", "coredns.io/plugin=errors"); err != nil {
		return err
	}
	fmt.Print(out)
	step("kubectl -n kube-system describe pod %s", pod.Name)
	if out, _, err = kube.Kubectl(ctx, "-n", "kube-system", "describe", "pod", pod.Name); err != nil {
		return err
	}
	fmt.Print(out)

	self, _ := os.Executable()
	fmt.Printf(`
Point kubectl at this cluster:

  export KUBECONFIG=%s
  %s -n kube-system get events -w

Make CoreDNS log more, and watch the events come:

  %s ask x.fail.test. y.fail.test.
  %s -n kube-system delete pod %s   # it writes what it has pending as it stops

Logs: %s (kubelet.log, containerd.log, ...)
`, kube.KubeconfigPath, os.Getenv("KUBECTL"), self, os.Getenv("KUBECTL"), pod.Name, kube.Dir)
	return keepRunning(ctx, nil, nil)
}

// addFailZone edits the Corefile the pods read in place, adding a zone
// whose upstream refuses, and waits until the reload plugin brought it to
// every pod.
func addFailZone(ctx context.Context, kube *cluster.Cluster) error {
	// The pods read the ConfigMap the overlay generated, named by its
	// content; the demo edits it in place to show a reload.
	dep, err := kube.Clientset.AppsV1().Deployments("kube-system").Get(ctx, "coredns", metav1.GetOptions{})
	if err != nil {
		return err
	}
	cmName := "coredns"
	for _, v := range dep.Spec.Template.Spec.Volumes {
		if v.Name == "config-volume" && v.ConfigMap != nil {
			cmName = v.ConfigMap.Name
		}
	}
	step("adding a zone whose upstream refuses to the Corefile (kubectl patch configmap " + cmName + ");\n    the kubelet and the reload plugin bring it to the pods in about 30s")
	cm, err := kube.Clientset.CoreV1().ConfigMaps("kube-system").Get(ctx, cmName, metav1.GetOptions{})
	if err != nil {
		return err
	}
	patch, _ := json.Marshal(map[string]any{"data": map[string]string{"Corefile": cm.Data["Corefile"] + failZone}})
	if _, _, err := kube.Kubectl(ctx, "-n", "kube-system", "patch", "configmap", cmName, "--type=merge", "-p", string(patch)); err != nil {
		return err
	}
	start := time.Now()
	// The Service spreads the queries over both pods: ask until several
	// in a row fail as they should, so that both have the new Corefile.
	err = wait.PollUntilContextTimeout(ctx, time.Second, 3*time.Minute, true, func(context.Context) (bool, error) {
		for range 8 {
			rcode, err := query("probe.fail.test.", clusterDNS)
			if err != nil || rcode != dns.RcodeServerFailure {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("the edited Corefile did not reach CoreDNS: %w", err)
	}
	fmt.Printf("  reloaded after %v\n", time.Since(start).Round(time.Second))

	return nil
}

// applyDNS applies the cluster's DNS as kubeadm installs it, then the
// overlay over it, and shows the pods' addresses behind the kube-dns
// Service.
func applyDNS(ctx context.Context, kube *cluster.Cluster, deploy, ref string) error {
	// The cluster's DNS as kubeadm installs it, then the overlay over it.
	for _, base := range []string{"kubeadm", "k8s_event"} {
		path := filepath.Join(deploy, base)
		dir := filepath.Join(kube.Dir, base)
		if err := kube.WriteNodeKustomization(dir, path, ref); err != nil {
			return err
		}
		step("kubectl apply -k %s (with the imported image)", path)
		out, _, err := kube.Kubectl(ctx, "apply", "-k", dir)
		if err != nil {
			return err
		}
		fmt.Print(out)
		step("kubectl -n kube-system rollout status deployment/coredns")
		out, _, err = kube.Kubectl(ctx, "-n", "kube-system", "rollout", "status", "deployment/coredns", "--timeout=3m")
		if err != nil {
			return err
		}
		fmt.Print(out)
	}

	if err := awaitRolledOut(ctx, kube); err != nil {
		return err
	}
	step("kubectl -n kube-system get endpointslices -l kubernetes.io/service-name=kube-dns (the pods' own addresses)")
	out, _, err := kube.Kubectl(ctx, "-n", "kube-system", "get", "endpointslices", "-l", "kubernetes.io/service-name=kube-dns")
	if err != nil {
		return err
	}
	fmt.Print(out)
	fmt.Printf("  the demo asks the kube-dns Service at %s\n", clusterDNS)
	return nil
}

// awaitRolledOut waits until the kube-dns Service's endpoints are the
// Deployment's ready pods alone: a pod the rollout replaced stays in the
// EndpointSlice, not ready, until it is gone.
func awaitRolledOut(ctx context.Context, kube *cluster.Cluster) error {
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		dep, err := kube.Clientset.AppsV1().Deployments("kube-system").Get(ctx, "coredns", metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		slices, err := kube.Clientset.DiscoveryV1().EndpointSlices("kube-system").List(ctx, metav1.ListOptions{
			LabelSelector: "kubernetes.io/service-name=kube-dns",
		})
		if err != nil {
			return false, nil
		}
		ready := 0
		for _, s := range slices.Items {
			for _, e := range s.Endpoints {
				if e.Conditions.Ready == nil || !*e.Conditions.Ready {
					return false, nil
				}
				ready++
			}
		}
		return dep.Spec.Replicas != nil && ready == int(*dep.Spec.Replicas), nil
	})
	if err != nil {
		return fmt.Errorf("the kube-dns Service's endpoints are not the rolled-out pods: %w", err)
	}
	return nil
}

// podWithEvents waits until a CoreDNS pod has an error event, and returns it.
func podWithEvents(ctx context.Context, kube *cluster.Cluster) (*corev1.Pod, error) {
	var pod *corev1.Pod
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		evs, err := kube.Clientset.CoreV1().Events("kube-system").List(ctx, metav1.ListOptions{
			LabelSelector: "coredns.io/plugin=errors",
		})
		if err != nil || len(evs.Items) == 0 {
			return false, nil
		}
		pod, err = kube.Clientset.CoreV1().Pods("kube-system").Get(ctx, evs.Items[0].InvolvedObject.Name, metav1.GetOptions{})
		return err == nil, nil
	})
	if err != nil {
		return nil, fmt.Errorf("no error event on a CoreDNS pod: %w", err)
	}
	return pod, nil
}

func query(name, server string) (int, error) {
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), dns.TypeA)
	c := &dns.Client{Timeout: 2 * time.Second}
	r, _, err := c.Exchange(m, server)
	if err != nil {
		return -1, err
	}
	return r.Rcode, nil
}

// ask is `demo ask [-server ADDR] NAME...`: one A query per name.
func ask(args []string) int {
	fs := flag.NewFlagSet("ask", flag.ExitOnError)
	server := fs.String("server", clusterDNS, "DNS server address")
	_ = fs.Parse(args)
	if fs.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: demo ask [-server "+clusterDNS+"] NAME...")
		return 2
	}
	status := 0
	for _, name := range fs.Args() {
		rcode, err := query(name, *server)
		if err != nil {
			fmt.Printf("%s: %v\n", name, err)
			status = 1
			continue
		}
		fmt.Printf("%s %s\n", strings.TrimSuffix(dns.Fqdn(name), "."), dns.RcodeToString[rcode])
	}
	return status
}
