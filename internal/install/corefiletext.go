package install

import (
	"fmt"
	"path"
	"slices"
	"sort"
	"strings"

	"github.com/coredns/caddy/caddyfile"
)

// corefileText is a Corefile as written: its tokens with their offsets,
// its server blocks and snippets with their stanzas, and how caddyfile
// reads each server block once snippets are expanded.
type corefileText struct {
	src    string
	tokens []token
	// parsed are the server blocks as caddyfile reads them: read once, they
	// serve the check, the edit and the plan.
	parsed []caddyfile.ServerBlock
	// blocks are the blocks as written, which the edit needs; layoutErr
	// is why they could not be told apart (the edit is refused, the check
	// and the plan go on).
	blocks    []serverBlock
	layoutErr error
	// newline is the file's line ending; unit the step by which its
	// blocks indent.
	newline, unit string
	// everyBlock, that the edit adds the plugins to every server block
	// (the layout's everyBlock).
	everyBlock bool
}

// serverBlock is a server block or a snippet; open and close are the
// indices of its braces in tokens.
type serverBlock struct {
	keys        []string
	open, close int
	stanzas     []stanza
	// parsed is the block as caddyfile.Parse gives it, snippets expanded
	// and file imports set aside; nil for a snippet.
	parsed *caddyfile.ServerBlock
}

// stanza is tokens[first:end]: a directive and its arguments and block,
// or one line of a block.
type stanza struct{ first, end int }

// splice replaces src[start:end] with text.
type splice struct {
	start, end int
	text       string
}

// applySplices makes the splices, which do not overlap, in src.
func applySplices(src string, splices []splice) string {
	sorted := append([]splice(nil), splices...)
	sort.SliceStable(sorted, func(i, j int) bool { return sorted[i].start < sorted[j].start })
	var b strings.Builder
	at := 0
	for _, s := range sorted {
		b.WriteString(src[at:s.start])
		b.WriteString(s.text)
		at = s.end
	}
	b.WriteString(src[at:])
	return b.String()
}

// readCorefile reads text as caddyfile does, the files of m it imports
// expanded, and its blocks as written, for an edit.
func readCorefile(text string, m *mountedFiles) (*corefileText, error) {
	c, err := parseCorefile(text, m)
	if err != nil {
		return nil, err
	}
	if c.layoutErr != nil {
		return nil, c.layoutErr
	}
	return c, nil
}

// parseCorefile is the one reader of a Corefile: caddyfile's parser, with
// any directive, over text with the files of m it imports expanded, run
// once; then the blocks as written.
func parseCorefile(text string, m *mountedFiles) (*corefileText, error) {
	parsed, err := caddyfile.Parse("Corefile", strings.NewReader(withoutFileImports(text, m)), nil)
	if err != nil {
		return nil, err
	}
	c := &corefileText{src: text, tokens: lex(text), parsed: parsed, newline: "\n"}
	if strings.Contains(text, "\r\n") {
		c.newline = "\r\n"
	}
	c.layoutErr = c.readLayout()
	return c, nil
}

// has reports whether any server block has the directive name, itself or
// through a snippet it imports.
func (c *corefileText) has(name string) bool {
	return slices.ContainsFunc(c.parsed, func(b caddyfile.ServerBlock) bool { return len(b.Tokens[name]) > 0 })
}

// readLayout reads the blocks as written and pairs each server block with
// caddyfile's reading of it.
func (c *corefileText) readLayout() error {
	parsed := c.parsed
	if err := c.readBlocks(); err != nil {
		return err
	}
	servers := 0
	for i := range c.blocks {
		if b := &c.blocks[i]; !isSnippet(b.keys) {
			if servers < len(parsed) {
				b.parsed = &parsed[servers]
			}
			servers++
		}
	}
	if servers != len(parsed) {
		return fmt.Errorf("Corefile: %d server blocks as written, %d once its imports are read: edit this Corefile by hand", servers, len(parsed))
	}
	c.unit = c.indentUnit()
	return nil
}

// isSnippet reports whether a block with keys is a snippet, "(name)".
func isSnippet(keys []string) bool {
	return len(keys) == 1 && strings.HasPrefix(keys[0], "(") && strings.HasSuffix(keys[0], ")")
}

