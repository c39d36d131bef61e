package install

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// newClient is the fake API server of the unit tests, answering as the
// real one does where a run depends on it: an access review is allowed
// unless forbid says otherwise, and a write with dryRun=All is checked
// (the object is there, or not) and kept nowhere.
func newClient(objs ...runtime.Object) *fake.Clientset {
	c := fake.NewClientset(objs...)
	serveFlowControl(c)
	c.PrependReactor("*", "*", dryRunReactor(c))
	c.PrependReactor("create", "selfsubjectaccessreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		rev := a.(k8stesting.CreateAction).GetObject().(*authorizationv1.SelfSubjectAccessReview).DeepCopy()
		rev.Status.Allowed = true
		return true, rev, nil
	})
	return c
}

func isDryRun(a k8stesting.Action) bool {
	var dry []string
	switch a := a.(type) {
	case k8stesting.CreateActionImpl:
		dry = a.GetCreateOptions().DryRun
	case k8stesting.UpdateActionImpl:
		dry = a.GetUpdateOptions().DryRun
	case k8stesting.PatchActionImpl:
		dry = a.GetPatchOptions().DryRun
	case k8stesting.DeleteActionImpl:
		dry = a.GetDeleteOptions().DryRun
	}
	return slices.Contains(dry, metav1.DryRunAll)
}

// dryRunReactor answers a dry run as the API server does, keeping nothing.
func dryRunReactor(c *fake.Clientset) k8stesting.ReactionFunc {
	return func(a k8stesting.Action) (bool, runtime.Object, error) {
		if !isDryRun(a) {
			return false, nil, nil
		}
		gvr, ns := a.GetResource(), a.GetNamespace()
		switch a := a.(type) {
		case k8stesting.CreateActionImpl:
			m, err := meta.Accessor(a.GetObject())
			if err != nil {
				return true, nil, err
			}
			if _, err := c.Tracker().Get(gvr, ns, m.GetName()); err == nil {
				return true, nil, apierrors.NewAlreadyExists(gvr.GroupResource(), m.GetName())
			}
			return true, a.GetObject(), nil
		case k8stesting.UpdateActionImpl:
			m, err := meta.Accessor(a.GetObject())
			if err != nil {
				return true, nil, err
			}
			if _, err := c.Tracker().Get(gvr, ns, m.GetName()); err != nil {
				return true, nil, err
			}
			return true, a.GetObject(), nil
		case k8stesting.PatchActionImpl:
			obj, err := c.Tracker().Get(gvr, ns, a.GetName())
			return true, obj, err
		case k8stesting.DeleteActionImpl:
			_, err := c.Tracker().Get(gvr, ns, a.GetName())
			return true, nil, err
		}
		return false, nil, nil
	}
}

// forbid takes verb on resource away from whoever runs the tool: the
// access review says so, and the API server refuses the request, a dry
// run included (authorization comes before both).
func forbid(c *fake.Clientset, verb, resource string) {
	c.PrependReactor(verb, resource, func(a k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(a.GetResource().GroupResource(), "", nil)
	})
	c.PrependReactor("create", "selfsubjectaccessreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		rev := a.(k8stesting.CreateAction).GetObject().(*authorizationv1.SelfSubjectAccessReview).DeepCopy()
		if at := rev.Spec.ResourceAttributes; at == nil || at.Verb != verb || at.Resource != resource {
			return false, nil, nil
		}
		rev.Status.Denied = true
		return true, rev, nil
	})
}

// writes records the writes that were made (not dry runs, not reviews,
// not the lease) in the order they were.
func writes(c *fake.Clientset) *[]string {
	var got []string
	c.PrependReactor("*", "*", func(a k8stesting.Action) (bool, runtime.Object, error) {
		switch a.GetVerb() {
		case "create", "update", "patch", "delete":
			if r := a.GetResource().Resource; r != "selfsubjectaccessreviews" && r != "leases" && !isDryRun(a) {
				got = append(got, a.GetVerb()+" "+r)
			}
		}
		return false, nil, nil
	})
	return &got
}

// A run whose RoleBinding create would be forbidden makes no write at all:
// the access review names the right missing before the first one.
func TestInstallWithoutTheRightToFinishWritesNothing(t *testing.T) {
	ctx := context.Background()
	c := newClient(deployment(), configMap())
	forbid(c, "create", "rolebindings")
	w := writes(c)
	err := Install(ctx, c, Options{Image: image, Wait: time.Minute})
	if !IsRefused(err) || !strings.Contains(err.Error(), "create rolebindings.rbac.authorization.k8s.io") {
		t.Errorf("install: %v, want it refused, naming the right missing", err)
	}
	if len(*w) > 0 {
		t.Errorf("install wrote %v before it found it could not finish", *w)
	}
}

