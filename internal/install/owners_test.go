package install

import (
	"bytes"
	"context"
	"encoding/json"
	appsv1 "k8s.io/api/apps/v1"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	applyapps "k8s.io/client-go/applyconfigurations/apps/v1"
	applycore "k8s.io/client-go/applyconfigurations/core/v1"
	applymeta "k8s.io/client-go/applyconfigurations/meta/v1"
)

// appliedDeployment is CoreDNS as a tool that applies server-side (helm
// 4, kubectl apply --server-side) has it.
func appliedDeployment() *applyapps.DeploymentApplyConfiguration {
	return applyapps.Deployment("coredns", "kube-system").
		WithLabels(map[string]string{"k8s-app": "kube-dns"}).
		WithSpec(applyapps.DeploymentSpec().
			WithReplicas(2).
			WithSelector(applymeta.LabelSelector().WithMatchLabels(map[string]string{"k8s-app": "kube-dns"})).
			WithTemplate(applycore.PodTemplateSpec().
				WithLabels(map[string]string{"k8s-app": "kube-dns"}).
				WithSpec(applycore.PodSpec().
					WithServiceAccountName("coredns").
					WithContainers(applycore.Container().
						WithName("coredns").
						WithImage("registry.k8s.io/coredns/coredns:v1.13.1").
						WithArgs("-conf", "/etc/coredns/Corefile").
						WithVolumeMounts(applycore.VolumeMount().WithName("config-volume").WithMountPath("/etc/coredns").WithReadOnly(true))).
					WithVolumes(applycore.Volume().WithName("config-volume").
						WithConfigMap(applycore.ConfigMapVolumeSource().WithName("coredns").
							WithItems(applycore.KeyToPath().WithKey("Corefile").WithPath("Corefile")))))))
}

// After an install, the next server-side apply of the Deployment under
// another field manager goes through without a conflict: the install
// does not keep the fields it set.
func TestInstallLeavesTheNextServerSideApplyWithoutConflict(t *testing.T) {
	ctx := context.Background()
	c := newClient(configMap())
	deps := c.AppsV1().Deployments("kube-system")
	if _, err := deps.Apply(ctx, appliedDeployment(), metav1.ApplyOptions{FieldManager: "platform"}); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := Install(ctx, c, withForce(Options{Image: image, Out: &out})); err != nil {
		t.Fatalf("install: %v\n%s", err, out.String())
	}
	if got := get(t, c).Spec.Template.Spec.Containers[0].Image; got != image {
		t.Fatalf("image %s after install", got)
	}
	if _, err := deps.Apply(ctx, appliedDeployment(), metav1.ApplyOptions{FieldManager: "platform"}); err != nil {
		t.Errorf("the next apply: %v", err)
	}
}

// Where another owner keeps the Deployment as it wants it, install
// refuses with the reason and the path that fits, changes nothing, and
// with --force goes on and says what it went on despite.
func TestInstallRefusesOtherOwners(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name        string
		labels      map[string]string
		annotations map[string]string
		want        string
	}{
		{"helm", map[string]string{"app.kubernetes.io/managed-by": "Helm"}, map[string]string{"meta.helm.sh/release-name": "dns"}, `helm release "dns"`},
		{"argo cd", nil, map[string]string{"argocd.argoproj.io/tracking-id": "dns:apps/Deployment:kube-system/coredns"}, "Argo CD"},
		{"flux", map[string]string{"kustomize.toolkit.fluxcd.io/name": "infra"}, nil, "Flux"},
		{"k3s", nil, map[string]string{"objectset.rio.cattle.io/id": "coredns"}, "k3s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := deployment()
			for k, v := range tc.labels {
				d.Labels[k] = v
			}
			d.Annotations = tc.annotations
			c := newClient(d, configMap())
			err := Install(ctx, c, Options{Image: image})
			if !IsRefused(err) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("install: %v, want it refused with %q", err, tc.want)
			}
			if got := get(t, c).Spec.Template.Spec.Containers[0].Image; got == image {
				t.Errorf("the refused install patched the Deployment")
			}
			if cms, _ := c.CoreV1().ConfigMaps("kube-system").List(ctx, metav1.ListOptions{}); len(cms.Items) != 1 {
				t.Errorf("the refused install made ConfigMaps")
			}
			var out bytes.Buffer
			if err := Install(ctx, c, withForce(Options{Image: image, Out: &out})); err != nil {
				t.Fatalf("--force: %v", err)
			}
			if !strings.Contains(out.String(), "warning: --force: ") {
				t.Errorf("--force does not say what it went on despite:\n%s", out.String())
			}
		})
	}
}

