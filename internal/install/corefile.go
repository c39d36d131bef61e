package install

import (
	"fmt"
	"slices"
	"strings"

	"github.com/coredns/caddy/caddyfile"
)

// AddPlugins returns the Corefile with kubeapi and k8s_event added to every
// server block that has the kubernetes plugin (or to the first server block
// when none has it), and whether it changed anything. k8s_event gets
// options as its block lines (e.g. "level info warning error"), or none
// for its defaults. A block that has kubeapi or k8s_event already, itself
// or through a snippet it imports, keeps it; every k8s_event stanza
// written in a server block takes the options given: each replaces the
// line of the same property, or is added before the stanza's closing
// brace.
//
// The Corefile is never printed anew: the new lines are inserted before
// the server block's closing brace, in the block's indentation and line
// ending, and an option line replaces the bytes of the line it replaces;
// every other byte, comments and layout included, stays. Snippets and
// imported files are not edited: a k8s_event stanza that comes from one
// cannot take options here, and a block that would have kubeapi twice is
// refused, as CoreDNS would not start.
func AddPlugins(text string, options []string) (string, bool, error) {
	return addPluginsWith(text, options, nil)
}

// addPluginsWith is AddPlugins of a Corefile beside the files m: what it
// imports of them counts as its own.
func addPluginsWith(text string, options []string, m *mountedFiles) (string, bool, error) {
	splices, err := planCorefile(text, options, m)
	if err != nil {
		return "", false, err
	}
	if len(splices) == 0 {
		return text, false, nil
	}
	return applySplices(text, splices), true, nil
}

// planCorefile is the splices that AddPlugins makes of text.
func planCorefile(text string, options []string, m *mountedFiles) ([]splice, error) {
	cf, err := parseCorefile(text, m)
	if err != nil {
		return nil, err
	}
	return cf.splices(options)
}

// withPlugins is the Corefile cf has read with kubeapi and k8s_event
// added (see AddPlugins), read in its turn.
func (cf *corefileText) withPlugins(options []string, m *mountedFiles) (*corefileText, error) {
	s, err := cf.splices(options)
	if err != nil || len(s) == 0 {
		return cf, err
	}
	out, err := parseCorefile(applySplices(cf.src, s), m)
	if out != nil {
		out.everyBlock = cf.everyBlock
	}
	return out, err
}

// splices are the edits that add kubeapi and k8s_event to the Corefile
// cf has read.
func (cf *corefileText) splices(options []string) ([]splice, error) {
	if err := checkOptionStanza(options); err != nil {
		return nil, err
	}
	if cf.layoutErr != nil {
		return nil, cf.layoutErr
	}
	targets := cf.targets()
	if len(targets) == 0 {
		return nil, fmt.Errorf("the Corefile has no server block")
	}
	var splices []splice
	for _, b := range targets {
		s, err := cf.addPlugins(b, options)
		if err != nil {
			return nil, err
		}
		splices = append(splices, s...)
	}
	for i := range cf.blocks {
		s, err := cf.setOptions(&cf.blocks[i], options)
		if err != nil {
			return nil, err
		}
		splices = append(splices, s...)
	}
	return splices, nil
}

// HasPlugins reports whether any server block of the Corefile has
// k8s_event, itself or through a snippet it imports.
func HasPlugins(text string) bool {
	return hasPluginsWith(text, nil)
}

// hasPluginsWith is HasPlugins of a Corefile beside the files m.
func hasPluginsWith(text string, m *mountedFiles) bool {
	c, err := parseCorefile(text, m)
	return err == nil && c.has("k8s_event")
}

// externalPlugins are the plugins of k8s_event's build (kubeapi,
// k8s_event) that a server block of c has, itself or through a snippet
// it imports: a stock CoreDNS image stops on either.
func (c *corefileText) externalPlugins() []string {
	var out []string
	for _, name := range []string{"kubeapi", "k8s_event"} {
		if c.has(name) {
			out = append(out, name)
		}
	}
	return out
}

// targets are the server blocks that get the plugins: every one with
// everyBlock, else those with the kubernetes plugin, or the first.
func (c *corefileText) targets() []*serverBlock {
	var with, all []*serverBlock
	for i := range c.blocks {
		b := &c.blocks[i]
		if b.parsed == nil {
			continue
		}
		all = append(all, b)
		if len(b.parsed.Tokens["kubernetes"]) > 0 {
			with = append(with, b)
		}
	}
	if c.everyBlock {
		return all
	}
	if len(with) > 0 || len(all) == 0 {
		return with
	}
	return all[:1]
}

