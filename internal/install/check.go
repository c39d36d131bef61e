package install

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/coredns/caddy/caddyfile"

	k8s_event "github.com/dnsops/k8s_event"
	"github.com/dnsops/k8s_event/internal/directives"
)

// CheckCorefile reads the whole Corefile as the CoreDNS this tool installs
// would on start: caddy's parser with that CoreDNS's directives (every
// in-tree plugin, kubeapi and k8s_event), then every k8s_event stanza with
// the plugin's own parser, which also refuses settings that conflict
// between server blocks; a server block with kubeapi twice (a snippet's
// and its own) is refused as kubeapi's setup refuses it. Files the
// Corefile imports are on the pods, not here: their import lines are set
// aside. A plugin's block whose } shares a line with an option is
// refused: caddyfile reads that } as one more argument of the option.
func CheckCorefile(text string) error {
	return checkCorefileWith(text, nil)
}

// checkCorefileWith is CheckCorefile of a Corefile beside the files m,
// what it imports of them read as its own.
func checkCorefileWith(text string, m *mountedFiles) error {
	c, err := parseCorefile(text, m)
	if err != nil {
		return err
	}
	return c.check()
}

// check is CheckCorefile of the Corefile c has read.
func (c *corefileText) check() error {
	if err := blockClosedOnAnOptionLine(c.tokens); err != nil {
		return err
	}
	if err := c.unknownDirective(); err != nil {
		return err
	}
	var stanzas [][]caddyfile.Token
	for _, b := range c.parsed {
		if n := stanzaCount(b.Tokens["kubeapi"]); n > 1 {
			return kubeapiTwice(b.Keys, n)
		}
		if tokens, ok := b.Tokens["k8s_event"]; ok {
			stanzas = append(stanzas, tokens)
		}
	}
	if err := k8s_event.CheckBlocks(stanzas); err != nil {
		return fmt.Errorf("k8s_event: %w", err)
	}
	return nil
}

// unknownDirective refuses, as caddyfile's parser given the directives
// of the CoreDNS this tool installs does, the first directive (in block
// and line order) that CoreDNS does not know.
func (c *corefileText) unknownDirective() error {
	known := directives.Known()
	for _, b := range c.parsed {
		var first *caddyfile.Token
		for dir, tokens := range b.Tokens {
			if !slices.Contains(known, dir) && (first == nil || tokens[0].Line < first.Line) {
				first = &caddyfile.Token{File: tokens[0].File, Line: tokens[0].Line, Text: dir}
			}
		}
		if first != nil && first.File == "" {
			first.File = "Corefile" // as the parser names the text it reads
		}
		if first != nil {
			return fmt.Errorf("%s:%d - Error during parsing: Unknown directive '%s'", first.File, first.Line, first.Text)
		}
	}
	return nil
}

// checkOptionStanza reads the --option lines as the k8s_event stanza they
// make, with the plugin's own parser (the rule that refuses a property
// given twice included), and returns the error it would give, naming the
// line at fault.
func checkOptionStanza(options []string) error {
	const file = "--option"
	tokens := []caddyfile.Token{{File: file, Text: "k8s_event"}, {File: file, Text: "{"}}
	for i, o := range options {
		words := lex(o)
		if len(words) == 0 {
			return fmt.Errorf("--option %q: empty", o)
		}
		for _, w := range words {
			tokens = append(tokens, caddyfile.Token{File: file, Line: i + 1, Text: w.text})
		}
	}
	tokens = append(tokens, caddyfile.Token{File: file, Line: len(options) + 1, Text: "}"})
	err := k8s_event.CheckBlocks([][]caddyfile.Token{tokens})
	if err == nil {
		return nil
	}
	// caddy writes FILE:LINE - Error during parsing: MESSAGE.
	where, msg, ok := strings.Cut(err.Error(), " - Error during parsing: ")
	if line, convErr := strconv.Atoi(strings.TrimPrefix(where, file+":")); ok && convErr == nil && line >= 1 && line <= len(options) {
		return fmt.Errorf("--option %q: %s", options[line-1], msg)
	}
	return fmt.Errorf("--option: %w", err)
}

// blockClosedOnAnOptionLine refuses a plugin's block that closes on the
// line of its last option, as in "health { lameduck 5s }": caddyfile's
// RemainingArgs reads the } as one more argument, and the plugins refuse
// it (health: "Wrong argument count or unexpected line ending after
// '}'"), so CoreDNS would not start. "health { }" is read as empty.
func blockClosedOnAnOptionLine(tokens []token) error {
	var open []int
	for i, t := range tokens {
		switch t.text {
		case "{":
			open = append(open, i)
		case "}":
			if len(open) == 0 {
				return nil // caddyfile's parser says what is wrong
			}
			o := open[len(open)-1]
			open = open[:len(open)-1]
			if len(open) >= 1 && !startsLine(tokens, i) && tokens[i-1].text != "{" {
				d := o
				for d > 0 && !startsLine(tokens, d) {
					d--
				}
				return fmt.Errorf("Corefile:%d: the block of %s closes on the line of its option %q: CoreDNS reads that } as one more argument, and %s would not start; put the } on a line of its own", t.line, tokens[d].text, tokens[i-1].text+" }", tokens[d].text)
			}
		}
	}
	return nil
}
