package k8s_event

import (
	"strings"
	"testing"
	"time"
	"unicode/utf8"
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
