package k8s_event

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/coredns/caddy"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
)

// The seed corpora are in testdata/fuzz; plain `go test` runs them.

// FuzzParse feeds arbitrary text to parse as the body of a k8s_event block.
func FuzzParse(f *testing.F) {
	f.Fuzz(func(t *testing.T, body string) {
		input := "k8s_event {\n" + body + "\n}"
		cfg, err := parse(caddy.NewTestController("dns", input))
		if err != nil {
			return
		}
		if cfg.levels == 0 || cfg.levels&^all != 0 {
			t.Errorf("%q: levels out of range: %b", input, cfg.levels)
		}
		if !(cfg.qps > 0 && cfg.qps <= maxQPS) {
			t.Errorf("%q: QPS out of range (0, %g]: %v", input, maxQPS, cfg.qps)
		}
		if cfg.burst < 1 || cfg.burst > maxBurst {
			t.Errorf("%q: burst out of range [1, %d]: %d", input, maxBurst, cfg.burst)
		}
		if cfg.cacheSize < 1 || cfg.cacheSize > maxCacheSize {
			t.Errorf("%q: cache size out of range [1, %d]: %d", input, maxCacheSize, cfg.cacheSize)
		}

		// What was accepted, written out in full, reads back the same.
		canonical := fmt.Sprintf("k8s_event {\nlevel %s\nrate %s %d %d\n}",
			cfg.levels, strconv.FormatFloat(cfg.qps, 'g', -1, 64), cfg.burst, cfg.cacheSize)
		again, err := parse(caddy.NewTestController("dns", canonical))
		if err != nil {
			t.Fatalf("%q: accepted as %q, which does not parse: %v", input, canonical, err)
		}
		cfg.rateSet = true
		if again != cfg {
			t.Errorf("%q: accepted as %+v, read back as %+v", input, cfg, again)
		}
	})
}

// FuzzEventMessage checks that any log line makes a message, and an event,
// that the API server takes.
func FuzzEventMessage(f *testing.F) {
	refs := []corev1.ObjectReference{
		testRef,
		{Kind: "Namespace", APIVersion: "v1", Name: metav1.NamespaceDefault}, // as podFromEnv without the downward API
	}
	names := newEventNames()
	f.Fuzz(func(t *testing.T, s string) {
		msg := eventMessage(s)
		if !utf8.ValidString(msg) {
			t.Errorf("%q: message is not valid UTF-8: %q", s, msg)
		}
		if strings.IndexByte(msg, 0) >= 0 {
			t.Errorf("%q: message has a NUL byte: %q", s, msg)
		}
		if len(msg) > maxMessageBytes {
			t.Errorf("%q: message has %d bytes, more than %d", s, len(msg), maxMessageBytes)
		}
		if strings.IndexFunc(msg, hidden) >= 0 {
			t.Errorf("%q: message has a control character: %q", s, msg)
		}
		clean := len(s) <= maxMessageBytes && utf8.ValidString(s) && strings.IndexFunc(s, hidden) < 0
		if clean && msg != s {
			t.Errorf("%q: expected the message unchanged, got %q", s, msg)
		}

		for _, ref := range refs {
			ns := ref.Namespace
			if ns == "" {
				ns = metav1.NamespaceDefault
			}
			for l := range numLevels {
				spec := writeSpec{key: eventKey{level: l, plugin: "plugin/errors: ", message: msg}, message: msg, count: 1, first: epoch, last: epoch}
				ev := newEvent(ref, testNode, ns, names.next(ref.Name, epoch), spec)
				for _, problem := range eventProblems(ev) {
					t.Errorf("%q: %s event: %s", s, l, problem)
				}
			}
		}
	})
}

// eventProblems applies what the API server checks of a core/v1 Event on
// create (ValidateEventCreate, and the events.k8s.io limits), and that the
// message survives the trip through JSON.
func eventProblems(ev *corev1.Event) []string {
	var problems []string
	for _, msg := range validation.IsDNS1123Subdomain(ev.Name) {
		problems = append(problems, "name "+ev.Name+": "+msg)
	}
	for _, msg := range validation.IsDNS1123Label(ev.Namespace) {
		problems = append(problems, "namespace "+ev.Namespace+": "+msg)
	}
	if ns := ev.InvolvedObject.Namespace; ns != ev.Namespace && (ns != "" || ev.Namespace != metav1.NamespaceDefault) {
		problems = append(problems, fmt.Sprintf("involvedObject.namespace %q does not match namespace %q", ns, ev.Namespace))
	}
	if ev.Type != corev1.EventTypeNormal && ev.Type != corev1.EventTypeWarning {
		problems = append(problems, "type: "+ev.Type)
	}
	if ev.Reason == "" || len(ev.Reason) > 128 {
		problems = append(problems, "reason: "+ev.Reason)
	}
	for _, msg := range validation.IsQualifiedName(ev.Reason) {
		problems = append(problems, "reason "+ev.Reason+": "+msg)
	}
	if ev.Action == "" || len(ev.Action) > 128 {
		problems = append(problems, "action: "+ev.Action)
	}
	for _, msg := range validation.IsQualifiedName(ev.ReportingController) {
		problems = append(problems, "reportingController "+ev.ReportingController+": "+msg)
	}
	if ev.ReportingInstance == "" || len(ev.ReportingInstance) > 128 {
		problems = append(problems, "reportingInstance: "+ev.ReportingInstance)
	}
	if len(ev.Message) > maxMessageBytes {
		problems = append(problems, fmt.Sprintf("message has %d bytes", len(ev.Message)))
	}
	for k, v := range ev.Labels {
		for _, msg := range append(validation.IsQualifiedName(k), validation.IsValidLabelValue(v)...) {
			problems = append(problems, fmt.Sprintf("label %s=%s: %s", k, v, msg))
		}
	}
	if len(ev.Labels) != 2 {
		problems = append(problems, fmt.Sprintf("labels %v, want plugin and level", ev.Labels))
	}
	if ev.Count < 1 {
		problems = append(problems, fmt.Sprintf("count %d", ev.Count))
	}
	b, err := json.Marshal(ev)
	if err != nil {
		return append(problems, err.Error())
	}
	var back corev1.Event
	if err := json.Unmarshal(b, &back); err != nil {
		return append(problems, err.Error())
	}
	if back.Message != ev.Message {
		problems = append(problems, fmt.Sprintf("message %q comes back from JSON as %q", ev.Message, back.Message))
	}
	return problems
}
