package install

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/coredns/caddy/caddyfile"
)

// corpus is every Corefile of testdata/corefile, refused ones included,
// by file name.
func corpus(t testing.TB) map[string]string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("testdata", "corefile", "*.Corefile"))
	if err != nil {
		t.Fatal(err)
	}
	refused, err := filepath.Glob(filepath.Join("testdata", "corefile", "refused", "*.Corefile"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, f := range append(files, refused...) {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		out[strings.TrimPrefix(f, filepath.Join("testdata", "corefile")+string(filepath.Separator))] = string(b)
	}
	if len(out) == 0 {
		t.Fatal("no Corefiles in testdata/corefile")
	}
	return out
}

// lexerEdgeCases are inputs where caddyfile's rules are easy to get
// wrong.
var lexerEdgeCases = []string{
	"",
	"\uFEFF.:53 {\n}\n",
	"a\"b\" c",
	`"a \"quoted\" \n word" next`,
	"\"unterminated\nquote",
	"\"\" empty",
	"\"",
	"word#comment\nnext",
	"# only a comment",
	"foo\rbar\r\nbaz",
	"{$ENV} {%WIN%} {}",
	"\"multi\nline\" after\nnext",
	"a\\\"b \"c\\d\"",
	"\xff\xfe bad utf8 \"\xc3\"",
	"x \uFEFFy",
	"tab\there\vvt\fff\u00a0nbsp\u2028ls",
}

// lexMismatch is where lex and caddyfile's Dispenser first differ on src,
// or "".
func lexMismatch(src string) string {
	got := lex(src)
	d := caddyfile.NewDispenser("Corefile", strings.NewReader(src))
	i := 0
	for d.Next() {
		if i >= len(got) {
			return "caddyfile has more tokens: " + d.Val()
		}
		if got[i].text != d.Val() || got[i].line != d.Line() {
			return fmt.Sprintf("token %d: %q line %d, caddyfile %q line %d", i, got[i].text, got[i].line, d.Val(), d.Line())
		}
		i++
	}
	if i != len(got) {
		return "lex has more tokens: " + got[i].text
	}
	return ""
}

// offsetMismatch checks that each token's bytes are the token: read
// alone, they give the token's text.
func offsetMismatch(src string) string {
	for _, tok := range lex(src) {
		raw := src[tok.start:tok.end]
		if strings.HasPrefix(raw, "\uFEFF") {
			continue // alone, it would be read as a byte order mark
		}
		again := lex(raw)
		if len(again) != 1 || again[0].text != tok.text {
			return "bytes " + raw + " are not the token " + tok.text
		}
	}
	return ""
}

func TestLexMatchesCaddyfileOnTheCorpus(t *testing.T) {
	for name, src := range corpus(t) {
		if m := lexMismatch(src); m != "" {
			t.Errorf("%s: %s", name, m)
		}
		if m := offsetMismatch(src); m != "" {
			t.Errorf("%s: %s", name, m)
		}
	}
	for _, src := range lexerEdgeCases {
		if m := lexMismatch(src); m != "" {
			t.Errorf("%q: %s", src, m)
		}
		if m := offsetMismatch(src); m != "" {
			t.Errorf("%q: %s", src, m)
		}
	}
}

func TestLexGivesTheBytesOfAOneLineBlock(t *testing.T) {
	src := "    health { lameduck 5s } # five\n"
	var got []string
	for _, tok := range lex(src) {
		got = append(got, src[tok.start:tok.end])
	}
	if want := []string{"health", "{", "lameduck", "5s", "}"}; strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("token bytes %q, want %q", got, want)
	}
}

func FuzzLex(f *testing.F) {
	for _, src := range corpus(f) {
		f.Add(src)
	}
	for _, src := range lexerEdgeCases {
		f.Add(src)
	}
	f.Fuzz(func(t *testing.T, src string) {
		if m := lexMismatch(src); m != "" {
			t.Fatal(m)
		}
		if m := offsetMismatch(src); m != "" {
			t.Fatal(m)
		}
	})
}
