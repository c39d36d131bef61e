package k8s_event

import (
	"bytes"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/miekg/dns"
	"k8s.io/apimachinery/pkg/util/validation"
)

func TestIsStorm(t *testing.T) {
	tests := []struct {
		key   eventKey
		count int64
		want  bool
	}{
		{eventKey{level: levelError, plugin: "plugin/errors: ", message: "m"}, 9, false},
		{eventKey{level: levelError, plugin: "plugin/errors: ", message: "m"}, 10, true},
		{eventKey{level: levelWarning, plugin: "plugin/forward: ", message: "m"}, 195, true},
		{eventKey{level: levelError, plugin: "plugin/errors: "}, 2, true}, // combined
		{eventKey{level: levelWarning, plugin: "plugin/errors: "}, 1, true},
		{eventKey{level: levelInfo, plugin: "plugin/errors: "}, 100, false},
		{eventKey{level: levelDebug, plugin: "plugin/errors: ", message: "m"}, 100, false},
		{eventKey{level: levelFatal, plugin: "plugin/errors: ", message: "m"}, 100, false},
	}
	for _, tt := range tests {
		if got := isStorm(tt.key, tt.count); got != tt.want {
			t.Errorf("isStorm(%+v, %d) = %v, want %v", tt.key, tt.count, got, tt.want)
		}
	}
}

func TestEndReason(t *testing.T) {
	if got := endReason(levelError); got != "CoreDNSErrorEnded" {
		t.Errorf("endReason(error) = %q", got)
	}
	if got := endReason(levelWarning); got != "CoreDNSWarningEnded" {
		t.Errorf("endReason(warning) = %q", got)
	}
}

func TestEndMessage(t *testing.T) {
	day := time.Date(2026, 3, 4, 0, 0, 0, 0, time.UTC)
	at := func(d time.Duration) time.Time { return day.Add(d) }
	line := "2 b.example.net. A: read udp 10.0.0.5:41234->10.0.0.2:53: i/o timeout"
	tests := []struct {
		name        string
		latest      string
		count       int64
		first, last time.Time
		want        string
	}{
		{"the example", "plugin/errors: " + line, 195, at(10*time.Hour + 2*time.Minute + 13*time.Second), at(10*time.Hour + 7*time.Minute + 40*time.Second),
			`plugin/errors: 195 lines like "` + line + `" from 10:02:13 to 10:07:40, none since`},
		{"latest without its prefix", line, 12, at(time.Hour), at(2 * time.Hour),
			`plugin/errors: 12 lines like "` + line + `" from 01:00:00 to 02:00:00, none since`},
		{"one line", "plugin/errors: " + line, 1, at(time.Hour), at(time.Hour),
			`plugin/errors: 1 line like "` + line + `" from 01:00:00 to 01:00:00, none since`},
		{"over midnight", "plugin/errors: " + line, 30, at(23*time.Hour + 59*time.Minute), at(24*time.Hour + time.Minute),
			`plugin/errors: 30 lines like "` + line + `" from 2026-03-04 23:59:00 to 2026-03-05 00:01:00, none since`},
		{"in UTC whatever the zone", "plugin/errors: " + line, 10, at(time.Hour).In(time.FixedZone("X", 3600*5)), at(2 * time.Hour).In(time.FixedZone("Y", -3600*3)),
			`plugin/errors: 10 lines like "` + line + `" from 01:00:00 to 02:00:00, none since`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := endMessage("plugin/errors: ", tt.latest, "", 0, tt.count, tt.first, tt.last); got != tt.want {
				t.Errorf("got  %s\nwant %s", got, tt.want)
			}
		})
	}
}

// TestEndMessageLongLine: a long latest line is cut in the middle, on a
// rune boundary and with the marker, so that its cause and the times still
// end the message.
func TestEndMessageLongLine(t *testing.T) {
	at := time.Date(2026, 3, 4, 10, 0, 0, 0, time.UTC)
	latest := "plugin/errors: " + strings.Repeat("é", 2000) + ": i/o timeout"
	got := endMessage("plugin/errors: ", latest, "", 0, 500, at, at.Add(time.Minute))
	if len(got) > maxMessageBytes {
		t.Errorf("%d bytes, want at most %d", len(got), maxMessageBytes)
	}
	if !utf8.ValidString(got) {
		t.Errorf("not valid UTF-8: %q", got)
	}
	if want := `éé: i/o timeout" from 10:00:00 to 10:01:00, none since`; !strings.HasSuffix(got, want) || !strings.Contains(got, cutMarker) {
		t.Errorf("ends %q, want %q", got[max(len(got)-80, 0):], want)
	}
	if want := `plugin/errors: 500 lines like "éé`; !strings.HasPrefix(got, want) {
		t.Errorf("begins %q, want %q", got[:40], want)
	}
	// A line with a NUL and invalid UTF-8 is made fit like every message.
	got = endMessage("plugin/errors: ", "plugin/errors: a\x00b\xffc", "", 0, 10, at, at)
	if !utf8.ValidString(got) || strings.IndexByte(got, 0) >= 0 {
		t.Errorf("not made fit: %q", got)
	}
}