// addPlugins is the splice that adds to b what it lacks of kubeapi and
// k8s_event, before its closing brace.
func (c *corefileText) addPlugins(b *serverBlock, options []string) ([]splice, error) {
	var lines []string
	switch n := stanzaCount(b.parsed.Tokens["kubeapi"]); {
	case n > 1:
		return nil, kubeapiTwice(b.parsed.Keys, n)
	case n == 0:
		lines = append(lines, "kubeapi")
	}
	if len(b.parsed.Tokens["k8s_event"]) == 0 {
		lines = append(lines, c.stanzaLines(options)...)
	}
	if len(lines) == 0 {
		return nil, nil
	}
	return []splice{c.insertBeforeClose(b.close, lines, c.directiveIndent(b), c.indentOf(b.open))}, nil
}

// kubeapiTwice is the error for a server block with more than one kubeapi
// stanza.
func kubeapiTwice(keys []string, n int) error {
	return fmt.Errorf("server block %s has kubeapi %d times (counting the snippets and files of its ConfigMap it imports): kubeapi may appear once in a server block, and CoreDNS would not start; remove all but one", strings.Join(keys, " "), n)
}

// stanzaLines is a k8s_event stanza with options, a line each.
func (c *corefileText) stanzaLines(options []string) []string {
	if len(options) == 0 {
		return []string{"k8s_event"}
	}
	lines := []string{"k8s_event {"}
	for _, o := range options {
		lines = append(lines, c.unit+strings.TrimSpace(o))
	}
	return append(lines, "}")
}

// setOptions is the splices that give every k8s_event stanza of b the
// options: each replaces the line of the property it sets, or is added.
func (c *corefileText) setOptions(b *serverBlock, options []string) ([]splice, error) {
	if b.parsed == nil || len(options) == 0 || len(b.parsed.Tokens["k8s_event"]) == 0 {
		return nil, nil
	}
	var splices []splice
	found := false
	for _, s := range b.stanzas {
		if c.tokens[s.first].text != "k8s_event" {
			continue
		}
		found = true
		more, err := c.setStanzaOptions(s, options)
		if err != nil {
			return nil, err
		}
		splices = append(splices, more...)
	}
	if !found {
		return nil, fmt.Errorf("server block %s has k8s_event from a snippet or a file it imports, which install does not edit: set the options there, or install without --option", strings.Join(b.parsed.Keys, " "))
	}
	return splices, nil
}

// setStanzaOptions is the splices that give stanza s the options.
func (c *corefileText) setStanzaOptions(s stanza, options []string) ([]splice, error) {
	open := slices.IndexFunc(c.tokens[s.first:s.end], func(t token) bool { return t.text == "{" })
	last := c.tokens[s.end-1]
	indent := c.indentOf(s.first)
	if open < 0 {
		var b strings.Builder
		b.WriteString(" {" + c.newline)
		for _, o := range options {
			b.WriteString(indent + c.unit + strings.TrimSpace(o) + c.newline)
		}
		b.WriteString(indent + "}")
		return []splice{{last.end, last.end, b.String()}}, nil
	}
	open += s.first
	if last.text != "}" {
		return nil, fmt.Errorf("Corefile:%d: the k8s_event stanza has tokens after its block", last.line)
	}
	lines := c.optionLines(open+1, s.end-1)
	var splices []splice
	var missing []string
	for _, o := range options {
		want := texts(lex(o))
		i := slices.IndexFunc(lines, func(l stanza) bool { return c.tokens[l.first].text == want[0] })
		if i < 0 {
			missing = append(missing, strings.TrimSpace(o))
			continue
		}
		l := lines[i]
		if !slices.Equal(texts(c.tokens[l.first:l.end]), want) {
			splices = append(splices, splice{c.tokens[l.first].start, c.tokens[l.end-1].end, strings.TrimSpace(o)})
		}
	}
	if len(missing) > 0 {
		optIndent := indent + c.unit
		for _, l := range lines {
			if w, ok := c.lineIndent(l.first); ok {
				optIndent = w
				break
			}
		}
		splices = append(splices, c.insertBeforeClose(s.end-1, missing, optIndent, indent))
	}
	return splices, nil
}

// optionLines splits the tokens [from, to) of a block into its lines.
func (c *corefileText) optionLines(from, to int) []stanza {
	var lines []stanza
	for i := from; i < to; i++ {
		if i == from || startsLine(c.tokens, i) {
			lines = append(lines, stanza{first: i})
		}
		lines[len(lines)-1].end = i + 1
	}
	return lines
}

func texts(tokens []token) []string {
	out := make([]string, len(tokens))
	for i, t := range tokens {
		out[i] = t.text
	}
	return out
}

// stanzaCount is how many stanzas a plugin's setup finds in the tokens
// caddyfile.Parse gives its directive in one server block, read as
// kubeapi's setup reads them: a second is an error there.
func stanzaCount(tokens []caddyfile.Token) int {
	d := caddyfile.NewDispenserTokens("Corefile", tokens)
	n := 0
	for d.Next() {
		n++
		for d.NextBlock() {
			d.RemainingArgs()
		}
	}
	return n
}
