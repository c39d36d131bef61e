package k8s_event

import (
	"github.com/coredns/caddy"
	"github.com/coredns/caddy/caddyfile"
)

// CheckBlocks reads the k8s_event stanzas of one Corefile, one per server block (each the tokens
// caddyfile.Parse gives the k8s_event directive), as setup would, and returns the error setup would
// give: a stanza the plugin refuses, or settings of two blocks that conflict. Install tooling uses
// it to refuse a whole Corefile before any pod runs it.
func CheckBlocks(stanzas [][]caddyfile.Token) error {
	inst := &instance{}
	for _, tokens := range stanzas {
		c := caddy.NewTestController("dns", "")
		c.Dispenser = caddyfile.NewDispenserTokens("Corefile", tokens)
		cfg, err := parse(c)
		if err != nil {
			return err
		}
		if _, err := inst.addBlock(cfg, nil); err != nil {
			return err
		}
	}
	return nil
}
