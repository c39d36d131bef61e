//go:build e2e

package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// kubeadmClusterRole is the ClusterRole system:coredns as kubeadm makes it
// (deploy/kubeadm/rbac.yaml): list and watch, no get.
func kubeadmClusterRole(t *testing.T) rbacv1.ClusterRole {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(kubeadmDir(), "rbac.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for doc := range strings.SplitSeq(string(b), "\n---") {
		var role rbacv1.ClusterRole
		if err := yaml.Unmarshal([]byte(doc), &role); err != nil {
			t.Fatal(err)
		}
		if role.Kind == "ClusterRole" && role.Name == "system:coredns" {
			return role
		}
	}
	t.Fatal("deploy/kubeadm/rbac.yaml has no ClusterRole system:coredns")
	return rbacv1.ClusterRole{}
}

// TestUIDWithKubeadmRights runs CoreDNS without COREDNS_POD_UID as a
// ServiceAccount that has exactly kubeadm's system:coredns rules and the
// documents' events Role: the plugin finds the pod's UID with list, and
// its events carry it, so `kubectl describe pod` shows them.
func TestUIDWithKubeadmRights(t *testing.T) {
	pod := testPod(t)
	ns, sa := pod.Namespace, "coredns-kubeadm"
	kc, err := kube.ServiceAccountKubeconfig(t.Context(), ns, sa)
	if err != nil {
		t.Fatal(err)
	}
	rememberToken(t, kc)
	role := kubeadmClusterRole(t)
	for _, r := range role.Rules {
		for _, v := range r.Verbs {
			if v == "get" {
				t.Fatalf("kubeadm's system:coredns grants get: %v", role.Rules)
			}
		}
	}
	role.ObjectMeta = metav1.ObjectMeta{Name: "e2e-kubeadm-coredns-" + ns}
	ctx := t.Context()
	if _, err := kube.Clientset.RbacV1().ClusterRoles().Create(ctx, &role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: role.Name},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: sa, Namespace: ns}},
	}
	if _, err := kube.Clientset.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = kube.Clientset.RbacV1().ClusterRoleBindings().Delete(t.Context(), role.Name, metav1.DeleteOptions{})
		_ = kube.Clientset.RbacV1().ClusterRoles().Delete(t.Context(), role.Name, metav1.DeleteOptions{})
	})
	setEventRules(t, ns, sa, readmeRules(t))
	c := startFaults(t, pod, faultsCorefile, withKubeconfig(kc), withoutUID())

	const line = "found with list"
	c.logLine("warning", 1, line)
	evs := waitEventsFor(t, pod, 30*time.Second, "the event", func(evs []corev1.Event) bool {
		return len(withExactMessage(evs, "plugin/logline: "+line)) == 1
	})
	ev := withExactMessage(evs, "plugin/logline: "+line)[0]
	if ev.InvolvedObject.UID != pod.UID {
		t.Errorf("involvedObject.uid %q, want the pod's %q", ev.InvolvedObject.UID, pod.UID)
	}
	if n := c.metric(errors403); n != 0 {
		t.Errorf("api_errors{403}=%v: the read of the pod was refused", n)
	}
	if out := kubectl(t, "describe", "pod", "-n", pod.Namespace, pod.Name); !strings.Contains(out, line) {
		t.Errorf("kubectl describe pod does not list the event:\n%s", out)
	}
}
