// Command demo shows k8s_event at work on a local Kubernetes.
//
// Where a node can run (Linux, as root), it starts an image registry on
// loopback, etcd, kube-apiserver, containerd, a kubelet, kube-proxy, the
// controller manager and the scheduler, pushes the image to the registry,
// installs CoreDNS as the cluster's DNS from it (the node pulls it) through
// deploy/k8s_event, shows the kube-dns Service's endpoints (the pods' own
// addresses), makes CoreDNS log by asking that Service's ClusterIP, and
// shows `kubectl describe pod` of a live CoreDNS pod.
// Elsewhere it says why, starts etcd and kube-apiserver only, creates the
// Pod demo/coredns-demo and runs CoreDNS as a process on its behalf.
// It keeps running until interrupted, unless DEMO_EXIT=1 or standard input
// is not a terminal, and stops everything it started.
//
// Usage (make demo does all of it):
//
//	eval "$(hack/tools.sh env node)" && export KUBE_APISERVER ETCD KUBECTL ...
//	make image && go build -o bin/coredns-e2e ./test/cmd/coredns
//	go run ./cmd/demo -coredns bin/coredns-e2e -image bin/IMAGE.tar -image-ref NAME:TAG
//
// `demo ask NAME...` sends DNS queries to the demo's CoreDNS, for machines
// without dig.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/dnsops/k8s_event/test/plugin/logline"

	"github.com/miekg/dns"
	"golang.org/x/term"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/dnsops/k8s_event/internal/cluster"
)

