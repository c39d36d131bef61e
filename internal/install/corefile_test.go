package install

import (
	"strings"
	"testing"
)

// custom is a Corefile as operators change kubeadm's: another cluster
// domain, hosts entries, a stub zone.
const custom = `.:53 {
    errors
    health {
       lameduck 5s
    }
    ready
    hosts {
       10.0.0.1 registry.corp.example
       fallthrough
    }
    kubernetes cluster.test in-addr.arpa ip6.arpa {
       pods insecure
       fallthrough in-addr.arpa ip6.arpa
       ttl 30
    }
    prometheus :9153
    forward . /etc/resolv.conf {
       max_concurrent 1000
    }
    cache 30 {
       disable success cluster.test
       disable denial cluster.test
    }
    loop
    reload
    loadbalance
}
corp.example:53 {
    errors
    cache 30
    forward . 10.1.2.3 10.1.2.4
}
`

func TestAddPlugins(t *testing.T) {
	out, changed, err := AddPlugins(custom, []string{"level info warning error"})
	if err != nil || !changed {
		t.Fatalf("AddPlugins: changed %v, %v", changed, err)
	}
	t.Logf("\n%s", Diff(custom, out))
	for _, want := range []string{
		"kubernetes cluster.test in-addr.arpa ip6.arpa {",
		"10.0.0.1 registry.corp.example",
		"corp.example:53 {",
		"forward . 10.1.2.3 10.1.2.4",
		"disable denial cluster.test",
		"    kubeapi\n",
		"    k8s_event {\n        level info warning error\n    }",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the new Corefile lacks %q:\n%s", want, out)
		}
	}
	// Only the block with kubernetes gets them.
	stub := out[strings.Index(out, "corp.example:53"):]
	if strings.Contains(stub, "kubeapi") || strings.Contains(stub, "k8s_event") {
		t.Errorf("the stub zone's block got the plugins:\n%s", stub)
	}
	// Every line of the original is there, as the parser writes it.
	for _, l := range strings.Split(custom, "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.Contains(out, l) {
			t.Errorf("line %q is gone:\n%s", l, out)
		}
	}
	// Again: nothing to add.
	again, changed, err := AddPlugins(out, []string{"level info warning error"})
	if err != nil || changed || again != out {
		t.Errorf("AddPlugins on its own output: changed %v, %v", changed, err)
	}
	if !HasPlugins(out) || HasPlugins(custom) {
		t.Errorf("HasPlugins: %v on the new Corefile, %v on the old", HasPlugins(out), HasPlugins(custom))
	}
}

func TestAddPluginsWithoutKubernetes(t *testing.T) {
	in := "(common) {\n    errors\n}\nexample.org:53 {\n    import common\n    whoami\n}\nexample.net:53 {\n    whoami\n}\n"
	out, _, err := AddPlugins(in, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := "(common) {\n    errors\n}\n\nexample.org:53 {\n    import common\n    whoami\n    kubeapi\n    k8s_event\n}\n\nexample.net:53 {\n    whoami\n}\n"
	if out != want {
		t.Errorf("got\n%s\nwant\n%s", out, want)
	}
}

func TestAddPluginsRefuses(t *testing.T) {
	for _, tc := range []struct{ in, err string }{
		{".:53 {\n    view a {\n        expr name() == 'x'\n        deeper {\n        }\n    }\n}\n", "Corefile:4: a block nested inside a plugin's options; edit this Corefile by hand"},
		{".:53 {\n    whoami\n", "Corefile: 1 unclosed blocks"},
		{".:53 {\n    whoami\n}\n}\n", "Corefile:4: unexpected }"},
		{"", "the Corefile has no server block"},
	} {
		_, _, err := AddPlugins(tc.in, nil)
		if err == nil || err.Error() != tc.err {
			t.Errorf("AddPlugins(%q): %v, want %q", tc.in, err, tc.err)
		}
	}
}

// An install changes only what k8s_event needs and keeps every other line
// of the Corefile: a quoted argument with a space must stay one argument.
func TestAddPluginsKeepsQuotedArgs(t *testing.T) {
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
func TestAddPluginsKeepsEnvPlaceholders(t *testing.T) {
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
func TestAddPluginsKeepsServerKeys(t *testing.T) {
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
func TestAddPluginsSnippetWithKubernetes(t *testing.T) {
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
func TestAddPluginsKeepsTopLevelImport(t *testing.T) {
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
func TestAddPluginsIdempotent(t *testing.T) {
	out, _, err := AddPlugins(custom, []string{"level info warning error"})
	if err != nil {
		t.Fatal(err)
	}
	again, changed, err := AddPlugins(out, []string{"level info warning error"})
	if err != nil || changed || again != out {
		t.Errorf("second AddPlugins: changed %v, err %v\n%s", changed, err, Diff(out, again))
	}
}
