package install

import (
	"bytes"
	"context"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The Corefile ConfigMap the pods read keeps every key of the operator's,
// binaryData too, and the dry run names each.
func TestInstallKeepsBinaryData(t *testing.T) {
	ctx := context.Background()
	d := deployment()
	d.Spec.Template.Spec.Volumes[0].ConfigMap.Items = []corev1.KeyToPath{
		{Key: "Corefile", Path: "Corefile"}, {Key: "db.example", Path: "db.example"}, {Key: "site.bin", Path: "site.bin"},
	}
	cm := configMap()
	cm.Data["db.example"] = "$ORIGIN example.\n@ 3600 IN SOA ns. admin. 1 7200 3600 1209600 3600\n"
	cm.BinaryData = map[string][]byte{"site.bin": []byte("\x00\x01binary\xff\xfe\x00\x02")}
	c := newClient(d, cm)
	var out bytes.Buffer
	if err := Install(ctx, c, Options{Image: image, DryRun: true, Out: &out}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "site.bin") {
		t.Errorf("the dry run does not name site.bin:\n%s", out.String())
	}
	if err := Install(ctx, c, Options{Image: image}); err != nil {
		t.Fatal(err)
	}
	gen, err := c.CoreV1().ConfigMaps("kube-system").Get(ctx, get(t, c).Spec.Template.Spec.Volumes[0].ConfigMap.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if string(gen.BinaryData["site.bin"]) != string(cm.BinaryData["site.bin"]) || gen.Data["db.example"] != cm.Data["db.example"] {
		t.Errorf("the generated ConfigMap has data %v, binaryData %v", keysOf(gen.Data), gen.BinaryData)
	}
}

func keysOf(m map[string]string) []string {
	var k []string
	for x := range m {
		k = append(k, x)
	}
	return k
}

// A ConfigMap of the name install would write that is not its own, or
// whose content was edited, is refused: the pods would read it.
func TestInstallRefusesAConfigMapOfItsNameThatIsNotItsOwn(t *testing.T) {
	ctx := context.Background()
	c := newClient(deployment(), configMap())
	if err := Install(ctx, c, Options{Image: image}); err != nil {
		t.Fatal(err)
	}
	name := get(t, c).Spec.Template.Spec.Volumes[0].ConfigMap.Name
	if err := Uninstall(ctx, c, Options{}); err != nil {
		t.Fatal(err)
	}
	impostor := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "kube-system"}, Data: map[string]string{"Corefile": ".:53 {\n    whoami\n}\n"}}
	if _, err := c.CoreV1().ConfigMaps("kube-system").Create(ctx, impostor, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := Install(ctx, c, Options{Image: image}); !IsRefused(err) || !strings.Contains(err.Error(), "is not what install would write") {
		t.Errorf("install: %v", err)
	}
}

// A key the pods do not mount changes nothing they read: status finds no
// problem with it, and installing again keeps the template, so no pod
// rolls onto an identical Corefile. A change to the Corefile still does.
func TestAKeyThePodsDoNotMountNeitherRollsThePodsNorIsAProblem(t *testing.T) {
	ctx := context.Background()
	cm := configMap()
	cm.Data["notes"] = "first\n"
	c := newClient(deployment(), cm)
	if err := Install(ctx, c, Options{Image: image}); err != nil {
		t.Fatal(err)
	}
	before := get(t, c).Spec.Template
	edit := func(key, value string) {
		t.Helper()
		now, err := c.CoreV1().ConfigMaps("kube-system").Get(ctx, "coredns", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		now.Data[key] = value
		if _, err := c.CoreV1().ConfigMaps("kube-system").Update(ctx, now, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	edit("notes", "second\n")
	if text, healthy := statusText(t, c); !healthy {
		t.Errorf("status after a change to a key the pods do not mount:\n%s", text)
	}
	if err := Install(ctx, c, Options{Image: image}); err != nil {
		t.Fatal(err)
	}
	if after := get(t, c).Spec.Template; !equalJSON(after, before) {
		t.Errorf("installing again after a change to a key the pods do not mount changed the template:\n%s\n%s", specJSON(&appsv1.Deployment{Spec: appsv1.DeploymentSpec{Template: before}}), specJSON(&appsv1.Deployment{Spec: appsv1.DeploymentSpec{Template: after}}))
	}
	edit("Corefile", cm.Data["Corefile"]+"example.org:53 {\n    whoami\n}\n")
	if text, healthy := statusText(t, c); healthy || !strings.Contains(text, "changed since the install") {
		t.Errorf("status after a change to the Corefile:\n%s", text)
	}
}

// A Corefile that imports a file which is a key of its own ConfigMap
// (mounted beside it, read by CoreDNS as /etc/coredns/common.conf): that
// file is not on the pods out of the tool's sight, it is in the very
// ConfigMap the install copies into the one the pods read. When it holds
// kubeapi, the server block has kubeapi already: the install adds only
// k8s_event, as it does for a snippet, and does not add a second kubeapi,
// which kubeapi's setup would refuse.
func TestInstallCountsKubeapiInAnImportedKeyOfItsConfigMap(t *testing.T) {
	ctx := context.Background()
	d := deployment()
	// The volume mounts every key, as kubeadm's does.
	d.Spec.Template.Spec.Volumes[0].ConfigMap.Items = nil
	cm := configMap()
	cm.Data = map[string]string{
		"Corefile":    ".:53 {\n    import common.conf\n    errors\n    kubernetes cluster.local in-addr.arpa ip6.arpa\n    forward . /etc/resolv.conf\n}\n",
		"common.conf": "kubeapi\nhealth\nready\n",
	}
	for _, pattern := range []string{"common.conf", "/etc/coredns/common.conf", "*.conf"} {
		cm.Data["Corefile"] = strings.Replace(cm.Data["Corefile"], "import common.conf", "import "+pattern, 1)
		var out bytes.Buffer
		err := Install(ctx, newClient(d, cm), Options{Image: image, DryRun: true, Out: &out})
		if err != nil || strings.Contains(out.String(), "+     kubeapi") || !strings.Contains(out.String(), "+     k8s_event") {
			t.Errorf("import %s: install --dry-run: %v; want k8s_event added and no second kubeapi (common.conf has one):\n%s", pattern, err, out.String())
		}
		cm.Data["Corefile"] = strings.Replace(cm.Data["Corefile"], "import "+pattern, "import common.conf", 1)
	}
}

// A second kubeapi written in the Corefile beside one in an imported key
// of its ConfigMap is refused: CoreDNS would not start.
func TestInstallRefusesKubeapiTwiceThroughAnImportedKeyOfItsConfigMap(t *testing.T) {
	d := deployment()
	d.Spec.Template.Spec.Volumes[0].ConfigMap.Items = nil
	cm := configMap()
	cm.Data = map[string]string{
		"Corefile":    ".:53 {\n    import common.conf\n    kubeapi\n    kubernetes cluster.local\n}\n",
		"common.conf": "kubeapi\n",
	}
	err := Install(context.Background(), newClient(d, cm), Options{Image: image, DryRun: true, Out: &bytes.Buffer{}})
	if err == nil || !strings.Contains(err.Error(), "kubeapi 2 times") {
		t.Errorf("install --dry-run: %v; want it refused: kubeapi twice", err)
	}
}

// Two Deployments that read one ConfigMap each get a copy of their own:
// the second install is not told to delete the copy the first one's pods
// read.
func TestTwoDeploymentsOnOneConfigMapGetACopyEach(t *testing.T) {
	ctx := context.Background()
	second := deployment()
	second.Name, second.UID = "coredns-internal", "d2-uid"
	c := newClient(deployment(), second, configMap())
	for _, name := range []string{"coredns", "coredns-internal"} {
		if err := Install(ctx, c, Options{Image: image, Deployment: name}); err != nil {
			t.Fatalf("install of %s: %v", name, err)
		}
	}
	var names []string
	for _, name := range []string{"coredns", "coredns-internal"} {
		d, err := c.AppsV1().Deployments("kube-system").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, d.Spec.Template.Spec.Volumes[0].ConfigMap.Name)
	}
	if names[0] == names[1] {
		t.Fatalf("both Deployments read configmap %s", names[0])
	}
	for _, n := range names {
		if _, err := c.CoreV1().ConfigMaps("kube-system").Get(ctx, n, metav1.GetOptions{}); err != nil {
			t.Errorf("configmap %s: %v", n, err)
		}
	}
}
