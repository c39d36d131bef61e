package install

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
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
	got := strings.Join(selectors(kindDeployment), " ")
	if got != "k8s-app=kube-dns app.kubernetes.io/name=coredns" {
		t.Errorf("selectors: %s", got)
	}
}

// upstreamObjects are the objects of the manifest at rel in k8s.io/kubernetes
// (the release tools/go.mod names, from the module cache), each old string
// of replace replaced by its new one first.
func upstreamObjects(t *testing.T, rel string, replace ...string) []runtime.Object {
	t.Helper()
	dir := kubernetesDir(t)
	b, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(rel)))
	if err != nil {
		t.Fatal(err)
	}
	text := strings.NewReplacer(replace...).Replace(string(b))
	var objs []runtime.Object
	r := utilyaml.NewYAMLReader(bufio.NewReader(strings.NewReader(text)))
	for {
		doc, err := r.Read()
		if err != nil {
			break
		}
		obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(doc, nil, nil)
		if err == nil {
			objs = append(objs, obj)
		}
	}
	return objs
}

// kubernetesDir is where the module cache holds k8s.io/kubernetes at the
// release tools/go.mod names, downloaded through the module proxy when
// it is not there yet.
func kubernetesDir(t *testing.T) string {
	t.Helper()
	for _, args := range [][]string{{"list", "-m", "-f", "{{.Dir}}", "k8s.io/kubernetes"}, {"mod", "download", "-json", "k8s.io/kubernetes"}} {
		cmd := exec.Command("go", args...)
		cmd.Dir = filepath.Join("..", "..", "tools")
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("go %s in tools: %v", strings.Join(args, " "), err)
		}
		dir := strings.TrimSpace(string(out))
		if args[0] == "mod" {
			var m struct{ Dir string }
			_ = json.Unmarshal(out, &m)
			dir = m.Dir
		}
		if dir != "" {
			return dir
		}
	}
	t.Fatal("k8s.io/kubernetes: not in the module cache")
	return ""
}

// kube-up's CoreDNS addon (cluster/addons/dns/coredns of k8s.io/kubernetes)
// carries the addon manager's Reconcile label: refused, even with --force,
// with the vendor's way; so is a CoreDNS whose ConfigMap alone carries it.
func TestInstallRefusesAnAddonInReconcileMode(t *testing.T) {
	ctx := context.Background()
	kubeUp := upstreamObjects(t, "cluster/addons/dns/coredns/coredns.yaml.base",
		"__DNS__DOMAIN__", "cluster.local", "__DNS__SERVER__", "10.96.0.10", "__DNS__MEMORY__LIMIT__", "170Mi")
	cm := configMap()
	cm.Labels = map[string]string{reconcileLabel: "Reconcile"}
	for name, objs := range map[string][]runtime.Object{"kube-up": kubeUp, "configmap": {deployment(), cm}} {
		c := newClient(objs...)
		var out bytes.Buffer
		err := Install(ctx, c, withForce(Options{Image: image, DryRun: true, JSON: true, Out: &out}))
		var res Result
		_ = json.Unmarshal(out.Bytes(), &res)
		if !IsRefused(err) || !strings.Contains(err.Error(), "EnsureExists") || !strings.Contains(err.Error(), "NodeLocalDNS=DISABLED") || res.Layout != "addon manager (kube-up, GKE)" {
			t.Errorf("%s: install --force: %v, layout %q; want it refused with the vendor's way", name, err, res.Layout)
		}
	}
}

// OpenShift's DNS operator owns the DaemonSet dns-default: install and
// status refuse, found in openshift-dns whether it is named or not, with
// the operator's way.
func TestInstallRefusesOpenShiftsDNS(t *testing.T) {
	ctx := context.Background()
	for _, o := range []Options{{Image: image}, {Image: image, Namespace: "openshift-dns"}, {Image: image, Namespace: "openshift-dns", Deployment: "dns-default"}} {
		c := newClient(layoutObjects(t, "openshift")...)
		err := Install(ctx, c, withForce(o))
		if !IsRefused(err) || !strings.Contains(err.Error(), "oc edit dns.operator/default") || !strings.Contains(err.Error(), "daemonset openshift-dns/dns-default") {
			t.Errorf("install --force -n %q --deployment %q: %v, want it refused with the operator's way", o.Namespace, o.Deployment, err)
		}
		if _, err := Status(ctx, c, o); !IsRefused(err) {
			t.Errorf("status -n %q: %v, want the refusal", o.Namespace, err)
		}
	}
}

// node-local-dns as upstream ships it (cluster/addons/dns/nodelocaldns of
// k8s.io/kubernetes) carries the addon manager's Reconcile label: install
// refuses it, even with --force, with the vendor's way, whether its
// placeholders are there or replaced as its README tells users.
func TestInstallRefusesNodeLocalDNSInReconcileMode(t *testing.T) {
	const manifest = "cluster/addons/dns/nodelocaldns/nodelocaldns.yaml"
	for name, replace := range map[string][]string{
		"placeholders": nil,
		"replaced":     {"__PILLAR__LOCAL__DNS__", "169.254.20.10", "__PILLAR__DNS__DOMAIN__", "cluster.local", "__PILLAR__DNS__SERVER__", "10.96.0.10"},
	} {
		objs := upstreamObjects(t, manifest, replace...)
		if len(objs) < 5 {
			t.Fatalf("%s: %d objects read from %s", name, len(objs), manifest)
		}
		c := newClient(append(objs, deployment(), configMap())...)
		err := Install(context.Background(), c, withForce(Options{Image: image, Deployment: "node-local-dns", DryRun: true}))
		if !IsRefused(err) || !strings.Contains(err.Error(), "daemonset kube-system/node-local-dns") || !strings.Contains(err.Error(), "NodeLocalDNS=DISABLED") {
			t.Errorf("%s: install --force of node-local-dns: %v, want it refused with the vendor's way", name, err)
		}
	}
}
