package install

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The dry run lists every write the run makes, in order: the ConfigMap,
// the RBAC, the patch, the strategy put back and the prune; and says the
// images, the keys and what the rollout does to availability.
func TestInstallDryRunListsEveryChange(t *testing.T) {
	ctx := context.Background()
	stale := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "coredns-k8s-event-0123456789", Namespace: "kube-system",
		Labels: map[string]string{DeploymentLabel: "coredns", managedByLabel: FieldManager}}}
	role, _ := rbacFor(deployment(), "coredns")
	role.Rules[0].Verbs = []string{"create"}
	cm := configMap()
	cm.BinaryData = map[string][]byte{"site.bin": {0, 1, 2}}
	c := newClient(chartDefaults(), cm, stale, role)
	controller(c, nil, func(*appsv1.Deployment) appsv1.DeploymentStatus { return rolled(1) })

	run := func(dry bool) Result {
		var out bytes.Buffer
		if err := Install(ctx, c, Options{Image: image, DryRun: dry, Wait: 5 * time.Second, JSON: true, Out: &out}); err != nil {
			t.Fatalf("install (dry run %v): %v\n%s", dry, err, out.String())
		}
		var r Result
		if err := json.Unmarshal(out.Bytes(), &r); err != nil {
			t.Fatalf("-o json: %v\n%s", err, out.String())
		}
		return r
	}
	writes := func(r Result) string {
		var s []string
		for _, ch := range r.Changes {
			s = append(s, fmt.Sprintf("%s %s %s", ch.Action, ch.Kind, ch.Name))
		}
		return strings.Join(s, "\n")
	}
	dry := run(true)
	if dry.ImageBefore != "registry.k8s.io/coredns/coredns:v1.13.1" || dry.ImageAfter != image || !strings.Contains(dry.Rollout, "maxUnavailable 0") {
		t.Errorf("dry run: images %s -> %s, rollout %q", dry.ImageBefore, dry.ImageAfter, dry.Rollout)
	}
	if dry.CoreDNSBefore != "1.13.1" || dry.CoreDNSAfter != "1.13.1" {
		t.Errorf("dry run: CoreDNS %s -> %s, want 1.13.1 -> 1.13.1", dry.CoreDNSBefore, dry.CoreDNSAfter)
	}
	if keys := strings.Join(dry.Keys, "\n"); !strings.Contains(keys, "Corefile: the Corefile, with kubeapi and k8s_event") || !strings.Contains(keys, "site.bin: copied from binaryData (3 bytes)") {
		t.Errorf("dry run keys:\n%s", keys)
	}
	real := run(false)
	if writes(dry) != writes(real) {
		t.Errorf("the dry run says\n%s\nthe run did\n%s", writes(dry), writes(real))
	}
	for _, want := range []string{"create configmap", "update role kube-system/coredns-k8s-event", "create rolebinding", "patch deployment", "delete configmap kube-system/coredns-k8s-event-0123456789"} {
		if !strings.Contains(writes(dry), want) {
			t.Errorf("the dry run does not say %q:\n%s", want, writes(dry))
		}
	}
	if r, _ := c.RbacV1().Roles("kube-system").Get(ctx, "coredns-k8s-event", metav1.GetOptions{}); !grantsEvents(r.Rules) {
		t.Errorf("the install's own role was not updated: %+v", r.Rules)
	}
}

// status -o json is one document with the state and the problems.
func TestStatusJSON(t *testing.T) {
	ctx := context.Background()
	c := newClient(deployment(), configMap())
	if err := Install(ctx, c, Options{Image: image}); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	s, err := Status(ctx, c, Options{Out: &out, JSON: true})
	if err != nil {
		t.Fatal(err)
	}
	var got StatusReport
	if err := json.Unmarshal(out.Bytes(), &got); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if got.State != StateInstalled || got.Role != "present" || got.RoleBinding != "present" || !equalJSON(got, *s) {
		t.Errorf("status -o json:\n%s", out.String())
	}
	if err := c.CoreV1().ConfigMaps("kube-system").Delete(ctx, got.ConfigMap, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if s, _ := Status(ctx, c, Options{}); s.Healthy() || !strings.Contains(strings.Join(s.Problems, "\n"), "is missing: new pods cannot start") {
		t.Errorf("status with the generated ConfigMap gone: %+v", s.Problems)
	}
}

// The uninstall's dry run lists the writes the uninstall makes, in order.
func TestUninstallDryRunListsEveryChange(t *testing.T) {
	ctx := context.Background()
	c := newClient(chartDefaults(), configMap())
	controller(c, nil, func(*appsv1.Deployment) appsv1.DeploymentStatus { return rolled(1) })
	if err := Install(ctx, c, Options{Image: image, Wait: 5 * time.Second}); err != nil {
		t.Fatal(err)
	}
	// The ReplicaSet the Deployment controller keeps of the installed
	// revision: it still reads the generated ConfigMap.
	d := get(t, c)
	rs := &appsv1.ReplicaSet{ObjectMeta: metav1.ObjectMeta{Name: "coredns-1", Namespace: "kube-system",
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "Deployment", Name: "coredns", UID: d.UID}}},
		Spec: appsv1.ReplicaSetSpec{Template: d.Spec.Template}}
	if _, err := c.AppsV1().ReplicaSets("kube-system").Create(ctx, rs, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	run := func(dry bool) string {
		var out bytes.Buffer
		if err := Uninstall(ctx, c, Options{DryRun: dry, Wait: 5 * time.Second, JSON: true, Out: &out}); err != nil {
			t.Fatalf("uninstall (dry run %v): %v\n%s", dry, err, out.String())
		}
		var r Result
		if err := json.Unmarshal(out.Bytes(), &r); err != nil {
			t.Fatal(err)
		}
		var s []string
		for _, ch := range r.Changes {
			s = append(s, fmt.Sprintf("%s %s %s", ch.Action, ch.Kind, ch.Name))
		}
		return strings.Join(s, "\n")
	}
	dry, real := run(true), run(false)
	if dry != real {
		t.Errorf("the dry run says\n%s\nthe run did\n%s", dry, real)
	}
	for _, want := range []string{"patch deployment", "delete rolebinding", "delete role"} {
		if !strings.Contains(dry, want) {
			t.Errorf("the dry run does not say %q:\n%s", want, dry)
		}
	}
}