func TestEventMessage(t *testing.T) {
	tests := []struct {
		name     string
		input    string
		expected string
	}{
		{"empty", "", ""},
		{"short", "plugin/errors: 2 example.org. A: i/o timeout", "plugin/errors: 2 example.org. A: i/o timeout"},
		{"percent", "plugin/errors: 100%d done %s", "plugin/errors: 100%d done %s"},
		{"trailing newline", "plugin/errors: x\n", "plugin/errors: x"},
		{"trailing newlines", "plugin/errors: x\n\n", "plugin/errors: x"},
		{"inner newline", "a\nb", `a\nb`},
		{"inner CR", "a\rb", `a\rb`},
		{"ESC", "a\x1b[2Jb", `a\x1b[2Jb`},
		{"BS", "ab\bc", `ab\bc`},
		{"BEL", "a\ab", `a\ab`},
		{"DEL", "a\x7fb", `a\x7fb`},
		{"C1", "a\u0085b\u009bc", `a\u0085b\u009bc`},
		{"tab", "a\tb", "a\tb"},
		{"right-to-left override", "a\u202eb", `a\u202eb`},
		{"bidi controls", "\u061c\u200e\u200f\u202a\u2066\u2069", `\u061c\u200e\u200f\u202a\u2066\u2069`},
		{"CoreDNS's escapes", `plugin/errors: 2 a\001\.b. A: i/o timeout`, `plugin/errors: 2 a\001\.b. A: i/o timeout`},
		{"not controls", "é日😀\u00a0\u200b", "é日😀\u00a0\u200b"},
		{"invalid UTF-8", "a\xffb", "a\uFFFDb"},
		{"invalid UTF-8 run", "a\xff\xfe\xfdb", "a\uFFFDb"},
		{"truncated rune", "a\xe6\x97", "a\uFFFD"},
		{"NUL", "a\x00b", `a\x00b`},
		{"NULs and invalid UTF-8", "\x00\xff\x00", `\x00` + "\uFFFD" + `\x00`},
		{"exactly the limit", strings.Repeat("x", maxMessageBytes), strings.Repeat("x", maxMessageBytes)},
		{"the limit and a newline", strings.Repeat("x", maxMessageBytes) + "\n", strings.Repeat("x", maxMessageBytes)},
		{"one over the limit", strings.Repeat("x", maxMessageBytes+1), strings.Repeat("x", (maxMessageBytes-len(cutMarker))/2) + cutMarker + strings.Repeat("x", maxMessageBytes-len(cutMarker)-(maxMessageBytes-len(cutMarker))/2)},
	}
	for _, test := range tests {
		if got := eventMessage(test.input); got != test.expected {
			t.Errorf("%s: expected %.60q, got %.60q", test.name, test.expected, got)
		}
	}
}

// TestEventMessageCutInTheMiddle: a message over the limit keeps its
// start and its end, cut between runes, with the marker between them.
func TestEventMessageCutInTheMiddle(t *testing.T) {
	tests := []struct {
		name  string
		input string
	}{
		{"ASCII", strings.Repeat("x", 5000)},
		{"2-byte runes", strings.Repeat("é", 2500)},
		{"3-byte runes", strings.Repeat("日", 1700)},
		{"4-byte runes", strings.Repeat("😀", 1300)},
		{"mixed runes", strings.Repeat("aé日😀", 400)},
		{"prefix shifts the runes", "plugin/errors: " + strings.Repeat("日", 1700)},
		{"trailing newline", strings.Repeat("é", 2500) + "\n"},
	}
	for _, test := range tests {
		got := eventMessage(test.input)
		checkCut(t, test.name, strings.TrimRight(test.input, "\n"), got)
	}
}

// checkCut checks that got is whole cut in the middle: at most
// maxMessageBytes of valid UTF-8 and less than a rune or an escape on
// either side short of it, the start of whole and its end around cutMarker.
func checkCut(t *testing.T, name, whole, got string) (head, tail string) {
	t.Helper()
	if len(got) > maxMessageBytes || len(got) < maxMessageBytes-10 {
		t.Errorf("%s: %d bytes, want at most %d and less than an escape on either side short of it", name, len(got), maxMessageBytes)
	}
	if !utf8.ValidString(got) {
		t.Errorf("%s: not valid UTF-8: %q", name, got)
	}
	head, tail, ok := strings.Cut(got, cutMarker)
	if !ok || !strings.HasPrefix(whole, head) || !strings.HasSuffix(whole, tail) {
		t.Errorf("%s: want the start of the line, %q and its end, got %.40q...%.40q", name, cutMarker, got, got[max(len(got)-40, 0):])
	}
	return head, tail
}

