package install

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/coredns/caddy/caddyfile"
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
		"    k8s_event {\n       level info warning error\n    }",
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
	// The original is there to the byte, with the lines inserted before
	// the first block's closing brace.
	at := strings.Index(custom, "}\ncorp.example")
	if !strings.HasPrefix(out, custom[:at]) || !strings.HasSuffix(out, custom[at:]) {
		t.Errorf("the original's bytes changed:\n%s", out)
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
	want := "(common) {\n    errors\n}\nexample.org:53 {\n    import common\n    whoami\n    kubeapi\n    k8s_event\n}\nexample.net:53 {\n    whoami\n}\n"
	if out != want {
		t.Errorf("got\n%s\nwant\n%s", out, want)
	}
}

func TestAddPluginsRefuses(t *testing.T) {
	for _, tc := range []struct{ in, err string }{
		{".:53 {\n    whoami\n", "Corefile:2 - Syntax error: Unexpected token 'whoami', expecting '}'"},
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

var update = flag.Bool("update", false, "write testdata/corefile/*.Corefile.out from what AddPlugins gives")

// corpusOptions are the --option lines each Corefile of the corpus is
// installed with; the others get none.
var corpusOptions = map[string][]string{
	"installed.Corefile":         {"level info warning error", "quiet 2m"},
	"installed-oneline.Corefile": {"level warning error", "rate 5 50"},
	"installed-bare.Corefile":    {"level error"},
	"comments.Corefile":          {"level warning error"},
}

// refusedAsWritten are the Corefiles of the corpus that CoreDNS refuses
// as they are, and install with them: install keeps their bytes, and
// its check says why CoreDNS would not start.
var refusedAsWritten = map[string]error{
	"oneline-health.Corefile":     errors.New(`Corefile:3: the block of health closes on the line of its option "5s }": CoreDNS reads that } as one more argument, and health would not start; put the } on a line of its own`),
	"oneline-kubernetes.Corefile": errors.New(`Corefile:7: the block of kubernetes closes on the line of its option "insecure }": CoreDNS reads that } as one more argument, and kubernetes would not start; put the } on a line of its own`),
}

// Every Corefile of the corpus gets kubeapi and k8s_event and keeps every
// other byte: the result is the one in testdata (NAME.Corefile.out, made
// with -update and read by eye), the splices only insert or replace the
// bytes of k8s_event option lines, every server block keeps its keys and
// every other directive's tokens, CoreDNS's parser accepts the result
// (or refuses it as it refuses the original), and installing again
// changes nothing.
func TestAddPluginsKeepsEveryByteOfTheCorpus(t *testing.T) {
	for name, src := range corpus(t) {
		if strings.HasPrefix(name, "refused") {
			continue
		}
		t.Run(name, func(t *testing.T) {
			opts := corpusOptions[name]
			splices, err := planCorefile(src, opts, nil)
			if err != nil {
				t.Fatal(err)
			}
			out := applySplices(src, splices)
			checkSplicesKeepBytes(t, src, splices)
			checkBlocksKept(t, src, out, true)
			if err := CheckCorefile(out); fmt.Sprint(err) != fmt.Sprint(refusedAsWritten[name]) {
				t.Errorf("CheckCorefile: %v, want %v\n%s", err, refusedAsWritten[name], out)
			}
			again, changed, err := AddPlugins(out, opts)
			if err != nil || changed || again != out {
				t.Errorf("installing again: changed %v, %v\n%s", changed, err, Diff(out, again))
			}
			golden := filepath.Join("testdata", "corefile", name+".out")
			if *update {
				if err := os.WriteFile(golden, []byte(out), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatal(err)
			}
			if out != string(want) {
				t.Errorf("the result differs from %s:\n%s", golden, Diff(string(want), out))
			}
		})
	}
}

// checkSplicesKeepBytes fails t unless each splice inserts, replaces
// white space before a closing brace, or replaces bytes within one line
// of a k8s_event stanza of src.
func checkSplicesKeepBytes(t *testing.T, src string, splices []splice) {
	t.Helper()
	cf, err := readCorefile(src, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range splices {
		if s.start == s.end || strings.TrimSpace(src[s.start:s.end]) == "" && !strings.Contains(src[s.start:s.end], "\n") && strings.HasPrefix(src[s.end:], "}") {
			continue
		}
		inStanza := false
		for _, b := range cf.blocks {
			for _, st := range b.stanzas {
				if cf.tokens[st.first].text == "k8s_event" && cf.tokens[st.first].start <= s.start && s.end <= cf.tokens[st.end-1].end {
					inStanza = true
				}
			}
		}
		if !inStanza || strings.Contains(src[s.start:s.end], "\n") {
			t.Errorf("a splice replaces %q, not a k8s_event option line", src[s.start:s.end])
		}
	}
}

// checkBlocksKept fails t unless out has the server blocks of src, with
// the same keys and the same tokens for every directive but kubeapi and
// k8s_event, and each block with kubernetes (or the first) has kubeapi
// and k8s_event (once each where once is true).
func checkBlocksKept(t *testing.T, src, out string, once bool) {
	t.Helper()
	parse := func(text string) []caddyfile.ServerBlock {
		blocks, err := caddyfile.Parse("Corefile", strings.NewReader(withoutFileImports(text, nil)), nil)
		if err != nil {
			t.Fatalf("parse: %v\n%s", err, text)
		}
		return blocks
	}
	before, after := parse(src), parse(out)
	if len(before) != len(after) {
		t.Fatalf("%d server blocks, want %d:\n%s", len(after), len(before), out)
	}
	for i, b := range before {
		a := after[i]
		if !slices.Equal(a.Keys, b.Keys) {
			t.Errorf("server block %v is now %v", b.Keys, a.Keys)
		}
		for dir, tokens := range b.Tokens {
			if dir != "kubeapi" && dir != "k8s_event" && !slices.Equal(caddyTexts(tokens), caddyTexts(a.Tokens[dir])) {
				t.Errorf("server block %v: %s was %q, is %q", b.Keys, dir, caddyTexts(tokens), caddyTexts(a.Tokens[dir]))
			}
		}
		if len(b.Tokens["kubernetes"]) > 0 || i == 0 && !slices.ContainsFunc(before, func(b caddyfile.ServerBlock) bool { return len(b.Tokens["kubernetes"]) > 0 }) {
			if n, m := stanzaCount(a.Tokens["kubeapi"]), stanzaCount(a.Tokens["k8s_event"]); n < 1 || m < 1 || once && (n != 1 || m != 1) {
				t.Errorf("server block %v has kubeapi %d times and k8s_event %d times, want once each:\n%s", a.Keys, n, m, out)
			}
		}
	}
}

func caddyTexts(tokens []caddyfile.Token) []string {
	out := make([]string, len(tokens))
	for i, t := range tokens {
		out[i] = t.Text
	}
	return out
}

// A one-line option block ("health { lameduck 5s }", "kubernetes
// cluster.local { pods insecure }") stays as it is, in its server block:
// kubeapi and k8s_event go into that block, and the kubernetes stanza
// keeps every option.
func TestAddPluginsKeepsOneLineBlocksInTheirServerBlock(t *testing.T) {
	for _, name := range []string{"oneline-health.Corefile", "oneline-kubernetes.Corefile"} {
		src := corpus(t)[name]
		out, _, err := AddPlugins(src, nil)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		blocks, err := caddyfile.Parse("Corefile", strings.NewReader(out), nil)
		if err != nil {
			t.Fatalf("%s: %v\n%s", name, err, out)
		}
		if len(blocks) != 1 || !slices.Equal(blocks[0].Keys, []string{".:53"}) {
			t.Fatalf("%s: server blocks %d, the first %v; want .:53 alone:\n%s", name, len(blocks), blocks[0].Keys, out)
		}
		kube := strings.Join(caddyTexts(blocks[0].Tokens["kubernetes"]), " ")
		if !strings.Contains(kube, "pods insecure") {
			t.Errorf("%s: the kubernetes stanza is %q", name, kube)
		}
		if len(blocks[0].Tokens["kubeapi"]) != 1 || len(blocks[0].Tokens["k8s_event"]) != 1 {
			t.Errorf("%s: kubeapi %q, k8s_event %q", name, caddyTexts(blocks[0].Tokens["kubeapi"]), caddyTexts(blocks[0].Tokens["k8s_event"]))
		}
		if !strings.Contains(out, "{ lameduck 5s }") && !strings.Contains(out, "{ pods insecure }") {
			t.Errorf("%s: the one-line block is gone:\n%s", name, out)
		}
	}
}

// kubeapi that a server block imports from a snippet counts: the block
// gets no second one, and CoreDNS would start.
func TestAddPluginsCountsKubeapiFromAnImportedSnippet(t *testing.T) {
	src := corpus(t)["kubeapi-in-snippet.Corefile"]
	out, _, err := AddPlugins(src, nil)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Count(out, "kubeapi") != 1 {
		t.Errorf("kubeapi %d times:\n%s", strings.Count(out, "kubeapi"), out)
	}
	if err := CheckCorefile(out); err != nil {
		t.Errorf("CheckCorefile: %v", err)
	}
}

// The refused Corefiles of the corpus are refused before anything is
// written, each with what would not start and what to do.
func TestAddPluginsRefusesWhatWouldNotStart(t *testing.T) {
	cases := map[string]struct {
		options []string
		err     string
	}{
		"kubeapi-twice.Corefile":        {nil, "server block .:53 has kubeapi 2 times (counting the snippets and files of its ConfigMap it imports): kubeapi may appear once in a server block, and CoreDNS would not start; remove all but one"},
		"k8s_event-in-snippet.Corefile": {[]string{"level info"}, "server block .:53 has k8s_event from a snippet or a file it imports, which install does not edit: set the options there, or install without --option"},
		"unclosed.Corefile":             {nil, "Corefile:3: kubernetes is not closed"},
		"no-braces.Corefile":            {nil, "Corefile:1: server block .:53 has no braces: add them, then install"},
		"k8s_event-refused.Corefile":    {nil, "k8s_event: Corefile:7 - Error during parsing: level given twice"},
	}
	all := corpus(t)
	for name, tc := range cases {
		src, ok := all[filepath.Join("refused", name)]
		if !ok {
			t.Fatalf("no %s in the corpus", name)
		}
		out, _, err := AddPlugins(src, tc.options)
		if err == nil {
			err = CheckCorefile(out)
		}
		if err == nil || err.Error() != tc.err {
			t.Errorf("%s: %v, want %q", name, err, tc.err)
		}
	}
	for name := range all {
		if _, ok := cases[strings.TrimPrefix(name, "refused"+string(filepath.Separator))]; strings.HasPrefix(name, "refused") && !ok {
			t.Errorf("%s has no case here", name)
		}
	}
}

// Whatever Corefile AddPlugins accepts, its result keeps the server
// blocks, their keys and every other directive's tokens, and has kubeapi
// and k8s_event where they go.
func FuzzAddPlugins(f *testing.F) {
	for name, src := range corpus(f) {
		f.Add(src, strings.Join(corpusOptions[name], "\n"))
	}
	f.Fuzz(func(t *testing.T, src, options string) {
		var opts []string
		if options != "" {
			opts = strings.Split(options, "\n")
		}
		if _, err := caddyfile.Parse("Corefile", strings.NewReader(withoutFileImports(src, nil)), nil); err != nil {
			return
		}
		out, _, err := AddPlugins(src, opts)
		if err != nil {
			return
		}
		checkBlocksKept(t, src, out, false)
	})
}
