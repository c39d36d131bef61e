package k8s_event

import (
	"hash/maphash"
	"strconv"
	"strings"

	"github.com/miekg/dns"
)

// Placeholders of the parts of a line that vary between occurrences of one error.
const (
	shapeName = "<name>"  // a DNS name
	shapeIP   = "<ip>"    // an IPv4 or IPv6 address, with or without a port
	shapeNum  = "<n>"     // a number, a port
	shapeDur  = "<d>"     // a duration: 1.5s, 300ms, 1m30s
	shapeHex  = "<hex>"   // a hexadecimal identifier or hash: 8 hex digits or more, or 0x...
	shapeUUID = "<uuid>"  // a UUID
	shapeType = "<type>"  // a query type: A, AAAA, TYPE65280
	shapeCls  = "<class>" // a query class: IN, CH, CLASS255
)

// lineShape is the shape of a log line: its text with DNS names, IP addresses (v4, v6, with or
// without a port, a->b pairs), port numbers, numbers, durations and hexadecimal or UUID identifiers
// replaced by placeholders, so that
//
//	plugin/errors: 2 a.example.org. A: read udp 10.0.0.5:41234->10.0.0.2:53: i/o timeout
//	plugin/errors: 2 b.example.net. AAAA: read udp 10.0.0.5:50112->10.0.0.2:53: i/o timeout
//
// have one shape, plugin/errors: <n> <name>. <type>: read udp <ip>-><ip>: i/o timeout. Every
// token a DNS client chooses is a placeholder: the name (with any byte CoreDNS prints as it is,
// '*', '=' and "->" among them), the query type and class. It works on words separated by spaces,
// each stripped of the punctuation around it; the shape of a shape is itself. It is only a key:
// the line's text is never changed.
func lineShape(s string) string {
	return string(appendShape(make([]byte, 0, len(s)), s, nil))
}

// shapeSeed keys shapeHash: shapes are compared only within one process.
var shapeSeed = maphash.MakeSeed()

// shapeHash is a 64-bit hash of lineShape(s): the correlator's key for a combined event. The shape
// is built in a buffer on the stack, so that a message costs no allocation.
func shapeHash(s string) uint64 {
	var buf [shapeBufSize]byte
	return maphash.Bytes(shapeSeed, appendShape(buf[:0], s, nil))
}

// found keeps the first word of a line that its shape names <name>, and the first it names <ip>.
type found struct{ name, ip string }

func (f *found) saw(placeholder, w string) {
	if f != nil && placeholder == shapeName && f.name == "" {
		f.name = w
	} else if f != nil && placeholder == shapeIP && f.ip == "" {
		f.ip = w
	}
}

// shapeBufSize holds any message's shape: "1 " becomes "<n> ", no more.
const shapeBufSize = 2*maxMessageBytes + len(shapeName)

// appendShape appends the shape of s to b. It goes through s once, word by word; a word without a
// digit, '.', ':', '=' or '>' cannot hold anything a placeholder replaces, and is copied as it is.
// A backslash escapes the byte after it, a space too, as in a name CoreDNS prints ("a\
// b.example."). Every step is linear in the length of the word. f, if not nil, is told of names
// and addresses.
func appendShape(b []byte, s string, f *found) []byte {
	start, m := 0, charClass(0)
	for i := 0; i < len(s); i++ {
		k := scanned[s[i]]
		if k&classStop == 0 { // the commonest: a byte within a word, one look-up
			m |= k
			continue
		}
		c := s[i]
		if c == '\\' && i+1 < len(s) {
			i++
			m |= classes[s[i]]
			continue
		}
		if c != ' ' && c != '\t' {
			m |= classes[c]
			continue
		}
		if word := s[start:i]; queryName(word, s[i+1:]) {
			f.saw(shapeName, word[:len(word)-1])
			b = append(append(b, shapeName...), '.', c)
		} else if m&shaped == 0 && !maybeRR(s[start:i]) {
			b = append(b, s[start:i+1]...)
		} else {
			b = append(appendWord(b, s[start:i], m, f), c)
		}
		start, m = i+1, 0
	}
	if m&shaped == 0 && !maybeRR(s[start:]) {
		return append(b, s[start:]...)
	}
	return appendWord(b, s[start:], m, f)
}

