package install

import (
	"context"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// When no container is named coredns and there are several, the error
// says so and points at --container, which was not given.
func TestInstallNamesTheContainersWhenNoneIsCoredns(t *testing.T) {
	d := deployment()
	d.Spec.Template.Spec.Containers[0].Name = "dns"
	d.Spec.Template.Spec.Containers = append(d.Spec.Template.Spec.Containers, corev1.Container{Name: "sidecar", Image: "busybox"})
	c := newClient(d, configMap())
	err := Install(context.Background(), c, Options{Image: image})
	want := "deployment kube-system/coredns: none of its containers [dns sidecar] is named coredns: name the CoreDNS one with --container"
	if err == nil || err.Error() != want {
		t.Errorf("got %v\nwant %s", err, want)
	}
	if err := Install(context.Background(), c, Options{Image: image, Container: "dns"}); err != nil {
		t.Errorf("--container dns: %v", err)
	}
	if got := get(t, c).Spec.Template.Spec.Containers; got[0].Image != image || got[1].Image != "busybox" {
		t.Errorf("images %s, %s", got[0].Image, got[1].Image)
	}
}

func TestFindErrors(t *testing.T) {
	ctx := context.Background()
	other := deployment()
	other.Name = "coredns-two"
	for _, tc := range []struct {
		name    string
		objs    []any
		o       Options
		wantErr string
	}{
		{"none", nil, Options{Image: image}, `no Deployment labelled k8s-app=kube-dns or app.kubernetes.io/name=coredns in namespace "kube-system": name it with --workload deployment/NAME or daemonset/NAME (and --namespace)`},
		{"two", []any{deployment(), other}, Options{Image: image}, `namespace "kube-system" has 2 CoreDNS Deployments (coredns, coredns-two): name one with --deployment`},
		{"container", []any{deployment(), configMap()}, Options{Image: image, Container: "dns"}, `deployment kube-system/coredns: --container "dns": not among its containers [coredns]`},
		{"image", []any{deployment(), configMap()}, Options{}, "--image: not given: deployment kube-system/coredns runs CoreDNS 1.13.1 (image registry.k8s.io/coredns/coredns:v1.13.1); name the image of k8s_event on that release (make image COREDNS_VERSION=1.13.1 builds it, and prints its reference)"},
		{"level", []any{deployment(), configMap()}, Options{Image: image, Options: []string{"level info warn"}}, `--option "level info warn": level must be one of debug, info, warning, error, fatal: "warn"`},
		{"property", []any{deployment(), configMap()}, Options{Image: image, Options: []string{"levels info"}}, `--option "levels info": unknown property "levels"`},
		{"twice", []any{deployment(), configMap()}, Options{Image: image, Options: []string{"level info", "level error"}}, `--option "level error": level given twice`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newClient()
			for _, o := range tc.objs {
				switch o := o.(type) {
				case *appsv1.Deployment:
					_, _ = c.AppsV1().Deployments(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
				case *corev1.ConfigMap:
					_, _ = c.CoreV1().ConfigMaps(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
				}
			}
			err := Install(ctx, c, tc.o)
			if err == nil || err.Error() != tc.wantErr {
				t.Errorf("got %v\nwant %s", err, tc.wantErr)
			}
		})
	}
}

func TestConfPath(t *testing.T) {
	for in, want := range map[string]string{
		"-conf /etc/coredns/Corefile": "/etc/coredns/Corefile",
		"-conf=/etc/coredns/Corefile": "/etc/coredns/Corefile",
		"--conf /x/Corefile":          "/x/Corefile",
		"-dns.port 53":                "",
		"-conf":                       "",
	} {
		if got := confPath(strings.Fields(in)); got != want {
			t.Errorf("confPath(%q) = %q, want %q", in, got, want)
		}
	}
}

// CoreDNS run as a DaemonSet is not taken for a Deployment: install
// says it found a DaemonSet and names it with --workload, the way that
// works, found by its labels or by its name.
func TestInstallOnADaemonSetSaysTheWayThatWorks(t *testing.T) {
	ctx := context.Background()
	d := deployment()
	ds := &appsv1.DaemonSet{ObjectMeta: d.ObjectMeta, Spec: appsv1.DaemonSetSpec{Selector: d.Spec.Selector, Template: d.Spec.Template}}
	for _, o := range []Options{{Image: image}, {Image: image, Deployment: "coredns"}} {
		c := newClient(ds.DeepCopy(), configMap())
		err := Install(ctx, c, o)
		if err == nil || !strings.Contains(err.Error(), "--workload daemonset/coredns") || strings.Contains(err.Error(), "name it with --deployment") {
			t.Errorf("install %+v on a DaemonSet: %v", o, err)
		}
	}
}

// --workload daemonset/NAME that is not there is named.
func TestInstallOnAWorkloadNamedAsADaemonSetThatIsNotThere(t *testing.T) {
	c := newClient(configMap())
	err := Install(context.Background(), c, Options{Image: image, Kind: kindDaemonSet, Deployment: "dns"})
	if err == nil || !strings.Contains(err.Error(), "--workload daemonset/dns: no such DaemonSet") {
		t.Errorf("install --workload daemonset/dns: %v", err)
	}
}
