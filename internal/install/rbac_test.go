package install

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

// The operator's Role and RoleBinding of the names install uses, without
// its labels, as the kustomize component makes them and more.
func operatorRBAC() (*rbacv1.Role, *rbacv1.RoleBinding) {
	meta := metav1.ObjectMeta{Name: "coredns-k8s-event", Namespace: "kube-system"}
	role := &rbacv1.Role{ObjectMeta: meta, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}},
		{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get"}},
	}}
	binding := &rbacv1.RoleBinding{ObjectMeta: meta, RoleRef: rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "coredns-k8s-event"},
		Subjects: []rbacv1.Subject{
			{Kind: "ServiceAccount", Name: "coredns", Namespace: "kube-system"},
			{Kind: "User", Name: "alice"},
		}}
	return role, binding
}

// Install never changes a Role or RoleBinding it did not make: the
// operator's keep their rules and subjects, and the dry run says so.
func TestInstallKeepsTheOperatorsRBAC(t *testing.T) {
	ctx := context.Background()
	role, binding := operatorRBAC()
	c := newClient(deployment(), configMap(), role, binding)
	var out bytes.Buffer
	if err := Install(ctx, c, Options{Image: image, DryRun: true, Out: &out}); err != nil {
		t.Fatal(err)
	}
	if s := out.String(); strings.Contains(s, "update role") || strings.Contains(s, "replace rolebinding") {
		t.Errorf("the dry run would change the operator's RBAC:\n%s", s)
	}
	if err := Install(ctx, c, Options{Image: image, Out: &out}); err != nil {
		t.Fatal(err)
	}
	r, _ := c.RbacV1().Roles("kube-system").Get(ctx, "coredns-k8s-event", metav1.GetOptions{})
	b, _ := c.RbacV1().RoleBindings("kube-system").Get(ctx, "coredns-k8s-event", metav1.GetOptions{})
	if len(r.Rules) != 2 || len(b.Subjects) != 2 {
		t.Errorf("after install the operator's role has %d rules (want 2), its rolebinding %d subjects (want 2)", len(r.Rules), len(b.Subjects))
	}
}

// A Role of the name install uses that is not install's and does not let
// the pods write events is refused, and left as it is.
func TestInstallRefusesTheOperatorsRoleWithoutEvents(t *testing.T) {
	ctx := context.Background()
	role, binding := operatorRBAC()
	role.Rules = role.Rules[1:]
	c := newClient(deployment(), configMap(), role, binding)
	err := Install(ctx, c, Options{Image: image})
	if !IsRefused(err) || !strings.Contains(err.Error(), "does not grant create and patch on events") {
		t.Fatalf("install: %v, want it refused", err)
	}
	if r, _ := c.RbacV1().Roles("kube-system").Get(ctx, "coredns-k8s-event", metav1.GetOptions{}); len(r.Rules) != 1 {
		t.Errorf("the role changed: %+v", r.Rules)
	}
	if d := get(t, c); d.Spec.Template.Spec.Containers[0].Image == image {
		t.Errorf("the Deployment was patched")
	}
}

