package install

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
)

// Result is what a run of install or uninstall did, or with DryRun would
// do: with Options.JSON it is written to Out as one JSON document.
type Result struct {
	Command    string `json:"command"`
	DryRun     bool   `json:"dryRun"`
	Deployment string `json:"deployment,omitempty"`
	// ImageBefore and ImageAfter are the CoreDNS images before and after.
	ImageBefore string `json:"imageBefore,omitempty"`
	ImageAfter  string `json:"imageAfter,omitempty"`
	// CoreDNSBefore and CoreDNSAfter are the CoreDNS releases those
	// images run, as their tags name them, or "unknown".
	CoreDNSBefore string `json:"corednsBefore,omitempty"`
	CoreDNSAfter  string `json:"corednsAfter,omitempty"`
	// Keys say, key by key, what the Corefile ConfigMap the pods read
	// keeps of the operator's.
	Keys []string `json:"keys,omitempty"`
	// Rollout says what the rollout does to availability.
	Rollout string `json:"rollout,omitempty"`
	// Changes are the writes, in order.
	Changes []Change `json:"changes"`
	// Warnings are what --force went on despite.
	Warnings []string `json:"warnings,omitempty"`
	Error    string   `json:"error,omitempty"`
	// Refused is set when the run changed nothing for a reason that
	// --force, or the operator's own change, would settle.
	Refused bool `json:"refused,omitempty"`
	// Undo is the command that puts back what a failed run changed, when
	// the run could not.
	Undo string `json:"undo,omitempty"`
}

// Change is one write.
type Change struct {
	// Action is create, update, replace, patch, delete or keep.
	Action string `json:"action"`
	Kind   string `json:"kind"`
	Name   string `json:"name"`
	// Detail is a diff, a patch or a reason.
	Detail string `json:"detail,omitempty"`
	// When is "now" or "after the rollout".
	When string `json:"when,omitempty"`
}

// RefusedError is an install or uninstall that changed nothing because
// another owner, or the objects' state, calls for a decision.
type RefusedError struct {
	Reasons []string
}

func (e *RefusedError) Error() string {
	if len(e.Reasons) == 1 {
		return e.Reasons[0]
	}
	return "refused:\n  - " + strings.Join(e.Reasons, "\n  - ")
}

// IsRefused reports whether err is a RefusedError.
func IsRefused(err error) bool {
	var r *RefusedError
	return errors.As(err, &r)
}

// run is one install or uninstall: its options and what it reports.
type run struct {
	o   *Options
	res Result
	// created are the deletes that take back what the run created, for
	// a rollout that fails and is put back.
	created []func(context.Context) error
	// done are the writes made, kept in the report when a conflict
	// starts the run over.
	done []Change
}

// restart begins the report again for another attempt after a conflict:
// with the writes already made.
func (r *run) restart() {
	r.res.Changes, r.res.Warnings = slices.Clone(r.done), nil
}

func newRun(o *Options, command string) *run {
	return &run{o: o, res: Result{Command: command, DryRun: o.DryRun, Changes: []Change{}}}
}

// printf writes text output; with JSON, nothing.
func (r *run) printf(format string, args ...any) {
	if r.o.Out != nil && !r.o.JSON {
		fmt.Fprintf(r.o.Out, format, args...)
	}
}

// change records a write and prints line, then the detail indented.
func (r *run) change(ch Change, line string) {
	if ch.Action == "keep" && slices.ContainsFunc(r.done, func(d Change) bool { return d.Kind == ch.Kind && d.Name == ch.Name }) {
		return // made by an earlier attempt of this run, and listed so
	}
	r.res.Changes = append(r.res.Changes, ch)
	if ch.Detail != "" && strings.Contains(ch.Detail, "\n") {
		r.printf("%s:\n%s", line, indent(ch.Detail))
		return
	}
	if ch.Detail != "" {
		r.printf("%s: %s\n", line, ch.Detail)
		return
	}
	r.printf("%s\n", line)
}

func (r *run) warn(msg string) {
	r.res.Warnings = append(r.res.Warnings, msg)
	r.printf("warning: %s\n", msg)
}

// finish writes the JSON result and returns err.
func (r *run) finish(err error) error {
	if err != nil {
		r.res.Error = err.Error()
		r.res.Refused = IsRefused(err)
	}
	if r.o.JSON && r.o.Out != nil {
		b, _ := json.MarshalIndent(r.res, "", "  ")
		fmt.Fprintf(r.o.Out, "%s\n", b)
	}
	return err
}

func indent(s string) string {
	var b strings.Builder
	for _, l := range strings.SplitAfter(s, "\n") {
		if l != "" {
			b.WriteString("    " + l)
		}
	}
	if !strings.HasSuffix(b.String(), "\n") {
		b.WriteString("\n")
	}
	return b.String()
}