// With nothing to patch (k8s_event installed already), the run prunes
// the generated ConfigMaps no revision reads, as its dry run says.
func TestInstallWithNothingToPatchPrunesWhatItsDryRunSays(t *testing.T) {
	ctx := context.Background()
	c := newClient(deployment(), configMap())
	if err := Install(ctx, c, Options{Image: image}); err != nil {
		t.Fatal(err)
	}
	d := get(t, c)
	// What a run interrupted after creating its ConfigMap, before its
	// patch, leaves behind.
	stale := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "coredns-k8s-event-0123456789", Namespace: "kube-system",
		Labels:          map[string]string{DeploymentLabel: "coredns", managedByLabel: FieldManager},
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "Deployment", Name: "coredns", UID: d.UID}}},
		Data: map[string]string{"Corefile": ".:53 {\n    kubeapi\n    k8s_event\n}\n"}}
	if _, err := c.CoreV1().ConfigMaps("kube-system").Create(ctx, stale, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var dry bytes.Buffer
	if err := Install(ctx, c, Options{Image: image, DryRun: true, Out: &dry}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(dry.String(), "delete configmap kube-system/"+stale.Name) {
		t.Fatalf("the dry run does not list the prune (the premise of this test):\n%s", dry.String())
	}
	var out bytes.Buffer
	if err := Install(ctx, c, Options{Image: image, Out: &out}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CoreV1().ConfigMaps("kube-system").Get(ctx, stale.Name, metav1.GetOptions{}); err == nil {
		t.Errorf("the dry run said\n%sbut the real run kept configmap %s:\n%s", dry.String(), stale.Name, out.String())
	}
}

// After a rollout that fails and is put back, -o json's changes are the
// writes that stayed and what undid the others: the Corefile ConfigMap,
// Role and RoleBinding are listed as created and then deleted, so the
// Deployment's patch must be followed by the put-back that undid it (the
// template and the strategy are the operator's again). A script that
// reads the changes otherwise takes the Deployment for patched.
func TestInstallJSONListsThePutBackOfAFailedRollout(t *testing.T) {
	ctx := context.Background()
	d := chartDefaults()
	c := newClient(d.DeepCopy(), configMap())
	rolloutNeverReady(c, image)
	var out bytes.Buffer
	err := Install(ctx, c, Options{Image: image, Wait: 2 * time.Second, JSON: true, Out: &out})
	if err == nil || !strings.Contains(err.Error(), "is back as it was") {
		t.Fatalf("install: %v\n%s", err, out.String())
	}
	got := get(t, c)
	if !equalJSON(got.Spec.Template, d.Spec.Template) || !equalJSON(got.Spec.Strategy, d.Spec.Strategy) {
		t.Fatalf("the Deployment is not put back; this test is about the report")
	}
	var res Result
	if err := json.Unmarshal(out.Bytes(), &res); err != nil {
		t.Fatal(err)
	}
	patched := false
	var list []string
	for _, ch := range res.Changes {
		list = append(list, ch.Action+" "+ch.Kind+" "+ch.Name)
		if ch.Kind != "deployment" {
			continue
		}
		switch ch.Action {
		case "patch":
			patched = true
		case "update", "delete":
			patched = false // put back
		}
	}
	if patched {
		t.Errorf("-o json lists the Deployment's patch as a write that stayed, and nothing that put it back, though the template and strategy are the operator's again:\n  %s", strings.Join(list, "\n  "))
	}
}

// -o json writes "changes": [] whatever the run did, a refusal included:
// never null.
func TestJSONChangesIsAListOnARefusal(t *testing.T) {
	d := deployment()
	d.Spec.Paused = true
	c := newClient(d, configMap())
	var out bytes.Buffer
	if err := Install(context.Background(), c, Options{Image: image, JSON: true, Out: &out}); !IsRefused(err) {
		t.Fatalf("install on a paused Deployment: %v", err)
	}
	if !strings.Contains(out.String(), `"changes": []`) {
		t.Errorf("-o json of a refusal:\n%s", out.String())
	}
}