// readBlocks reads the top level as caddyfile's parser does: server
// blocks, snippets, and imports, which are left as they are.
func (c *corefileText) readBlocks() error {
	for i := 0; i < len(c.tokens); {
		if c.tokens[i].text == "import" && startsLine(c.tokens, i) {
			i += 2
			continue
		}
		b, next, err := c.readBlock(i)
		if err != nil {
			return err
		}
		c.blocks = append(c.blocks, b)
		i = next
	}
	return nil
}

// readBlock reads the block whose keys start at tokens[i], and returns
// the index after its closing brace.
func (c *corefileText) readBlock(i int) (serverBlock, int, error) {
	var b serverBlock
	first, another := c.tokens[i], false
	for ; i < len(c.tokens) && c.tokens[i].text != "{"; i++ {
		if c.tokens[i].text == "}" {
			return b, 0, fmt.Errorf("Corefile:%d: unexpected }", c.tokens[i].line)
		}
		if len(b.keys) > 0 && !another && startsLine(c.tokens, i) {
			break
		}
		b.keys = append(b.keys, c.tokens[i].text)
		another = strings.HasSuffix(c.tokens[i].text, ",")
	}
	if i == len(c.tokens) || c.tokens[i].text != "{" {
		return b, 0, fmt.Errorf("Corefile:%d: server block %s has no braces: add them, then install", first.line, strings.Join(b.keys, " "))
	}
	b.open = i
	if isSnippet(b.keys) {
		close, err := c.matchingBrace(i)
		b.close = close
		return b, close + 1, err
	}
	for i++; i < len(c.tokens) && c.tokens[i].text != "}"; {
		end, err := c.stanzaEnd(i)
		if err != nil {
			return b, 0, err
		}
		b.stanzas = append(b.stanzas, stanza{i, end})
		i = end
	}
	if i == len(c.tokens) {
		return b, 0, fmt.Errorf("Corefile:%d: server block %s is not closed", first.line, strings.Join(b.keys, " "))
	}
	b.close = i
	return b, i + 1, nil
}

// stanzaEnd is the index after the directive that starts at tokens[i],
// found as caddyfile's parser finds it.
func (c *corefileText) stanzaEnd(i int) (int, error) {
	nesting := 0
	for j := i + 1; j < len(c.tokens); j++ {
		t := c.tokens[j]
		switch {
		case t.text == "{":
			nesting++
		case nesting == 0 && startsLine(c.tokens, j):
			return j, nil
		case t.text == "}" && nesting > 0:
			nesting--
		case t.text == "}":
			return 0, fmt.Errorf("Corefile:%d: unexpected }", t.line)
		}
	}
	return 0, fmt.Errorf("Corefile:%d: %s is not closed", c.tokens[i].line, c.tokens[i].text)
}

// matchingBrace is the index of the brace that closes tokens[open].
func (c *corefileText) matchingBrace(open int) (int, error) {
	depth := 0
	for j := open; j < len(c.tokens); j++ {
		switch c.tokens[j].text {
		case "{":
			depth++
		case "}":
			if depth--; depth == 0 {
				return j, nil
			}
		}
	}
	return 0, fmt.Errorf("Corefile:%d: a block is not closed", c.tokens[open].line)
}

// insertBeforeClose is the splice that puts lines, each after indent,
// before the closing brace tokens[close]: at the start of its line, or,
// where the brace shares its line, in place of the white space before
// it, on new lines after which the brace stands at braceIndent.
func (c *corefileText) insertBeforeClose(close int, lines []string, indent, braceIndent string) splice {
	var b strings.Builder
	brace := c.tokens[close]
	lineStart := strings.LastIndexByte(c.src[:brace.start], '\n') + 1
	if strings.TrimSpace(c.src[lineStart:brace.start]) == "" {
		for _, l := range lines {
			b.WriteString(indent + l + c.newline)
		}
		return splice{lineStart, lineStart, b.String()}
	}
	// The token before the brace is on its line: a comment would have
	// ended the line.
	after := c.tokens[close-1].end
	b.WriteString(c.newline)
	for _, l := range lines {
		b.WriteString(indent + l + c.newline)
	}
	b.WriteString(braceIndent)
	return splice{after, brace.start, b.String()}
}

// lineIndent is the white space before tokens[i] on its line, and
// whether only white space is there.
func (c *corefileText) lineIndent(i int) (string, bool) {
	start := c.tokens[i].start
	before := c.src[strings.LastIndexByte(c.src[:start], '\n')+1 : start]
	if strings.TrimLeft(before, " \t") != "" {
		return "", false
	}
	return before, true
}

