package install

import (
	"context"
	"fmt"
	"slices"
	"strings"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	rbacv1client "k8s.io/client-go/kubernetes/typed/rbac/v1"
	"k8s.io/client-go/util/retry"
)

// ours reports whether an object carries the labels the install gives
// what it makes for the Deployment: only those does it update or delete.
func ours(m metav1.ObjectMeta, deployment string) bool {
	return m.Labels[managedByLabel] == FieldManager && m.Labels[DeploymentLabel] == deployment
}

func rbacFor(d metav1.Object, sa string) (*rbacv1.Role, *rbacv1.RoleBinding) {
	meta := metav1.ObjectMeta{
		Name:      d.GetName() + "-k8s-event",
		Namespace: d.GetNamespace(),
		Labels:    map[string]string{DeploymentLabel: d.GetName(), managedByLabel: FieldManager},
	}
	role := &rbacv1.Role{
		TypeMeta:   metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "Role"},
		ObjectMeta: meta,
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}}},
	}
	binding := &rbacv1.RoleBinding{
		TypeMeta:   metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "RoleBinding"},
		ObjectMeta: *meta.DeepCopy(),
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: meta.Name},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: sa, Namespace: d.GetNamespace()}},
	}
	return role, binding
}

// grantsEvents reports whether rules let their subject create and patch
// core events.
func grantsEvents(rules []rbacv1.PolicyRule) bool {
	for _, verb := range []string{"create", "patch"} {
		if !slices.ContainsFunc(rules, func(r rbacv1.PolicyRule) bool {
			return (slices.Contains(r.APIGroups, "") || slices.Contains(r.APIGroups, "*")) &&
				(slices.Contains(r.Resources, "events") || slices.Contains(r.Resources, "*")) &&
				(slices.Contains(r.Verbs, verb) || slices.Contains(r.Verbs, "*")) && len(r.ResourceNames) == 0
		}) {
			return false
		}
	}
	return true
}

func bindsServiceAccount(b *rbacv1.RoleBinding, ns, sa string) bool {
	return slices.ContainsFunc(b.Subjects, func(s rbacv1.Subject) bool {
		return s.Kind == "ServiceAccount" && s.Name == sa && (s.Namespace == ns || s.Namespace == "")
	})
}

func subjectsString(subjects []rbacv1.Subject) string {
	var s []string
	for _, x := range subjects {
		s = append(s, strings.ToLower(x.Kind)+" "+x.Namespace+"/"+x.Name)
	}
	return strings.Join(s, ", ")
}

// planRBAC says what the Role and RoleBinding need. Objects of those names
// that do not carry the install's labels are the operator's: they are
// never changed, only checked to grant what k8s_event needs, and refused
// when they do not.
func planRBAC(ctx context.Context, c kubernetes.Interface, role *rbacv1.Role, binding *rbacv1.RoleBinding, deployment string) ([]step, error) {
	var refuse []string
	steps, why, err := planRole(ctx, c, role, deployment)
	if err != nil {
		return nil, err
	}
	refuse = append(refuse, why...)
	roleIsNew := len(steps) > 0 && steps[0].change.Action == "create"
	bsteps, why, err := planBinding(ctx, c, binding, deployment, roleIsNew)
	if err != nil {
		return nil, err
	}
	refuse = append(refuse, why...)
	if len(refuse) > 0 {
		return nil, &RefusedError{refuse}
	}
	return append(steps, bsteps...), nil
}

func rbacRight(verb, resource, name string) right {
	return right{verb: verb, group: "rbac.authorization.k8s.io", resource: resource, name: name}
}

// planRole says what the Role needs: created, updated to the rules
// k8s_event needs, or kept.
func planRole(ctx context.Context, c kubernetes.Interface, role *rbacv1.Role, deployment string) ([]step, []string, error) {
	ns := role.Namespace
	roles := c.RbacV1().Roles(ns)
	name := ns + "/" + role.Name
	have, err := roles.Get(ctx, role.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		create := func(dry []string) func(context.Context) error {
			return func(ctx context.Context) error {
				_, err := roles.Create(ctx, role, metav1.CreateOptions{FieldManager: FieldManager, DryRun: dry})
				return err
			}
		}
		n := needs("create role "+name, rbacRight("create", "roles", ""), rbacRight("delete", "roles", role.Name))
		return []step{{
			change: Change{Action: "create", Kind: "role", Name: name, Detail: "create, patch events"},
			line:   "create role " + name,
			do:     create(nil), dry: create(dryAll), needs: []need{n},
			undo: func(ctx context.Context) error { return roles.Delete(ctx, role.Name, metav1.DeleteOptions{}) },
		}}, nil, nil
	case err != nil:
		return nil, nil, err
	case !ours(have.ObjectMeta, deployment):
		if !grantsEvents(have.Rules) {
			return nil, []string{fmt.Sprintf("role %s is there and is not this tool's (it lacks the label %s=%s), and it does not grant create and patch on events: add that rule to it, or delete it and let install make its own", name, managedByLabel, FieldManager)}, nil
		}
		return []step{{
			change: Change{Action: "keep", Kind: "role", Name: name, Detail: "not this tool's; it grants create, patch events: kept as it is"},
			line:   "keep role " + name,
		}}, nil, nil
	case !grantsEvents(have.Rules):
		return []step{updateRole(roles, have, role.Rules)}, nil, nil
	}
	return nil, nil, nil
}

