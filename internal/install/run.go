package install

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

// run is one install or uninstall: its options and what it reports.
type run struct {
	o   *Options
	res Result
	// created take back what the run wrote, for a run cut off before its
	// patch, or a rollout that fails and is put back.
	created []undoStep
	// done are the writes made, kept in the report when a conflict
	// starts the run over.
	done []Change
}

// planner is a planner for an attempt of the run.
func (r *run) planner() *planner {
	return &planner{o: r.o, command: r.res.Command}
}

// report takes what a plan says of itself into the run's report, and
// says its warnings.
func (r *run) report(rep planReport) {
	res := &r.res
	res.Deployment, res.Kind, res.Layout = rep.Deployment, rep.Kind, rep.Layout
	res.ImageBefore, res.ImageAfter = rep.ImageBefore, rep.ImageAfter
	res.CoreDNSBefore, res.CoreDNSAfter = rep.CoreDNSBefore, rep.CoreDNSAfter
	res.Keys, res.Rollout = rep.Keys, rep.Rollout
	res.FlowControl, res.Fleet = rep.FlowControl, rep.Fleet
	for _, w := range rep.Warnings {
		r.warn(w)
	}
}

// restart begins the report again for another attempt after a conflict:
// with the writes already made.
func (r *run) restart() {
	// Never nil: -o json writes "changes": [] on every path.
	r.res.Changes, r.res.Warnings = append([]Change{}, r.done...), nil
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
	if r.res.Changes == nil {
		r.res.Changes = []Change{}
	}
	if r.o.JSON && r.o.Out != nil {
		b, _ := json.MarshalIndent(r.res, "", "  ")
		fmt.Fprintf(r.o.Out, "%s\n", b)
	}
	return err
}

// undoStep takes back one write of the run.
type undoStep struct {
	write Change
	// undo deletes what write created, or puts back what it changed; it
	// returns errKept when it leaves the object as it is.
	undo func(context.Context) error
}

// errKept is an undo that leaves the object as it is.
var errKept = errors.New("kept")

// takeBack deletes, or puts back, what the run created, even when ctx
// is done, and lists each as a change.
func (r *run) takeBack(ctx context.Context) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	for _, u := range slices.Backward(r.created) {
		switch err := u.undo(ctx); {
		case errors.Is(err, errKept):
		case err != nil && !apierrors.IsNotFound(err):
			r.warn(fmt.Sprintf("taking back what the run created: %v", err))
		case u.write.Action == "create":
			r.change(Change{Action: "delete", Kind: u.write.Kind, Name: u.write.Name, Detail: "taken back: the run did not finish"}, fmt.Sprintf("delete %s %s", u.write.Kind, u.write.Name))
		default:
			r.change(Change{Action: "update", Kind: u.write.Kind, Name: u.write.Name, Detail: "put back as it was: the run did not finish"}, fmt.Sprintf("put back %s %s", u.write.Kind, u.write.Name))
		}
	}
	r.created = nil
}

// wrote takes what apply went through into the report: each step said,
// and each write made kept for the report of a retry and to be taken
// back.
func (r *run) wrote(a applied) {
	for i, s := range a.steps {
		r.change(s.change, s.line)
		if !a.written[i] {
			continue
		}
		r.done = append(r.done, s.change)
		if s.undo != nil {
			r.created = append(r.created, undoStep{s.change, s.undo})
		}
	}
}
