package install

import (
	"fmt"
	"strings"

	"github.com/coredns/caddy/caddyfile"
	"github.com/coredns/coredns/core/dnsserver"

	k8s_event "github.com/dnsops/k8s_event"
	"github.com/dnsops/k8s_event/internal/directives"
)

// CheckCorefile reads the whole Corefile as the CoreDNS this tool installs
// would on start: caddy's parser with that CoreDNS's directives (every
// in-tree plugin, kubeapi and k8s_event), then every k8s_event stanza with
// the plugin's own parser, which also refuses settings that conflict
// between server blocks. Files the Corefile imports are on the pods, not
// here: their import lines are set aside.
func CheckCorefile(text string) error {
	directives.Standard()
	blocks, err := caddyfile.Parse("Corefile", strings.NewReader(withoutFileImports(text)), dnsserver.Directives)
	if err != nil {
		return err
	}
	var stanzas [][]caddyfile.Token
	for _, b := range blocks {
		if tokens, ok := b.Tokens["k8s_event"]; ok {
			stanzas = append(stanzas, tokens)
		}
	}
	if err := k8s_event.CheckBlocks(stanzas); err != nil {
		return fmt.Errorf("k8s_event: %w", err)
	}
	return nil
}

// withoutFileImports is text with the lines that import files blanked
// (the line numbers stay); imports of the Corefile's own snippets stay.
func withoutFileImports(text string) string {
	snippets := map[string]bool{}
	lines := strings.Split(text, "\n")
	for _, l := range lines {
		f := strings.Fields(l)
		if len(f) > 0 && strings.HasPrefix(f[0], "(") {
			snippets[strings.Trim(f[0], "(){")] = true
		}
	}
	for i, l := range lines {
		f := strings.Fields(l)
		if len(f) >= 2 && f[0] == "import" && !snippets[strings.Trim(f[1], `"`)] {
			lines[i] = ""
		}
	}
	return strings.Join(lines, "\n")
}