// Uninstall deletes only the Role and RoleBinding install made: those a
// kustomize component made stay, and k8s_event keeps writing events.
func TestUninstallKeepsRBACItDidNotMake(t *testing.T) {
	ctx := context.Background()
	role, binding := operatorRBAC()
	c := newClient(deployment(), configMap(), role, binding)
	var out bytes.Buffer
	if err := Uninstall(ctx, c, Options{Out: &out}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.RbacV1().Roles("kube-system").Get(ctx, "coredns-k8s-event", metav1.GetOptions{}); err != nil {
		t.Errorf("the operator's role: %v", err)
	}
	if _, err := c.RbacV1().RoleBindings("kube-system").Get(ctx, "coredns-k8s-event", metav1.GetOptions{}); err != nil {
		t.Errorf("the operator's rolebinding: %v", err)
	}
}

// Installing again where the install's RoleBinding gained a subject keeps
// it, with its subjects, even where creating a RoleBinding is forbidden:
// the running pods never lose their right to write events.
func TestInstallAgainKeepsTheRoleBindingThatGainedASubject(t *testing.T) {
	ctx := context.Background()
	c := newClient(deployment(), configMap())
	if err := Install(ctx, c, Options{Image: image}); err != nil {
		t.Fatal(err)
	}
	b, _ := c.RbacV1().RoleBindings("kube-system").Get(ctx, "coredns-k8s-event", metav1.GetOptions{})
	b.Subjects = append(b.Subjects, rbacv1.Subject{Kind: "User", Name: "alice"})
	if _, err := c.RbacV1().RoleBindings("kube-system").Update(ctx, b, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	forbid(c, "create", "rolebindings")
	forbid(c, "delete", "rolebindings")
	var out bytes.Buffer
	if err := Install(ctx, c, Options{Image: image, Options: []string{"level info warning error"}, Out: &out}); err != nil {
		t.Errorf("install again: %v\n%s", err, out.String())
	}
	got, err := c.RbacV1().RoleBindings("kube-system").Get(ctx, "coredns-k8s-event", metav1.GetOptions{})
	if err != nil || len(got.Subjects) != 2 {
		t.Errorf("the rolebinding after installing again: %+v, %v; want it with both subjects", got, err)
	}
}

// Where the pods' ServiceAccount is not among the RoleBinding's subjects,
// it is added in place: the subjects it has stay (the running pods may
// run as one of them); a forbidden update changes nothing.
func TestInstallUpdatesTheRoleBindingInPlace(t *testing.T) {
	ctx := context.Background()
	c := newClient(deployment(), configMap())
	if err := Install(ctx, c, Options{Image: image}); err != nil {
		t.Fatal(err)
	}
	d := get(t, c)
	d.Spec.Template.Spec.ServiceAccountName = "dns"
	if _, err := c.AppsV1().Deployments("kube-system").Update(ctx, d, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	forbid(c, "delete", "rolebindings")
	if err := Install(ctx, c, Options{Image: image}); err != nil {
		t.Fatal(err)
	}
	got, _ := c.RbacV1().RoleBindings("kube-system").Get(ctx, "coredns-k8s-event", metav1.GetOptions{})
	if len(got.Subjects) != 2 || got.Subjects[0].Name != "coredns" || got.Subjects[1].Name != "dns" {
		t.Errorf("subjects %+v, want coredns then dns", got.Subjects)
	}
}

// A RoleBinding of the install's that refers to another role is made
// anew, the new one before the old one goes.
func TestInstallReplacesARoleBindingToAnotherRoleNewFirst(t *testing.T) {
	ctx := context.Background()
	role, _ := rbacFor(deployment(), "coredns")
	_, b := rbacFor(deployment(), "coredns")
	b.RoleRef.Name = "other"
	c := newClient(deployment(), configMap(), role, b)
	w := writes(c)
	if err := Install(ctx, c, Options{Image: image}); err != nil {
		t.Fatal(err)
	}
	want := []string{"create rolebindings", "delete rolebindings", "create rolebindings", "delete rolebindings"}
	var rb []string
	for _, x := range *w {
		if strings.HasSuffix(x, "rolebindings") {
			rb = append(rb, x)
		}
	}
	if strings.Join(rb, ",") != strings.Join(want, ",") {
		t.Errorf("writes of rolebindings %v, want %v", rb, want)
	}
	got, err := c.RbacV1().RoleBindings("kube-system").Get(ctx, "coredns-k8s-event", metav1.GetOptions{})
	if err != nil || got.RoleRef.Name != "coredns-k8s-event" {
		t.Errorf("rolebinding %+v, %v", got, err)
	}
	if list, _ := c.RbacV1().RoleBindings("kube-system").List(ctx, metav1.ListOptions{}); len(list.Items) != 1 {
		t.Errorf("%d rolebindings, want 1", len(list.Items))
	}
}

// An install again over the tool's own Role, to which the operator added
// a rule since (here get on pods, which k8s_event's pod read needs when
// COREDNS_POD_UID is not set), whose rollout fails and is put back,
// leaves the Role with the operator's rules.
func TestInstallPutBackGivesTheRoleItsRulesBack(t *testing.T) {
	ctx, c, image2 := installedBeforeAFailingBuild(t)
	role, err := c.RbacV1().Roles("kube-system").Get(ctx, "coredns-k8s-event", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	role.Rules = append(role.Rules, rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get"}})
	if _, err := c.RbacV1().Roles("kube-system").Update(ctx, role, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	want := role.Rules
	var out bytes.Buffer
	err = Install(ctx, c, Options{Image: image2, Wait: 2 * time.Second, Settle: time.Second, Out: &out})
	if err == nil || !strings.Contains(err.Error(), "is back as it was") {
		t.Fatalf("install of the build that fails: %v\n%s", err, out.String())
	}
	got, err := c.RbacV1().Roles("kube-system").Get(ctx, "coredns-k8s-event", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !equalJSON(got.Rules, want) {
		t.Errorf("after the failed install, put back, role rules are %+v, want the operator's %+v\n%s", got.Rules, want, out.String())
	}
}

// The install's Role, whose events rule the operator replaced by another,
// gets the events rule added beside theirs; when the rollout fails and is
// put back, the Role has the operator's rules again.
func TestInstallAddsTheEventsRuleToItsRoleAndTakesItBack(t *testing.T) {
	ctx, c, image2 := installedBeforeAFailingBuild(t)
	role, err := c.RbacV1().Roles("kube-system").Get(ctx, "coredns-k8s-event", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	role.Rules = []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get"}}}
	if _, err := c.RbacV1().Roles("kube-system").Update(ctx, role, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	err = Install(ctx, c, Options{Image: image2, Wait: 2 * time.Second, Settle: time.Second, Out: &out})
	if err == nil || !strings.Contains(err.Error(), "is back as it was") {
		t.Fatalf("install of the build that fails: %v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "update role kube-system/coredns-k8s-event") {
		t.Errorf("the install did not update the Role:\n%s", out.String())
	}
	got, err := c.RbacV1().Roles("kube-system").Get(ctx, "coredns-k8s-event", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !equalJSON(got.Rules, role.Rules) {
		t.Errorf("after the failed install, put back, role rules are %+v, want the operator's %+v\n%s", got.Rules, role.Rules, out.String())
	}
}

// installedBeforeAFailingBuild installs k8s_event on the chart's defaults
// and returns the client and a build whose pods never get Ready: an
// install of it fails and is put back.
func installedBeforeAFailingBuild(t *testing.T) (context.Context, *fake.Clientset, string) {
	t.Helper()
	ctx := context.Background()
	d := chartDefaults()
	c := newClient(d.DeepCopy(), configMap())
	const image2 = "registry.example/coredns-k8s-event:1.13.1-0.2.0-def"
	rolloutNeverReady(c, image2)
	if err := Install(ctx, c, Options{Image: image, Wait: 5 * time.Second, Settle: time.Second}); err != nil {
		t.Fatal(err)
	}
	return ctx, c, image2
}
