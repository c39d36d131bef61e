package k8s_event

import (
	"strings"
	"testing"

	"github.com/coredns/caddy/caddyfile"
)

func stanzas(t *testing.T, corefile string) [][]caddyfile.Token {
	t.Helper()
	blocks, err := caddyfile.Parse("Corefile", strings.NewReader(corefile), nil)
	if err != nil {
		t.Fatal(err)
	}
	var out [][]caddyfile.Token
	for _, b := range blocks {
		if tokens, ok := b.Tokens[pluginName]; ok {
			out = append(out, tokens)
		}
	}
	return out
}

func TestCheckBlocks(t *testing.T) {
	for _, tc := range []struct {
		corefile, wantErr string
	}{
		{".:53 {\n    k8s_event {\n        level info\n    }\n}\n", ""},
		{"a.:53 {\n    k8s_event {\n        rate 1 2\n    }\n}\nb.:53 {\n    k8s_event\n}\n", ""},
		{".:53 {\n    k8s_event {\n        level error\n        level info\n    }\n}\n", "level given twice"},
		{".:53 {\n    k8s_event\n    k8s_event\n}\n", "this plugin"},
		{"a.:53 {\n    k8s_event {\n        rate 1 2\n    }\n}\nb.:53 {\n    k8s_event {\n        rate 2 2\n    }\n}\n", "conflicts with rate"},
		{".:53 {\n    k8s_event {\n        levels info\n    }\n}\n", `unknown property "levels"`},
	} {
		err := CheckBlocks(stanzas(t, tc.corefile))
		switch {
		case tc.wantErr == "" && err != nil:
			t.Errorf("%q: %v", tc.corefile, err)
		case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
			t.Errorf("%q: %v, want %q", tc.corefile, err, tc.wantErr)
		}
	}
}
