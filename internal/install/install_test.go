package install

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

// image is k8s_event on the CoreDNS release deployment() runs.
const image = "registry.example/coredns-k8s-event:1.13.1-0.2.0-abc"

// deployment is CoreDNS as kubeadm lays it out, with an operator's
// changes: replicas, a memory limit, a toleration, an env variable.
func deployment() *appsv1.Deployment {
	replicas := int32(3)
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "coredns", Namespace: "kube-system", UID: "d-uid", Labels: map[string]string{"k8s-app": "kube-dns"}},
		Spec: appsv1.DeploymentSpec{
			Replicas: &replicas,
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"k8s-app": "kube-dns"}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"k8s-app": "kube-dns"}},
				Spec: corev1.PodSpec{
					ServiceAccountName: "coredns",
					Tolerations:        []corev1.Toleration{{Key: "dedicated", Operator: corev1.TolerationOpEqual, Value: "dns", Effect: corev1.TaintEffectNoSchedule}},
					Containers: []corev1.Container{{
						Name:  "coredns",
						Image: "registry.k8s.io/coredns/coredns:v1.13.1",
						Args:  []string{"-conf", "/etc/coredns/Corefile"},
						Env:   []corev1.EnvVar{{Name: "GODEBUG", Value: "netdns=go"}},
						Resources: corev1.ResourceRequirements{
							Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("512Mi")},
						},
						VolumeMounts: []corev1.VolumeMount{{Name: "config-volume", MountPath: "/etc/coredns", ReadOnly: true}},
					}},
					Volumes: []corev1.Volume{{Name: "config-volume", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
						LocalObjectReference: corev1.LocalObjectReference{Name: "coredns"},
						Items:                []corev1.KeyToPath{{Key: "Corefile", Path: "Corefile"}},
					}}}},
				},
			},
		},
	}
}

func configMap() *corev1.ConfigMap {
	return &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "coredns", Namespace: "kube-system"},
		Data:       map[string]string{"Corefile": custom},
	}
}

