package install

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

// The fleet line goes to a DaemonSet and to a Deployment of more than
// FleetThreshold replicas, not to a smaller one.
func TestFleetForManyReplicas(t *testing.T) {
	for _, tc := range []struct {
		kind     string
		replicas int
		want     string
	}{
		{kindDaemonSet, 1, "fleet 0.1 100"},
		{kindDaemonSet, 5000, "fleet 0.1 100"},
		{kindDeployment, 5, "fleet 0.1 100"},
		{kindDeployment, 300, "fleet 0.1 100"},
		{kindDeployment, 4, ""},
		{kindDeployment, 2, ""},
		{kindDeployment, 1, ""},
	} {
		if got, why := fleetFor(tc.kind, tc.replicas); got != tc.want || why == "" {
			t.Errorf("%s of %d replicas: %q (%s), want %q", tc.kind, tc.replicas, got, why, tc.want)
		}
	}
}

// The fleet's Role reads the DaemonSet by name and lists the pods (the
// plugin finds its DaemonSet as its pod's controller, and node-local-dns's
// service account has no rights of its own), or reads the Deployment by
// name and its ReplicaSets.
func TestFleetRBACReadsTheWorkload(t *testing.T) {
	role, binding := fleetRBAC("kube-system", "node-local-dns", kindDaemonSet, "node-local-dns")
	if got := rulesString(role.Rules); got != "list pods; get daemonsets node-local-dns" {
		t.Errorf("DaemonSet: %s", got)
	}
	if s := binding.Subjects[0]; s.Name != "node-local-dns" || binding.RoleRef.Name != "node-local-dns-k8s-event-fleet" {
		t.Errorf("binding %+v", binding)
	}
	role, _ = fleetRBAC("kube-system", "coredns", kindDeployment, "coredns")
	if got := rulesString(role.Rules); got != "get deployments coredns; get replicasets" {
		t.Errorf("Deployment: %s", got)
	}
}

