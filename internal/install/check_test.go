package install

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/coredns/caddy/caddyfile"
	"github.com/coredns/coredns/core/dnsserver"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dnsops/k8s_event/internal/directives"
)

// A k8s_event block the plugin refuses (level twice, as the upstream
// plugin accepted) is refused before anything is written: the whole
// Corefile is checked, not only the --option lines.
func TestInstallRefusesAK8sEventBlockThePluginRefuses(t *testing.T) {
	ctx := context.Background()
	cm := configMap()
	cm.Data["Corefile"] = ".:53 {\n    errors\n    kubernetes cluster.local\n    k8s_event {\n        level error\n        level info\n    }\n}\n"
	c := newClient(deployment(), cm)
	err := Install(ctx, c, Options{Image: image})
	if err == nil || !strings.Contains(err.Error(), "level given twice") {
		t.Fatalf("install: %v, want the block refused", err)
	}
	if cms, _ := c.CoreV1().ConfigMaps("kube-system").List(ctx, metav1.ListOptions{}); len(cms.Items) != 1 {
		t.Errorf("%d ConfigMaps, want the operator's only", len(cms.Items))
	}
}

// An empty server block or snippet keeps its braces: without them the
// next block's key is read as its content.
func TestAddPluginsKeepsEmptyBlocks(t *testing.T) {
	in := "(empty) {\n}\n.:53 {\n    kubernetes cluster.local\n}\nempty.example:53 {\n}\n"
	out, _, err := AddPlugins(in, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := caddyfile.Parse("Corefile", strings.NewReader(out), nil); err != nil {
		t.Errorf("the Corefile does not parse: %v\n%s", err, out)
	}
	for _, want := range []string{"(empty) {\n}", "empty.example:53 {\n}"} {
		if !strings.Contains(out, want) {
			t.Errorf("lost %q:\n%s", want, out)
		}
	}
}

// --option sets the property in a k8s_event block the Corefile has
// already: the line of that property is replaced.
func TestInstallOptionReplacesTheLineOfAnExistingBlock(t *testing.T) {
	ctx := context.Background()
	cm := configMap()
	cm.Data["Corefile"] = ".:53 {\n    errors\n    kubernetes cluster.local\n    kubeapi\n    k8s_event {\n        level error\n        rate 1 20\n    }\n}\n"
	c := newClient(deployment(), cm)
	if err := Install(ctx, c, Options{Image: image, Options: []string{"level info warning error"}}); err != nil {
		t.Fatal(err)
	}
	gen, err := c.CoreV1().ConfigMaps("kube-system").Get(ctx, get(t, c).Spec.Template.Spec.Volumes[0].ConfigMap.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got := gen.Data["Corefile"]
	if want := ".:53 {\n    errors\n    kubernetes cluster.local\n    kubeapi\n    k8s_event {\n        level info warning error\n        rate 1 20\n    }\n}\n"; got != want {
		t.Errorf("the Corefile the pods read:\n%s", got)
	}
}

// The whole Corefile is read as the CoreDNS being installed reads it: its
// directives, and k8s_event's settings across server blocks.
func TestCheckCorefile(t *testing.T) {
	for _, tc := range []struct{ corefile, wantErr string }{
		{custom, ""},
		{".:53 {\n    kubernetes cluster.local\n    kubeapi\n    k8s_event\n}\nimport /etc/coredns/custom/zones.server\n", ""},
		{"(common) {\n    errors\n}\n.:53 {\n    import common\n    k8s_event\n}\n", ""},
		{".:53 {\n    kubernetes cluster.local\n    no_such_plugin\n}\n", "Unknown directive 'no_such_plugin'"},
		{"a.:53 {\n    k8s_event {\n        quiet 1m\n    }\n}\nb.:53 {\n    k8s_event {\n        quiet 2m\n    }\n}\n", "quiet 2m0s conflicts with quiet 1m0s"},
	} {
		err := CheckCorefile(tc.corefile)
		switch {
		case tc.wantErr == "" && err != nil:
			t.Errorf("%q: %v", tc.corefile, err)
		case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
			t.Errorf("%q: %v, want %q", tc.corefile, err, tc.wantErr)
		}
	}
}

// The --option lines are one k8s_event stanza, read by the plugin's own
// parser: its rules (a property given twice included) and its messages,
// with the line at fault named.
func TestCheckOptionStanzaUsesThePluginsRules(t *testing.T) {
	for _, tc := range []struct {
		options []string
		err     string
	}{
		{nil, ""},
		{[]string{"level info warning error", "rate 5 50", "quiet 2m"}, ""},
		{[]string{"level info", "level error"}, `--option "level error": level given twice`},
		{[]string{"rate 1", "quiet 1m", "rate 2"}, `--option "rate 2": rate given twice`},
		{[]string{"quiet 1m", "bogus 1"}, `--option "bogus 1": unknown property "bogus"`},
		{[]string{"level loud"}, `--option "level loud": level must be one of debug, info, warning, error, fatal: "loud"`},
		{[]string{"level info", " "}, `--option " ": empty`},
	} {
		err := checkOptionStanza(tc.options)
		if got := fmt.Sprint(err); tc.err == "" && err != nil || tc.err != "" && got != tc.err {
			t.Errorf("%q: %v, want %q", tc.options, err, tc.err)
		}
	}
}

// AddPlugins reads its options by the same rule before it edits.
func TestAddPluginsRefusesOptionsThePluginRefuses(t *testing.T) {
	_, _, err := AddPlugins(custom, []string{"quiet 1m", "quiet 2m"})
	if err == nil || err.Error() != `--option "quiet 2m": quiet given twice` {
		t.Errorf("AddPlugins: %v", err)
	}
}

// The one reader parses with any directive; its check refuses an unknown
// one with the error caddyfile's parser gives when handed CoreDNS's
// directives, and accepts what that parser accepts, on the corpus and on
// Corefiles with a directive CoreDNS does not know.
func TestCheckReadsUnknownDirectivesAsCaddyfileDoes(t *testing.T) {
	texts := corpus(t)
	texts["unknown"] = ".:53 {\n    errors\n    no_such_plugin a\n    other_unknown\n}\n"
	texts["unknown in a snippet"] = "(s) {\n    not_a_plugin\n}\n.:53 {\n    import s\n    whoami\n}\n"
	texts["unknown in the second block"] = ".:53 {\n    whoami\n}\nexample.org:53 {\n    whoami\n    nope\n}\n"
	for name, text := range texts {
		_, want := caddyfile.Parse("Corefile", strings.NewReader(text), directives.Known())
		c, err := parseCorefile(text, nil)
		if err != nil {
			continue // caddyfile refuses it whatever the directives
		}
		got := c.unknownDirective()
		switch {
		case want == nil && got != nil, want != nil && got == nil, want != nil && got.Error() != want.Error():
			t.Errorf("%s: the reader's check says %v, caddyfile %v", name, got, want)
		}
	}
}

// Two runs in one process check their Corefiles at once, beside a reader
// of CoreDNS's own directive list (a CoreDNS in the same process): the
// directives they check against are worked out once, on a copy, and
// CoreDNS's list is never written, so nothing races (go test -race) and
// both runs know kubeapi and k8s_event.
func TestTwoRunsInOneProcessDoNotRace(t *testing.T) {
	saved := slices.Clone(dnsserver.Directives)
	t.Cleanup(func() { dnsserver.Directives = saved })
	dnsserver.Directives = slices.DeleteFunc(slices.Clone(saved), func(d string) bool { return d == "kubeapi" || d == "k8s_event" })
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- Install(context.Background(), newClient(deployment(), configMap()), Options{Image: image})
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for range 1000 {
			_ = slices.Contains(dnsserver.Directives, "kubeapi")
		}
	}()
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("install: %v", err)
		}
	}
	if slices.Contains(dnsserver.Directives, "kubeapi") {
		t.Errorf("a run wrote CoreDNS's directive list: %v", dnsserver.Directives)
	}
}
