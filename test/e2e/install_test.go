//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	applyapps "k8s.io/client-go/applyconfigurations/apps/v1"
	applycore "k8s.io/client-go/applyconfigurations/core/v1"
	applymeta "k8s.io/client-go/applyconfigurations/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/dnsops/k8s_event/internal/install"
)

// TestInstallAgainstTheAPIServer runs install, status and uninstall
// against a real API server (no node: nothing rolls) as a ServiceAccount
// bound to deploy/kubectl-k8s-event/role.yaml and nothing more, over a
// Deployment of 5 replicas applied server-side by another field manager:
// the Role and ClusterRole are enough (escalation checks included, the
// fleet's Role among them), install makes the FlowSchema and the level and
// uninstall deletes them, the next server-side apply has no
// conflict, and a second run is refused while one holds the lease.
func TestInstallAgainstTheAPIServer(t *testing.T) {
	ctx := t.Context()
	ns := namespaceFor(t)
	if _, err := kube.CreateNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	admin := kube.Clientset
	corefile := ".:53 {\n    errors\n    kubernetes cluster.local\n    forward . /etc/resolv.conf\n}\n"
	if _, err := admin.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "coredns"}, Data: map[string]string{"Corefile": corefile}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	applied := applyapps.Deployment("coredns", ns).
		WithLabels(map[string]string{"k8s-app": "kube-dns"}).
		WithSpec(applyapps.DeploymentSpec().
			WithReplicas(5). // more than install.FleetThreshold: fleet, and its Role
			WithSelector(applymeta.LabelSelector().WithMatchLabels(map[string]string{"k8s-app": "kube-dns"})).
			WithTemplate(applycore.PodTemplateSpec().
				WithLabels(map[string]string{"k8s-app": "kube-dns"}).
				WithSpec(applycore.PodSpec().
					WithServiceAccountName("coredns").
					WithContainers(applycore.Container().
						WithName("coredns").
						WithImage("registry.k8s.io/coredns/coredns:v1.13.1").
						WithArgs("-conf", "/etc/coredns/Corefile").
						WithVolumeMounts(applycore.VolumeMount().WithName("config-volume").WithMountPath("/etc/coredns"))).
					WithVolumes(applycore.Volume().WithName("config-volume").
						WithConfigMap(applycore.ConfigMapVolumeSource().WithName("coredns"))))))
	deps := admin.AppsV1().Deployments(ns)
	if _, err := deps.Apply(ctx, applied, metav1.ApplyOptions{FieldManager: "platform"}); err != nil {
		t.Fatal(err)
	}
	op := operatorClient(t, ns)
	const image = "localhost/coredns-k8s-event:test"
	var out bytes.Buffer
	err := install.Install(ctx, op, install.Options{Namespace: ns, Image: image, Out: &out})
	if !install.IsRefused(err) || !strings.Contains(err.Error(), `field manager "platform"`) {
		t.Fatalf("install over a server-side applier: %v, want it refused", err)
	}
	out.Reset()
	if err := install.Install(ctx, op, install.Options{Namespace: ns, Image: image, Force: true, Out: &out}); err != nil {
		t.Fatalf("install --force as the operator: %v\n%s", err, out.String())
	}
	d, err := deps.Get(ctx, "coredns", metav1.GetOptions{})
	if err != nil || d.Spec.Template.Spec.Containers[0].Image != image {
		t.Fatalf("after install: %v", err)
	}
	for _, m := range d.ManagedFields {
		if m.Manager == install.FieldManager {
			t.Errorf("install kept its fields: %s", m.FieldsV1.Raw)
		}
	}
	if s, err := install.Status(ctx, op, install.Options{Namespace: ns}); err != nil || s.State != install.StateInstalled {
		t.Errorf("status as the operator: %+v, %v", s, err)
	}
	if r, err := admin.RbacV1().Roles(ns).Get(ctx, "coredns-k8s-event-fleet", metav1.GetOptions{}); err != nil || len(r.Rules) != 2 {
		t.Errorf("after install, the fleet's role: %v", err)
	}
	flowSchema := install.FlowSchemaName(ns, "coredns")
	if fs, err := admin.FlowcontrolV1().FlowSchemas().Get(ctx, flowSchema, metav1.GetOptions{}); err != nil || fs.Spec.PriorityLevelConfiguration.Name != "k8s-event" {
		t.Errorf("after install, flowschema %s: %v", flowSchema, err)
	}
	if _, err := admin.FlowcontrolV1().PriorityLevelConfigurations().Get(ctx, "k8s-event", metav1.GetOptions{}); err != nil {
		t.Errorf("after install, prioritylevelconfiguration k8s-event: %v", err)
	}
	// Again: the level and the FlowSchema, as the API server keeps them,
	// are what install would write.
	out.Reset()
	if err := install.Install(ctx, op, install.Options{Namespace: ns, Image: image, Force: true, JSON: true, Out: &out}); err != nil {
		t.Fatalf("install again: %v\n%s", err, out.String())
	}
	var again install.Result
	if err := json.Unmarshal(out.Bytes(), &again); err != nil {
		t.Fatal(err)
	}
	for _, ch := range again.Changes {
		if (ch.Kind == "flowschema" || ch.Kind == "prioritylevelconfiguration") && ch.Action != "keep" {
			t.Errorf("install again: %s %s %s (%s), want it kept", ch.Action, ch.Kind, ch.Name, ch.Detail)
		}
	}

	// Another run holds the lease and renews it, as a live run does.
	holder, secs, now := "elsewhere/1/x", int32(60), metav1.NewMicroTime(time.Now())
	leases := admin.CoordinationV1().Leases(ns)
	if _, err := leases.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "coredns-k8s-event"},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: &holder, LeaseDurationSeconds: &secs, AcquireTime: &now, RenewTime: &now}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	renewCtx, stopRenewing := context.WithCancel(ctx)
	renewed := make(chan struct{})
	go func() {
		defer close(renewed)
		for {
			select {
			case <-renewCtx.Done():
				return
			case <-time.After(time.Second):
			}
			l, err := leases.Get(renewCtx, "coredns-k8s-event", metav1.GetOptions{})
			if err != nil {
				continue
			}
			at := metav1.NewMicroTime(time.Now())
			l.Spec.RenewTime = &at
			_, _ = leases.Update(renewCtx, l, metav1.UpdateOptions{})
		}
	}()
	err = install.Uninstall(ctx, op, install.Options{Namespace: ns})
	stopRenewing()
	<-renewed
	if !install.IsRefused(err) || !strings.Contains(err.Error(), holder) {
		t.Errorf("uninstall while another run holds the lease and renews it: %v", err)
	}
	if err := leases.Delete(ctx, "coredns-k8s-event", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}

	// The platform applies again, without --force-conflicts.
	if _, err := deps.Apply(ctx, applied, metav1.ApplyOptions{FieldManager: "platform"}); err != nil {
		t.Errorf("the next server-side apply: %v", err)
	}
	out.Reset()
	if err := install.Uninstall(ctx, op, install.Options{Namespace: ns, Out: &out}); err != nil {
		t.Fatalf("uninstall as the operator: %v\n%s", err, out.String())
	}
	if _, err := admin.FlowcontrolV1().FlowSchemas().Get(ctx, flowSchema, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("after uninstall, flowschema %s: %v, want it gone", flowSchema, err)
	}
	for _, get := range []func() error{
		func() error {
			_, err := admin.RbacV1().Roles(ns).Get(ctx, "coredns-k8s-event", metav1.GetOptions{})
			return err
		},
		func() error {
			_, err := admin.RbacV1().RoleBindings(ns).Get(ctx, "coredns-k8s-event", metav1.GetOptions{})
			return err
		},
		func() error {
			_, err := admin.RbacV1().Roles(ns).Get(ctx, "coredns-k8s-event-fleet", metav1.GetOptions{})
			return err
		},
	} {
		if err := get(); err == nil {
			t.Errorf("after uninstall the Role or RoleBinding is there")
		}
	}
}