// TestEventMessageKeepsTheCause: a name of 255 bytes that CoreDNS prints
// with an escape each (1004 characters) leaves the cause at the end of the
// line in the message, and the cut splits none of the escapes.
func TestEventMessageKeepsTheCause(t *testing.T) {
	var wire []byte
	for _, n := range []int{63, 63, 63, 61} {
		wire = append(append(wire, byte(n)), bytes.Repeat([]byte{1}, n)...)
	}
	name, _, err := dns.UnpackDomainName(append(wire, 0), 0)
	if err != nil || len(name) != 1004 {
		t.Fatalf("name of %d characters (%v), want 1004", len(name), err)
	}
	line := "plugin/errors: 2 " + name + " A: read udp 10.0.0.5:41234->10.0.0.2:53: i/o timeout"
	head, tail := checkCut(t, "255-byte name", line, eventMessage(line))
	if !strings.HasPrefix(head, "plugin/errors: 2 \\001") || !strings.HasSuffix(tail, "A: read udp 10.0.0.5:41234->10.0.0.2:53: i/o timeout") {
		t.Errorf("lost the start or the cause: %q ... %q", head, tail)
	}
	for _, part := range []string{strings.TrimPrefix(head, "plugin/errors: 2 "), strings.TrimSuffix(tail, " A: read udp 10.0.0.5:41234->10.0.0.2:53: i/o timeout")} {
		if rest := strings.NewReplacer(`\001`, "", ".", "").Replace(part); rest != "" {
			t.Errorf("an escape was cut: %q keeps %q", part, rest)
		}
	}
}

// TestControlCharactersReachTheAPIEscaped: a line that would move the
// cursor, clear the screen or turn the text around in kubectl's output
// reaches the API as visible text.
func TestControlCharactersReachTheAPIEscaped(t *testing.T) {
	h, api, clk := newTestHarness(t, testConfig(all, 100, 100, 64))
	h.observe(ln(levelError, "errors", "2 a.example. A: \x1b[2J\r\n\b\a\u202eexample.org\n", clk.Now()))
	drain(h)
	if got, want := only(t, events(t, api)).Message, `plugin/errors: 2 a.example. A: \x1b[2J\r\n\b\a\u202eexample.org`; got != want {
		t.Errorf("message %q, want %q", got, want)
	}
}

// Controls grow fourfold into escapes: the limit holds after escaping, and
// the cut splits no escape.
func TestEventMessageEscapedThenCut(t *testing.T) {
	for _, input := range []string{strings.Repeat("\x00", 1000), strings.Repeat("a\xff", 1000), strings.Repeat("\u202e", 1000), strings.Repeat("\x1bé", 1000)} {
		got := eventMessage(input)
		head, tail := checkCut(t, fmt.Sprintf("%.12q", input), escapeControls(strings.ToValidUTF8(input, "\uFFFD")), got)
		for _, part := range []string{head, tail} {
			if rest := strings.NewReplacer(`\x00`, "", `\u202e`, "", `\x1b`, "", "é", "", "a\uFFFD", "").Replace(part); rest != "" && rest != "a" && rest != "\uFFFD" {
				t.Errorf("%.12q: an escape or a rune was cut: %q", input, rest)
			}
		}
	}
}

// nameTime is the time encoded in an event name given without a tag.
func nameTime(t *testing.T, name string) int64 {
	t.Helper()
	i := strings.LastIndexByte(name, '.')
	n, err := strconv.ParseInt(name[i+1:], 16, 64)
	if err != nil {
		t.Fatalf("name %q: %v", name, err)
	}
	return n
}

func TestEventNamesIncrease(t *testing.T) {
	var names eventNames // no tag: the time is the whole suffix
	seen := map[string]bool{}
	last := int64(0)
	times := []time.Time{epoch, epoch, epoch, epoch.Add(-time.Hour), epoch, epoch.Add(time.Nanosecond), epoch.Add(time.Second), epoch.Add(time.Second)}
	for i, now := range times {
		name := names.next("coredns-0", now)
		if seen[name] {
			t.Errorf("call %d: name %q given twice", i, name)
		}
		seen[name] = true
		if !strings.HasPrefix(name, "coredns-0.") {
			t.Errorf("call %d: expected %q to start with %q", i, name, "coredns-0.")
		}
		n := nameTime(t, name)
		if n <= last {
			t.Errorf("call %d: expected %q to sort after the last name (%x)", i, name, last)
		}
		if n < now.UnixNano() {
			t.Errorf("call %d: expected %q not to be before %v", i, name, now)
		}
		last = n
	}
	if first := names.next("x", epoch.Add(time.Minute)); nameTime(t, first) != epoch.Add(time.Minute).UnixNano() {
		t.Errorf("expected the name to follow the clock once it is ahead, got %q", first)
	}
}

