package install

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes/scheme"
)

// layoutObjects are the objects of testdata/layouts/name.yaml: a layout's
// Deployment and ConfigMap as it ships them.
func layoutObjects(t *testing.T, name string) []runtime.Object {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "layouts", name+".yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var objs []runtime.Object
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(b)))
	for {
		doc, err := r.Read()
		if err != nil {
			break
		}
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(doc, nil, nil)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		objs = append(objs, obj)
	}
	return objs
}

// Each layout is told from its own objects: the ones the tool knows are
// installed (here with --force, past the owners and releases each fixture
// has), the ones it leaves alone are refused, even with --force, with the
// vendor's own way.
func TestLayoutsAreToldFromTheirObjects(t *testing.T) {
	for _, tc := range []struct {
		fixture, layout string
		refused         string // "" when installed
	}{
		{"kubeadm", "kubeadm, kind", ""},
		{"helm-chart", "CoreDNS helm chart", ""},
		{"k3s", "k3s", ""},
		{"kubespray", "kubespray", ""},
		{"eks-addon", "EKS add-on", "aws eks delete-addon --cluster-name CLUSTER --addon-name coredns --preserve"},
		{"aks", "AKS", "AKS supports no third-party plugins"},
		{"rke2", "RKE2", "HelmChartConfig named rke2-coredns"},
	} {
		t.Run(tc.fixture, func(t *testing.T) {
			ctx := context.Background()
			c := newClient(layoutObjects(t, tc.fixture)...)
			var out bytes.Buffer
			err := Install(ctx, c, withForce(Options{Image: image, DryRun: true, JSON: true, Out: &out, Wait: time.Minute}))
			var res Result
			if jerr := json.Unmarshal(out.Bytes(), &res); jerr != nil {
				t.Fatalf("%v: %s", jerr, out.String())
			}
			if res.Layout != tc.layout {
				t.Errorf("layout %q, want %q", res.Layout, tc.layout)
			}
			switch {
			case tc.refused == "" && err != nil:
				t.Errorf("install: %v", err)
			case tc.refused != "" && (!IsRefused(err) || !strings.Contains(err.Error(), tc.refused)):
				t.Errorf("install: %v, want it refused with %q", err, tc.refused)
			}
			s, err := Status(ctx, c, Options{})
			if err != nil {
				t.Fatal(err)
			}
			if s.Layout != tc.layout {
				t.Errorf("status: layout %q, want %q", s.Layout, tc.layout)
			}
		})
	}
}

// kubespray sets the addon manager's Reconcile label, but runs no addon
// manager: its Deployment is installed without --force, with a warning
// that kubespray's next run puts its own back.
func TestInstallOnKubesprayWarnsOfItsNextRun(t *testing.T) {
	c := newClient(layoutObjects(t, "kubespray")...)
	var out bytes.Buffer
	if err := Install(context.Background(), c, Options{Image: image, Out: &out, DryRun: true, Wait: time.Minute}); err != nil {
		t.Fatalf("install: %v", err)
	}
	if !strings.Contains(out.String(), "warning: kubespray applies its CoreDNS Deployment again") {
		t.Errorf("no warning of kubespray's next run:\n%s", out.String())
	}
}

// The selectors that find CoreDNS come from the layouts.
func TestSelectorsComeFromTheLayouts(t *testing.T) {
	got := strings.Join(selectors(), " ")
	if got != "k8s-app=kube-dns app.kubernetes.io/name=coredns" {
		t.Errorf("selectors: %s", got)
	}
}
