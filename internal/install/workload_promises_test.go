package install

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	k8stesting "k8s.io/client-go/testing"
)

// A Deployment and a DaemonSet of one name in one namespace would share
// the objects the tool makes, named by the workload's name alone: with
// k8s_event installed on the Deployment, install on the DaemonSet and
// uninstall from it are refused, naming the Deployment, and the
// Deployment stays installed: the Corefile copy its pods read, its Role
// and RoleBinding.
func TestAWorkloadOfTheNameOfAnInstalledOneIsRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ds := daemonSetOfNodes()
	ds.UID = "ds-uid"
	c := newClient(deployment(), ds.DeepCopy(), configMap())
	newDSController(c, 2, "")
	var out bytes.Buffer
	if err := Install(ctx, c, Options{Image: image, Out: &out}); err != nil {
		t.Fatalf("install on the Deployment: %v\n%s", err, out.String())
	}
	od := Options{Image: image, Kind: kindDaemonSet, Deployment: "coredns", Wait: 20 * time.Second, Settle: time.Second, Out: &out}
	for what, run := range map[string]func(context.Context, kubernetes.Interface, Options) error{"install": Install, "uninstall": Uninstall} {
		err := run(ctx, c, od)
		if !IsRefused(err) || !strings.Contains(err.Error(), "deployment kube-system/coredns has k8s_event installed") {
			t.Errorf("%s on the DaemonSet of the Deployment's name: %v, want it refused, naming the Deployment", what, err)
		}
	}
	cm := get(t, c).Spec.Template.Spec.Volumes[0].ConfigMap.Name
	if _, err := c.CoreV1().ConfigMaps("kube-system").Get(ctx, cm, metav1.GetOptions{}); err != nil {
		t.Errorf("configmap %s, which the Deployment's pods read: %v", cm, err)
	}
	if _, err := c.RbacV1().Roles("kube-system").Get(ctx, "coredns-k8s-event", metav1.GetOptions{}); err != nil {
		t.Errorf("role coredns-k8s-event, which the Deployment's pods use: %v", err)
	}
	s, err := Status(ctx, c, Options{Deployment: "coredns"})
	if err != nil || s.State != StateInstalled || len(s.Problems) > 0 {
		t.Errorf("status of the Deployment: %v %s %q", err, s.State, s.Problems)
	}
}

// "--dry-run lists every write the run would make, in order, including
// the strategy put back and the ConfigMaps pruned after the rollout": for
// a DaemonSet, the dry run's changes are the real run's, the canary's
// and the batches' writes included.
func TestDaemonSetDryRunListsTheWritesOfTheRealRun(t *testing.T) {
	t.Parallel()
	for _, hostNetwork := range []bool{false, true} {
		ctx := context.Background()
		stock := daemonSetOfNodes()
		stock.Spec.Template.Spec.HostNetwork = hostNetwork
		c := newClient(stock.DeepCopy(), configMap())
		newDSController(c, 3, "")
		c.AppsV1().DaemonSets("kube-system").Get(ctx, "coredns", metav1.GetOptions{})
		var dry, real bytes.Buffer
		o := Options{Image: image, Kind: kindDaemonSet, Deployment: "coredns", Wait: 20 * time.Second, Settle: time.Second, JSON: true}
		o.DryRun, o.Out = true, &dry
		if err := Install(ctx, c, o); err != nil {
			t.Fatalf("dry run: %v\n%s", err, dry.String())
		}
		o.DryRun, o.Out = false, &real
		if err := Install(ctx, c, o); err != nil {
			t.Fatalf("install: %v\n%s", err, real.String())
		}
		var d, r Result
		if err := json.Unmarshal(dry.Bytes(), &d); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(real.Bytes(), &r); err != nil {
			t.Fatal(err)
		}
		say := func(cs []Change) []string {
			var out []string
			for _, ch := range cs {
				name := ch.Name
				if ch.Kind == "pod" {
					name = "POD"
				}
				out = append(out, ch.Action+" "+ch.Kind+" "+name)
			}
			return out
		}
		if strings.Join(say(d.Changes), "\n") != strings.Join(say(r.Changes), "\n") {
			t.Errorf("hostNetwork %v: the dry run lists\n  %s\nthe run made\n  %s", hostNetwork, strings.Join(say(d.Changes), "\n  "), strings.Join(say(r.Changes), "\n  "))
		}
	}
}

