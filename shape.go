package k8s_event

import "strings"

// Placeholders of the parts of a line that vary between occurrences of one
// error.
const (
	shapeName = "<name>" // a DNS name
	shapeIP   = "<ip>"   // an IPv4 or IPv6 address, with or without a port
	shapeNum  = "<n>"    // a number, a port
	shapeDur  = "<d>"    // a duration: 1.5s, 300ms, 1m30s
	shapeHex  = "<hex>"  // a hexadecimal identifier or hash: 8 hex digits or more, or 0x...
	shapeUUID = "<uuid>" // a UUID
)

// lineShape is the shape of a log line: its text with DNS names, IP
// addresses (v4, v6, with or without a port, a->b pairs), port numbers,
// numbers, durations and hexadecimal or UUID identifiers replaced by
// placeholders, so that
//
//	plugin/errors: 2 a.example.org. A: read udp 10.0.0.5:41234->10.0.0.2:53: i/o timeout
//	plugin/errors: 2 b.example.net. AAAA: read udp 10.0.0.5:50112->10.0.0.2:53: i/o timeout
//
// have one shape, plugin/errors: <n> <name>. A: read udp <ip>-><ip>: i/o
// timeout (the query type stays: it is a word). It works on words separated
// by spaces, each stripped of the punctuation around it; the shape of a
// shape is itself. It is only a key: the line's text is never changed.
func lineShape(s string) string {
	var b strings.Builder
	b.Grow(len(s))
	walkShape(&b, s)
	return b.String()
}

// shapeHash is the 64-bit FNV-1a hash of lineShape(s), made without
// building the shape: the correlator's key for a combined event.
func shapeHash(s string) uint64 {
	h := fnvHash(fnvOffset)
	walkShape(&h, s)
	return uint64(h)
}

const (
	fnvOffset = 14695981039346656037
	fnvPrime  = 1099511628211
)

// fnvHash hashes what is written to it.
type fnvHash uint64

func (h *fnvHash) WriteString(s string) (int, error) {
	for i := 0; i < len(s); i++ {
		*h = (*h ^ fnvHash(s[i])) * fnvPrime
	}
	return len(s), nil
}

func (h *fnvHash) WriteByte(c byte) error {
	*h = (*h ^ fnvHash(c)) * fnvPrime
	return nil
}

// shapeSink is where a shape is written: a strings.Builder or an fnvHash.
type shapeSink interface {
	WriteString(string) (int, error)
	WriteByte(byte) error
}

func walkShape(b shapeSink, s string) {
	for len(s) > 0 {
		i := strings.IndexAny(s, " \t")
		if i < 0 {
			i = len(s)
		}
		shapeWord(b, s[:i])
		if i == len(s) {
			break
		}
		b.WriteByte(s[i])
		s = s[i+1:]
	}
}

// shapeWord writes the shape of one word: each side of "->", and the value
// of key=value, shaped alone.
func shapeWord(b shapeSink, w string) {
	if plainWord(w) {
		b.WriteString(w)
		return
	}
	for {
		i := strings.Index(w, "->")
		if i < 0 {
			break
		}
		shapeWord(b, w[:i])
		b.WriteString("->")
		w = w[i+2:]
	}
	if i := strings.IndexByte(w, '='); i >= 0 {
		b.WriteString(w[:i+1])
		shapeWord(b, w[i+1:])
		return
	}
	end := len(w)
	for end > 0 && closing[w[end-1]] {
		end--
	}
	if isIPv6(w[:end]) { // before ':' is taken for punctuation: ::1
		b.WriteString(shapeIP)
		b.WriteString(w[end:])
		return
	}
	start := 0
	for start < end && opening[w[start]] {
		if w[start] == '[' {
			if n, ok := bracketedIP(w[start:]); ok {
				b.WriteString(w[:start])
				b.WriteString(shapeIP)
				b.WriteString(w[start+n:])
				return
			}
		}
		start++
	}
	b.WriteString(w[:start])
	b.WriteString(shapeOf(w[start:end]))
	b.WriteString(w[end:])
}

// Punctuation taken off a word's ends before it is classified.
var opening, closing = byteSet(`([{"'<:`), byteSet(`)]}"'>,;:.?!`)

func byteSet(chars string) (set [256]bool) {
	for i := 0; i < len(chars); i++ {
		set[chars[i]] = true
	}
	return set
}

// plainWord tells a word that no placeholder can replace: without a digit,
// a dot, a colon, "->" or "=" (a name has a dot, a hex identifier a digit
// or 0x, an IPv6 address a colon).
func plainWord(w string) bool {
	for i := 0; i < len(w); i++ {
		switch c := w[i]; {
		case c >= '0' && c <= '9', c == '.', c == ':', c == '=', c == '>':
			return false
		}
	}
	return true
}

// bracketedIP matches [v6]:port or [v6] at the start of w and returns its
// length, the punctuation after it excluded.
func bracketedIP(w string) (int, bool) {
	end := strings.IndexByte(w, ']')
	if end < 0 || !isIPv6(w[1:end]) {
		return 0, false
	}
	n := end + 1
	if n+1 < len(w) && w[n] == ':' && isDigits(w[n+1:endOfDigits(w, n+1)]) {
		n = endOfDigits(w, n+1)
	}
	return n, true
}