// TestEventNamesTagged: each process's names end in a tag of its own, so
// that two replicas writing at the same nanosecond take different names.
func TestEventNamesTagged(t *testing.T) {
	a, b := newEventNames(), newEventNames()
	if a.tag == "" || a.tag == b.tag {
		t.Skipf("tags %q and %q: the random draw met, or none was drawn", a.tag, b.tag)
	}
	na, nb := a.next("coredns-0", epoch), b.next("coredns-0", epoch)
	if na == nb || !strings.HasSuffix(na, a.tag) || !strings.HasSuffix(nb, b.tag) {
		t.Errorf("names %q and %q, tags %q and %q", na, nb, a.tag, b.tag)
	}
}

func TestEventNamesLong(t *testing.T) {
	long := func(sep string) string { return strings.Repeat("a", 235) + sep + strings.Repeat("b", 14) }
	tests := []struct {
		name   string
		object string
	}{
		{"short", "coredns-0"},
		{"253 letters", strings.Repeat("a", 253)},
		{"250 letters", strings.Repeat("a", 250)},
		{"cut on a dash", long("-")},
		{"cut on a dot", long(".")},
		{"labels", strings.Repeat(strings.Repeat("c", 62)+".", 4)[:250]},
	}
	for _, test := range tests {
		if errs := validation.IsDNS1123Subdomain(test.object); len(errs) != 0 {
			t.Fatalf("%s: the object name is not valid itself: %v", test.name, errs)
		}
		names := newEventNames()
		got := map[string]bool{}
		for range 3 {
			name := names.next(test.object, epoch)
			if len(name) > maxNameLen {
				t.Errorf("%s: expected at most %d characters, got %d", test.name, maxNameLen, len(name))
			}
			if errs := validation.IsDNS1123Subdomain(name); len(errs) != 0 {
				t.Errorf("%s: %q is not a DNS subdomain: %v", test.name, name, errs)
			}
			if got[name] {
				t.Errorf("%s: name %q given twice", test.name, name)
			}
			got[name] = true
		}
	}
}

// BenchmarkEventMessage: what the scheduler's goroutine pays to make a
// message of a line, ordinary or full of controls.
func BenchmarkEventMessage(b *testing.B) {
	for _, bm := range []struct{ name, line string }{
		{"ordinary", "plugin/errors: 2 a.example.org. A: read udp 10.0.0.5:41234->10.0.0.2:53: i/o timeout"},
		{"controls", "plugin/errors: 2 a.example.org. A: \x1b[2J\r\n\u202e: i/o timeout"},
		{"long", "plugin/errors: 2 " + strings.Repeat(`\001`, 300) + " A: read udp 10.0.0.5:41234->10.0.0.2:53: i/o timeout"},
	} {
		b.Run(bm.name, func(b *testing.B) {
			for range b.N {
				eventMessage(bm.line)
			}
		})
	}
}

// TestIndexHiddenFindsEveryByteAtEveryPlace: the first hidden character is
// found wherever it falls, within or after the eight-byte steps, behind
// bytes that border the printable range.
func TestIndexHiddenFindsEveryByteAtEveryPlace(t *testing.T) {
	for _, pad := range []byte{' ', '~', 'a', '\t'} {
		for n := range 20 {
			for c := range 256 {
				s := strings.Repeat(string(pad), n) + string(rune(c)) + "tail"
				if got, want := indexHidden(s), strings.IndexFunc(s, hidden); got != want {
					t.Fatalf("indexHidden(%q) = %d, want %d", s, got, want)
				}
			}
		}
	}
}

// A line taken as it is, printable ASCII, is one eventMessage's full checks leave as it is: every
// byte at every place, within or after the eight-byte steps, behind bytes that border the range.
func TestPrintableLinesAreTakenAsTheyAre(t *testing.T) {
	for _, pad := range []byte{' ', '~', 'a', '\t'} {
		for n := range 20 {
			for c := range 256 {
				s := strings.Repeat(string(pad), n) + string([]byte{byte(c)}) + "tail"
				want := true
				for i := range len(s) {
					want = want && s[i] >= ' ' && s[i] <= '~'
				}
				if got := printableASCII(s); got != want {
					t.Fatalf("printableASCII(%q) = %v, want %v", s, got, want)
				}
				if want && (!utf8.ValidString(s) || escapeControls(s) != s) {
					t.Fatalf("%q is taken as it is, but the checks change it", s)
				}
			}
		}
	}
}
