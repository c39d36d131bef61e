package install

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"slices"
	"sync"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

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

// A run whose patch meets a conflict and whose retry is refused (the
// Deployment paused meanwhile) changes nothing: the ConfigMap, Role and
// RoleBinding of the first attempt are taken back, as exit 5 promises.
func TestInstallRefusedAfterAConflictLeavesNothingChanged(t *testing.T) {
	ctx := context.Background()
	c := newClient(deployment(), configMap())
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

// A conflict on the Deployment's patch (any write meanwhile, the
// Deployment controller's status among them) starts the run over; its
// report still lists the ConfigMap, Role and RoleBinding it created.
func TestInstallReportAfterAConflictListsTheObjectsItCreated(t *testing.T) {
	ctx := context.Background()
	c := newClient(deployment(), configMap())
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

// A write the API server refuses did not happen, and what the run takes
// back is undone: -o json lists the writes that stayed and the deletes
// that undid them, never the refused patch.
func TestInstallReportListsTheWritesThatStayedAndTheDeletesThatUndidThem(t *testing.T) {
	ctx := context.Background()
	c := newClient(deployment(), configMap())
	c.PrependReactor("patch", "deployments", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if isDryRun(a) {
			return false, nil, nil
		}
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Group: "apps", Resource: "deployments"}, "coredns", errors.New("denied by a webhook"))
	})
	var out bytes.Buffer
	if err := Install(ctx, c, Options{Image: image, JSON: true, Out: &out}); err == nil {
		t.Fatal("install: no error")
	}
	var res Result
	if err := json.Unmarshal(out.Bytes(), &res); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, ch := range res.Changes {
		got = append(got, ch.Action+" "+ch.Kind)
	}
	want := []string{"create configmap", "create role", "create rolebinding", "create prioritylevelconfiguration", "create flowschema",
		"delete flowschema", "delete prioritylevelconfiguration", "delete rolebinding", "delete role", "delete configmap"}
	if !slices.Equal(got, want) {
		t.Errorf("changes %v, want %v", got, want)
	}
	if cms, _ := c.CoreV1().ConfigMaps("kube-system").List(ctx, metav1.ListOptions{}); len(cms.Items) != 1 {
		t.Errorf("%d ConfigMaps left, want the operator's alone", len(cms.Items))
	}
}