// queryName tells whether w is a query's name as the errors plugin prints it: fully qualified,
// with a query type after it ("A:"). Then every byte of its labels is the name's, whatever a
// client chose: "c0://x.example." and ":a/b." are names, one token each. A name it does not tell
// of is found without the type (isName).
func queryName(w, rest string) bool {
	n := len(w)
	if n < 2 || w[n-1] != '.' || rest == "" || rest[0] < 'A' || rest[0] > 'Z' {
		return false
	}
	label := 0
	for i := 0; i < n-1; i++ {
		switch c := w[i]; {
		case c == '\\':
			k := escapeLen(w[i:])
			if k == 0 {
				return false
			}
			i += k - 1
		case c == '.':
			if label == 0 {
				return false
			}
			label = -1
		case c == '<' || unprinted[c]:
			return false
		}
		label++
	}
	if i := strings.IndexByte(rest, ' '); i >= 0 {
		rest = rest[:i]
	}
	return rrShape(strings.TrimSuffix(rest, ":")) == shapeType
}

// maxRRWord is the length of the longest query type or class CoreDNS prints: NSEC3PARAM,
// CLASS65535.
const maxRRWord = 10

// maybeRR tells, at the cost of a byte, whether w may be a query type or class, with punctuation.
func maybeRR(w string) bool {
	if w != "" && opening[w[0]] { // "HINFO, as the log plugin quotes a question
		w = w[1:]
	}
	return w != "" && w[0] >= 'A' && w[0] <= 'Z' && len(w) <= maxRRWord+2
}

// rrWords are the query types and classes as CoreDNS prints them, with their placeholders.
var rrWords = func() map[string]string {
	words := map[string]string{}
	for _, s := range dns.ClassToString {
		words[s] = shapeCls
	}
	for _, s := range dns.TypeToString { // ANY is a type and a class: a type
		words[s] = shapeType
	}
	return words
}()

// rrShape is the placeholder of a query type or class ("A", "TYPE65280", "CLASS3"), or "".
func rrShape(w string) string {
	switch w { // the commonest, without hashing: as rrWords has them
	case "A", "AAAA", "PTR", "SRV", "MX", "TXT", "CNAME", "NS", "SOA", "HTTPS", "SVCB", "ANY":
		return shapeType
	case "IN":
		return shapeCls
	}
	if p, ok := rrWords[w]; ok {
		return p
	}
	shape, n := shapeType, strings.TrimPrefix(w, "TYPE")
	if len(n) == len(w) {
		shape, n = shapeCls, strings.TrimPrefix(w, "CLASS")
	}
	if len(n) < len(w) && isDigits(n) && len(n) <= 5 {
		if v, err := strconv.Atoi(n); err == nil && v <= 65535 {
			return shape
		}
	}
	return ""
}

// trimClosing is the end of w without the punctuation after it (none escaped).
func trimClosing(w string) int {
	end := len(w)
	for end > 0 && closing[w[end-1]] && (end == 1 || w[end-2] != '\\' || !escaped(w, end-1)) {
		end--
	}
	return end
}

// appendWord appends the shape of one word, whose classes are m: each side
// of "->", and the value of key=value, shaped alone.
func appendWord(b []byte, w string, m charClass, f *found) []byte {
	if maybeRR(w) && m&(classDot|classEq|classGt) == 0 { // "A", "AAAA:", "IN,": no name can be one
		start, end := 0, trimClosing(w)
		if opening[w[0]] {
			start = 1
		}
		if p := rrShape(w[start:max(end, start)]); p != "" {
			return append(append(append(b, w[:start]...), p...), w[end:]...)
		}
	}
	switch {
	case m&shaped == 0:
		return append(b, w...)
	case m == classDigit: // the commonest: a count, a port, a code
		return append(b, shapeNum...)
	// a.example
	case m&(classColon|classEq|classGt) == 0 && !opening[w[0]] && !closing[w[len(w)-1]]:
		p := shapeOf(w, m)
		f.saw(p, w)
		return append(b, p...)
	}
	if m&classDot != 0 && m&(classEq|classGt) != 0 { // a query's name may hold them: "a->b.org."
		if start, end, ok := fqdn(w); ok {
			f.saw(shapeName, w[start:end])
			return append(append(append(b, w[:start]...), shapeName...), w[end:]...)
		}
	}
	if m&classGt != 0 && strings.Contains(w, "->") {
		return appendArrowSides(b, w, f)
	}
	if m&classEq != 0 { // key=value, a=b=value: the value alone
		i := strings.LastIndexByte(w, '=')
		b, w = append(b, w[:i+1]...), w[i+1:]
		if m = classOf(w); m&shaped == 0 {
			return append(b, w...)
		}
	}
	return appendValue(b, w, m, f)
}

