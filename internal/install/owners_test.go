package install

import (
	"bytes"
	"context"
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
		{"addon manager", map[string]string{"addonmanager.kubernetes.io/mode": "Reconcile"}, nil, "set the label to EnsureExists"},
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
