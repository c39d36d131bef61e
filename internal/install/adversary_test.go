package install

import (
	"bytes"
	"context"
	"encoding/json"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes/fake"
	"strings"
	"testing"
)

// An install changes only what k8s_event needs and keeps every other line
// of the Corefile: a quoted argument with a space must stay one argument.
func TestAdversaryAddPluginsKeepsQuotedArgs(t *testing.T) {
	in := `.:53 {
    errors
    template IN TXT version.example {
        answer "version.example. 60 IN TXT \"v1 two\""
    }
    kubernetes cluster.local
    forward . /etc/resolv.conf
}
`
	out, _, err := AddPlugins(in, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, `answer "version.example. 60 IN TXT \"v1 two\""`) {
		t.Errorf("the quoted answer is not kept:\n%s", Diff(in, out))
	}
}

// Environment substitution ({$VAR}) is resolved by CoreDNS when it loads
// the Corefile; an install must keep the placeholder, not the value on the
// machine that runs kubectl.
func TestAdversaryAddPluginsKeepsEnvPlaceholders(t *testing.T) {
	t.Setenv("UPSTREAM_DNS", "192.0.2.99")
	in := `.:53 {
    errors
    kubernetes cluster.local
    forward . {$UPSTREAM_DNS}
}
`
	out, _, err := AddPlugins(in, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "forward . {$UPSTREAM_DNS}") {
		t.Errorf("the placeholder is not kept:\n%s", Diff(in, out))
	}
}

// A server block with several keys keeps all of them.
func TestAdversaryAddPluginsKeepsServerKeys(t *testing.T) {
	in := `cluster.local:53 in-addr.arpa:53 {
    errors
    kubernetes cluster.local in-addr.arpa
}
. {
    forward . /etc/resolv.conf
}
`
	out, _, err := AddPlugins(in, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "cluster.local:53 in-addr.arpa:53 {") {
		t.Errorf("the server keys are not kept:\n%s", Diff(in, out))
	}
}

// A Corefile that imports a snippet holding kubernetes: the server block
// importing it is the one serving the cluster, so it gets the plugins, and
// the snippet is kept.
func TestAdversaryAddPluginsSnippetWithKubernetes(t *testing.T) {
	in := `(cluster) {
    kubernetes cluster.local
}
.:53 {
    errors
    import cluster
    forward . /etc/resolv.conf
}
`
	out, _, err := AddPlugins(in, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "(cluster) {") || !strings.Contains(out, "import cluster") {
		t.Errorf("the snippet or its import is not kept:\n%s", out)
	}
	if !strings.Contains(out, "kubeapi") {
		t.Errorf("no kubeapi:\n%s", out)
	}
}

// A Corefile that imports other files (kubeadm-like "import
// /etc/coredns/custom/*.server"): the import line is kept.
func TestAdversaryAddPluginsKeepsTopLevelImport(t *testing.T) {
	in := `.:53 {
    errors
    kubernetes cluster.local
    forward . /etc/resolv.conf
}
import /etc/coredns/custom/*.server
`
	out, _, err := AddPlugins(in, nil)
	if err != nil {
		t.Fatalf("AddPlugins: %v", err)
	}
	if !strings.Contains(out, "import /etc/coredns/custom/*.server") {
		t.Errorf("the top-level import is lost:\n%s", Diff(in, out))
	}
}

// Running it twice changes nothing the second time.
func TestAdversaryAddPluginsIdempotent(t *testing.T) {
	out, _, err := AddPlugins(custom, []string{"level info warning error"})
	if err != nil {
		t.Fatal(err)
	}
	again, changed, err := AddPlugins(out, []string{"level info warning error"})
	if err != nil || changed || again != out {
		t.Errorf("second AddPlugins: changed %v, err %v\n%s", changed, err, Diff(out, again))
	}
}

// Bad input gets a clear error naming the option and the value, before
// any pod rolls: a rate whose QPS is not a number would keep CoreDNS from
// starting.
func TestAdversaryInstallRefusesBadRate(t *testing.T) {
	ctx := context.Background()
	for _, opt := range []string{"rate fast", "rate 10 many", "rate 10 20 -3"} {
		c := fake.NewClientset(deployment(), configMap())
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
func TestAdversaryUninstallKeepsEnvOrder(t *testing.T) {
	ctx := context.Background()
	stock := deployment()
	stock.Spec.Template.Spec.Containers[0].Env = []corev1.EnvVar{
		{Name: "COREDNS_NODE_NAME", Value: "fixed"},
		{Name: "GODEBUG", Value: "netdns=go"},
	}
	c := fake.NewClientset(stock.DeepCopy(), configMap())
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
func TestAdversaryInstallTakesQuiet(t *testing.T) {
	c := fake.NewClientset(deployment(), configMap())
	var out bytes.Buffer
	if err := Install(context.Background(), c, Options{Image: image, Options: []string{"quiet 30s"}, Out: &out}); err != nil {
		t.Errorf("--option \"quiet 30s\": %v", err)
	}
}

// Install twice changes nothing the second time; install after uninstall
// gives the same Deployment as the first install.
func TestAdversaryInstallTwiceAndAfterUninstall(t *testing.T) {
	ctx := context.Background()
	c := fake.NewClientset(deployment(), configMap())
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