// operatorClient is a client for a ServiceAccount of ns bound to
// deploy/kubectl-k8s-event/role.yaml: its Role in ns, its ClusterRole
// cluster-wide.
func operatorClient(t *testing.T, ns string) kubernetes.Interface {
	t.Helper()
	ctx := context.Background()
	for _, args := range [][]string{
		{"-n", ns, "apply", "-f", filepath.Join(repoRoot, "deploy/kubectl-k8s-event/role.yaml")},
		{"-n", ns, "create", "serviceaccount", "dns-operator"},
		{"-n", ns, "create", "rolebinding", "kubectl-k8s-event", "--role", "kubectl-k8s-event", "--serviceaccount", ns + ":dns-operator"},
		{"create", "clusterrolebinding", "kubectl-k8s-event-" + ns, "--clusterrole", "kubectl-k8s-event", "--serviceaccount", ns + ":dns-operator"},
	} {
		if _, stderr, err := kube.Kubectl(ctx, args...); err != nil {
			t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, stderr)
		}
	}
	t.Cleanup(func() {
		_ = kube.Clientset.RbacV1().ClusterRoleBindings().Delete(context.Background(), "kubectl-k8s-event-"+ns, metav1.DeleteOptions{})
	})
	tr, err := kube.Clientset.CoreV1().ServiceAccounts(ns).CreateToken(ctx, "dns-operator", &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := rest.AnonymousClientConfig(kube.RESTConfig)
	cfg.BearerToken = tr.Status.Token
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}