const (
	namespace = "demo"
	podName   = "coredns-demo"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "ask" {
		os.Exit(ask(os.Args[2:]))
	}
	coredns := flag.String("coredns", "bin/coredns-e2e", "CoreDNS binary built from ./test/cmd/coredns, for the demo without a node")
	archive := flag.String("image", "", "image archive that `make image` writes, for the demo on a node")
	ref := flag.String("image-ref", "", "NAME:TAG of that image")
	deploy := flag.String("deploy", "deploy", "the directory of the kubeadm layout and the k8s_event overlay")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	why := cluster.NodeSupported()
	if why == nil && (*archive == "" || *ref == "") {
		why = errors.New("-image and -image-ref are not set")
	}
	if why == nil {
		err = runNode(ctx, *archive, *ref, *deploy)
	} else {
		step("no node on this machine (%v): CoreDNS runs as a process beside the control plane instead", why)
		err = run(ctx, *coredns)
	}
	if err != nil && !errors.Is(err, context.Canceled) {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, corednsBin string) error {
	corednsBin, err := filepath.Abs(corednsBin)
	if err != nil {
		return err
	}
	step("starting etcd and kube-apiserver")
	kube, err := cluster.New(ctx, cluster.Options{})
	if err != nil {
		return err
	}
	defer kube.Stop()

	step("creating namespace %s and pod %s", namespace, podName)
	if _, err := kube.CreateNamespace(ctx, namespace); err != nil {
		return err
	}
	pod, err := kube.CreatePod(ctx, namespace, podName)
	if err != nil {
		return err
	}

	dnsPort, err := cluster.FreeDNSPort()
	if err != nil {
		return err
	}
	loglinePort, err := cluster.FreePort()
	if err != nil {
		return err
	}
	dnsAddr := "127.0.0.1:" + strconv.Itoa(dnsPort)
	loglineAddr := "127.0.0.1:" + strconv.Itoa(loglinePort)
	corefile, conf, err := writeCorefile(kube, dnsPort, loglineAddr)
	if err != nil {
		return err
	}

	step("starting CoreDNS on %s with\n%s", dnsAddr, indent(corefile))
	coredns, err := cluster.StartProcess("coredns", filepath.Join(kube.Dir, "coredns.log"), []string{
		"COREDNS_POD_NAME=" + pod.Name,
		"COREDNS_NAMESPACE=" + pod.Namespace,
		"COREDNS_POD_UID=" + string(pod.UID),
		"COREDNS_NODE_NAME=localhost",
	}, corednsBin, "-conf", conf)
	if err != nil {
		return err
	}
	defer coredns.Stop(10 * time.Second)
	if err := waitListening(ctx, coredns, dnsAddr); err != nil {
		return err
	}

	if err := showEvents(ctx, kube, pod, coredns, dnsAddr, loglineAddr); err != nil {
		return err
	}

	kubectl := os.Getenv("KUBECTL")
	fmt.Printf(`
Point kubectl at this cluster:

  export KUBECONFIG=%s
  %s get events -n %s -w

Make CoreDNS log more:

  curl -X POST --data 'disk almost full' 'http://%s/log?level=warning&count=3'
  bin/demo ask -server 127.0.0.1:%d x.fail.logline.

CoreDNS log: %s
`, kube.KubeconfigPath, kubectl, namespace, loglineAddr, dnsPort, coredns.LogPath)

	return keepRunning(ctx, coredns.Done(), func() string { return "coredns exited:\n" + coredns.LogTail(20) })
}

// writeCorefile writes the demo's Corefile beside the cluster's files.
func writeCorefile(kube *cluster.Cluster, dnsPort int, loglineAddr string) (corefile, conf string, err error) {
	corefile = fmt.Sprintf(`.:%d {
    kubeapi {
        kubeconfig %s
    }
    k8s_event {
        level info warning error
    }
    reload
    errors
    log
    logline %s
    whoami
}
`, dnsPort, kube.KubeconfigPath, loglineAddr)
	conf = filepath.Join(kube.Dir, "Corefile")
	if err := os.WriteFile(conf, []byte(corefile), 0o644); err != nil {
		return "", "", err
	}
	return corefile, conf, nil
}

// showEvents makes CoreDNS log lines of three levels, waits for their
// events and shows them as kubectl does.
func showEvents(ctx context.Context, kube *cluster.Cluster, pod *corev1.Pod, coredns *cluster.Process, dnsAddr, loglineAddr string) error {
	step("making CoreDNS log: queries (info), failing queries (error), a warning")
	for _, name := range []string{"www.example.org.", "db.fail.logline.", "api.fail.logline."} {
		m := new(dns.Msg)
		m.SetQuestion(name, dns.TypeA)
		r, err := dns.Exchange(m, dnsAddr)
		if err != nil {
			return fmt.Errorf("query %s: %w", name, err)
		}
		fmt.Printf("  %-20s %s\n", name, dns.RcodeToString[r.Rcode])
	}
	if err := logline.Post(ctx, loglineAddr, "warning", 1, "upstream 192.0.2.53:53 is slow: 100% of queries over 2s"); err != nil {
		return err
	}

	step("waiting for the events")
	if err := waitEvents(ctx, kube, pod); err != nil {
		return fmt.Errorf("%w\n--- coredns log ---\n%s", err, coredns.LogTail(30))
	}

	step("kubectl get events -n %s", namespace)
	out, _, err := kube.Kubectl(ctx, "get", "events", "-n", namespace)
	if err != nil {
		return err
	}
	fmt.Print(out)
	step("kubectl describe pod %s -n %s (events)", podName, namespace)
	out, _, err = kube.Kubectl(ctx, "describe", "pod", podName, "-n", namespace)
	if err != nil {
		return err
	}
	if i := strings.Index(out, "Events:"); i >= 0 {
		out = out[i:]
	}
	fmt.Print(out)

	return nil
}

// keepRunning waits for Ctrl-C, unless DEMO_EXIT=1 or there is no
// terminal; or until died is closed.
func keepRunning(ctx context.Context, died <-chan struct{}, why func() string) error {
	if os.Getenv("DEMO_EXIT") == "1" || !term.IsTerminal(int(os.Stdin.Fd())) {
		step("done; stopping (DEMO_EXIT=1 or no terminal)")
		return nil
	}
	step("running; press Ctrl-C to stop")
	select {
	case <-ctx.Done():
	case <-died:
		return errors.New(why())
	}
	step("stopping")
	return nil
}

func step(format string, args ...any) {
	fmt.Printf("\n==> "+format+"\n", args...)
}

func indent(s string) string {
	return "    " + strings.ReplaceAll(strings.TrimRight(s, "\n"), "\n", "\n    ")
}

// waitListening waits until p accepts TCP connections on addr.
func waitListening(ctx context.Context, p *cluster.Process, addr string) error {
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		if p.Exited() {
			return false, errors.New("coredns exited")
		}
		conn, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			conn.Close()
		}
		return err == nil, nil
	})
	if err != nil {
		return fmt.Errorf("coredns did not start: %w\n%s", err, p.LogTail(30))
	}
	return nil
}

// waitEvents waits until the pod has an event of each reason the demo caused.
func waitEvents(ctx context.Context, kube *cluster.Cluster, pod *corev1.Pod) error {
	want := []string{"CoreDNSInfo", "CoreDNSWarning", "CoreDNSError"}
	return wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		list, err := kube.Clientset.CoreV1().Events(pod.Namespace).List(ctx, metav1.ListOptions{
			FieldSelector: "involvedObject.uid=" + string(pod.UID),
		})
		if err != nil {
			return false, err
		}
		seen := map[string]bool{}
		for _, e := range list.Items {
			seen[e.Reason] = true
		}
		for _, r := range want {
			if !seen[r] {
				return false, nil
			}
		}
		return true, nil
	})
}