// "If the rollout does not finish within --timeout, or the run is
// interrupted, install puts the DaemonSet back": a canary that never gets
// Ready (its pod Pending, unschedulable on its node) fails the run within
// --timeout, not a minute past the settle time.
func TestDaemonSetCanaryNeverReadyFailsWithinTheTimeout(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	stock := daemonSetOfNodes()
	stock.Spec.Template.Spec.HostNetwork = true
	c := newClient(stock.DeepCopy(), configMap())
	var k *dsController
	// Runs after the controller's sync: the new template's pods stay
	// Pending.
	c.PrependReactor("list", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		k.mu.Lock()
		defer k.mu.Unlock()
		l, _ := c.Tracker().List(podsResource, corev1.SchemeGroupVersion.WithKind("Pod"), "kube-system")
		for _, p := range l.(*corev1.PodList).Items {
			if p.Spec.Containers[0].Image != image || p.Status.Phase == corev1.PodPending {
				continue
			}
			p.Status = corev1.PodStatus{Phase: corev1.PodPending, Conditions: []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: "Unschedulable", Message: "0/3 nodes are available: 1 Insufficient memory"}}}
			delete(k.readyAt, p.Name)
			_ = c.Tracker().Update(podsResource, &p, "kube-system")
		}
		return false, nil, nil
	})
	k = newDSController(c, 3, "")
	c.AppsV1().DaemonSets("kube-system").Get(ctx, "coredns", metav1.GetOptions{})
	var out bytes.Buffer
	o := Options{Image: image, Kind: kindDaemonSet, Deployment: "coredns", Wait: 3 * time.Second, Settle: time.Second, Out: &out}
	done := make(chan error, 1)
	go func() { done <- Install(ctx, c, o) }()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "canary") {
			t.Errorf("install with a canary that never gets Ready: %v\n%s", err, out.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("install with --timeout %v still waits on its canary after 30s", o.Wait)
	}
}

// The dry run of a DaemonSet's uninstall lists the writes of the real
// uninstall, the canary's and the batches' included.
func TestDaemonSetUninstallDryRunListsTheWritesOfTheRealRun(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	stock := daemonSetOfNodes()
	stock.Spec.Template.Spec.HostNetwork = true
	c := newClient(stock.DeepCopy(), configMap())
	newDSController(c, 3, "")
	c.AppsV1().DaemonSets("kube-system").Get(ctx, "coredns", metav1.GetOptions{})
	var dry, real bytes.Buffer
	o := Options{Image: image, Kind: kindDaemonSet, Deployment: "coredns", Wait: 20 * time.Second, Settle: time.Second, JSON: true, Out: &real}
	if err := Install(ctx, c, o); err != nil {
		t.Fatalf("install: %v\n%s", err, real.String())
	}
	real.Reset()
	o.DryRun, o.Out = true, &dry
	if err := Uninstall(ctx, c, o); err != nil {
		t.Fatalf("dry run: %v\n%s", err, dry.String())
	}
	o.DryRun, o.Out = false, &real
	if err := Uninstall(ctx, c, o); err != nil {
		t.Fatalf("uninstall: %v\n%s", err, real.String())
	}
	var d, r Result
	if err := json.Unmarshal(dry.Bytes(), &d); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(real.Bytes(), &r); err != nil {
		t.Fatal(err)
	}
	say := func(cs []Change) string {
		var out []string
		for _, ch := range cs {
			name := ch.Name
			if ch.Kind == "pod" {
				name = "POD"
			}
			out = append(out, ch.Action+" "+ch.Kind+" "+name)
		}
		return strings.Join(out, "\n  ")
	}
	if say(d.Changes) != say(r.Changes) {
		t.Errorf("the dry run lists\n  %s\nthe uninstall made\n  %s", say(d.Changes), say(r.Changes))
	}
}

// "--dry-run lists every write the run would make, in order, including
// the strategy put back and the ConfigMaps pruned after the rollout": the
// dry run of a Deployment's uninstall lists the Corefile copy the
// uninstall deletes (revisionHistoryLimit 0: no revision keeps it).
func TestUninstallDryRunListsTheCorefileCopyItPrunes(t *testing.T) {
	ctx := context.Background()
	dep := deployment()
	dep.Spec.RevisionHistoryLimit = ptrTo(int32(0))
	c := newClient(dep, configMap())
	var dry, real bytes.Buffer
	o := Options{Image: image, JSON: true, Out: &real}
	if err := Install(ctx, c, o); err != nil {
		t.Fatalf("install: %v\n%s", err, real.String())
	}
	real.Reset()
	o.DryRun, o.Out = true, &dry
	if err := Uninstall(ctx, c, o); err != nil {
		t.Fatalf("dry run: %v\n%s", err, dry.String())
	}
	o.DryRun, o.Out = false, &real
	if err := Uninstall(ctx, c, o); err != nil {
		t.Fatalf("uninstall: %v\n%s", err, real.String())
	}
	var d, r Result
	_ = json.Unmarshal(dry.Bytes(), &d)
	_ = json.Unmarshal(real.Bytes(), &r)
	say := func(cs []Change) string {
		var out []string
		for _, ch := range cs {
			out = append(out, ch.Action+" "+ch.Kind+" "+ch.Name)
		}
		return strings.Join(out, "\n  ")
	}
	if say(d.Changes) != say(r.Changes) {
		t.Errorf("the dry run lists\n  %s\nthe uninstall made\n  %s", say(d.Changes), say(r.Changes))
	}
}

// OpenShift's DaemonSet named without its namespace (install --workload
// daemonset/dns-default) is refused with the operator's way, as it is
// when found unnamed: the layout says where OpenShift runs it.
func TestOpenShiftsDNSNamedWithoutItsNamespaceIsRefused(t *testing.T) {
	c := newClient(layoutObjects(t, "openshift")...)
	err := Install(context.Background(), c, withForce(Options{Image: image, Kind: kindDaemonSet, Deployment: "dns-default"}))
	if !IsRefused(err) || !strings.Contains(err.Error(), "oc edit dns.operator/default") {
		t.Errorf("install --workload daemonset/dns-default: %v, want it refused with the operator's way", err)
	}
}