// A field manager that applies the image server-side is another owner.
func TestInstallRefusesAServerSideApplierOfTheImage(t *testing.T) {
	ctx := context.Background()
	c := newClient(configMap())
	if _, err := c.AppsV1().Deployments("kube-system").Apply(ctx, appliedDeployment(), metav1.ApplyOptions{FieldManager: "platform"}); err != nil {
		t.Fatal(err)
	}
	err := Install(ctx, c, Options{Image: image})
	if !IsRefused(err) || !strings.Contains(err.Error(), `field manager "platform"`) || !strings.Contains(err.Error(), `containers[name="coredns"].image`) {
		t.Errorf("install: %v", err)
	}
}

// k3s's NodeHosts is rewritten as nodes come and go: a copy would go
// stale, so install refuses unless forced.
func TestInstallRefusesNodeHostsUnlessForced(t *testing.T) {
	cm := configMap()
	cm.Data["NodeHosts"] = "10.0.0.5 node-a\n"
	d := deployment()
	d.Spec.Template.Spec.Volumes[0].ConfigMap.Items = append(d.Spec.Template.Spec.Volumes[0].ConfigMap.Items, corev1.KeyToPath{Key: "NodeHosts", Path: "NodeHosts"})
	c := newClient(d, cm)
	if err := Install(context.Background(), c, Options{Image: image}); !IsRefused(err) || !strings.Contains(err.Error(), "NodeHosts") {
		t.Errorf("install: %v", err)
	}
}

// lastAppliedOf is a kubectl.kubernetes.io/last-applied-configuration of d
// as a client-side apply of its manifest leaves it.
func lastAppliedOf(t *testing.T, d *appsv1.Deployment) string {
	t.Helper()
	m := d.DeepCopy()
	m.TypeMeta = metav1.TypeMeta{APIVersion: "apps/v1", Kind: "Deployment"}
	m.ObjectMeta = metav1.ObjectMeta{Name: d.Name, Namespace: d.Namespace, Labels: d.Labels}
	m.Status = appsv1.DeploymentStatus{}
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// Argo CD 2.x with its defaults tracks by label and applies client-side:
// no argocd.argoproj.io key, but its last-applied configuration holds the
// image and the config volume, and its next sync puts them back. Install
// refuses unless forced; a plain kubectl apply gets a warning.
func TestInstallRefusesAClientSideApplierThatKeepsApplying(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name    string
		labels  map[string]string
		manager string
		refused string // "" when only warned
	}{
		{"argo cd label tracking", map[string]string{"app.kubernetes.io/instance": "dns"}, "", "Argo CD"},
		{"argo cd field manager", nil, "argocd-application-controller", `field manager "argocd-application-controller"`},
		{"kubectl apply", nil, "kubectl-client-side-apply", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := deployment()
			for k, v := range tc.labels {
				d.Labels[k] = v
			}
			d.Annotations = map[string]string{corev1.LastAppliedConfigAnnotation: lastAppliedOf(t, d)}
			d.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: tc.manager, Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "apps/v1"}}
			c := newClient(d, configMap())
			var out bytes.Buffer
			err := Install(ctx, c, Options{Image: image, Out: &out})
			if tc.refused == "" {
				if err != nil || !strings.Contains(out.String(), "warning: deployment kube-system/coredns was applied with kubectl apply") {
					t.Errorf("install: %v, want a warning:\n%s", err, out.String())
				}
				return
			}
			if !IsRefused(err) || !strings.Contains(err.Error(), tc.refused) || !strings.Contains(err.Error(), "last-applied configuration holds the image and the config volume") {
				t.Fatalf("install: %v, want it refused with %q", err, tc.refused)
			}
			if err := Install(ctx, c, withForce(Options{Image: image})); err != nil {
				t.Errorf("--force: %v", err)
			}
		})
	}
}
