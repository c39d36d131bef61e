package install

import (
	"context"
	"fmt"
	"slices"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// ours reports whether an object carries the labels the install gives
// what it makes for the Deployment: only those does it update or delete.
func ours(m metav1.ObjectMeta, deployment string) bool {
	return m.Labels[managedByLabel] == FieldManager && m.Labels[DeploymentLabel] == deployment
}

func rbacFor(d *appsv1.Deployment, sa string) (*rbacv1.Role, *rbacv1.RoleBinding) {
	meta := metav1.ObjectMeta{
		Name:      d.Name + "-k8s-event",
		Namespace: d.Namespace,
		Labels:    map[string]string{DeploymentLabel: d.Name, managedByLabel: FieldManager},
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
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: sa, Namespace: d.Namespace}},
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

// rbacStep is one write of the RBAC the install needs.
type rbacStep struct {
	change Change
	line   string
	do     func(ctx context.Context) error // nil: nothing to write
	undo   func(ctx context.Context) error // for a create: the delete that takes it back
}

// planRBAC says what the Role and RoleBinding need. Objects of those names
// that do not carry the install's labels are the operator's: they are
// never changed, only checked to grant what k8s_event needs, and refused
// when they do not.
func planRBAC(ctx context.Context, c kubernetes.Interface, role *rbacv1.Role, binding *rbacv1.RoleBinding, deployment string) ([]rbacStep, error) {
	ns := role.Namespace
	roles, bindings := c.RbacV1().Roles(ns), c.RbacV1().RoleBindings(ns)
	var steps []rbacStep
	var refuse []string
	have, err := roles.Get(ctx, role.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		steps = append(steps, rbacStep{
			change: Change{Action: "create", Kind: "role", Name: ns + "/" + role.Name, Detail: "create, patch events"},
			line:   fmt.Sprintf("create role %s/%s", ns, role.Name),
			do: func(ctx context.Context) error {
				_, err := roles.Create(ctx, role, metav1.CreateOptions{FieldManager: FieldManager})
				return err
			},
			undo: func(ctx context.Context) error { return roles.Delete(ctx, role.Name, metav1.DeleteOptions{}) },
		})
	case err != nil:
		return nil, err
	case !ours(have.ObjectMeta, deployment):
		if !grantsEvents(have.Rules) {
			refuse = append(refuse, fmt.Sprintf("role %s/%s is there and is not this tool's (it lacks the label %s=%s), and it does not grant create and patch on events: add that rule to it, or delete it and let install make its own", ns, role.Name, managedByLabel, FieldManager))
		} else {
			steps = append(steps, rbacStep{
				change: Change{Action: "keep", Kind: "role", Name: ns + "/" + role.Name, Detail: "not this tool's; it grants create, patch events: kept as it is"},
				line:   fmt.Sprintf("keep role %s/%s", ns, role.Name),
			})
		}
	case !equalJSON(have.Rules, role.Rules):
		have = have.DeepCopy()
		have.Rules = role.Rules
		steps = append(steps, rbacStep{
			change: Change{Action: "update", Kind: "role", Name: ns + "/" + role.Name, Detail: "create, patch events"},
			line:   fmt.Sprintf("update role %s/%s", ns, role.Name),
			do: func(ctx context.Context) error {
				_, err := roles.Update(ctx, have, metav1.UpdateOptions{FieldManager: FieldManager})
				return err
			},
		})
	}
	subject := binding.Subjects[0]
	hb, err := bindings.Get(ctx, binding.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		steps = append(steps, rbacStep{
			change: Change{Action: "create", Kind: "rolebinding", Name: ns + "/" + binding.Name, Detail: fmt.Sprintf("role %s to serviceaccount %s/%s", role.Name, subject.Namespace, subject.Name)},
			line:   fmt.Sprintf("create rolebinding %s/%s", ns, binding.Name),
			do: func(ctx context.Context) error {
				_, err := bindings.Create(ctx, binding, metav1.CreateOptions{FieldManager: FieldManager})
				return err
			},
			undo: func(ctx context.Context) error { return bindings.Delete(ctx, binding.Name, metav1.DeleteOptions{}) },
		})
	case err != nil:
		return nil, err
	case !ours(hb.ObjectMeta, deployment):
		if hb.RoleRef.Kind != "Role" || hb.RoleRef.Name != role.Name || !bindsServiceAccount(hb, ns, subject.Name) {
			refuse = append(refuse, fmt.Sprintf("rolebinding %s/%s is there and is not this tool's (it lacks the label %s=%s), and it does not bind role %s to serviceaccount %s/%s (it binds %s %s to %s): add that subject to it, or delete it and let install make its own", ns, binding.Name, managedByLabel, FieldManager, role.Name, ns, subject.Name, strings.ToLower(hb.RoleRef.Kind), hb.RoleRef.Name, subjectsString(hb.Subjects)))
		} else {
			steps = append(steps, rbacStep{
				change: Change{Action: "keep", Kind: "rolebinding", Name: ns + "/" + binding.Name, Detail: fmt.Sprintf("not this tool's; it binds role %s to serviceaccount %s/%s: kept as it is", role.Name, ns, subject.Name)},
				line:   fmt.Sprintf("keep rolebinding %s/%s", ns, binding.Name),
			})
		}
	case !equalJSON(hb.Subjects, binding.Subjects) || !equalJSON(hb.RoleRef, binding.RoleRef):
		steps = append(steps, rbacStep{
			change: Change{Action: "replace", Kind: "rolebinding", Name: ns + "/" + binding.Name, Detail: fmt.Sprintf("role %s to serviceaccount %s/%s (was %s %s to %s)", role.Name, subject.Namespace, subject.Name, strings.ToLower(hb.RoleRef.Kind), hb.RoleRef.Name, subjectsString(hb.Subjects))},
			line:   fmt.Sprintf("replace rolebinding %s/%s", ns, binding.Name),
			do: func(ctx context.Context) error {
				// The role it refers to cannot change in place.
				if err := bindings.Delete(ctx, binding.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &hb.UID}}); err != nil && !apierrors.IsNotFound(err) {
					return err
				}
				_, err := bindings.Create(ctx, binding, metav1.CreateOptions{FieldManager: FieldManager})
				return err
			},
		})
	}
	if len(refuse) > 0 {
		return nil, &RefusedError{refuse}
	}
	return steps, nil
}
