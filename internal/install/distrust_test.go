package install

import (
	"bytes"
	"context"
	"encoding/json"
	"slices"
	"strings"
	"sync"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// zoneFileSetup is deployment() and configMap() with a zone file the
// operator serves with the file plugin.
func zoneFileSetup() (*appsv1.Deployment, *corev1.ConfigMap) {
	d := deployment()
	cm := configMap()
	cm.Data["db.corp.example"] = "$ORIGIN corp.example.\n@ 3600 IN SOA ns. admin. 1 7200 3600 1209600 3600\n"
	return d, cm
}

func hasItem(v *corev1.ConfigMapVolumeSource, key string) bool {
	return slices.ContainsFunc(v.Items, func(it corev1.KeyToPath) bool { return it.Key == key })
}

// Promise (docs/install.md, "What an install changes" and "To change the
// Corefile, ... run install again"): an install changes only what
// k8s_event needs, the config volume's ConfigMap name among them; the
// operator's other settings stay as they are.
//
// What happens: after the install, the operator mounts one more key of
// the ConfigMap (a zone file) by adding it to the config volume's items,
// edits the Corefile and runs install again, as the docs say. The
// reinstall takes the volume recorded at the first install for the
// original and patches the Deployment back to it: the operator's new item
// is dropped, the zone file disappears from the pods (the key listing even
// says "not mounted").
func TestReinstallKeepsAnItemTheOperatorAddedToTheConfigVolume(t *testing.T) {
	ctx := context.Background()
	d, cm := zoneFileSetup()
	c := fake.NewClientset(d, cm)
	if err := Install(ctx, c, Options{Image: image}); err != nil {
		t.Fatal(err)
	}
	// The operator mounts the zone file too (kubectl edit deployment).
	now := get(t, c)
	vol := now.Spec.Template.Spec.Volumes[0].ConfigMap
	vol.Items = append(vol.Items, corev1.KeyToPath{Key: "db.corp.example", Path: "db.corp.example"})
	if _, err := c.AppsV1().Deployments("kube-system").Update(ctx, now, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	// ...edits the Corefile, and runs install again.
	src, _ := c.CoreV1().ConfigMaps("kube-system").Get(ctx, "coredns", metav1.GetOptions{})
	src.Data["Corefile"] = strings.Replace(src.Data["Corefile"], "errors", "errors\n    file /etc/coredns/db.corp.example corp.example", 1)
	if _, err := c.CoreV1().ConfigMaps("kube-system").Update(ctx, src, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := Install(ctx, c, Options{Image: image, Out: &out}); err != nil {
		t.Fatal(err)
	}
	if v := get(t, c).Spec.Template.Spec.Volumes[0].ConfigMap; !hasItem(v, "db.corp.example") {
		t.Errorf("the reinstall dropped the item the operator added to the config volume: items %+v\n%s", v.Items, out.String())
	}
}

// Promise (docs/install.md, Uninstall): uninstall gives back the config
// volume's ConfigMap reference recorded at install; "a field something
// else has set since ... is left as it is".
//
// What happens: the whole volume recorded at install is put back, so an
// item the operator added to the volume after the install is removed by
// uninstall, and the pods lose the zone file they served.
func TestUninstallKeepsAnItemTheOperatorAddedToTheConfigVolume(t *testing.T) {
	ctx := context.Background()
	d, cm := zoneFileSetup()
	c := fake.NewClientset(d, cm)
	if err := Install(ctx, c, Options{Image: image}); err != nil {
		t.Fatal(err)
	}
	now := get(t, c)
	vol := now.Spec.Template.Spec.Volumes[0].ConfigMap
	vol.Items = append(vol.Items, corev1.KeyToPath{Key: "db.corp.example", Path: "db.corp.example"})
	if _, err := c.AppsV1().Deployments("kube-system").Update(ctx, now, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := Uninstall(ctx, c, Options{}); err != nil {
		t.Fatal(err)
	}
	v := get(t, c).Spec.Template.Spec.Volumes[0].ConfigMap
	if v.Name != "coredns" {
		t.Fatalf("uninstall left the volume on configmap %s", v.Name)
	}
	if !hasItem(v, "db.corp.example") {
		t.Errorf("uninstall removed the item the operator added to the config volume after the install: items %+v", v.Items)
	}
}

// Promise (docs/install.md): "--dry-run lists every write the run would
// make, in order, including ... the ConfigMaps pruned after the rollout".
//
// What happens: when the Deployment has k8s_event already (nothing to
// patch), the dry run says "after the rollout, delete configmap X" for a
// generated ConfigMap no revision reads (left by an interrupted run), but
// the real run returns before its prune step and deletes nothing.
func TestInstallWithNothingToPatchPrunesWhatItsDryRunSays(t *testing.T) {
	ctx := context.Background()
	c := fake.NewClientset(deployment(), configMap())
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

// conflictOnce makes the first patch of the Deployment meet a concurrent
// write, as the API server does when the patch's resourceVersion is no
// longer the object's: the concurrent change (edit) lands, the patch gets
// 409 Conflict.
func conflictOnce(c *fake.Clientset, edit func(d *appsv1.Deployment)) {
	var once sync.Once
	c.PrependReactor("patch", "deployments", func(a k8stesting.Action) (bool, runtime.Object, error) {
		hit := false
		once.Do(func() {
			hit = true
			obj, err := c.Tracker().Get(deploymentsResource, a.GetNamespace(), a.(k8stesting.PatchAction).GetName())
			if err != nil {
				return
			}
			d := obj.(*appsv1.Deployment).DeepCopy()
			edit(d)
			_ = c.Tracker().Update(deploymentsResource, d, d.Namespace)
		})
		if hit {
			return true, nil, apierrors.NewConflict(schema.GroupResource{Group: "apps", Resource: "deployments"}, a.(k8stesting.PatchAction).GetName(), nil)
		}
		return false, nil, nil
	})
}

// Promise (docs/install.md, exit codes; usage text): "5 refused, nothing
// changed"; a refusal says why "and nothing is changed".
//
// What happens: the first attempt creates the Corefile ConfigMap, the Role
// and the RoleBinding, then its patch meets a concurrent change (here
// `kubectl rollout pause`); the retry refuses the paused Deployment and
// the run exits "refused" with the ConfigMap, Role and RoleBinding it
// made left in the cluster, unreported.
func TestInstallRefusedAfterAConflictLeavesNothingChanged(t *testing.T) {
	ctx := context.Background()
	c := fake.NewClientset(deployment(), configMap())
	conflictOnce(c, func(d *appsv1.Deployment) { d.Spec.Paused = true })
	var out bytes.Buffer
	err := Install(ctx, c, Options{Image: image, Out: &out, JSON: true})
	if !IsRefused(err) {
		t.Fatalf("install: %v, want refused (paused)", err)
	}
	var left []string
	if _, err := c.RbacV1().Roles("kube-system").Get(ctx, "coredns-k8s-event", metav1.GetOptions{}); err == nil {
		left = append(left, "role coredns-k8s-event")
	}
	if _, err := c.RbacV1().RoleBindings("kube-system").Get(ctx, "coredns-k8s-event", metav1.GetOptions{}); err == nil {
		left = append(left, "rolebinding coredns-k8s-event")
	}
	cms, _ := c.CoreV1().ConfigMaps("kube-system").List(ctx, metav1.ListOptions{LabelSelector: DeploymentLabel + "=coredns"})
	for _, cm := range cms.Items {
		left = append(left, "configmap "+cm.Name)
	}
	if len(left) > 0 {
		t.Errorf("install was refused (exit 5, \"nothing changed\") but left %v in the cluster; its report:\n%s", left, out.String())
	}
}

// Promise (docs/install.md): -o json carries "the changes" of the run;
// the run "lists each write".
//
// What happens: a conflict on the Deployment's patch (any concurrent
// write, a status update of the Deployment controller is enough) makes
// the run start over, and the report is reset: the ConfigMap, Role and
// RoleBinding this run created show as "keep ... there already" or not at
// all.
func TestInstallReportAfterAConflictListsTheObjectsItCreated(t *testing.T) {
	ctx := context.Background()
	c := fake.NewClientset(deployment(), configMap())
	conflictOnce(c, func(d *appsv1.Deployment) { d.Status.ObservedGeneration++ })
	var out bytes.Buffer
	if err := Install(ctx, c, Options{Image: image, Out: &out, JSON: true}); err != nil {
		t.Fatal(err)
	}
	var res Result
	if err := json.Unmarshal(out.Bytes(), &res); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	created := map[string]bool{}
	for _, ch := range res.Changes {
		if ch.Action == "create" {
			created[ch.Kind] = true
		}
	}
	for _, kind := range []string{"configmap", "role", "rolebinding"} {
		if !created[kind] {
			t.Errorf("the run created a %s, but its -o json report does not say so: %+v", kind, res.Changes)
		}
	}
}

// Promise (docs/install.md, Status; exit codes): status says whether
// k8s_event is installed and lists problems, pods that do not start among
// them; exit 0 means "installed, no problem".
//
// What happens: an install that did not wait (the Deployment's own
// strategy is safe, so --timeout 0 needs no --force) leaves a rollout
// whose new pods are never created (the ReplicaSet's FailedCreate: a
// quota, an admission webhook) and that has passed its progress deadline.
// Every Ready pod still runs the stock image; status reports "installed",
// no problem, and so exit 0.
func TestStatusReportsARolloutWhoseNewPodsNeverStart(t *testing.T) {
	ctx := context.Background()
	d := deployment()
	d.Spec.Strategy = appsv1.DeploymentStrategy{Type: appsv1.RollingUpdateDeploymentStrategyType, RollingUpdate: &appsv1.RollingUpdateDeployment{
		MaxUnavailable: ptrTo(intstr.FromInt32(0)), MaxSurge: ptrTo(intstr.FromInt32(1)),
	}}
	d.Status = rolled(3)
	c := fake.NewClientset(d, configMap())
	if err := Install(ctx, c, Options{Image: image}); err != nil {
		t.Fatal(err)
	}
	// What the Deployment controller reports when the new ReplicaSet
	// cannot create its pods: the old pods stay, Ready.
	now := get(t, c)
	now.Generation = 2
	now.Status = appsv1.DeploymentStatus{ObservedGeneration: 2, Replicas: 3, UpdatedReplicas: 0, ReadyReplicas: 3, AvailableReplicas: 3,
		Conditions: []appsv1.DeploymentCondition{
			{Type: appsv1.DeploymentAvailable, Status: corev1.ConditionTrue, Reason: "MinimumReplicasAvailable"},
			{Type: appsv1.DeploymentProgressing, Status: corev1.ConditionFalse, Reason: "ProgressDeadlineExceeded", Message: `ReplicaSet "coredns-5d78c9869d" has timed out progressing.`},
			{Type: appsv1.DeploymentReplicaFailure, Status: corev1.ConditionTrue, Reason: "FailedCreate", Message: `pods "coredns-5d78c9869d-" is forbidden: exceeded quota: dns-quota`},
		}}
	if _, err := c.AppsV1().Deployments("kube-system").Update(ctx, now, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"coredns-old-a", "coredns-old-b", "coredns-old-c"} {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "kube-system", Labels: map[string]string{"k8s-app": "kube-dns"}},
			Status: corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}}
		if _, err := c.CoreV1().Pods("kube-system").Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	text, healthy := statusText(t, c)
	if healthy {
		t.Errorf("status finds no problem (exit 0) though no pod runs what install set:\n%s", text)
	}
}
