package install

import (
	"bytes"
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Uninstall gives the pods back the operator's ConfigMap: when it is gone,
// the pods would not start, so uninstall (and its dry run) refuses unless
// forced, and says why.
func TestUninstallRefusesToPointThePodsAtAConfigMapThatIsGone(t *testing.T) {
	ctx := context.Background()
	c := newClient(deployment(), configMap())
	if err := Install(ctx, c, Options{Image: image, Wait: 0, Force: true}); err != nil {
		t.Fatal(err)
	}
	if err := c.CoreV1().ConfigMaps("kube-system").Delete(ctx, "coredns", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, dry := range []bool{true, false} {
		var out bytes.Buffer
		err := Uninstall(ctx, c, Options{DryRun: dry, Out: &out, Wait: 0, Force: false})
		if !IsRefused(err) || !strings.Contains(err.Error(), "configmap kube-system/coredns") || !strings.Contains(err.Error(), "--force") {
			t.Errorf("uninstall (dry run %v): %v, want it refused, naming the ConfigMap and --force\n%s", dry, err, out.String())
		}
	}
	if _, ok := get(t, c).Spec.Template.Annotations[Annotation]; !ok {
		t.Fatalf("the refused uninstall changed the Deployment")
	}
	var out bytes.Buffer
	if err := Uninstall(ctx, c, Options{Out: &out, Force: true}); err != nil {
		t.Fatalf("uninstall --force: %v", err)
	}
	if !strings.Contains(out.String(), "warning: --force: configmap kube-system/coredns") {
		t.Errorf("uninstall --force does not say what it went on despite:\n%s", out.String())
	}
}

// The volume mounts the operator's ConfigMap with items (the helm chart's
// way: the Corefile and a zone file). Since the install the operator
// took the zone file's key out of that ConfigMap; the pods, reading the
// copy install made, still start. Uninstall would point them at a
// ConfigMap without a key the volume lists, which the kubelet cannot
// mount ("configmap references non-existent config key"): the new pods
// would not start, just as when the ConfigMap is gone. Install checks
// this of the ConfigMap it writes; uninstall (and its dry run) must
// refuse it unless forced, too.
func TestUninstallRefusesAConfigMapWithoutAKeyTheVolumeMounts(t *testing.T) {
	ctx := context.Background()
	d := deployment()
	vol := d.Spec.Template.Spec.Volumes[0].ConfigMap
	vol.Items = append(vol.Items, corev1.KeyToPath{Key: "example.db", Path: "example.db"})
	cm := configMap()
	cm.Data["example.db"] = "$ORIGIN example.\n@ 3600 IN SOA ns.example. admin.example. 1 7200 3600 1209600 3600\n"
	c := newClient(d, cm)
	if err := Install(ctx, c, Options{Image: image, Wait: 0, Force: true}); err != nil {
		t.Fatal(err)
	}
	cm, err := c.CoreV1().ConfigMaps("kube-system").Get(ctx, "coredns", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	delete(cm.Data, "example.db")
	if _, err := c.CoreV1().ConfigMaps("kube-system").Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	err = Uninstall(ctx, c, Options{DryRun: true, Out: &out, Wait: 0, Force: false})
	if !IsRefused(err) || !strings.Contains(err.Error(), "example.db") {
		t.Errorf("uninstall --dry-run: %v, want it refused: configmap kube-system/coredns has no key example.db, which the volume mounts, and the pods would not start\n%s", err, out.String())
	}
}

// Install updates its RoleBinding in place and keeps the subjects it has
// (docs: "the RoleBinding keeps the subjects it has and gains the
// ServiceAccount"). A subject the operator added to it since (here a
// second DNS Deployment's ServiceAccount that also reports events) is
// the operator's setting; uninstall deletes the whole RoleBinding, and
// that ServiceAccount gets 403 on every event from then on, with no word
// in the report. Uninstall should take out only the subject install
// added (or keep the binding and say so).
func TestUninstallKeepsSubjectsTheOperatorAddedToTheRoleBinding(t *testing.T) {
	ctx := context.Background()
	c := newClient(deployment(), configMap())
	if err := Install(ctx, c, Options{Image: image, Wait: 0, Force: true}); err != nil {
		t.Fatal(err)
	}
	b, err := c.RbacV1().RoleBindings("kube-system").Get(ctx, "coredns-k8s-event", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	extra := rbacv1.Subject{Kind: "ServiceAccount", Name: "coredns-internal", Namespace: "kube-system"}
	b.Subjects = append(b.Subjects, extra)
	if _, err := c.RbacV1().RoleBindings("kube-system").Update(ctx, b, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := Uninstall(ctx, c, Options{Out: &out, Wait: 0, Force: true}); err != nil {
		t.Fatalf("uninstall: %v\n%s", err, out.String())
	}
	got, err := c.RbacV1().RoleBindings("kube-system").Get(ctx, "coredns-k8s-event", metav1.GetOptions{})
	if err != nil || !bindsServiceAccount(got, "kube-system", extra.Name) {
		t.Errorf("after uninstall the rolebinding is %v (%v): the operator's subject serviceaccount kube-system/%s lost its binding\n%s", got, err, extra.Name, out.String())
	}
	if bindsServiceAccount(got, "kube-system", "coredns") {
		t.Errorf("after uninstall the rolebinding still binds the Deployment's serviceaccount: %v", got.Subjects)
	}
	if _, err := c.RbacV1().Roles("kube-system").Get(ctx, "coredns-k8s-event", metav1.GetOptions{}); err != nil {
		t.Errorf("the role the rolebinding still refers to: %v", err)
	}
	if !strings.Contains(out.String(), "keep role kube-system/coredns-k8s-event") {
		t.Errorf("uninstall does not say it keeps the role:\n%s", out.String())
	}
}

// An operator who keeps the plugin's options in their own Corefile (a
// k8s_event block) and installs: uninstall would hand that Corefile to the
// stock image, which stops on the unknown directive. Uninstall and its dry
// run refuse and say so; --force goes on.
func TestUninstallRefusesToGiveTheStockImageACorefileWithK8sEvent(t *testing.T) {
	ctx := context.Background()
	cm := configMap()
	withBlock, _, err := AddPlugins(custom, []string{"level error"})
	if err != nil {
		t.Fatal(err)
	}
	cm.Data["Corefile"] = withBlock
	c := newClient(deployment(), cm)
	if err := Install(ctx, c, Options{Image: image}); err != nil {
		t.Fatal(err)
	}
	for _, dry := range []bool{true, false} {
		var out bytes.Buffer
		err := Uninstall(ctx, c, Options{DryRun: dry, Out: &out})
		if !IsRefused(err) || !strings.Contains(err.Error(), "Unknown directive 'k8s_event'") || !strings.Contains(err.Error(), "registry.k8s.io/coredns/coredns:v1.13.1") {
			t.Errorf("uninstall (dry run %v): %v, want it refused, naming the directive and the image\n%s", dry, err, out.String())
		}
	}
	if get(t, c).Spec.Template.Spec.Containers[0].Image != image {
		t.Fatal("the refused uninstall changed the Deployment")
	}
	if err := Uninstall(ctx, c, Options{Force: true}); err != nil {
		t.Fatalf("uninstall --force: %v", err)
	}
}