// updateRole is the step that adds rules to the install's Role have,
// keeping the rules others added to it, and whose undo gives it back
// have's rules.
func updateRole(roles rbacv1client.RoleInterface, have *rbacv1.Role, rules []rbacv1.PolicyRule) step {
	name := have.Namespace + "/" + have.Name
	want := have.DeepCopy()
	want.Rules = append(want.Rules, rules...)
	update := func(dry []string) func(context.Context) error {
		return func(ctx context.Context) error {
			_, err := roles.Update(ctx, want, metav1.UpdateOptions{FieldManager: FieldManager, DryRun: dry})
			return err
		}
	}
	undo := func(ctx context.Context) error {
		return retry.RetryOnConflict(retry.DefaultRetry, func() error {
			now, err := roles.Get(ctx, have.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			now.Rules = have.Rules
			_, err = roles.Update(ctx, now, metav1.UpdateOptions{FieldManager: FieldManager})
			return err
		})
	}
	n := needs("update role "+name, rbacRight("get", "roles", have.Name), rbacRight("update", "roles", have.Name))
	return step{
		change: Change{Action: "update", Kind: "role", Name: name, Detail: "create, patch events added to its rules"},
		line:   "update role " + name,
		do:     update(nil), dry: update(dryAll), needs: []need{n}, undo: undo,
	}
}

// planBinding says what the RoleBinding needs. One of the install's that
// refers to its Role is updated in place, never deleted: the subjects
// others added stay, and the pods that run now keep their right to write
// events throughout. Only one that refers to another role is replaced,
// and then the new one is made before the old one goes.
func planBinding(ctx context.Context, c kubernetes.Interface, binding *rbacv1.RoleBinding, deployment string, roleIsNew bool) ([]step, []string, error) {
	ns := binding.Namespace
	bindings := c.RbacV1().RoleBindings(ns)
	name := ns + "/" + binding.Name
	subject := binding.Subjects[0]
	to := fmt.Sprintf("role %s to serviceaccount %s/%s", binding.RoleRef.Name, subject.Namespace, subject.Name)
	// Binding a Role takes the right to bind it, or every right it grants.
	n := need{all: []right{rbacRight("bind", "roles", binding.RoleRef.Name)}, or: []right{{verb: "create", resource: "events"}, {verb: "patch", resource: "events"}}}
	hb, err := bindings.Get(ctx, binding.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		create := func(dry []string) func(context.Context) error {
			return func(ctx context.Context) error {
				_, err := bindings.Create(ctx, binding, metav1.CreateOptions{FieldManager: FieldManager, DryRun: dry})
				return err
			}
		}
		cn := needs("create rolebinding "+name, rbacRight("create", "rolebindings", ""), rbacRight("delete", "rolebindings", binding.Name))
		n.why = "binding role " + binding.RoleRef.Name
		s := step{
			change: Change{Action: "create", Kind: "rolebinding", Name: name, Detail: to},
			line:   "create rolebinding " + name,
			do:     create(nil), dry: create(dryAll), needs: []need{cn},
			undo: func(ctx context.Context) error { return bindings.Delete(ctx, binding.Name, metav1.DeleteOptions{}) },
		}
		if roleIsNew {
			// The API server checks the binding against the Role, which the
			// dry run of the Role's create did not keep: the review asks it.
			s.dry = nil
			s.needs = append(s.needs, n)
		}
		return []step{s}, nil, nil
	case err != nil:
		return nil, nil, err
	case !ours(hb.ObjectMeta, deployment):
		if hb.RoleRef.Kind != "Role" || hb.RoleRef.Name != binding.RoleRef.Name || !bindsServiceAccount(hb, ns, subject.Name) {
			return nil, []string{fmt.Sprintf("rolebinding %s is there and is not this tool's (it lacks the label %s=%s), and it does not bind role %s to serviceaccount %s/%s (it binds %s %s to %s): add that subject to it, or delete it and let install make its own", name, managedByLabel, FieldManager, binding.RoleRef.Name, ns, subject.Name, strings.ToLower(hb.RoleRef.Kind), hb.RoleRef.Name, subjectsString(hb.Subjects))}, nil
		}
		return []step{{
			change: Change{Action: "keep", Kind: "rolebinding", Name: name, Detail: fmt.Sprintf("not this tool's; it binds %s: kept as it is", to)},
			line:   "keep rolebinding " + name,
		}}, nil, nil
	case !equalJSON(hb.RoleRef, binding.RoleRef):
		return replaceBinding(bindings, hb, binding, to), nil, nil
	case !bindsServiceAccount(hb, ns, subject.Name):
		return updateBinding(bindings, hb, subject, to), nil, nil
	}
	return nil, nil, nil
}

type bindingClient interface {
	Create(context.Context, *rbacv1.RoleBinding, metav1.CreateOptions) (*rbacv1.RoleBinding, error)
	Update(context.Context, *rbacv1.RoleBinding, metav1.UpdateOptions) (*rbacv1.RoleBinding, error)
	Delete(context.Context, string, metav1.DeleteOptions) error
}

// updateBinding adds the pods' ServiceAccount to the install's RoleBinding
// in place, keeping the subjects it has: the pods that run now may run as
// another. A failed rollout puts the subjects back.
func updateBinding(bindings bindingClient, have *rbacv1.RoleBinding, subject rbacv1.Subject, to string) []step {
	name := have.Namespace + "/" + have.Name
	want := have.DeepCopy()
	want.Subjects = append(want.Subjects, subject)
	update := func(b *rbacv1.RoleBinding, dry []string) func(context.Context) error {
		return func(ctx context.Context) error {
			_, err := bindings.Update(ctx, b, metav1.UpdateOptions{FieldManager: FieldManager, DryRun: dry})
			return err
		}
	}
	n := needs("update rolebinding "+name, rbacRight("update", "rolebindings", have.Name))
	old := have.DeepCopy()
	return []step{{
		change: Change{Action: "update", Kind: "rolebinding", Name: name, Detail: fmt.Sprintf("%s added, in place (it binds %s)", to, subjectsString(have.Subjects))},
		line:   "update rolebinding " + name,
		do:     update(want, nil), dry: update(want, dryAll), needs: []need{n},
		undo: func(ctx context.Context) error {
			// The object as the update left it: its resourceVersion is newer.
			old.ResourceVersion = ""
			return update(old, nil)(ctx)
		},
	}}
}

// replaceBinding replaces the install's RoleBinding that refers to
// another role (roleRef cannot change in place): the new one is made
// under a second name before the old one goes, then under its own name,
// and the second name goes last, so that a binding is there throughout.
func replaceBinding(bindings bindingClient, have, binding *rbacv1.RoleBinding, to string) []step {
	ns := have.Namespace
	name := ns + "/" + binding.Name
	next := binding.DeepCopy()
	next.Name = binding.Name + "-next"
	create := func(b *rbacv1.RoleBinding, dry []string) func(context.Context) error {
		return func(ctx context.Context) error {
			_, err := bindings.Create(ctx, b, metav1.CreateOptions{FieldManager: FieldManager, DryRun: dry})
			if apierrors.IsAlreadyExists(err) && dry == nil {
				return nil // an earlier run made it
			}
			return err
		}
	}
	del := func(n string, uid *types.UID, dry []string) func(context.Context) error {
		return func(ctx context.Context) error {
			err := bindings.Delete(ctx, n, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: uid}, DryRun: dry})
			if apierrors.IsNotFound(err) {
				return nil
			}
			return err
		}
	}
	n := needs("replace rolebinding "+name, rbacRight("create", "rolebindings", ""), rbacRight("delete", "rolebindings", binding.Name), rbacRight("delete", "rolebindings", next.Name))
	detail := fmt.Sprintf("%s (was %s %s to %s; roleRef cannot change in place: made anew, under %s first)", to, strings.ToLower(have.RoleRef.Kind), have.RoleRef.Name, subjectsString(have.Subjects), next.Name)
	return []step{
		{change: Change{Action: "replace", Kind: "rolebinding", Name: name, Detail: detail}, line: "replace rolebinding " + name, needs: []need{n},
			do: func(ctx context.Context) error {
				for _, f := range []func(context.Context) error{create(next, nil), del(have.Name, &have.UID, nil), create(binding, nil), del(next.Name, nil, nil)} {
					if err := f(ctx); err != nil {
						return err
					}
				}
				return nil
			},
			dry: func(ctx context.Context) error {
				if err := create(next, dryAll)(ctx); err != nil {
					return err
				}
				return del(have.Name, &have.UID, dryAll)(ctx)
			}},
	}
}
