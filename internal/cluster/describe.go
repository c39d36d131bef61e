package cluster

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// DescribeEvents lists events one a line, for test failures and logs:
// name, type, reason, count and the start of the message.
func DescribeEvents(evs []corev1.Event) string {
	var b strings.Builder
	for _, e := range evs {
		msg := e.Message
		if len(msg) > 120 {
			msg = msg[:120] + "..."
		}
		fmt.Fprintf(&b, "  %s %s %s count=%d %q\n", e.Name, e.Type, e.Reason, e.Count, msg)
	}
	if b.Len() == 0 {
		return "  (none)\n"
	}
	return b.String()
}

// EventsWith returns the events with reason (any, when "") whose message
// contains substr.
func EventsWith(evs []corev1.Event, reason, substr string) []corev1.Event {
	var out []corev1.Event
	for _, e := range evs {
		if (reason == "" || e.Reason == reason) && strings.Contains(e.Message, substr) {
			out = append(out, e)
		}
	}
	return out
}