func endOfDigits(w string, i int) int {
	for i < len(w) && w[i] >= '0' && w[i] <= '9' {
		i++
	}
	return i
}

// shapeOf is the placeholder of a word stripped of punctuation, or the
// word itself.
func shapeOf(w string) string {
	switch {
	case w == "":
		return w
	case isNumber(w):
		return shapeNum
	case isUUID(w):
		return shapeUUID
	case isDuration(w):
		return shapeDur
	case isHostPort(w):
		return shapeIP
	case isHex(w):
		return shapeHex
	case isName(w):
		return shapeName
	}
	return w
}

func isDigits(w string) bool {
	if w == "" {
		return false
	}
	for i := 0; i < len(w); i++ {
		if w[i] < '0' || w[i] > '9' {
			return false
		}
	}
	return true
}

// isNumber: 12, -3, 4.5, 1.2.3 made of digits only is not one.
func isNumber(w string) bool {
	if w[0] == '-' || w[0] == '+' {
		w = w[1:]
	}
	intPart, frac, dot := strings.Cut(w, ".")
	return isDigits(intPart) && (!dot || isDigits(frac))
}

func isUUID(w string) bool {
	if len(w) != 36 {
		return false
	}
	for i := 0; i < 36; i++ {
		switch i {
		case 8, 13, 18, 23:
			if w[i] != '-' {
				return false
			}
		default:
			if !isHexDigit(w[i]) {
				return false
			}
		}
	}
	return true
}

func isHexDigit(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}

// isDuration: one or more number-unit pairs, as Go prints a time.Duration.
func isDuration(w string) bool {
	if w[0] == '-' {
		w = w[1:]
	}
	if w == "" {
		return false
	}
	for w != "" {
		i := 0
		for i < len(w) && (w[i] >= '0' && w[i] <= '9' || w[i] == '.') {
			i++
		}
		if i == 0 {
			return false
		}
		w = w[i:]
		switch {
		case strings.HasPrefix(w, "ns"), strings.HasPrefix(w, "us"), strings.HasPrefix(w, "ms"):
			w = w[2:]
		case strings.HasPrefix(w, "µs"):
			w = w[len("µs"):]
		case strings.HasPrefix(w, "h"), strings.HasPrefix(w, "m"), strings.HasPrefix(w, "s"):
			w = w[1:]
		default:
			return false
		}
	}
	return true
}

// isHostPort: an IPv4 or IPv6 address, or IPv4:port.
func isHostPort(w string) bool {
	if isIPv4(w) || isIPv6(w) {
		return true
	}
	host, port, ok := cutLast(w, ':')
	return ok && isIPv4(host) && isDigits(port)
}

func cutLast(w string, sep byte) (string, string, bool) {
	i := strings.LastIndexByte(w, sep)
	if i < 0 {
		return w, "", false
	}
	return w[:i], w[i+1:], true
}

func isIPv4(w string) bool {
	parts := 0
	for w != "" {
		octet, rest, _ := strings.Cut(w, ".")
		if len(octet) == 0 || len(octet) > 3 || !isDigits(octet) {
			return false
		}
		parts++
		w = rest
	}
	return parts == 4
}

// isIPv6: hex groups and colons, with "::" or seven colons, maybe a zone
// or an IPv4 tail.
func isIPv6(w string) bool {
	if zone := strings.IndexByte(w, '%'); zone >= 0 {
		w = w[:zone]
	}
	colons := strings.Count(w, ":")
	if colons < 2 || colons > 7 || colons < 7 && !strings.Contains(w, "::") {
		return false
	}
	if last := strings.LastIndexByte(w, ':'); strings.IndexByte(w[last:], '.') >= 0 {
		if !isIPv4(w[last+1:]) {
			return false
		}
		w = w[:last]
	}
	for i := 0; i < len(w); i++ {
		if w[i] != ':' && !isHexDigit(w[i]) {
			return false
		}
	}
	return true
}

// isHex: 0x followed by hex digits, or 8 hex digits or more with a digit
// among them (so that a word like "deadbeef" is one, "accepted" is not).
func isHex(w string) bool {
	if len(w) > 2 && w[0] == '0' && (w[1] == 'x' || w[1] == 'X') {
		w = w[2:]
		for i := 0; i < len(w); i++ {
			if !isHexDigit(w[i]) {
				return false
			}
		}
		return true
	}
	if len(w) < 8 {
		return false
	}
	digit := false
	for i := 0; i < len(w); i++ {
		if !isHexDigit(w[i]) {
			return false
		}
		digit = digit || w[i] <= '9'
	}
	return digit
}

// isName: two labels or more of letters, digits, '-', '_' or a leading
// '*', with a letter somewhere.
func isName(w string) bool {
	if strings.IndexByte(w, '.') < 0 {
		return false
	}
	letter, labelLen := false, 0
	for i := 0; i < len(w); i++ {
		switch c := w[i]; {
		case c == '.':
			if labelLen == 0 {
				return false
			}
			labelLen = 0
			continue
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z':
			letter = true
		case c >= '0' && c <= '9', c == '-', c == '_':
		case c == '*' && labelLen == 0 && (i+1 == len(w) || w[i+1] == '.'):
		default:
			return false
		}
		labelLen++
	}
	return letter && labelLen > 0
}
