//go:build e2e

package cluster

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

func TestCluster(t *testing.T) {
	c := NewForTest(t, Options{})
	ctx := t.Context()

	t.Run("kubectl version", func(t *testing.T) {
		out, _, err := c.Kubectl(ctx, "version", "-o", "json")
		if err != nil {
			t.Fatal(err)
		}
		var v struct {
			ClientVersion struct{ GitVersion, Major, Minor string }
			ServerVersion struct{ GitVersion, Major, Minor string }
		}
		if err := json.Unmarshal([]byte(out), &v); err != nil {
			t.Fatalf("kubectl version: %v\n%s", err, out)
		}
		for _, side := range []struct{ GitVersion, Major, Minor string }{v.ClientVersion, v.ServerVersion} {
			if !strings.HasPrefix(side.GitVersion, "v1.") || side.Major != "1" || side.Minor == "" {
				t.Errorf("kubectl version: want v1.x with major and minor set, got %+v", side)
			}
		}
	})

	t.Run("kubectl get ns", func(t *testing.T) {
		out, _, err := c.Kubectl(ctx, "get", "ns", "-o", "name")
		if err != nil {
			t.Fatal(err)
		}
		for _, ns := range []string{"namespace/default", "namespace/kube-system"} {
			if !strings.Contains(out, ns) {
				t.Errorf("kubectl get ns: %s missing from\n%s", ns, out)
			}
		}
	})

	t.Run("pod", func(t *testing.T) {
		if _, err := c.CreateNamespace(ctx, "smoke"); err != nil {
			t.Fatal(err)
		}
		pod, err := c.CreatePod(ctx, "smoke", "coredns-smoke")
		if err != nil {
			t.Fatal(err)
		}
		if pod.UID == "" {
			t.Fatal("pod has no UID")
		}
	})

	t.Run("service account has no rights by default", func(t *testing.T) {
		path, err := c.ServiceAccountKubeconfig(ctx, "smoke", "nobody")
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := clientcmd.BuildConfigFromFlags("", path)
		if err != nil {
			t.Fatal(err)
		}
		cs := kubernetes.NewForConfigOrDie(cfg)
		_, err = cs.CoreV1().Pods("smoke").List(ctx, metav1.ListOptions{})
		if !apierrors.IsForbidden(err) {
			t.Fatalf("list pods as a new service account: want forbidden, got %v", err)
		}
		out, _, err := c.KubectlAs(ctx, path, "auth", "whoami", "-o", "jsonpath={.status.userInfo.username}")
		if err != nil {
			t.Fatal(err)
		}
		if want := "system:serviceaccount:smoke:nobody"; out != want {
			t.Fatalf("kubectl auth whoami: got %q, want %q", out, want)
		}
	})

	t.Run("metrics", func(t *testing.T) {
		text, err := c.MetricsText(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(text, "apiserver_request_total") {
			t.Fatal("apiserver_request_total missing from /metrics")
		}
	})
}

func TestEventRateLimit(t *testing.T) {
	c := NewForTest(t, EventRateLimit(1, 3))
	ctx := t.Context()
	if _, err := c.CreateNamespace(ctx, "limited"); err != nil {
		t.Fatal(err)
	}
	var created int
	for i := range 10 {
		_, err := c.Clientset.CoreV1().Events("limited").Create(ctx, &corev1.Event{
			ObjectMeta:     metav1.ObjectMeta{Name: fmt.Sprintf("e%d", i)},
			InvolvedObject: corev1.ObjectReference{Kind: "Pod", Namespace: "limited", Name: "p", APIVersion: "v1"},
			Reason:         "Test",
			Message:        "burst",
			Type:           corev1.EventTypeNormal,
		}, metav1.CreateOptions{})
		switch {
		case err == nil:
			created++
		case apierrors.IsTooManyRequests(err):
		default:
			t.Fatal(err)
		}
	}
	// A burst of 3, and maybe a token that refilled during the loop.
	if created < 3 || created > 5 {
		t.Fatalf("created %d of 10 events at once with burst 3, want 3 to 5", created)
	}
}
