package k8s_event

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

const (
	component = "CoreDNS"
	action    = "Logged"

	// maxMessageBytes is the events.k8s.io limit on a note; core/v1 has
	// none, but etcd and kubectl output are better off with it.
	maxMessageBytes = 1024
	maxInstanceLen  = 128
	maxNameLen      = 253
)

// eventMessage makes a log line fit for an event: valid UTF-8, no trailing newline, its controls
// escaped (escapeControls), and at most maxMessageBytes, cut in the middle (cutMiddle).
func eventMessage(s string) string {
	for s != "" && (s[len(s)-1] == '\n' || s[len(s)-1] == '\r') {
		s = s[:len(s)-1]
	}
	if printableASCII(s) { // the commonest: valid, with no control, in one pass
		return cutMiddle(s, maxMessageBytes)
	}
	if !utf8.ValidString(s) {
		s = strings.ToValidUTF8(s, "\uFFFD")
	}
	return cutMiddle(escapeControls(s), maxMessageBytes)
}

// printableASCII tells whether every byte of s is printable ASCII, from ' ' to '~'.
func printableASCII(s string) bool {
	i := 0
	for ; i+8 <= len(s); i += 8 {
		if !printable8(s[i : i+8]) {
			return false
		}
	}
	for ; i < len(s); i++ {
		if s[i] < ' ' || s[i] > '~' {
			return false
		}
	}
	return true
}

// printable8 tells whether the eight bytes of b are all printable ASCII: none below ' ', none
// from DEL up.
func printable8(b string) bool {
	x := uint64(b[0]) | uint64(b[1])<<8 | uint64(b[2])<<16 | uint64(b[3])<<24 |
		uint64(b[4])<<32 | uint64(b[5])<<40 | uint64(b[6])<<48 | uint64(b[7])<<56
	const ones, highs = 0x0101010101010101, 0x8080808080808080
	return ((x-ones*' ')|(x+ones*(0x80-0x7f))|x)&highs == 0
}

// escapeControls quotes, as Go does (\n, \x1b, \u202e), the control (C0 but tab, DEL, C1) and
// bidirectional characters of s: no line may move the cursor or turn text around in kubectl's
// output. Backslashes stay, so CoreDNS's escapes (\DDD, \.) read as in the log.
func escapeControls(s string) string {
	i := indexHidden(s)
	if i < 0 {
		return s
	}
	b := make([]byte, 0, len(s)+16)
	for _, r := range s[i:] {
		if !hidden(r) {
			b = utf8.AppendRune(b, r)
			continue
		}
		q := strconv.QuoteRune(r)
		b = append(b, q[1:len(q)-1]...)
	}
	return s[:i] + string(b)
}

// indexHidden is strings.IndexFunc(s, hidden), without a call per printable byte of ASCII.
func indexHidden(s string) int {
	i := 0
	for ; i+8 <= len(s); i += 8 { // eight bytes at a time while all are printable ASCII
		if !printable8(s[i : i+8]) {
			break // a byte below ' ', from DEL up, or not ASCII: look at each
		}
	}
	for i < len(s) {
		if c := s[i]; c-' ' < utf8.RuneSelf-1-' ' || c == '\t' {
			i++
			continue
		}
		r, n := utf8.DecodeRuneInString(s[i:])
		if hidden(r) {
			return i
		}
		i += n
	}
	return -1
}

func hidden(r rune) bool {
	return r != '\t' && (unicode.IsControl(r) || unicode.Is(unicode.Bidi_Control, r))
}

// cutMarker stands for the middle of a message cut by cutMiddle.
const cutMarker = " ...(cut)... "

// cutMiddle keeps both ends of s, at most limit bytes with cutMarker between them: an error's cause
// often ends its line ("... i/o timeout"). Cuts fall between runes, outside escapes.
func cutMiddle(s string, limit int) string {
	if len(s) <= limit {
		return s
	}
	room := max(limit-len(cutMarker), 0)
	head := room / 2
	for head > 0 && !boundary(s, head) {
		head--
	}
	tail := len(s) - (room - head)
	for !boundary(s, tail) {
		tail++
	}
	return s[:head] + cutMarker + s[tail:]
}

// boundary tells whether s may be cut at i: between runes, not in an escape (escapeLen).
func boundary(s string, i int) bool {
	if i < len(s) && !utf8.RuneStart(s[i]) {
		return false
	}
	from := max(i-5, 0)
	k := strings.LastIndexByte(s[from:i], '\\')
	return k < 0 || from+k+escapeLen(s[from+k:]) <= i
}

// writeSpec is what one write says of an event: a snapshot of its entry.
type writeSpec struct {
	key         eventKey
	message     string
	count       int64
	first, last time.Time
	name        string // set: patch this event
	end         bool   // the end of a storm: message is the whole message
}

// text is the message as written: a combined event says so after the
// plugin's prefix, so that every message starts with "plugin/NAME: ".
func (s writeSpec) text() string {
	if s.key.combined() {
		rest, ok := strings.CutPrefix(s.message, s.key.plugin)
		if !ok {
			return eventMessage(combinedPrefix + s.message)
		}
		return eventMessage(s.key.plugin + combinedPrefix + rest)
	}
	return s.message
}

