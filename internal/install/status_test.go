package install

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
)

// componentInstall is k8s_event as the kustomize component sets it up:
// the image, the four variables, a Corefile ConfigMap with k8s_event, and
// a Role and RoleBinding without the install's labels.
func componentInstall() []runtime.Object {
	d := deployment()
	ctr := &d.Spec.Template.Spec.Containers[0]
	ctr.Image = image
	ctr.Env = append(ctr.Env, Env...)
	d.Spec.Template.Spec.Volumes[0].ConfigMap.Name = "coredns-k8s-event"
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "coredns-k8s-event", Namespace: "kube-system"},
		Data: map[string]string{"Corefile": ".:53 {\n    errors\n    kubernetes cluster.local\n    kubeapi\n    k8s_event\n}\n"}}
	role, binding := operatorRBAC()
	return []runtime.Object{d, configMap(), cm, role, binding}
}

// status tells a Deployment that runs k8s_event set up by other means,
// and install refuses to take that image for the stock one.
func TestStatusSaysInstalledByOtherMeans(t *testing.T) {
	c := fake.NewClientset(componentInstall()...)
	text, _ := statusText(t, c)
	if strings.Contains(text, "not installed") {
		t.Errorf("status:\n%s", text)
	}
	if err := Install(context.Background(), c, Options{Image: image + "-next"}); !IsRefused(err) || !strings.Contains(err.Error(), "set up by other means") {
		t.Errorf("install over it: %v, want it refused", err)
	}
}

// status tells when the pods run under another ServiceAccount than the
// one the RoleBinding binds.
func TestStatusSaysThePodsRunUnderAnotherServiceAccount(t *testing.T) {
	ctx := context.Background()
	c := fake.NewClientset(deployment(), configMap())
	if err := Install(ctx, c, Options{Image: image}); err != nil {
		t.Fatal(err)
	}
	d := get(t, c)
	d.Spec.Template.Spec.ServiceAccountName = "dns"
	if _, err := c.AppsV1().Deployments("kube-system").Update(ctx, d, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	text, healthy := statusText(t, c)
	if healthy || !strings.Contains(text, "serviceaccount kube-system/dns") {
		t.Errorf("status does not tell the ServiceAccount the pods run under:\n%s", text)
	}
}

// status tells when the operator's ConfigMap changed after the install
// (k3s rewrites NodeHosts as nodes come and go): the pods read the copy.
func TestStatusSaysTheSourceConfigMapChanged(t *testing.T) {
	ctx := context.Background()
	cm := configMap()
	cm.Data["NodeHosts"] = "10.0.0.5 node-a\n"
	c := fake.NewClientset(deployment(), cm)
	if err := Install(ctx, c, withForce(Options{Image: image})); err != nil {
		t.Fatal(err)
	}
	cm.Data["NodeHosts"] += "10.0.0.6 node-b\n"
	if _, err := c.CoreV1().ConfigMaps("kube-system").Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	text, healthy := statusText(t, c)
	if healthy || !strings.Contains(text, "configmap coredns changed since the install") {
		t.Errorf("status does not tell the change:\n%s", text)
	}
}