// appendArrowSides appends the shape of a word with "->": each side shaped alone.
func appendArrowSides(b []byte, w string, f *found) []byte {
	start, pm := 0, charClass(0)
	for i := 0; i < len(w); i++ {
		if w[i] == '-' && i+1 < len(w) && w[i+1] == '>' {
			b = append(appendWord(b, w[start:i], pm, f), "->"...)
			start, pm = i+2, 0
			i++
			continue
		}
		pm |= classes[w[i]]
	}
	return appendWord(b, w[start:], pm, f)
}

// appendValue appends the shape of a word with no "->" left, or of a key=value's value, whose
// classes are m: an address or a name within its punctuation.
func appendValue(b []byte, w string, m charClass, f *found) []byte {
	end := trimClosing(w)
	if end < len(w) { // "A:", "failed:": the punctuation alone may have been shaped
		if m = classOf(w[:end]); m&shaped == 0 {
			return append(b, w...)
		}
	}
	if m&classColon != 0 && isIPv6(w[:end]) { // before ':' is taken for punctuation: ::1
		f.saw(shapeIP, w[:end])
		return append(append(b, shapeIP...), w[end:]...)
	}
	start, bracket := 0, -1
	for start < end && opening[w[start]] {
		if w[start] == '[' {
			bracket = start
		}
		start++
	}
	// Of a run of openings, only the last '[' can open an address: the others have a '[' in it.
	if bracket >= 0 {
		if n, ok := bracketedIP(w[bracket:]); ok {
			f.saw(shapeIP, w[bracket:bracket+n])
			b = append(append(b, w[:bracket]...), shapeIP...)
			return append(b, w[bracket+n:]...)
		}
	}
	if start > 0 {
		m = classOf(w[start:end])
	}
	p := shapeOf(w[start:end], m)
	// A query's name, fully qualified, may have a '*' inside a label: "a*b.example."
	if p != shapeName && end < len(w) && w[end] == '.' && m&classDot != 0 &&
		isName(w[start:end], m, true) {
		p = shapeName
	}
	f.saw(p, w[start:end])
	return append(append(append(b, w[:start]...), p...), w[end:]...)
}

// fqdn finds in w a name as CoreDNS prints a query's, fully qualified, whatever printable bytes its
// labels hold ('*', '=', '>' among them), with punctuation around it: w[start:end], the final dot
// after it.
func fqdn(w string) (start, end int, ok bool) {
	end = trimClosing(w)
	for start < end && opening[w[start]] {
		start++
	}
	if end == len(w) || w[end] != '.' || start >= end {
		return 0, 0, false
	}
	return start, end, isName(w[start:end], classOf(w[start:end]), true)
}

// escaped tells whether w[i] follows a backslash that escapes it: an odd number of them.
func escaped(w string, i int) bool {
	n := 0
	for i > n && w[i-n-1] == '\\' {
		n++
	}
	return n%2 == 1
}

// Punctuation taken off a word's ends before it is classified.
var opening, closing = byteSet(`([{"'<:`), byteSet(`)]}"'>,;:.?!`)

func byteSet(chars string) (set [256]bool) {
	for i := 0; i < len(chars); i++ {
		set[chars[i]] = true
	}
	return set
}

// charClass is a set of the kinds of bytes in a word: one pass over a word
// tells which placeholders it could take, before any of them is tried.
type charClass uint16

