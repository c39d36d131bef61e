//go:build e2e

// Package node runs CoreDNS with k8s_event as the cluster's DNS on a real
// single-node Kubernetes (internal/cluster with a node): from the project's
// image, as kubeadm lays it out and then through deploy/k8s_event. It is a
// package of its own so that it runs beside test/e2e, whose tests share one
// control plane without a node.
package node

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/dnsops/k8s_event/internal/cluster"
	"github.com/dnsops/k8s_event/internal/image"
)

// eventAudit records who creates and patches events, and what the API
// answered.
const eventAudit = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Metadata
  resources:
  - group: ""
    resources: ["events"]
  verbs: ["create", "patch"]
- level: None
`

// failZone is a server block whose every query fails at once (nothing
// listens on port 9), so that each query logs one error line that names it.
// Over TCP the line is the same for each query of a name ("dial tcp
// 127.0.0.1:9: connect: connection refused"); over UDP it would carry the
// local port of each try.
const failZone = `
fail.test:53 {
    errors
    forward . 127.0.0.1:9 {
        force_tcp
    }
}
`

// nodeEnv is the node, and CoreDNS as the cluster's DNS on it.
// repoRoot is the root of the repository; tests run in their package's
// directory.
var repoRoot, _ = filepath.Abs("../../..")

type nodeEnv struct {
	t    *testing.T
	kube *cluster.Cluster
	dir  string // the test-only kustomizations
	ref  string // the image's full reference, which the overlay is set to
}

// archiveRef is the full reference of the image in archive, as its
// archive names it.
func archiveRef(t *testing.T, archive string) string {
	ref, err := image.Ref(archive)
	if err != nil {
		t.Fatal(err)
	}
	return ref
}

// pushedRef is the image of archive, one of the node's images, as a user
// names it after `make push`: in the node's registry, by tag.
func pushedRef(t *testing.T, kube *cluster.Cluster, archive string) string {
	p, ok := kube.Image(archive)
	if !ok {
		t.Fatalf("%s is not in the node's registry", archive)
	}
	return p.Tag
}

// nodeImage is the image archive: $K8S_EVENT_IMAGE, as `make test` sets
// it, or else one `make image` writes now.
func nodeImage(t *testing.T) string {
	if a := os.Getenv("K8S_EVENT_IMAGE"); a != "" {
		if !filepath.IsAbs(a) {
			a = filepath.Join(repoRoot, a)
		}
		return a
	}
	archive := filepath.Join(t.TempDir(), "image.tar")
	cmd := exec.CommandContext(t.Context(), "make", "image", "IMAGE_ARCHIVE="+archive)
	cmd.Dir = repoRoot
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("make image: %v\n%s", err, out)
	}
	return archive
}

// TestNode runs CoreDNS as the cluster's DNS on a real node (containerd,
// kubelet, controller manager, scheduler): first as kubeadm lays it out,
// from the project's image, then through the overlay, as users do.
func TestNode(t *testing.T) {
	if err := cluster.NodeSupported(); err != nil {
		fmt.Fprintf(os.Stderr, "SKIP TestNode: CoreDNS as a Pod on a real node: %v\n", err)
		t.Skip(err)
	}
	archive := nodeImage(t)
	start := time.Now()
	kube, err := cluster.New(t.Context(), cluster.Options{
		AuditPolicy: eventAudit,
		Node:        &cluster.NodeOptions{Images: []string{archive}, PodNetwork: true},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kube.Stop)
	t.Logf("control plane and node Ready in %v", since(start))
	e := &nodeEnv{t: t, kube: kube, dir: t.TempDir(), ref: pushedRef(t, kube, archive)}
	e.writeKustomizations()

	t.Run("stock", e.stock)
	if t.Failed() {
		return
	}
	t.Run("overlay rollout keeps DNS answering", e.overlay)
	if t.Failed() {
		return
	}
	t.Run("events on each pod", e.eventsOnEachPod)
	t.Run("writes come from the pod's own identity", e.identity)
	t.Run("ConfigMap edit reloads", e.reload)
	t.Run("deleted pod writes what it had pending", e.deletePod)
	t.Run("Role is exactly enough", e.role)
}

func since(t time.Time) time.Duration { return time.Since(t).Round(100 * time.Millisecond) }

func (e *nodeEnv) writeKustomizations() {
	for name, base := range map[string]string{"stock": "deploy/kubeadm", "overlay": "deploy/k8s_event"} {
		if err := e.kube.WriteNodeKustomization(filepath.Join(e.dir, name), filepath.Join(repoRoot, base), e.ref); err != nil {
			e.t.Fatal(err)
		}
	}
}

func (e *nodeEnv) kubectl(args ...string) string {
	e.t.Helper()
	out, _, err := e.kube.Kubectl(e.t.Context(), args...)
	if err != nil {
		e.t.Fatal(err)
	}
	return out
}

// rollout applies a kustomization and waits until the Deployment rolled.
func (e *nodeEnv) rollout(t *testing.T, name string) {
	t.Helper()
	start := time.Now()
	t.Logf("kubectl apply -k %s\n%s", name, e.kubectl("apply", "-k", filepath.Join(e.dir, name)))
	e.waitRollout(t)
	t.Logf("%s rolled out in %v", name, since(start))
}

// waitRollout waits until the Deployment has rolled out.
func (e *nodeEnv) waitRollout(t *testing.T) {
	t.Helper()
	if out, _, err := e.kube.Kubectl(t.Context(), "-n", "kube-system", "rollout", "status", "deployment/coredns", "--timeout=4m"); err != nil {
		pods, _, _ := e.kube.Kubectl(t.Context(), "-n", "kube-system", "describe", "pods", "-l", "k8s-app=kube-dns")
		t.Fatalf("%v\n%s\n%s\n--- kubelet ---\n%s", err, out, pods, e.kube.KubeletLog(30))
	}
}

// pods are the kube-dns pods that run and are not being deleted.
func (e *nodeEnv) pods(t *testing.T) []corev1.Pod {
	t.Helper()
	list, err := e.kube.Clientset.CoreV1().Pods("kube-system").List(t.Context(), metav1.ListOptions{LabelSelector: "k8s-app=kube-dns"})
	if err != nil {
		t.Fatal(err)
	}
	var out []corev1.Pod
	for _, p := range list.Items {
		if p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning {
			out = append(out, p)
		}
	}
	return out
}

func (e *nodeEnv) events(t *testing.T, pod *corev1.Pod) []corev1.Event {
	t.Helper()
	list, err := e.kube.Clientset.CoreV1().Events("kube-system").List(t.Context(), metav1.ListOptions{
		FieldSelector: "involvedObject.uid=" + string(pod.UID),
	})
	if err != nil {
		t.Fatal(err)
	}
	return list.Items
}

// waitEvents polls the events of pod until done accepts them.
func (e *nodeEnv) waitEvents(t *testing.T, pod *corev1.Pod, d time.Duration, what string, done func([]corev1.Event) bool) []corev1.Event {
	t.Helper()
	var last []corev1.Event
	err := wait.PollUntilContextTimeout(t.Context(), 200*time.Millisecond, d, true, func(ctx context.Context) (bool, error) {
		last = e.events(t, pod)
		return done(last), nil
	})
	if err != nil {
		logs, _, _ := e.kube.Kubectl(t.Context(), "-n", "kube-system", "logs", pod.Name, "--tail=30")
		t.Fatalf("pod %s: waiting %v for %s: %v; events:\n%s--- logs ---\n%s", pod.Name, d, what, err, cluster.DescribeEvents(last), logs)
	}
	return last
}

// dnsAddr is where the cluster's clients ask: the kube-dns Service, which
// the host reaches through kube-proxy's rules.
var dnsAddr = net.JoinHostPort(cluster.DNSServiceIP, "53")

// ask sends one query and returns the answer's rcode.
func ask(name string, timeout time.Duration) (int, error) {
	return askType(name, dns.TypeA, timeout)
}

func askType(name string, qtype uint16, timeout time.Duration) (int, error) {
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), qtype)
	c := &dns.Client{Timeout: timeout}
	r, _, err := c.Exchange(m, dnsAddr)
	if err != nil {
		return -1, err
	}
	return r.Rcode, nil
}

func (e *nodeEnv) stock(t *testing.T) {
	e.rollout(t, "stock")
	// A Service created with its Deployment answers once the EndpointSlice
	// controller and kube-proxy have caught up with the Ready pods; until
	// then kube-proxy rejects what is sent to it.
	start := time.Now()
	var rcode int
	var err error
	for {
		rcode, err = ask("kubernetes.default.svc.cluster.local.", 2*time.Second)
		if err == nil && rcode == dns.RcodeSuccess || time.Since(start) > 30*time.Second {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil || rcode != dns.RcodeSuccess {
		t.Fatalf("stock cluster DNS: rcode %d, %v", rcode, err)
	}
	t.Logf("the new kube-dns Service answered %v after the rollout", since(start))
	for _, p := range e.pods(t) {
		if evs := e.events(t, &p); len(withReasonPrefix(evs, "CoreDNS")) > 0 {
			t.Errorf("stock CoreDNS %s wrote CoreDNS events:\n%s", p.Name, cluster.DescribeEvents(evs))
		}
	}
}

func withReasonPrefix(evs []corev1.Event, prefix string) []corev1.Event {
	var out []corev1.Event
	for _, e := range evs {
		if strings.HasPrefix(e.Reason, prefix) {
			out = append(out, e)
		}
	}
	return out
}

// prober asks the cluster DNS for the kubernetes Service every 20ms, as a
// resolver does: 1s for an answer, then once more.
type prober struct {
	asked, firstTry, unanswered atomic.Int64
	stop                        chan struct{}
	done                        sync.WaitGroup
}

func startProber() *prober {
	p := &prober{stop: make(chan struct{})}
	p.done.Add(1)
	go func() {
		defer p.done.Done()
		for {
			select {
			case <-p.stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			p.asked.Add(1)
			ok := false
			for try := range 2 {
				rcode, err := ask("kubernetes.default.svc.cluster.local.", time.Second)
				if err == nil && rcode == dns.RcodeSuccess {
					ok = true
					break
				}
				if try == 0 {
					p.firstTry.Add(1)
				}
			}
			if !ok {
				p.unanswered.Add(1)
			}
		}
	}()
	return p
}

func (p *prober) finish() { close(p.stop); p.done.Wait() }

func (e *nodeEnv) overlay(t *testing.T) {
	p := startProber()
	e.rollout(t, "overlay")
	// The old pods answer until their lameduck ends.
	err := wait.PollUntilContextTimeout(t.Context(), time.Second, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		list, err := e.kube.Clientset.CoreV1().Pods("kube-system").List(ctx, metav1.ListOptions{LabelSelector: "k8s-app=kube-dns"})
		return err == nil && len(list.Items) == 2, nil
	})
	if err != nil {
		t.Errorf("the old pods did not go: %v", err)
	}
	p.finish()
	t.Logf("DNS through the rollout: %d queries, %d needed a second try, %d unanswered",
		p.asked.Load(), p.firstTry.Load(), p.unanswered.Load())
	if p.unanswered.Load() > 0 || p.asked.Load() < 100 {
		t.Errorf("the cluster DNS did not answer %d of %d queries during the rollout", p.unanswered.Load(), p.asked.Load())
	}
	if pods := e.pods(t); len(pods) != 2 {
		t.Fatalf("%d kube-dns pods run, want 2", len(pods))
	}
}

func (e *nodeEnv) eventsOnEachPod(t *testing.T) {
	for _, p := range e.pods(t) {
		var ready time.Time
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodReady {
				ready = c.LastTransitionTime.Time
			}
		}
		evs := e.waitEvents(t, &p, time.Minute, "its CoreDNSInfo event", func(evs []corev1.Event) bool {
			return len(cluster.EventsWith(evs, "CoreDNSInfo", "Running configuration SHA512")) > 0
		})
		var first time.Time
		for _, ev := range withReasonPrefix(evs, "CoreDNS") {
			if first.IsZero() || ev.FirstTimestamp.Time.Before(first) {
				first = ev.FirstTimestamp.Time
			}
			if ev.InvolvedObject.Name != p.Name || ev.InvolvedObject.UID != p.UID || ev.Source.Host != e.kube.NodeName {
				t.Errorf("event %s is on %s/%s from host %q, want %s/%s from %s", ev.Name,
					ev.InvolvedObject.Name, ev.InvolvedObject.UID, ev.Source.Host, p.Name, p.UID, e.kube.NodeName)
			}
		}
		t.Logf("pod %s: Ready %v after it was created, first event %v after",
			p.Name, ready.Sub(p.CreationTimestamp.Time), first.Sub(p.CreationTimestamp.Time))

		describe := e.kubectl("-n", "kube-system", "describe", "pod", p.Name)
		if !strings.Contains(describe, "CoreDNSInfo") || !strings.Contains(describe, "Running configuration SHA512") {
			t.Errorf("kubectl describe pod %s does not list its CoreDNS events:\n%s", p.Name, describe)
		}
		if !strings.Contains(describe, "Node:") || !strings.Contains(describe, e.kube.NodeName) {
			t.Errorf("kubectl describe pod %s does not name node %s", p.Name, e.kube.NodeName)
		}
		listed := e.kubectl("-n", "kube-system", "events", "--for", "pod/"+p.Name)
		if !strings.Contains(listed, "CoreDNSInfo") || !strings.Contains(listed, "Running configuration SHA512") {
			t.Errorf("kubectl events --for pod/%s does not list its CoreDNS events:\n%s", p.Name, listed)
		}
	}
}

// auditRecord is the part of an audit event that tells who did what.
type auditRecord struct {
	Verb string
	User struct {
		Username string
		Extra    map[string][]string
	}
	ObjectRef struct {
		Resource, Namespace, Name string
	}
	ResponseStatus struct{ Code int }
}

func (e *nodeEnv) audit(t *testing.T) []auditRecord {
	t.Helper()
	f, err := os.Open(e.kube.AuditLogPath)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []auditRecord
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var r auditRecord
		if json.Unmarshal(sc.Bytes(), &r) == nil && r.ObjectRef.Resource == "events" && r.ObjectRef.Namespace == "kube-system" {
			out = append(out, r)
		}
	}
	return out
}

// identity checks that every event write in kube-system came from the
// coredns ServiceAccount with a token bound to the pod the event is about.
func (e *nodeEnv) identity(t *testing.T) {
	pods := map[string]bool{}
	for _, p := range e.pods(t) {
		pods[p.Name] = true
	}
	byPod := map[string]int{}
	for _, r := range e.audit(t) {
		if r.User.Username != "system:serviceaccount:kube-system:coredns" {
			continue // the kubelet's and controllers' own events
		}
		podName := r.User.Extra["authentication.kubernetes.io/pod-name"]
		if len(podName) != 1 || !strings.HasPrefix(r.ObjectRef.Name, podName[0]+".") {
			t.Errorf("%s of event %s by %s with pod %v: want a token bound to the pod the event is on",
				r.Verb, r.ObjectRef.Name, r.User.Username, podName)
			continue
		}
		byPod[podName[0]]++
	}
	for p := range pods {
		if byPod[p] == 0 {
			t.Errorf("no event write by pod %s's own identity in the audit log", p)
		}
	}
	t.Logf("event writes by the coredns ServiceAccount, per bound pod: %v", byPod)
}

// configMap is the name of the ConfigMap the pods read their Corefile
// from: the overlay generates it, named by its content.
func (e *nodeEnv) configMap(t *testing.T) string {
	d, err := e.kube.Clientset.AppsV1().Deployments("kube-system").Get(t.Context(), "coredns", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range d.Spec.Template.Spec.Volumes {
		if v.Name == "config-volume" && v.ConfigMap != nil {
			return v.ConfigMap.Name
		}
	}
	t.Fatal("the Deployment has no config-volume")
	return ""
}

// corefile returns the Corefile the pods read.
func (e *nodeEnv) corefile(t *testing.T) string {
	cm, err := e.kube.Clientset.CoreV1().ConfigMaps("kube-system").Get(t.Context(), e.configMap(t), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return cm.Data["Corefile"]
}

// setCorefile edits the ConfigMap the pods read in place, so that the
// reload plugin picks the edit up (an install makes a new one instead).
func (e *nodeEnv) setCorefile(t *testing.T, corefile string) {
	t.Helper()
	patch, _ := json.Marshal(map[string]any{"data": map[string]string{"Corefile": corefile}})
	e.kubectl("-n", "kube-system", "patch", "configmap", e.configMap(t), "--type=merge", "-p", string(patch))
}

func (e *nodeEnv) reload(t *testing.T) {
	pods := e.pods(t)
	old := e.corefile(t)
	hashes := func(evs []corev1.Event) int {
		return len(cluster.EventsWith(evs, "CoreDNSInfo", "Running configuration SHA512"))
	}
	before := map[string]int{}
	for _, p := range pods {
		before[p.Name] = hashes(e.events(t, &p))
	}

	start := time.Now()
	e.setCorefile(t, old+failZone)
	for _, p := range pods {
		e.waitEvents(t, &p, 2*time.Minute, "the reload of the edited ConfigMap", func(evs []corev1.Event) bool {
			return hashes(evs) > before[p.Name]
		})
		t.Logf("pod %s: reload event %v after the ConfigMap edit", p.Name, since(start))
	}
	if rcode, err := ask("x.fail.test.", 2*time.Second); err != nil || rcode != dns.RcodeServerFailure {
		t.Fatalf("the new server block does not answer: rcode %d, %v", rcode, err)
	}

	// A broken edit: the pods keep the Corefile they have and say why.
	good := e.corefile(t)
	start = time.Now()
	e.setCorefile(t, good+"\nbroken.test:53 {\n    nosuchplugin\n}\n")
	p := startProber()
	for _, pod := range pods {
		evs := e.waitEvents(t, &pod, 2*time.Minute, "a warning about the broken Corefile", func(evs []corev1.Event) bool {
			for _, ev := range evs {
				if ev.Type == corev1.EventTypeWarning && strings.Contains(ev.Message, "nosuchplugin") {
					return true
				}
			}
			return false
		})
		for _, ev := range evs {
			if strings.Contains(ev.Message, "nosuchplugin") {
				t.Logf("pod %s: %s %s %v after the broken edit: %s", pod.Name, ev.Type, ev.Reason, since(start), ev.Message)
			}
		}
	}
	p.finish()
	if p.unanswered.Load() > 0 {
		t.Errorf("after the broken edit %d of %d queries went unanswered", p.unanswered.Load(), p.asked.Load())
	}
	e.setCorefile(t, good)
}

// errorLines counts the error lines in pod's log whose query name contains
// marker.
func errorLines(logs, marker string) int {
	n := 0
	for _, l := range strings.Split(logs, "\n") {
		if strings.Contains(l, "[ERROR] plugin/errors:") && strings.Contains(l, marker) {
			n++
		}
	}
	return n
}

// counted sums the counts of the events of pod whose message contains
// marker.
func counted(evs []corev1.Event, marker string) int {
	n := 0
	for _, ev := range cluster.EventsWith(evs, "", marker) {
		n += int(ev.Count)
	}
	return n
}

func (e *nodeEnv) fail(name string) { _, _ = ask(name, 2*time.Second) }

func (e *nodeEnv) setVerbs(t *testing.T, verbs ...string) {
	t.Helper()
	patch, _ := json.Marshal([]map[string]any{{"op": "replace", "path": "/rules/0/verbs", "value": verbs}})
	e.kubectl("-n", "kube-system", "patch", "role", "coredns-k8s-event", "--type=json", "-p", string(patch))
}

func (e *nodeEnv) role(t *testing.T) {
	// On new pods: what the earlier steps spent of the pods' buckets
	// (25 writes per level, then one per five minutes) would make a
	// write wait minutes for its token, and so its 403.
	start := time.Now()
	e.kubectl("-n", "kube-system", "rollout", "restart", "deployment/coredns")
	e.waitRollout(t)
	// The old pods answer through their lameduck: wait until they are
	// gone, so that every line below is logged by a new pod.
	err := wait.PollUntilContextTimeout(t.Context(), 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		list, err := e.kube.Clientset.CoreV1().Pods("kube-system").List(ctx, metav1.ListOptions{LabelSelector: "k8s-app=kube-dns"})
		return err == nil && len(list.Items) == len(e.pods(t)), nil
	})
	if err != nil {
		t.Fatalf("the old pods did not go: %v", err)
	}
	pods := e.pods(t)
	t.Logf("restarted in %v: %d pods", since(start), len(pods))
	sinceTime := time.Now().UTC().Format(time.RFC3339)
	// forbidden counts the 403s by verb, and by pod (the pod-bound token
	// names it).
	forbidden := func() (byVerb, byPod map[string]int) {
		byVerb, byPod = map[string]int{}, map[string]int{}
		for _, r := range e.audit(t) {
			if r.User.Username == "system:serviceaccount:kube-system:coredns" && r.ResponseStatus.Code == 403 {
				byVerb[r.Verb]++
				for _, name := range r.User.Extra["authentication.kubernetes.io/pod-name"] {
					byPod[name]++
				}
			}
		}
		return byVerb, byPod
	}
	var changed time.Time // when the Role was last patched
	// refused waits for a 403 on verb. Queries reach the two pods as the
	// Service spreads them, so lines that would be written
	// with that verb may all have gone to the pod that had no use for it:
	// every 2 s, more asks once.
	refused := func(verb string, more func()) {
		t.Helper()
		last := time.Now()
		err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
			byVerb, _ := forbidden()
			if byVerb[verb] == 0 && time.Since(last) > 2*time.Second {
				more()
				last = time.Now()
			}
			return byVerb[verb] > 0, nil
		})
		if err != nil {
			var writes []string
			for _, r := range e.audit(t) {
				if r.User.Username == "system:serviceaccount:kube-system:coredns" {
					writes = append(writes, fmt.Sprintf("%s %d %v", r.Verb, r.ResponseStatus.Code, r.User.Extra["authentication.kubernetes.io/pod-name"]))
				}
			}
			list, _ := e.kube.Clientset.CoreV1().Events("kube-system").List(t.Context(), metav1.ListOptions{})
			var evs []string
			for _, ev := range cluster.EventsWith(list.Items, "", ".rbac.fail.test.") {
				evs = append(evs, fmt.Sprintf("%s count %d: %s", ev.InvolvedObject.Name, ev.Count, ev.Message))
			}
			t.Fatalf("no 403 on %s within a minute: %v\nthe ServiceAccount's event writes:\n%s\nevents:\n%s",
				verb, err, strings.Join(writes, "\n"), strings.Join(evs, "\n"))
		}
		t.Logf("403 on %s %v after the Role changed", verb, time.Since(changed).Round(100*time.Millisecond))
	}

	// Without patch: repeats of one line cannot update the count. (Lines
	// of one shape past the 10 distinct of a pod would go to a combined
	// event, also by patch; on new pods it is the repeats.)
	repeat := func() { e.fail("repeat.rbac.fail.test.") }
	changed = time.Now()
	e.setVerbs(t, "create")
	for range 10 {
		repeat()
	}
	// Lines that come before their create has gone out ride in its count:
	// repeat once the event is there.
	err = wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		list, err := e.kube.Clientset.CoreV1().Events("kube-system").List(ctx, metav1.ListOptions{})
		return err == nil && len(cluster.EventsWith(list.Items, "", "repeat.rbac.fail.test.")) > 0, nil
	})
	if err != nil {
		t.Fatalf("no event of the repeated line: %v", err)
	}
	for range 10 {
		repeat()
	}
	// Without create: new lines cannot be written. They are of a shape
	// no earlier step logged (the query type is in the line): a pod past
	// 10 distinct lines would add a line of a known shape to that shape's
	// combined event, a patch.
	refused("patch", repeat)
	changed = time.Now()
	e.setVerbs(t, "patch")
	next := 0
	newLine := func() {
		_, _ = askType(fmt.Sprintf("new%d.rbac.fail.test.", next), dns.TypeTXT, 2*time.Second)
		next++
	}
	for range 5 {
		newLine()
	}
	refused("create", newLine)
	byVerb, byPod := forbidden()
	t.Logf("403s while a verb was taken away: %v, by pod %v", byVerb, byPod)

	changed = time.Now()
	e.setVerbs(t, "create", "patch")
	for _, p := range pods {
		// Every line of the pod, the refused ones among them, is in an
		// event's count once the Role is whole again. All of them: once
		// a pod has logged more than 10 distinct lines, new ones join
		// the combined event of their shape, whose count holds lines of
		// earlier steps too.
		logs := e.kubectl("-n", "kube-system", "logs", p.Name)
		lines := errorLines(logs, ".fail.test.")
		evs := e.waitEvents(t, &p, 2*time.Minute, fmt.Sprintf("the %d lines after the Role is whole again", lines), func(evs []corev1.Event) bool {
			return counted(evs, ".fail.test.") == lines
		})
		_, byPod := forbidden() // all of them: none comes after the Role is whole
		said := strings.Count(e.kubectl("-n", "kube-system", "logs", p.Name, "--since-time="+sinceTime), "plugin/k8s_event: writing event:")
		t.Logf("pod %s: %d lines, %d in events (%d objects) %v after the Role is whole, %d writes refused, said %d times why it could not write",
			p.Name, lines, counted(evs, ".fail.test."), len(cluster.EventsWith(evs, "", ".fail.test.")), time.Since(changed).Round(100*time.Millisecond), byPod[p.Name], said)
		// A pod whose lines all went out under the verb that was left was
		// never refused: it has nothing to say.
		if want := min(byPod[p.Name], 1); said != want {
			t.Errorf("pod %s was refused %d times and said %d times that it could not write, want %d:\n%s", p.Name, byPod[p.Name], said, want, grepLines(logs, "plugin/k8s_event"))
		}
	}
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// deletePod deletes a pod while it logs, and checks that every line it
// logged, up to its exit, is counted in its events.
func (e *nodeEnv) deletePod(t *testing.T) {
	pod := e.pods(t)[0]
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	var logs strings.Builder
	follow := exec.CommandContext(ctx, os.Getenv("KUBECTL"), "--kubeconfig="+e.kube.KubeconfigPath,
		"-n", "kube-system", "logs", "-f", pod.Name)
	follow.Stdout = &logs
	if err := follow.Start(); err != nil {
		t.Fatal(err)
	}
	stopped := make(chan error, 1)
	go func() { stopped <- follow.Wait() }()
	time.Sleep(time.Second) // the stream is open

	// A few lines a second, as a failing upstream gives; the default rate
	// (25 writes, then one per 5 minutes for each level) covers them.
	for i := range 5 {
		e.fail("before" + strconv.Itoa(i) + ".delete.fail.test.")
	}
	start := time.Now()
	e.kubectl("-n", "kube-system", "delete", "pod", pod.Name, "--wait=false")
	// CoreDNS answers through its lameduck: what it logs then is pending
	// when it exits.
	for i := 0; time.Since(start) < 3*time.Second; i++ {
		e.fail("lameduck" + strconv.Itoa(i) + ".delete.fail.test.")
		time.Sleep(200 * time.Millisecond)
	}
	select {
	case <-stopped:
	case <-ctx.Done():
		t.Fatalf("pod %s did not exit", pod.Name)
	}
	exited := since(start)
	// All the pod's lines, as in role: a combined event holds lines of
	// earlier steps too.
	lines := errorLines(logs.String(), ".fail.test.")
	evs := e.waitEvents(t, &pod, 30*time.Second, fmt.Sprintf("%d lines counted", lines), func(evs []corev1.Event) bool {
		return counted(evs, ".fail.test.") >= lines
	})
	t.Logf("pod %s exited %v after the delete; it logged %d lines (%d of this step, %d during the lameduck); its events count %d in %d objects",
		pod.Name, exited, lines, errorLines(logs.String(), "delete.fail.test"), errorLines(logs.String(), "lameduck"), counted(evs, ".fail.test."), len(cluster.EventsWith(evs, "", ".fail.test.")))
	if got := counted(evs, ".fail.test."); got != lines {
		t.Errorf("events count %d lines, the pod logged %d", got, lines)
	}
}