// newEvent builds the Event that a first write creates.
func newEvent(ref corev1.ObjectReference, node, namespace, name string, s writeSpec) *corev1.Event {
	instance := ref.Name
	if len(instance) > maxInstanceLen {
		instance = instance[:maxInstanceLen]
	}
	reason, typ, message := s.key.level.reason(), s.key.level.eventType(), s.text()
	if s.end {
		reason, typ, message = endReason(s.key.level), corev1.EventTypeNormal, s.message
	}
	return &corev1.Event{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, Labels: map[string]string{
			labelPlugin: pluginLabel(s.key.plugin),
			labelLevel:  s.key.level.String(),
		}},
		InvolvedObject:      ref,
		Reason:              reason,
		Message:             message,
		Type:                typ,
		Source:              corev1.EventSource{Component: component, Host: node},
		FirstTimestamp:      metav1.NewTime(s.first),
		LastTimestamp:       metav1.NewTime(s.last),
		Count:               clampCount(s.count),
		Action:              action,
		ReportingController: component,
		ReportingInstance:   instance,
	}
}

// Labels on every event: the plugin whose logger wrote the line, and its
// level, so that `kubectl get events -l` and exporters select on them.
const (
	labelPlugin = "coredns.io/plugin"
	labelLevel  = "coredns.io/level"
)

// pluginLabel is the NAME of CoreDNS's prefix "plugin/NAME: " made a valid label value: at most 63
// characters of [A-Za-z0-9-_.], a letter or digit at each end; "unknown" when nothing is left.
func pluginLabel(prefix string) string {
	name := strings.TrimSuffix(strings.TrimPrefix(prefix, "plugin/"), ": ")
	b := []byte(name)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' ||
			c == '_' || c == '.') {
			b[i] = '_'
		}
	}
	name = string(b[:min(len(b), 63)])
	name = strings.TrimFunc(name, func(r rune) bool { return r == '-' || r == '_' || r == '.' })
	if name == "" {
		return "unknown"
	}
	return name
}

// countPatch is the strategic-merge patch of a repeat: count, last time and latest message.
func countPatch(s writeSpec) []byte {
	patch, _ := json.Marshal(map[string]any{
		"count":         clampCount(s.count),
		"lastTimestamp": metav1.NewTime(s.last),
		"message":       s.text(),
	})
	return patch
}

func clampCount(n int64) int32 { return int32(min(max(n, 0), math.MaxInt32)) }

// eventNames hands out names in client-go's form, <object>.<hex time>, strictly increasing within
// the process and ending in a random tag of the process, so that names never collide across
// replicas and restarts, even when every replica reports on namespace/default.
type eventNames struct {
	last int64
	tag  string
}

func newEventNames() *eventNames {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return &eventNames{tag: hex.EncodeToString(b)}
}

func (n *eventNames) next(object string, now time.Time) string {
	t := max(now.UnixNano(), n.last+1)
	n.last = t
	suffix := fmt.Sprintf(".%x%s", t, n.tag)
	if len(object)+len(suffix) > maxNameLen {
		object = strings.TrimRight(object[:maxNameLen-len(suffix)], ".-")
	}
	return object + suffix
}

// stormLines is the count from which an event of its own is a storm.
const stormLines = 10

// isStorm tells whether an event is a storm whose end is said: a combined
// event, or one of stormLines lines or more, at warning or error.
func isStorm(key eventKey, count int64) bool {
	if key.level != levelWarning && key.level != levelError {
		return false
	}
	return key.combined() || count >= stormLines
}

// endReason is the reason of the event that says a storm of level l ended.
func endReason(l level) string { return l.reason() + "Ended" }

// endMessage says that a storm ended: its plugin, its total count, what it was about (the shape of
// a combined event's lines, with its heavy hitters in top, or an event's own line) and its first
// and last time (UTC; with the date when the two are not on the same day), e.g. (one line):
//
//	plugin/errors: 195 lines like "<n> <name>. <type>: ...: i/o timeout"
//	(most: a.example.org ≥40) from 10:02:13 to 10:07:40, none since
//
// The end of the other shapes' lines (shapes > 0) gives their number of shapes instead:
// "plugin/errors: 40 lines of 12 other shapes from ...". prefix is the plugin's "plugin/NAME: ";
// about may start with it. The quoted text is cut, with a visible marker, to fit maxMessageBytes.
func endMessage(prefix, about, top string, shapes int, count int64, first, last time.Time) string {
	first, last = first.UTC(), last.UTC()
	layout := time.TimeOnly
	if first.YearDay() != last.YearDay() || first.Year() != last.Year() {
		layout = time.DateTime
	}
	noun := "lines"
	if count == 1 {
		noun = "line"
	}
	if top != "" {
		top = " (" + top + ")"
	}
	head := fmt.Sprintf("%s%d %s like \"", prefix, count, noun)
	tail := fmt.Sprintf("\"%s from %s to %s, none since", top, first.Format(layout),
		last.Format(layout))
	if shapes > 0 { // of the lines of other shapes: no line to quote
		n := fmt.Sprint(shapes)
		if shapes >= maxCountedShapes {
			n = "≥" + n
		}
		head, tail, about = fmt.Sprintf("%s%d %s of %s other shapes", prefix, count, noun, n),
			tail[1:], ""
	}
	line := eventMessage(strings.TrimPrefix(about, prefix))
	return head + cutMiddle(line, maxMessageBytes-len(head)-len(tail)) + tail
}