const (
	classDigit     charClass = 1 << iota
	classHexLetter           // a-f, A-F
	// the letters of a duration's units but a hex digit: h, m, n, s, u, and µ's bytes
	classUnit
	classX // x, X: 0x...
	classDot
	classColon
	classDash
	classPlus
	classEq
	classGt
	classOther // the other letters, and every other byte

	// shaped are the classes without which no placeholder can replace a word or a part of it: a
	// name has a dot, a hex identifier a digit or 0x, an IPv6 address a colon.
	shaped = classDigit | classDot | classColon | classEq | classGt
)

var classes = func() (t [256]charClass) {
	for c := range t {
		t[c] = classOther
	}
	// The bytes of each class, in the order of the classes.
	for i, chars := range []string{"0123456789", "abcdefABCDEF", "hmnsu\xc2\xb5", "xX", ".", ":",
		"-", "+", "=", ">"} {
		for _, c := range []byte(chars) {
			t[c] = 1 << i
		}
	}
	return t
}()

// classStop marks, in scanned, the bytes appendShape stops at: a space or tab ends a word, a
// backslash escapes the byte after it. No word's classes hold it.
const classStop charClass = 1 << 15

// scanned is classes, with classStop on the bytes appendShape stops at.
var scanned = func() (t [256]charClass) {
	t = classes
	for _, c := range []byte(" \t\\") {
		t[c] |= classStop
	}
	return t
}()

// classOf is the set of the classes of w's bytes.
func classOf(w string) (m charClass) {
	for i := 0; i < len(w); i++ {
		m |= classes[w[i]]
	}
	return m
}

// only tells whether m has no class outside allowed.
func (m charClass) only(allowed charClass) bool { return m&^allowed == 0 }

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

// shapeOf is the placeholder of a word stripped of punctuation, or the word itself. m is the set of
// the classes of w's bytes: each test runs only when they allow it to match.
func shapeOf(w string, m charClass) string {
	switch {
	case w == "":
		return w
	case m.only(classDigit|classDot|classDash|classPlus) && isNumber(w):
		return shapeNum
	case len(w) == 36 && m.only(classDigit|classHexLetter|classDash) && isUUID(w):
		return shapeUUID
	case m.only(classDigit|classDot|classDash|classUnit) && isDuration(w):
		return shapeDur
	case (m&classColon != 0 || m.only(classDigit|classDot)) && isHostPort(w):
		return shapeIP
	case m.only(classDigit|classHexLetter|classX) && isHex(w):
		return shapeHex
	case m&classDot != 0 && isName(w, m, false):
		return shapeName
	}
	return w
}

func isDigits(w string) bool { return w != "" && endOfDigits(w, 0) == len(w) }

// isNumber: 12, -3, 4.5, 1.2.3 made of digits only is not one.
func isNumber(w string) bool {
	if w[0] == '-' || w[0] == '+' {
		w = w[1:]
	}
	i := endOfDigits(w, 0)
	return i > 0 && (i == len(w) || w[i] == '.' && isDigits(w[i+1:]))
}

func isUUID(w string) bool {
	for i := 0; i < len(w); i++ {
		if dash := i == 8 || i == 13 || i == 18 || i == 23; dash != (w[i] == '-') ||
			!dash && !isHexDigit(w[i]) {
			return false
		}
	}
	return len(w) == 36
}

func isHexDigit(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}

// isDuration: one or more number-unit pairs, as Go prints a time.Duration.
func isDuration(w string) bool {
	w = strings.TrimPrefix(w, "-")
	if w == "" {
		return false
	}
	for w != "" {
		i := 0
		for i < len(w) && (w[i] >= '0' && w[i] <= '9' || w[i] == '.') {
			i++
		}
		switch unit := w[i:]; {
		case i == 0 || unit == "": // no number, or no unit
			return false
		case len(unit) > 1 && unit[1] == 's' && (unit[0] == 'n' || unit[0] == 'u' ||
			unit[0] == 'm'):
			w = unit[2:]
		case strings.HasPrefix(unit, "µs"):
			w = unit[len("µs"):]
		case unit[0] == 'h' || unit[0] == 'm' || unit[0] == 's':
			w = unit[1:]
		default:
			return false
		}
	}
	return true
}