func get(t *testing.T, c *fake.Clientset) *appsv1.Deployment {
	t.Helper()
	d, err := c.AppsV1().Deployments("kube-system").Get(context.Background(), "coredns", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func specJSON(d *appsv1.Deployment) string {
	b, _ := json.Marshal(d.Spec)
	return string(b)
}

func TestInstallUninstall(t *testing.T) {
	ctx := context.Background()
	stock := deployment()
	c := newClient(stock.DeepCopy(), configMap())
	var out bytes.Buffer

	// A dry run changes nothing and says what it would.
	if err := Install(ctx, c, Options{Image: image, DryRun: true, Out: &out}); err != nil {
		t.Fatal(err)
	}
	t.Logf("dry run:\n%s", out.String())
	for _, want := range []string{"create configmap kube-system/coredns-k8s-event-", "+     kubeapi", "create role kube-system/coredns-k8s-event", "serviceaccount kube-system/coredns", "patch deployment kube-system/coredns:", image, "COREDNS_POD_UID"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the dry run does not say %q", want)
		}
	}
	if specJSON(get(t, c)) != specJSON(stock) {
		t.Fatal("the dry run changed the Deployment")
	}
	if cms, _ := c.CoreV1().ConfigMaps("kube-system").List(ctx, metav1.ListOptions{}); len(cms.Items) != 1 {
		t.Fatalf("the dry run made ConfigMaps: %d", len(cms.Items))
	}

	out.Reset()
	if err := Install(ctx, c, Options{Image: image, Options: []string{"level info warning error"}, Out: &out}); err != nil {
		t.Fatal(err)
	}
	d := get(t, c)
	ctr := d.Spec.Template.Spec.Containers[0]
	if ctr.Image != image {
		t.Errorf("image %s, want %s", ctr.Image, image)
	}
	if len(ctr.Env) != 5 || ctr.Env[0].Name != "GODEBUG" || ctr.Env[4].Name != "COREDNS_NODE_NAME" {
		t.Errorf("env %+v, want GODEBUG and the four variables", ctr.Env)
	}
	vol := d.Spec.Template.Spec.Volumes[0].ConfigMap
	if !strings.HasPrefix(vol.Name, "coredns-k8s-event-") || len(vol.Items) != 1 || vol.Items[0].Key != "Corefile" {
		t.Errorf("config volume %+v", vol)
	}
	gen, err := c.CoreV1().ConfigMaps("kube-system").Get(ctx, vol.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(gen.Data["Corefile"], "k8s_event {\n       level info warning error") || !strings.Contains(gen.Data["Corefile"], "corp.example:53") {
		t.Errorf("generated Corefile:\n%s", gen.Data["Corefile"])
	}
	if cm, _ := c.CoreV1().ConfigMaps("kube-system").Get(ctx, "coredns", metav1.GetOptions{}); cm.Data["Corefile"] != custom {
		t.Error("the operator's ConfigMap changed")
	}
	// Everything else is as it was.
	back := d.DeepCopy()
	back.Spec.Template.Spec.Containers[0].Image = stock.Spec.Template.Spec.Containers[0].Image
	back.Spec.Template.Spec.Containers[0].Env = stock.Spec.Template.Spec.Containers[0].Env
	back.Spec.Template.Spec.Volumes = stock.Spec.Template.Spec.Volumes
	back.Spec.Template.Annotations = nil
	if specJSON(back) != specJSON(stock) {
		t.Errorf("the install changed more than it needs:\n%s\n%s", specJSON(back), specJSON(stock))
	}
	role, err := c.RbacV1().Roles("kube-system").Get(ctx, "coredns-k8s-event", metav1.GetOptions{})
	if err != nil || len(role.Rules) != 1 || strings.Join(role.Rules[0].Verbs, ",") != "create,patch" || role.Rules[0].Resources[0] != "events" {
		t.Errorf("role: %+v %v", role, err)
	}
	rb, err := c.RbacV1().RoleBindings("kube-system").Get(ctx, "coredns-k8s-event", metav1.GetOptions{})
	if err != nil || rb.Subjects[0].Name != "coredns" {
		t.Errorf("rolebinding: %+v %v", rb, err)
	}

	// Again, with nothing new: nothing changes.
	out.Reset()
	if err := Install(ctx, c, Options{Image: image, Options: []string{"level info warning error"}, Out: &out}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "has k8s_event already") || specJSON(get(t, c)) != specJSON(d) {
		t.Errorf("a second install changed something:\n%s", out.String())
	}

	// The operator edits the Corefile and installs again: a new ConfigMap.
	cm := configMap()
	cm.Data["Corefile"] += "extra.example:53 {\n    whoami\n}\n"
	if _, err := c.CoreV1().ConfigMaps("kube-system").Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := Install(ctx, c, Options{Image: image, Out: &out}); err != nil {
		t.Fatal(err)
	}
	d2 := get(t, c)
	if n := d2.Spec.Template.Spec.Volumes[0].ConfigMap.Name; n == vol.Name || !strings.HasPrefix(n, "coredns-k8s-event-") {
		t.Errorf("after the edit the Deployment reads %s (before: %s)", n, vol.Name)
	}

	out.Reset()
	if err := Uninstall(ctx, c, Options{Out: &out}); err != nil {
		t.Fatal(err)
	}
	t.Logf("uninstall:\n%s", out.String())
	if got := get(t, c); specJSON(got) != specJSON(stock) {
		t.Errorf("uninstall did not give back the Deployment:\n%s\nwant\n%s", specJSON(got), specJSON(stock))
	}
	if _, err := c.RbacV1().Roles("kube-system").Get(ctx, "coredns-k8s-event", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("role after uninstall: %v", err)
	}
	if _, err := c.RbacV1().RoleBindings("kube-system").Get(ctx, "coredns-k8s-event", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("rolebinding after uninstall: %v", err)
	}
	// No ReplicaSet reads the generated ConfigMaps (the fake has no
	// controller): they go.
	if cms, _ := c.CoreV1().ConfigMaps("kube-system").List(ctx, metav1.ListOptions{}); len(cms.Items) != 1 {
		t.Errorf("%d ConfigMaps after uninstall, want the operator's only", len(cms.Items))
	}
}

// TestReinstallAfterReset: a helm upgrade puts back the chart's image and
// volume but keeps the variables and the annotation it does not know
// about; kubeadm rewrites the whole template. Install and uninstall take
// the template as they find it.
func TestReinstallAfterReset(t *testing.T) {
	ctx := context.Background()
	stock := deployment()
	c := newClient(stock.DeepCopy(), configMap())
	if err := Install(ctx, c, Options{Image: image}); err != nil {
		t.Fatal(err)
	}
	// What a three-way merge of an unchanged chart with a new image does.
	d := get(t, c)
	d.Spec.Template.Spec.Containers[0].Image = "registry.k8s.io/coredns/coredns:v1.14.0"
	d.Spec.Template.Spec.Volumes = stock.Spec.Template.Spec.Volumes
	if _, err := c.AppsV1().Deployments("kube-system").Update(ctx, d, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if _, err := Status(ctx, c, Options{Out: &out}); err != nil || !strings.Contains(out.String(), "partly undone") {
		t.Errorf("status: %v\n%s", err, out.String())
	}
	if err := Install(ctx, c, Options{Image: "registry.example/coredns-k8s-event:1.14.0-0.2.0-abc"}); err != nil {
		t.Fatal(err)
	}
	if err := Uninstall(ctx, c, Options{}); err != nil {
		t.Fatal(err)
	}
	want := stock.DeepCopy()
	want.Spec.Template.Spec.Containers[0].Image = "registry.k8s.io/coredns/coredns:v1.14.0"
	if got := get(t, c); specJSON(got) != specJSON(want) {
		t.Errorf("after the reset, install and uninstall:\n%s\nwant\n%s", specJSON(got), specJSON(want))
	}
}

// Bad input gets a clear error naming the option and the value, before
// any pod rolls: a rate whose QPS is not a number would keep CoreDNS from
// starting.
func TestInstallRefusesBadRate(t *testing.T) {
	ctx := context.Background()
	for _, opt := range []string{"rate fast", "rate 10 many", "rate 10 20 -3"} {
		c := newClient(deployment(), configMap())
		var out bytes.Buffer
		err := Install(ctx, c, Options{Image: image, Options: []string{opt}, Out: &out})
		if err == nil {
			t.Errorf("--option %q: install went ahead", opt)
			continue
		}
		if !strings.Contains(err.Error(), opt) {
			t.Errorf("--option %q: error does not name it: %v", opt, err)
		}
	}
}

// Uninstall gives back exactly the env the container had: a variable of
// one of the four names that was there before comes back in its place.
func TestUninstallKeepsEnvOrder(t *testing.T) {
	ctx := context.Background()
	stock := deployment()
	stock.Spec.Template.Spec.Containers[0].Env = []corev1.EnvVar{
		{Name: "COREDNS_NODE_NAME", Value: "fixed"},
		{Name: "GODEBUG", Value: "netdns=go"},
	}
	c := newClient(stock.DeepCopy(), configMap())
	var out bytes.Buffer
	if err := Install(ctx, c, Options{Image: image, Out: &out}); err != nil {
		t.Fatal(err)
	}
	if err := Uninstall(ctx, c, Options{Out: &out}); err != nil {
		t.Fatal(err)
	}
	got, _ := json.Marshal(get(t, c).Spec.Template.Spec.Containers[0].Env)
	want, _ := json.Marshal(stock.Spec.Template.Spec.Containers[0].Env)
	if string(got) != string(want) {
		t.Errorf("env after uninstall\n %s\nwant\n %s", got, want)
	}
}

// The install takes every property the plugin takes: quiet is one
// (README, setup.go), so --option "quiet 30s" must go through.
func TestInstallTakesQuiet(t *testing.T) {
	c := newClient(deployment(), configMap())
	var out bytes.Buffer
	if err := Install(context.Background(), c, Options{Image: image, Options: []string{"quiet 30s"}, Out: &out}); err != nil {
		t.Errorf("--option \"quiet 30s\": %v", err)
	}
}

// Install twice changes nothing the second time; install after uninstall
// gives the same Deployment as the first install.
func TestInstallTwiceAndAfterUninstall(t *testing.T) {
	ctx := context.Background()
	c := newClient(deployment(), configMap())
	var out bytes.Buffer
	if err := Install(ctx, c, Options{Image: image, Out: &out}); err != nil {
		t.Fatal(err)
	}
	first := specJSON(get(t, c))
	out.Reset()
	if err := Install(ctx, c, Options{Image: image, Out: &out}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "has k8s_event already") || specJSON(get(t, c)) != first {
		t.Errorf("second install changed something:\n%s", out.String())
	}
	if err := Uninstall(ctx, c, Options{Out: &out}); err != nil {
		t.Fatal(err)
	}
	if got := specJSON(get(t, c)); got != specJSON(deployment()) {
		t.Errorf("after uninstall\n%s\nwant\n%s", got, specJSON(deployment()))
	}
	if err := Install(ctx, c, Options{Image: image, Out: &out}); err != nil {
		t.Fatal(err)
	}
	if specJSON(get(t, c)) != first {
		t.Errorf("install after uninstall differs from the first")
	}
}

func withForce(o Options) Options {
	o.Force = true
	return o
}
