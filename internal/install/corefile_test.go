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

func TestDiff(t *testing.T) {
	got := Diff("a\nb\nc\n", "a\nx\nc\nd\n")
	want := "  a\n+ x\n- b\n  c\n+ d\n"
	if got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
}