// isHostPort: an IPv4 or IPv6 address, or IPv4:port.
func isHostPort(w string) bool {
	i := strings.LastIndexByte(w, ':')
	if i < 0 {
		return isIPv4(w)
	}
	return isIPv4(w[:i]) && isDigits(w[i+1:]) || isIPv6(w)
}

func isIPv4(w string) bool {
	parts, digits := 1, 0
	for i := 0; i < len(w); i++ {
		switch c := w[i]; {
		case c >= '0' && c <= '9':
			if digits++; digits > 3 {
				return false
			}
		case c == '.' && digits > 0:
			if i+1 == len(w) { // a trailing dot ends it
				return parts == 4
			}
			parts, digits = parts+1, 0
		default:
			return false
		}
	}
	return parts == 4 && digits > 0
}

// isIPv6: hex groups and colons, with "::" or seven colons, maybe a zone
// or an IPv4 tail. One pass over w: it runs once a word.
func isIPv6(w string) bool {
	colons, double, last, bad := 0, false, -1, -1
	for i := 0; i < len(w); i++ {
		switch c := w[i]; {
		case c == ':':
			colons, double, last = colons+1, double || i > 0 && w[i-1] == ':', i
		case c == '%': // the zone: it ends the loop
			w = w[:i]
		case bad < 0 && !isHexDigit(c):
			bad = i
		}
	}
	if colons < 2 || colons > 7 || colons < 7 && !double {
		return false
	}
	return bad < 0 || bad > last && isIPv4(w[last+1:])
}

// isHex: 0x followed by hex digits, or 8 hex digits or more with a digit
// among them (so that a word like "deadbeef" is one, "accepted" is not).
func isHex(w string) bool {
	digit := len(w) > 2 && w[0] == '0' && (w[1] == 'x' || w[1] == 'X')
	if digit {
		w = w[2:]
	} else if len(w) < 8 {
		return false
	}
	for i := 0; i < len(w); i++ {
		if !isHexDigit(w[i]) {
			return false
		}
		digit = digit || w[i] <= '9'
	}
	return digit
}

// isName: two labels or more of the bytes CoreDNS prints unescaped in a name (printable ASCII but .
// space ' @ ; ( ) " \, '*' as a whole label only unless fq) or of its escapes of the others (\DDD,
// \. and the like), with a letter or an escape somewhere; no URL. m is the classes of w's bytes;
// fq,
// that w was followed by the final dot of a query's name, which a Go type (*v1.Pod) has not.
func isName(w string, m charClass, fq bool) bool {
	letter, dot, labelLen := false, false, 0
	for i := 0; i < len(w); i++ {
		switch c := w[i]; {
		case c == '\\':
			n := escapeLen(w[i:])
			if n == 0 {
				return false
			}
			letter, dot = true, dot || w[i+1] == '.'
			i += n - 1
		case c == '.':
			if labelLen == 0 {
				return false
			}
			dot, labelLen = true, 0
			continue
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z':
			letter = true
		case unprinted[c],
			// a Go type's *v1.Pod
			c == '*' && !fq && (labelLen > 0 || i+1 < len(w) && w[i+1] != '.'):
			return false
		}
		labelLen++
	}
	// a URL
	return letter && dot && labelLen > 0 && (m&classColon == 0 || !strings.Contains(w, "://"))
}

// unprinted are the bytes CoreDNS escapes in a name's label: no printable ASCII, or ' @ ; ( ) ".
var unprinted = func() (set [256]bool) {
	for c := range set {
		set[c] = c <= ' ' || c > '~' || strings.IndexByte(`'@;()"`, byte(c)) >= 0
	}
	return set
}()

// escapeLen is the length of the escape w starts with: CoreDNS's \DDD and
// \X (X no digit), eventMessage's \xHH and \uHHHH; 0 when it is none.
func escapeLen(w string) int {
	switch {
	case len(w) < 2:
		return 0
	case w[1] == 'x' && len(w) >= 4:
		return 4
	case w[1] == 'u' && len(w) >= 6:
		return 6
	case w[1] < '0' || w[1] > '9':
		return 2
	case len(w) >= 4 && isDigits(w[1:4]):
		return 4
	}
	return 0
}