// What no access review can see (RBAC's escalation check, admission) the
// server-side dry run of each write finds, before the first write.
func TestInstallRefusedByTheDryRunOfAWriteWritesNothing(t *testing.T) {
	ctx := context.Background()
	c := newClient(deployment(), configMap())
	c.PrependReactor("create", "roles", func(a k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(a.GetResource().GroupResource(), "coredns-k8s-event", errors.New("user is attempting to grant RBAC permissions not currently held"))
	})
	w := writes(c)
	err := Install(ctx, c, Options{Image: image, Wait: time.Minute})
	if !IsRefused(err) || !strings.Contains(err.Error(), "server-side dry run") || !strings.Contains(err.Error(), "not currently held") {
		t.Errorf("install: %v, want it refused by the dry run", err)
	}
	if len(*w) > 0 {
		t.Errorf("install wrote %v before it found it could not finish", *w)
	}
}

// The tool's dry run checks the rights too: where the real run would be
// forbidden part way, it says what is missing and fails, in text and JSON.
func TestDryRunSaysWhatTheRunWouldBeForbidden(t *testing.T) {
	ctx := context.Background()
	c := newClient(deployment(), configMap())
	forbid(c, "patch", "deployments")
	var out bytes.Buffer
	err := Install(ctx, c, Options{Image: image, DryRun: true, Out: &out})
	if !IsRefused(err) || !strings.Contains(err.Error(), "patch deployments.apps coredns") {
		t.Errorf("dry run: %v, want it refused, naming the right missing\n%s", err, out.String())
	}
	out.Reset()
	_ = Install(ctx, c, Options{Image: image, DryRun: true, JSON: true, Out: &out})
	var res Result
	if err := json.Unmarshal(out.Bytes(), &res); err != nil || !res.Refused || len(res.Missing) == 0 {
		t.Errorf("dry run, JSON: refused %v, missing %v (%v)\n%s", res.Refused, res.Missing, err, out.String())
	}
	ok := newClient(deployment(), configMap())
	out.Reset()
	if err := Install(ctx, ok, Options{Image: image, DryRun: true, Out: &out}); err != nil || !strings.Contains(out.String(), "access: every right the run needs is granted") {
		t.Errorf("dry run with every right: %v\n%s", err, out.String())
	}
}

// Uninstall, too, changes nothing where it could not finish.
func TestUninstallWithoutTheRightToFinishWritesNothing(t *testing.T) {
	ctx := context.Background()
	c := newClient(deployment(), configMap())
	if err := Install(ctx, c, Options{Image: image}); err != nil {
		t.Fatal(err)
	}
	forbid(c, "delete", "roles")
	w := writes(c)
	if err := Uninstall(ctx, c, Options{Wait: time.Minute}); !IsRefused(err) || !strings.Contains(err.Error(), "delete roles.rbac.authorization.k8s.io coredns-k8s-event") {
		t.Errorf("uninstall: %v, want it refused, naming the right missing", err)
	}
	if len(*w) > 0 {
		t.Errorf("uninstall wrote %v before it found it could not finish", *w)
	}
}

// Without the rights its lock needs, a run takes no Lease.
func TestInstallWithoutTheLeaseRightsTakesNoLease(t *testing.T) {
	ctx := context.Background()
	c := newClient(deployment(), configMap())
	forbid(c, "delete", "leases")
	if err := Install(ctx, c, Options{Image: image}); !IsRefused(err) || !strings.Contains(err.Error(), "delete leases.coordination.k8s.io") {
		t.Errorf("install: %v, want it refused, naming the right missing", err)
	}
	if l, _ := c.CoordinationV1().Leases("kube-system").List(ctx, metav1.ListOptions{}); len(l.Items) > 0 {
		t.Errorf("a lease was taken")
	}
}

// Whether the rollout settled is read from the pods (templatePods lists
// them, for the restarts during the wait and for the settle time): a run
// that may not list pods patches the Deployment, rolls every pod, cannot
// tell that they settled, and after the settle time plus a minute puts
// it all back. Listing pods is part of the right to finish, so a run
// without it must be refused before its first write, and the dry run
// must say so. (Here the run is cut off after 3 s, once its writes are
// made; on a real cluster it rolls twice and fails.)
func TestInstallWithoutTheRightToListPodsWritesNothing(t *testing.T) {
	d := chartDefaults()
	c := newClient(d.DeepCopy(), configMap())
	controller(c, nil, func(*appsv1.Deployment) appsv1.DeploymentStatus { return rolled(1) })
	forbid(c, "list", "pods")
	var out bytes.Buffer
	dry := Install(context.Background(), c, Options{Image: image, DryRun: true, Wait: time.Minute, Out: &out})
	if !IsRefused(dry) {
		t.Errorf("dry run: %v, want it refused: the run could not tell that its pods settled (list pods)\n%s", dry, out.String())
	}
	w := writes(c)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	err := Install(ctx, c, Options{Image: image, Wait: time.Minute, Settle: time.Second})
	if len(*w) > 0 {
		t.Errorf("install wrote %v before it found it could not finish (%v)", *w, err)
	}
}
