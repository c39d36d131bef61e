package install

import (
	"strings"
	"unicode"
	"unicode/utf8"
)

// token is one token of a Corefile as caddyfile's lexer reads it, and
// where it stands in the text. caddyfile's own tokens carry the file and
// the line only, so an edit cannot be placed by them.
type token struct {
	text string // as caddyfile gives it: quotes taken off, \" unescaped
	line int
	// start and end are byte offsets: src[start:end] is the token as
	// written, its quotes included.
	start, end int
}

// lexer reads tokens by caddyfile's rules (github.com/coredns/caddy
// caddyfile/lexer.go): tokens are separated by white space; a token that
// starts with " runs to the next unescaped ", and inside it only \" is
// an escape; # starts a comment to the end of the line; { and } are
// tokens only where white space separates them; \r is skipped outside
// quotes, even inside a word; {$VAR} is text like any other.
type lexer struct {
	src  string
	pos  int
	line int
}

// lex returns the tokens of src, each with its byte offsets.
func lex(src string) []token {
	l := lexer{src: src, line: 1}
	// caddyfile drops a leading byte order mark.
	if strings.HasPrefix(src, "\uFEFF") {
		l.pos = len("\uFEFF")
	}
	var tokens []token
	for {
		t, ok := l.next()
		if !ok {
			return tokens
		}
		tokens = append(tokens, t)
	}
}

// next reads the next token, as caddyfile's lexer.next does.
func (l *lexer) next() (token, bool) {
	var val []rune
	var t token
	comment, quoted, escaped := false, false, false
	for l.pos < len(l.src) {
		ch, size := utf8.DecodeRuneInString(l.src[l.pos:])
		at := l.pos
		l.pos += size
		if quoted {
			if !escaped && ch == '\\' {
				escaped = true
				continue
			}
			if !escaped && ch == '"' {
				t.text, t.end = string(val), l.pos
				return t, true
			}
			if ch == '\n' {
				l.line++
			}
			if escaped && ch != '"' {
				val = append(val, '\\')
			}
			val = append(val, ch)
			escaped = false
			continue
		}
		if unicode.IsSpace(ch) {
			if ch == '\r' {
				continue
			}
			if ch == '\n' {
				l.line++
				comment = false
			}
			if len(val) > 0 {
				t.text = string(val)
				return t, true
			}
			continue
		}
		if ch == '#' {
			comment = true
		}
		if comment {
			continue
		}
		if len(val) == 0 {
			t = token{line: l.line, start: at}
			if ch == '"' {
				quoted = true
				continue
			}
		}
		val = append(val, ch)
		t.end = l.pos
	}
	if len(val) == 0 {
		return token{}, false
	}
	if quoted {
		t.end = len(l.src)
	}
	t.text = string(val)
	return t, true
}

// startsLine reports whether tokens[i] is on a later line than the token
// before it, as caddyfile's Dispenser counts lines: a quoted token's own
// line breaks count.
func startsLine(tokens []token, i int) bool {
	if i == 0 {
		return true
	}
	prev := tokens[i-1]
	return prev.line+strings.Count(prev.text, "\n") < tokens[i].line
}
