package install

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
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
	c := newClient(componentInstall()...)
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
	c := installedThen(t, func(d *appsv1.Deployment) { d.Spec.Template.Spec.ServiceAccountName = "dns" })
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
	d := deployment() // mounting NodeHosts, as k3s does
	d.Spec.Template.Spec.Volumes[0].ConfigMap.Items = append(d.Spec.Template.Spec.Volumes[0].ConfigMap.Items, corev1.KeyToPath{Key: "NodeHosts", Path: "NodeHosts"})
	c := newClient(d, cm)
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

// status reports a rollout whose new pods are never created (the
// ReplicaSet's FailedCreate: a quota, an admission webhook) and that has
// passed its progress deadline, though every Ready pod still runs: exit 0
// would say "installed, no problem".
func TestStatusReportsARolloutWhoseNewPodsNeverStart(t *testing.T) {
	ctx := context.Background()
	d := deployment()
	d.Spec.Strategy = appsv1.DeploymentStrategy{Type: appsv1.RollingUpdateDeploymentStrategyType, RollingUpdate: &appsv1.RollingUpdateDeployment{
		MaxUnavailable: ptrTo(intstr.FromInt32(0)), MaxSurge: ptrTo(intstr.FromInt32(1)),
	}}
	d.Status = rolled(3)
	c := newClient(d, configMap())
	if err := Install(ctx, c, Options{Image: image}); err != nil {
		t.Fatal(err)
	}
	// What the Deployment controller reports when the new ReplicaSet
	// cannot create its pods: the old pods stay, Ready.
	now := get(t, c)
	now.Generation = 2
	now.Status = appsv1.DeploymentStatus{ObservedGeneration: 2, Replicas: 3, UpdatedReplicas: 0, ReadyReplicas: 3, AvailableReplicas: 3,
		Conditions: []appsv1.DeploymentCondition{
			{Type: appsv1.DeploymentAvailable, Status: corev1.ConditionTrue, Reason: "MinimumReplicasAvailable"},
			{Type: appsv1.DeploymentProgressing, Status: corev1.ConditionFalse, Reason: "ProgressDeadlineExceeded", Message: `ReplicaSet "coredns-5d78c9869d" has timed out progressing.`},
			{Type: appsv1.DeploymentReplicaFailure, Status: corev1.ConditionTrue, Reason: "FailedCreate", Message: `pods "coredns-5d78c9869d-" is forbidden: exceeded quota: dns-quota`},
		}}
	if _, err := c.AppsV1().Deployments("kube-system").Update(ctx, now, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"coredns-old-a", "coredns-old-b", "coredns-old-c"} {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "kube-system", Labels: map[string]string{"k8s-app": "kube-dns"}},
			Status: corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}}
		if _, err := c.CoreV1().Pods("kube-system").Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	text, healthy := statusText(t, c)
	if healthy {
		t.Errorf("status finds no problem (exit 0) though no pod runs what install set:\n%s", text)
	}
}

// statusText is status's text, and whether it found nothing wrong.
func statusText(t *testing.T, c kubernetes.Interface) (string, bool) {
	t.Helper()
	var out bytes.Buffer
	s, err := Status(context.Background(), c, Options{Out: &out})
	if err != nil {
		t.Fatal(err)
	}
	return out.String(), s.Healthy()
}

// A paused Deployment does not roll its pods to the installed template:
// status counts the Ready pods that run it, and is not healthy while too
// few do.
func TestStatusCountsThePodsThatRunTheInstalledTemplate(t *testing.T) {
	ctx := context.Background()
	c := installedThen(t, func(d *appsv1.Deployment) { d.Spec.Paused = true })
	d := get(t, c)
	pod := func(name string, annotations map[string]string) {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "kube-system", Labels: map[string]string{"k8s-app": "kube-dns"}, Annotations: annotations},
			Status: corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}}
		if _, err := c.CoreV1().Pods("kube-system").Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"coredns-old-a", "coredns-old-b", "coredns-old-c"} {
		pod(name, nil)
	}
	text, healthy := statusText(t, c)
	if healthy || !strings.Contains(text, "0 of 3") || !strings.Contains(text, "rollout resume") {
		t.Errorf("status of a paused Deployment whose pods run the template before the install:\n%s", text)
	}
	for _, name := range []string{"coredns-new-a", "coredns-new-b", "coredns-new-c"} {
		pod(name, d.Spec.Template.Annotations)
	}
	for _, name := range []string{"coredns-old-a", "coredns-old-b", "coredns-old-c"} {
		if err := c.CoreV1().Pods("kube-system").Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	s, err := Status(ctx, c, Options{})
	if err != nil || !s.Healthy() || s.Running != 3 {
		t.Errorf("status once the pods run the installed template: %+v, %v", s, err)
	}
}

// installedThen is a client where k8s_event is installed on deployment(),
// whose Deployment edit then changes as an operator would.
func installedThen(t *testing.T, edit func(d *appsv1.Deployment)) *fake.Clientset {
	t.Helper()
	ctx := context.Background()
	c := newClient(deployment(), configMap())
	if err := Install(ctx, c, Options{Image: image}); err != nil {
		t.Fatal(err)
	}
	d := get(t, c)
	edit(d)
	if _, err := c.AppsV1().Deployments("kube-system").Update(ctx, d, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	return c
}

// A read-only on-call user (the view role reads no Role or RoleBinding)
// gets status with what it may read, -o json written, and is told what
// was not checked.
func TestStatusOfAReadOnlyUserSaysWhatItCouldRead(t *testing.T) {
	c := installedThen(t, func(*appsv1.Deployment) {})
	forbid(c, "get", "roles")
	forbid(c, "get", "rolebindings")
	var out bytes.Buffer
	s, err := Status(context.Background(), c, Options{Out: &out, JSON: true})
	if err != nil {
		t.Fatalf("status of a read-only user: %v", err)
	}
	var got StatusReport
	if err := json.Unmarshal(out.Bytes(), &got); err != nil {
		t.Fatalf("-o json: %v\n%s", err, out.String())
	}
	if got.State != StateInstalled || got.Image != image || len(got.Unread) != 2 || !strings.Contains(got.Role, "forbidden") || s.Healthy() {
		t.Errorf("status of a read-only user: %s", out.String())
	}
}
