package k8s_event

import (
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

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
			if got := endMessage("plugin/errors: ", tt.latest, tt.count, tt.first, tt.last); got != tt.want {
				t.Errorf("got  %s\nwant %s", got, tt.want)
			}
		})
	}
}

// TestEndMessageLongLine: a long latest line is cut, on a rune boundary
// and with the marker, so that the times still end the message.
func TestEndMessageLongLine(t *testing.T) {
	at := time.Date(2026, 3, 4, 10, 0, 0, 0, time.UTC)
	latest := "plugin/errors: " + strings.Repeat("é", 2000)
	got := endMessage("plugin/errors: ", latest, 500, at, at.Add(time.Minute))
	if len(got) > maxMessageBytes {
		t.Errorf("%d bytes, want at most %d", len(got), maxMessageBytes)
	}
	if !utf8.ValidString(got) {
		t.Errorf("not valid UTF-8: %q", got)
	}
	if want := truncMarker + `" from 10:00:00 to 10:01:00, none since`; !strings.HasSuffix(got, want) {
		t.Errorf("ends %q, want %q", got[max(len(got)-80, 0):], want)
	}
	if want := `plugin/errors: 500 lines like "éé`; !strings.HasPrefix(got, want) {
		t.Errorf("begins %q, want %q", got[:40], want)
	}
	// A line with a NUL and invalid UTF-8 is made fit like every message.
	got = endMessage("plugin/errors: ", "plugin/errors: a\x00b\xffc", 10, at, at)
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
		{"inner newline", "a\nb", "a\nb"},
		{"invalid UTF-8", "a\xffb", "a\uFFFDb"},
		{"invalid UTF-8 run", "a\xff\xfe\xfdb", "a\uFFFDb"},
		{"truncated rune", "a\xe6\x97", "a\uFFFD"},
		{"NUL", "a\x00b", "a\uFFFDb"},
		{"NULs and invalid UTF-8", "\x00\xff\x00", "\uFFFD\uFFFD\uFFFD"},
		{"exactly the limit", strings.Repeat("x", maxMessageBytes), strings.Repeat("x", maxMessageBytes)},
		{"the limit and a newline", strings.Repeat("x", maxMessageBytes) + "\n", strings.Repeat("x", maxMessageBytes)},
		{"one over the limit", strings.Repeat("x", maxMessageBytes+1), strings.Repeat("x", maxMessageBytes-len(truncMarker)) + truncMarker},
	}
	for _, test := range tests {
		if got := eventMessage(test.input); got != test.expected {
			t.Errorf("%s: expected %.60q, got %.60q", test.name, test.expected, got)
		}
	}
}

func TestEventMessageTruncated(t *testing.T) {
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
		if len(got) > maxMessageBytes {
			t.Errorf("%s: expected at most %d bytes, got %d", test.name, maxMessageBytes, len(got))
		}
		if len(got) < maxMessageBytes-(utf8.UTFMax-1) {
			t.Errorf("%s: expected the cut to lose less than a rune, got %d bytes", test.name, len(got))
		}
		if !utf8.ValidString(got) {
			t.Errorf("%s: expected valid UTF-8, got %q", test.name, got[len(got)-len(truncMarker)-8:])
		}
		kept, ok := strings.CutSuffix(got, truncMarker)
		if !ok {
			t.Errorf("%s: expected the message to end with %q, got %q", test.name, truncMarker, got[max(0, len(got)-20):])
		}
		if !strings.HasPrefix(test.input, kept) {
			t.Errorf("%s: expected the kept part to be a prefix of the input", test.name)
		}
	}
}

// NUL bytes grow threefold into U+FFFD: the limit holds after replacing.
func TestEventMessageReplacedThenTruncated(t *testing.T) {
	for _, input := range []string{strings.Repeat("\x00", 1000), strings.Repeat("a\xff", 1000)} {
		got := eventMessage(input)
		if len(got) > maxMessageBytes || !utf8.ValidString(got) || strings.IndexByte(got, 0) >= 0 {
			t.Errorf("%.20q: expected at most %d bytes of valid UTF-8 without NUL, got %d bytes", input, maxMessageBytes, len(got))
		}
		if !strings.HasSuffix(got, truncMarker) {
			t.Errorf("%.20q: expected the message to end with %q", input, truncMarker)
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