// indentOf is the indentation of the line tokens[i] is on.
func (c *corefileText) indentOf(i int) string {
	start := c.tokens[i].start
	line := c.src[strings.LastIndexByte(c.src[:start], '\n')+1 : start]
	return line[:len(line)-len(strings.TrimLeft(line, " \t"))]
}

// directiveIndent is the indentation of b's directives: that of the
// first that starts its line, or one unit more than the block's keys.
func (c *corefileText) directiveIndent(b *serverBlock) string {
	for _, s := range b.stanzas {
		if w, ok := c.lineIndent(s.first); ok {
			return w
		}
	}
	return c.indentOf(b.open) + c.unit
}

// indentUnit is how far the file indents a block's lines past the line
// that opens it: the first such step it has, else a tab where its
// directives are indented by tabs, else four spaces.
func (c *corefileText) indentUnit() string {
	for _, b := range c.blocks {
		for _, s := range b.stanzas {
			outer, ok := c.lineIndent(s.first)
			if !ok || s.end-s.first < 3 {
				continue
			}
			for j := s.first + 1; j < s.end-1; j++ {
				if c.tokens[j].text == "{" {
					inner, ok := c.lineIndent(j + 1)
					if ok && len(inner) > len(outer) && strings.HasPrefix(inner, outer) {
						return inner[len(outer):]
					}
					break
				}
			}
		}
	}
	for _, b := range c.blocks {
		for _, s := range b.stanzas {
			if w, ok := c.lineIndent(s.first); ok && strings.HasPrefix(w, "\t") {
				return "\t"
			}
		}
	}
	return "    "
}

// mountedFiles are the files the config volume puts beside the Corefile
// in the pods, keys of the Corefile's own ConfigMap: an import of one
// reads that key, as a snippet would be read, not a file out of sight.
type mountedFiles struct {
	dir   string            // the Corefile's directory in the pods
	files map[string]string // path in the pods -> text
}

// maxImportDepth bounds imports within imported keys.
const maxImportDepth = 10

// matches are the paths of the mounted files that an import of pattern
// reads, in the order caddyfile's glob reads them.
func (m *mountedFiles) matches(pattern string) []string {
	if m == nil {
		return nil
	}
	if !path.IsAbs(pattern) {
		pattern = path.Join(m.dir, pattern)
	}
	var out []string
	for p := range m.files {
		if ok, _ := path.Match(pattern, p); ok {
			out = append(out, p)
		}
	}
	slices.Sort(out)
	return out
}

// withoutFileImports is text with each import of a file that m mounts
// replaced by that file's text, imports expanded in turn, and each import
// of another file blanked (those files are on the pods, not here; the
// line numbers before an expanded import stay). Imports of the Corefile's
// own snippets stay.
func withoutFileImports(text string, m *mountedFiles) string {
	return expandImports(text, m, snippetNames(text), 0)
}

// snippetNames are the names of the snippets text defines.
func snippetNames(text string) map[string]bool {
	tokens := lex(text)
	snippets := map[string]bool{}
	for i, t := range tokens {
		if startsLine(tokens, i) && isSnippet([]string{t.text}) {
			snippets[strings.TrimSuffix(t.text[1:], ")")] = true
		}
	}
	return snippets
}

// expandImports is withoutFileImports of text read at depth imports in.
func expandImports(text string, m *mountedFiles, snippets map[string]bool, depth int) string {
	tokens := lex(text)
	var splices []splice
	for i := 0; i+1 < len(tokens); i++ {
		if tokens[i].text != "import" || !startsLine(tokens, i) || startsLine(tokens, i+1) || snippets[tokens[i+1].text] {
			continue
		}
		s := splice{start: tokens[i].start, end: tokens[i+1].end}
		if files := m.matches(tokens[i+1].text); len(files) > 0 && depth < maxImportDepth {
			var b strings.Builder
			for _, f := range files {
				b.WriteString(expandImports(m.files[f], m, snippets, depth+1) + "\n")
			}
			s.text = b.String()
		} else {
			s.text = strings.Map(func(r rune) rune {
				if r == '\n' {
					return r
				}
				return ' '
			}, text[s.start:s.end])
		}
		splices = append(splices, s)
	}
	return applySplices(text, splices)
}
