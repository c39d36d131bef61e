package install

import (
	"bytes"
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

// zoneFileSetup is deployment() and configMap() with a zone file the
// operator serves with the file plugin.
func zoneFileSetup() (*appsv1.Deployment, *corev1.ConfigMap) {
	d := deployment()
	cm := configMap()
	cm.Data["db.corp.example"] = "$ORIGIN corp.example.\n@ 3600 IN SOA ns. admin. 1 7200 3600 1209600 3600\n"
	return d, cm
}

func hasItem(v *corev1.ConfigMapVolumeSource, key string) bool {
	return slices.ContainsFunc(v.Items, func(it corev1.KeyToPath) bool { return it.Key == key })
}

// installedThenZoneMounted is zoneFileSetup with k8s_event installed, and
// then the zone file mounted too, as an operator does with kubectl edit.
func installedThenZoneMounted(t *testing.T) *fake.Clientset {
	t.Helper()
	ctx := context.Background()
	d, cm := zoneFileSetup()
	c := newClient(d, cm)
	if err := Install(ctx, c, Options{Image: image}); err != nil {
		t.Fatal(err)
	}
	now := get(t, c)
	vol := now.Spec.Template.Spec.Volumes[0].ConfigMap
	vol.Items = append(vol.Items, corev1.KeyToPath{Key: "db.corp.example", Path: "db.corp.example"})
	if _, err := c.AppsV1().Deployments("kube-system").Update(ctx, now, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	return c
}

// An install changes only the config volume's ConfigMap name: an item the
// operator added to the volume after the first install (a zone file)
// stays through an edit of the Corefile and install again.
func TestReinstallKeepsAnItemTheOperatorAddedToTheConfigVolume(t *testing.T) {
	ctx := context.Background()
	c := installedThenZoneMounted(t)
	// ...edits the Corefile, and runs install again.
	src, _ := c.CoreV1().ConfigMaps("kube-system").Get(ctx, "coredns", metav1.GetOptions{})
	src.Data["Corefile"] = strings.Replace(src.Data["Corefile"], "errors", "errors\n    file /etc/coredns/db.corp.example corp.example", 1)
	if _, err := c.CoreV1().ConfigMaps("kube-system").Update(ctx, src, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := Install(ctx, c, Options{Image: image, Out: &out}); err != nil {
		t.Fatal(err)
	}
	if v := get(t, c).Spec.Template.Spec.Volumes[0].ConfigMap; !hasItem(v, "db.corp.example") {
		t.Errorf("the reinstall dropped the item the operator added to the config volume: items %+v\n%s", v.Items, out.String())
	}
}

// Uninstall gives back the config volume's ConfigMap name and leaves what
// was set since as it is: an item added after the install stays.
func TestUninstallKeepsAnItemTheOperatorAddedToTheConfigVolume(t *testing.T) {
	ctx := context.Background()
	c := installedThenZoneMounted(t)
	if err := Uninstall(ctx, c, Options{}); err != nil {
		t.Fatal(err)
	}
	v := get(t, c).Spec.Template.Spec.Volumes[0].ConfigMap
	if v.Name != "coredns" {
		t.Fatalf("uninstall left the volume on configmap %s", v.Name)
	}
	if !hasItem(v, "db.corp.example") {
		t.Errorf("uninstall removed the item the operator added to the config volume after the install: items %+v", v.Items)
	}
}

// A Deployment set up by hand with k8s_event in its Corefile and only some
// of the four variables is a hand install all the same: install refuses
// to record its image and Corefile as the originals.
func TestInstallRefusesAPartialHandInstall(t *testing.T) {
	d := deployment()
	ctr := &d.Spec.Template.Spec.Containers[0]
	ctr.Image = image
	ctr.Env = append(ctr.Env, Env[0], Env[1])
	cm := configMap()
	cm.Data["Corefile"] = ".:53 {\n    errors\n    kubernetes cluster.local\n    kubeapi\n    k8s_event\n}\n"
	c := newClient(d, cm)
	err := Install(context.Background(), c, Options{Image: image + "-next"})
	if !IsRefused(err) || !strings.Contains(err.Error(), "set up by other means") || !strings.Contains(err.Error(), "COREDNS_POD_UID") {
		t.Fatalf("install over a partial hand install: %v, want it refused, naming the missing variables", err)
	}
	if got := get(t, c).Spec.Template.Annotations[Annotation]; got != "" {
		t.Errorf("the refused install recorded %s", got)
	}
}

// A newer build of the plugin set by hand (kubectl set image) is not what
// the install replaced: install again keeps the stock image as the
// original, and uninstall gives that back.
func TestAHandUpgradeOfThePluginIsNotRecordedAsTheOriginal(t *testing.T) {
	ctx := context.Background()
	const newer = "registry.example/coredns-k8s-event:1.13.1-0.3.0-def"
	c := installedThen(t, func(d *appsv1.Deployment) { d.Spec.Template.Spec.Containers[0].Image = newer })
	if s, _ := statusText(t, c); !strings.Contains(s, "--image "+newer) {
		t.Errorf("status does not say to install again with the build set by hand:\n%s", s)
	}
	if err := Install(ctx, c, Options{Image: newer}); err != nil {
		t.Fatal(err)
	}
	d := get(t, c)
	var rec record
	if err := json.Unmarshal([]byte(d.Spec.Template.Annotations[Annotation]), &rec); err != nil {
		t.Fatal(err)
	}
	if stock := deployment().Spec.Template.Spec.Containers[0].Image; rec.Original.Image != stock || rec.Image != newer {
		t.Fatalf("record after install again: image %s, original %s; want %s, %s", rec.Image, rec.Original.Image, newer, stock)
	}
	if err := Uninstall(ctx, c, Options{}); err != nil {
		t.Fatal(err)
	}
	if got := get(t, c).Spec.Template.Spec.Containers[0].Image; got != deployment().Spec.Template.Spec.Containers[0].Image {
		t.Errorf("uninstall left image %s, want the stock one", got)
	}
	if s, err := Status(ctx, c, Options{}); err != nil || s.State != StateNotInstalled {
		t.Errorf("status after uninstall: %+v, %v", s, err)
	}
}
