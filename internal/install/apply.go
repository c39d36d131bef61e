package install

import (
	"context"
	"errors"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
)

// step is one write of a plan: what it changes, the line that says it,
// the write itself and what takes it back.
type step struct {
	change Change
	line   string
	do     func(ctx context.Context) error // nil: nothing to write; errKept: there already
	undo   func(ctx context.Context) error // what takes it back when the run fails
	needs  []need                          // the rights do and undo need
	dry    func(ctx context.Context) error // the server-side dry run of do; nil: none alone
}

// applied is what apply went through: each step said, in order, and
// whether its write was made.
type applied struct {
	steps   []step
	written []bool
}

// wrote reports whether apply made any write.
func (a applied) wrote() bool {
	return slices.Contains(a.written, true)
}

// apply makes the writes of steps in order, or with dry none: it returns
// what it went through, up to a write that failed, and that failure.
func apply(ctx context.Context, steps []step, dry bool) (applied, error) {
	var a applied
	for _, s := range steps {
		if dry || s.do == nil {
			a.steps, a.written = append(a.steps, s), append(a.written, false)
			continue
		}
		err := s.do(ctx)
		if err != nil && !errors.Is(err, errKept) {
			return a, fmt.Errorf("%s: %w", s.line, err)
		}
		a.steps, a.written = append(a.steps, s), append(a.written, err == nil)
	}
	return a, nil
}

// add is a, then b.
func (a applied) add(b applied) applied {
	return applied{steps: append(a.steps, b.steps...), written: append(a.written, b.written...)}
}

// applyStep makes the write of s, as apply does, and returns what it went
// through and the write's own error, unwrapped: nothing when it failed.
func applyStep(ctx context.Context, s step) (applied, error) {
	if s.do == nil {
		return applied{steps: []step{s}, written: []bool{false}}, nil
	}
	err := s.do(ctx)
	if err != nil && !errors.Is(err, errKept) {
		return applied{}, err
	}
	return applied{steps: []step{s}, written: []bool{err == nil}}, nil
}

// installSteps are the writes of the install p plans, in order, up to the
// workload's patch; with dry, what follows the rollout too.
func installSteps(c kubernetes.Interface, p *installPlan, dry bool) []step {
	var steps []step
	if p.genThere {
		steps = append(steps, step{change: Change{Action: "keep", Kind: "configmap", Name: p.w.meta().Namespace + "/" + p.gen.Name, Detail: "there already"}, line: "configmap " + p.w.meta().Namespace + "/" + p.gen.Name + " is there"})
	} else {
		steps = append(steps, configMapStep(c, p))
	}
	steps = append(steps, p.rbac...)
	return append(steps, patchSteps(c, p, dry)...)
}

// configMapStep creates the ConfigMap the pods will read; its undo
// deletes it unless the workload reads it all the same (a patch that went
// through, its answer lost).
func configMapStep(c kubernetes.Interface, p *installPlan) step {
	ns, gen, cms := p.w.meta().Namespace, p.gen, c.CoreV1().ConfigMaps(p.w.meta().Namespace)
	return step{
		change: Change{Action: "create", Kind: "configmap", Name: ns + "/" + gen.Name, Detail: p.diff},
		line:   fmt.Sprintf("create configmap %s/%s, the Corefile of %s with kubeapi and k8s_event", ns, gen.Name, p.source),
		do: func(ctx context.Context) error {
			_, err := cms.Create(ctx, gen, metav1.CreateOptions{FieldManager: FieldManager})
			if apierrors.IsAlreadyExists(err) {
				return errKept
			}
			return err
		},
		undo: func(ctx context.Context) error {
			now, err := p.w.get(ctx, c)
			switch {
			case err != nil:
				return err
			case slices.ContainsFunc(now.template().Spec.Volumes, func(v corev1.Volume) bool {
				return v.ConfigMap != nil && v.ConfigMap.Name == gen.Name
			}):
				return errKept
			}
			return cms.Delete(ctx, gen.Name, metav1.DeleteOptions{})
		},
	}
}

// patchSteps patch the workload, or say it has k8s_event already; with
// dry, what follows the rollout too.
func patchSteps(c kubernetes.Interface, p *installPlan, dry bool) []step {
	w, kind, name := p.w, kindName(p.w), nsName(p.w)
	ns := w.meta().Namespace
	var steps []step
	if p.patch == nil {
		steps = append(steps, step{change: Change{Action: "keep", Kind: kind, Name: name, Detail: "has k8s_event already"}, line: ref(w) + " has k8s_event already"})
		if p.release && !p.finish {
			steps = append(steps, step{change: Change{Action: "patch", Kind: kind, Name: name, Detail: "managedFields: the install's entry goes (a run was cut off before it gave up the fields it set)"}, line: "patch " + ref(w) + ", giving up the install's field ownership"})
		}
	} else {
		steps = append(steps, step{change: Change{Action: "patch", Kind: kind, Name: name, Detail: string(p.patch.display)}, line: "patch " + ref(w),
			do: func(ctx context.Context) error {
				return w.patch(ctx, c, types.StrategicMergePatchType, p.patch.body, metav1.PatchOptions{FieldManager: FieldManager})
			}})
	}
	if !dry {
		return steps
	}
	if p.strategy {
		steps = append(steps, dryStageSteps(p.before)...)
		steps = append(steps, step{change: Change{Action: "patch", Kind: kind, Name: name, When: "after the rollout", Detail: "strategy back to " + p.before.rolloutString()}, line: "after the rollout, patch " + ref(w)})
	}
	for _, cm := range p.prunes {
		steps = append(steps, step{change: Change{Action: "delete", Kind: "configmap", Name: ns + "/" + cm, When: "after the rollout", Detail: "no revision of " + ref(w) + " reads it"}, line: "after the rollout, delete configmap " + ns + "/" + cm})
	}
	return steps
}