// scaled is deployment() with n replicas, installed with options.
func installScaled(t *testing.T, n int32, cm *corev1.ConfigMap, o Options) (*fake.Clientset, string) {
	t.Helper()
	d := deployment()
	d.Spec.Replicas = &n
	c := newClient(d, cm)
	o.Image = image
	if err := Install(context.Background(), c, o); err != nil {
		t.Fatal(err)
	}
	gen, err := c.CoreV1().ConfigMaps("kube-system").Get(context.Background(), get(t, c).Spec.Template.Spec.Volumes[0].ConfigMap.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return c, gen.Data["Corefile"]
}

// A Deployment of many replicas gets the fleet line, and its
// ServiceAccount the right to read N; uninstall takes the right back.
func TestInstallTurnsFleetOnForALargeDeployment(t *testing.T) {
	ctx := context.Background()
	c, corefile := installScaled(t, 10, configMap(), Options{})
	if !strings.Contains(corefile, "k8s_event {\n       fleet 0.1 100\n") {
		t.Errorf("the Corefile the pods read has no fleet line:\n%s", corefile)
	}
	role, err := c.RbacV1().Roles("kube-system").Get(ctx, "coredns-k8s-event-fleet", metav1.GetOptions{})
	if err != nil || rulesString(role.Rules) != "get deployments coredns; get replicasets" || !ours(role.ObjectMeta, "coredns") {
		t.Fatalf("fleet role: %+v %v", role, err)
	}
	rb, err := c.RbacV1().RoleBindings("kube-system").Get(ctx, "coredns-k8s-event-fleet", metav1.GetOptions{})
	if err != nil || !bindsServiceAccount(rb, "kube-system", "coredns") || rb.RoleRef.Name != role.Name {
		t.Fatalf("fleet rolebinding: %+v %v", rb, err)
	}
	if err := Uninstall(ctx, c, Options{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.RbacV1().Roles("kube-system").Get(ctx, "coredns-k8s-event-fleet", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("fleet role after uninstall: %v", err)
	}
	if _, err := c.RbacV1().RoleBindings("kube-system").Get(ctx, "coredns-k8s-event-fleet", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("fleet rolebinding after uninstall: %v", err)
	}
}

// A Deployment of few replicas gets no fleet line and no fleet Role; nor
// does a large one with NoFleet (--fleet=false).
func TestInstallLeavesFleetOffForASmallDeployment(t *testing.T) {
	for _, tc := range []struct {
		n int32
		o Options
	}{{3, Options{}}, {10, Options{NoFleet: true}}} {
		c, corefile := installScaled(t, tc.n, configMap(), tc.o)
		if strings.Contains(corefile, "fleet") {
			t.Errorf("%d replicas, %+v: the Corefile has fleet:\n%s", tc.n, tc.o, corefile)
		}
		if _, err := c.RbacV1().Roles("kube-system").Get(context.Background(), "coredns-k8s-event-fleet", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("%d replicas, %+v: fleet role: %v", tc.n, tc.o, err)
		}
	}
}

// The operator's own fleet line, in the Corefile or as --option, is kept
// as written, and its reads granted.
func TestInstallKeepsTheOperatorsFleetLine(t *testing.T) {
	cm := configMap()
	cm.Data["Corefile"] = ".:53 {\n    errors\n    kubernetes cluster.local\n    kubeapi\n    k8s_event {\n        fleet 2 10\n    }\n}\n"
	c, corefile := installScaled(t, 10, cm, Options{})
	if strings.Count(corefile, "fleet") != 1 || !strings.Contains(corefile, "fleet 2 10") {
		t.Errorf("the Corefile's own fleet line:\n%s", corefile)
	}
	if _, err := c.RbacV1().Roles("kube-system").Get(context.Background(), "coredns-k8s-event-fleet", metav1.GetOptions{}); err != nil {
		t.Errorf("fleet role for the Corefile's own line: %v", err)
	}
	c, corefile = installScaled(t, 2, configMap(), Options{Options: []string{"fleet 1 30"}})
	if strings.Count(corefile, "fleet") != 1 || !strings.Contains(corefile, "fleet 1 30") {
		t.Errorf("the --option fleet line:\n%s", corefile)
	}
	if _, err := c.RbacV1().Roles("kube-system").Get(context.Background(), "coredns-k8s-event-fleet", metav1.GetOptions{}); err != nil {
		t.Errorf("fleet role for --option's line: %v", err)
	}
}

// For a DaemonSet, N is its desiredNumberScheduled: the plan says it, and
// the fleet's Role lets the pods' ServiceAccount list its pods and get
// that DaemonSet by name, which is how the plugin reads N.
func TestFleetOfADaemonSetIsItsScheduledNodes(t *testing.T) {
	c := newClient(daemonSetOfNodes(), configMap())
	newDSController(c, 5, "")
	var out bytes.Buffer
	o := Options{Image: image, Kind: kindDaemonSet, Deployment: "coredns", Wait: time.Minute, DryRun: true, JSON: true, Out: &out}
	if err := Install(context.Background(), c, o); err != nil {
		t.Fatalf("dry run: %v\n%s", err, out.String())
	}
	var res Result
	if err := json.Unmarshal(out.Bytes(), &res); err != nil {
		t.Fatal(err)
	}
	if res.Fleet != "fleet 0.1 100 (a DaemonSet runs a replica on every node: 5 now)" {
		t.Errorf("fleet: %q, want N of the 5 nodes scheduled", res.Fleet)
	}
	var role *Change
	for i, ch := range res.Changes {
		if ch.Kind == "role" && ch.Name == "kube-system/coredns-k8s-event-fleet" {
			role = &res.Changes[i]
		}
	}
	if role == nil || role.Action != "create" || role.Detail != "list pods; get daemonsets coredns" {
		t.Errorf("the fleet's role: %+v, want list pods and get of daemonset coredns", role)
	}
}
