package install

import (
	"errors"
	"strings"
)

// sayPlan says, before its writes, what the install p plans: from the
// plan's report.
func (r *run) sayPlan(p *installPlan) {
	if r.o.DryRun {
		r.printf("# dry run: nothing is changed\n")
	}
	res := &r.res
	r.printf("%s: image %s -> %s (CoreDNS %s -> %s)\n", ref(p.w), res.ImageBefore, res.ImageAfter, res.CoreDNSBefore, res.CoreDNSAfter)
	r.printf("configmap keys the pods read:\n%s", indent(strings.Join(res.Keys, "\n")))
	r.printf("rollout: %s\n%s", res.Rollout, r.extrasText())
}

// Result is what a run of install or uninstall did, or with DryRun would
// do: with Options.JSON it is written to Out as one JSON document.
type Result struct {
	Command    string `json:"command"`
	DryRun     bool   `json:"dryRun"`
	Deployment string `json:"deployment,omitempty"`
	// Kind is the kind of the workload that runs CoreDNS: Deployment or
	// DaemonSet.
	Kind string `json:"kind,omitempty"`
	// Layout is how the cluster runs CoreDNS (see StatusReport.Layout).
	Layout string `json:"layout,omitempty"`
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
	// FlowControl says the priority level of the event writes at the API
	// server; Fleet, the fleet line of the Corefile and why.
	FlowControl string `json:"flowControl,omitempty"`
	Fleet       string `json:"fleet,omitempty"`
	// Changes are the writes, in order.
	Changes []Change `json:"changes"`
	// Warnings are what --force went on despite.
	Warnings []string `json:"warnings,omitempty"`
	Error    string   `json:"error,omitempty"`
	// Refused is set when the run changed nothing for a reason that
	// --force, or the operator's own change, would settle.
	Refused bool `json:"refused,omitempty"`
	// Access says whether the one who runs it may make every write the
	// run needs (an access review per verb, then a server-side dry run of
	// each write); Missing names what is not granted or refused.
	Access  string   `json:"access,omitempty"`
	Missing []string `json:"missing,omitempty"`
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
