package install

import (
	"context"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
)

// Uninstall gives back what the install replaced in the Deployment that o
// names, and removes what the install made (the Role, the RoleBinding,
// the Corefile ConfigMaps no ReplicaSet of the Deployment refers to any
// more): only objects with the install's labels.
func Uninstall(ctx context.Context, c kubernetes.Interface, o Options) error {
	r := newRun(&o, "uninstall")
	return r.finish(r.uninstall(ctx, c))
}

// uninstallPlan is what an uninstall changes.
type uninstallPlan struct {
	t     *target
	patch *patch
	tmp   bool // temporary rollout settings; false: the operator's
	// notInstalled is a workload without k8s_event of this tool.
	notInstalled bool
	patched      bool
	// want is the workload with what the install replaced given back.
	want workload
}

func (r *run) uninstall(ctx context.Context, c kubernetes.Interface) error {
	o := r.o
	unlock, held, err := lockDeployment(ctx, c, o)
	if err != nil {
		return err
	}
	defer unlock()
	if held != "" {
		defer r.warn("the run would be refused now: " + held)
	}
	var p *uninstallPlan
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		r.restart()
		if o.DryRun {
			r.printf("# dry run: nothing is changed\n")
		}
		t, err := discover(ctx, c, o)
		if err != nil {
			return err
		}
		pl := r.planner()
		p, err = pl.planUninstall(ctx, c, t)
		r.report(pl.rep)
		if err != nil {
			return err
		}
		if p.patch != nil {
			if err := r.uninstallRights(ctx, c, p.t.w, p.patch); err != nil {
				return err
			}
			r.sayUninstallPlan(p)
		}
		a, err := apply(ctx, uninstallSteps(c, p), o.DryRun)
		r.wrote(a)
		p.patched = a.wrote()
		return err
	})
	if err != nil {
		return err
	}
	if o.DryRun {
		return r.sayUninstallAfterRollout(ctx, c, p)
	}
	d := p.t.w
	if p.patched {
		if err := r.rollout(ctx, c, d.operatorView(), p.tmp, p.t, uninstalled(p.t), nil); err != nil {
			return err
		}
	} else if err := r.finishCutOff(ctx, c, d); err != nil {
		return err
	}
	if err := r.rbacRemoval(ctx, c, d, ""); err != nil {
		return err
	}
	return r.extrasRemoval(ctx, c, d.meta().Namespace, d.meta().Name, "")
}

// finishCutOff finishes, where nothing rolls, what a run cut off after its
// rollout left: the install's field ownership goes, and the ConfigMaps no
// revision reads.
func (r *run) finishCutOff(ctx context.Context, c kubernetes.Interface, d workload) error {
	if fieldsHeld(d.meta()) {
		a, err := applyStep(ctx, releaseStep(c, d))
		if err != nil {
			return fmt.Errorf("%s: giving up the install's field ownership: %w", ref(d), err)
		}
		r.wrote(a)
	}
	a, err := prune(ctx, c, d, "")
	r.wrote(a)
	return err
}

// releaseStep is the patch that gives up the install's field ownership
// of d, which a run cut off after its rollout left.
func releaseStep(c kubernetes.Interface, d workload) step {
	return step{
		change: Change{Action: "patch", Kind: kindName(d), Name: nsName(d), Detail: "managedFields: the install's entry goes (a run was cut off before it gave up the fields it set)"},
		line:   "patch " + ref(d) + ", giving up the install's field ownership",
		do:     func(ctx context.Context) error { return releaseFields(ctx, c, d) },
	}
}

// planUninstall works out the Deployment's patch that gives back what
// the install replaced.
func (pl *planner) planUninstall(ctx context.Context, c kubernetes.Interface, t *target) (*uninstallPlan, error) {
	pl.found(t)
	p := &uninstallPlan{t: t}
	d := t.w
	var err error
	if t.rec == nil && d.operatorView() != d {
		// An uninstall cut off during its rollout: the operator's
		// strategy goes back.
		pl.rep.Rollout = d.interruptedRollout()
		p.patch, err = workloadPatch(d, d.operatorView())
		return p, err
	}
	if t.rec == nil {
		p.notInstalled = true
		return p, nil
	}
	if err := pl.checkGiveBack(t); err != nil {
		return nil, err
	}
	want := pl.uninstallTemplate(t)
	p.want = want
	base := d.operatorView()
	var refuse []string
	if p.tmp, refuse = base.planRollout(ctx, c, pl, want, settleFor(base, pl.o)); len(refuse) > 0 {
		return nil, &RefusedError{refuse}
	}
	p.patch, err = workloadPatch(d, want)
	return p, err
}

// checkGiveBack refuses, unless forced, to point the pods at a ConfigMap
// that is gone, or that lacks a key the volume lists: new pods could not
// start.
func (pl *planner) checkGiveBack(t *target) error {
	vol := t.current().Volume
	if vol.ConfigMap.Optional != nil && *vol.ConfigMap.Optional {
		return nil
	}
	ns, cm := t.w.meta().Namespace, t.source
	var why string
	switch {
	case cm == nil:
		why = fmt.Sprintf("configmap %s/%s, the Corefile install started from and uninstall would give back, is gone: the pods would not start", ns, vol.ConfigMap.Name)
	default:
		var missing []string
		for _, it := range vol.ConfigMap.Items {
			_, inData := cm.Data[it.Key]
			if _, inBinary := cm.BinaryData[it.Key]; !inData && !inBinary {
				missing = append(missing, it.Key)
			}
		}
		if len(missing) > 0 {
			why = fmt.Sprintf("configmap %s/%s, which uninstall would give back, has no key %s, which the volume %s mounts: the pods would not start", ns, vol.ConfigMap.Name, strings.Join(missing, ", "), vol.Name)
			break
		}
		if why = pluginsLeft(t, vol, cm); why == "" {
			return nil
		}
	}
	if pl.o.Force {
		pl.warn("--force: " + why)
		return nil
	}
	return &RefusedError{[]string{why + "; put it back (status shows its name), or --force to uninstall all the same"}}
}

// pluginsLeft says why the image uninstall gives back cannot load the
// Corefile of cm: it has kubeapi or k8s_event (the operator keeps the
// plugin's options there), which only a build with k8s_event knows; ""
// when it has neither.
func pluginsLeft(t *target, vol corev1.Volume, cm *corev1.ConfigMap) string {
	c, err := parseCorefile(cm.Data[t.key], t.mountedFiles(vol, cm.Data))
	if err != nil {
		return ""
	}
	found := c.externalPlugins()
	if len(found) == 0 {
		return ""
	}
	return fmt.Sprintf("configmap %s/%s, the Corefile uninstall would give back, has %s (key %s), which image %s, the one uninstall gives back, does not have: its pods would stop on \"Unknown directive '%s'\" and crash-loop; take %s out of that Corefile first (keep the options elsewhere), then uninstall, or --force if that image has k8s_event built in", cm.Namespace, cm.Name, strings.Join(found, " and "), t.key, t.current().Image, found[len(found)-1], strings.Join(found, " and "))
}

// uninstallTemplate is the workload with what the install replaced
// given back, and its record taken out.
func (pl *planner) uninstallTemplate(t *target) workload {
	orig := t.current()
	want := t.w.copyOf()
	tmpl := want.template()
	delete(tmpl.Annotations, Annotation)
	if len(tmpl.Annotations) == 0 {
		tmpl.Annotations = nil
	}
	ctr := &tmpl.Spec.Containers[t.container]
	pl.rep.ImageBefore, pl.rep.ImageAfter = ctr.Image, orig.Image
	pl.rep.CoreDNSBefore, pl.rep.CoreDNSAfter = release(ctr.Image), release(orig.Image)
	ctr.Image = orig.Image
	ctr.Env = orig.Env
	tmpl.Spec.Volumes[t.volume] = orig.Volume
	return want
}

// sayUninstallPlan says, before its patch, what the uninstall p plans:
// from the plan's report.
func (r *run) sayUninstallPlan(p *uninstallPlan) {
	res := &r.res
	r.printf("%s: image %s -> %s (CoreDNS %s -> %s)\n", ref(p.t.w), res.ImageBefore, res.ImageAfter, res.CoreDNSBefore, res.CoreDNSAfter)
	r.printf("rollout: %s\n", res.Rollout)
}

// uninstallSteps are the writes of the uninstall p plans: the workload's
// patch, or a workload the tool did not install into kept.
func uninstallSteps(c kubernetes.Interface, p *uninstallPlan) []step {
	d := p.t.w
	switch {
	case p.notInstalled:
		return []step{{change: Change{Action: "keep", Kind: kindName(d), Name: nsName(d), Detail: "k8s_event was not installed by this tool"}, line: ref(d) + " does not have k8s_event"}}
	case p.patch == nil:
		return nil
	}
	return []step{{
		change: Change{Action: "patch", Kind: kindName(d), Name: nsName(d), Detail: string(p.patch.display)},
		line:   "patch " + ref(d),
		do: func(ctx context.Context) error {
			return d.patch(ctx, c, types.StrategicMergePatchType, p.patch.body, metav1.PatchOptions{FieldManager: FieldManager})
		},
	}}
}

// sayUninstallAfterRollout lists, in a dry run, what the uninstall does
// once the pods have rolled back.
func (r *run) sayUninstallAfterRollout(ctx context.Context, c kubernetes.Interface, p *uninstallPlan) error {
	d := p.t.w
	ns := d.meta().Namespace
	when := ""
	if p.t.rec != nil {
		when = "after the rollout"
	}
	var steps []step
	if p.tmp && p.t.rec != nil {
		steps = append(dryStageSteps(d.operatorView()), strategyStep(c, d.operatorView(), Change{Action: "patch", Kind: kindName(d), Name: nsName(d), When: when, Detail: "strategy back to " + d.operatorView().rolloutString()},
			fmt.Sprintf("%s, patch %s", when, ref(d))))
	}
	if p.patch == nil && fieldsHeld(d.meta()) {
		steps = append(steps, releaseStep(c, d))
	}
	// The ConfigMaps no revision reads once the template given back
	// rolls out: the planned template, not the one that reads the copy.
	planned := d
	if p.want != nil {
		planned = p.want
	}
	unused, err := unusedConfigMaps(ctx, c, planned, "")
	if err != nil {
		return err
	}
	for _, cm := range unused {
		steps = append(steps, step{change: Change{Action: "delete", Kind: "configmap", Name: ns + "/" + cm, When: when, Detail: "no revision of " + ref(d) + " reads it"}, line: "delete configmap " + ns + "/" + cm})
	}
	a, _ := apply(ctx, steps, true)
	r.wrote(a)
	if err := r.rbacRemoval(ctx, c, d, when); err != nil {
		return err
	}
	return r.extrasRemoval(ctx, c, ns, d.meta().Name, when)
}

// uninstalled checks that the workload rolling out is the one uninstall
// patched.
func uninstalled(t *target) func(workload) error {
	orig := t.current()
	return func(now workload) error {
		spec := &now.template().Spec
		if _, ok := now.template().Annotations[Annotation]; ok || t.container >= len(spec.Containers) || spec.Containers[t.container].Image != orig.Image {
			return fmt.Errorf("%s changed during the rollout%s: it is not what uninstall patched", ref(now), changedBy(now, t))
		}
		return nil
	}
}

// rbacRemoval removes the Role and RoleBinding the install made (with a
// dry run, says it), and reports what it went through.
func (r *run) rbacRemoval(ctx context.Context, c kubernetes.Interface, w workload, when string) error {
	steps, err := rbacRemovalSteps(ctx, c, w, when)
	if err != nil {
		return err
	}
	a, err := apply(ctx, steps, r.o.DryRun)
	r.wrote(a)
	return err
}

// rbacRemovalSteps are the deletes of the Role and RoleBinding the
// install made; those of the same names without its labels stay. A
// RoleBinding of the install's that binds subjects others added loses
// only w's ServiceAccount, and the Role it refers to stays.
func rbacRemovalSteps(ctx context.Context, c kubernetes.Interface, w workload, when string) ([]step, error) {
	ns, deployment := w.meta().Namespace, w.meta().Name
	base := deployment + "-k8s-event"
	keepRole := false
	var steps []step
	keep := func(kind, name, detail, line string) {
		steps = append(steps, step{change: Change{Action: "keep", Kind: kind, Name: ns + "/" + name, Detail: detail}, line: line})
	}
	// base-next: a RoleBinding made anew by a run cut off part way.
	for _, it := range []struct{ kind, name string }{{"rolebinding", base + "-next"}, {"rolebinding", base}, {"role", base}} {
		kind, name := it.kind, it.name
		var meta metav1.ObjectMeta
		var del func(context.Context) error
		switch kind {
		case "rolebinding":
			b, err := c.RbacV1().RoleBindings(ns).Get(ctx, name, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				continue
			} else if err != nil {
				return nil, err
			}
			meta = b.ObjectMeta
			if others := otherSubjects(b, w); len(others) > 0 && ours(meta, deployment) {
				keepRole = keepRole || b.RoleRef.Name == base
				steps = append(steps, unbind(c, b, others, when))
				continue
			}
			del = func(ctx context.Context) error {
				return c.RbacV1().RoleBindings(ns).Delete(ctx, name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &b.UID}})
			}
		case "role":
			ro, err := c.RbacV1().Roles(ns).Get(ctx, name, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				continue
			} else if err != nil {
				return nil, err
			}
			meta = ro.ObjectMeta
			if keepRole && ours(meta, deployment) {
				keep(kind, name, "rolebinding "+ns+"/"+base+" still binds it to subjects others added: kept", fmt.Sprintf("keep %s %s/%s: rolebinding %s still binds it to subjects others added", kind, ns, name, base))
				continue
			}
			del = func(ctx context.Context) error {
				return c.RbacV1().Roles(ns).Delete(ctx, name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &ro.UID}})
			}
		}
		if !ours(meta, deployment) {
			keep(kind, name, fmt.Sprintf("not this tool's (no label %s=%s): kept", managedByLabel, FieldManager), fmt.Sprintf("keep %s %s/%s", kind, ns, name))
			continue
		}
		steps = append(steps, deleteStep(Change{Action: "delete", Kind: kind, Name: ns + "/" + name, When: when}, whenLine(when, fmt.Sprintf("delete %s %s/%s", kind, ns, name)), del))
	}
	return steps, nil
}

// otherSubjects are the subjects of b other than d's ServiceAccount: those
// others added to the install's RoleBinding.
func otherSubjects(b *rbacv1.RoleBinding, w workload) []rbacv1.Subject {
	d := w.meta()
	sa := w.template().Spec.ServiceAccountName
	if sa == "" {
		sa = "default"
	}
	var out []rbacv1.Subject
	for _, s := range b.Subjects {
		if s.Kind != "ServiceAccount" || s.Name != sa || (s.Namespace != d.Namespace && s.Namespace != "") {
			out = append(out, s)
		}
	}
	return out
}

// unbind is the update that takes w's ServiceAccount out of the
// install's RoleBinding b, keeping the subjects others added to it.
func unbind(c kubernetes.Interface, b *rbacv1.RoleBinding, others []rbacv1.Subject, when string) step {
	name := b.Namespace + "/" + b.Name
	want := b.DeepCopy()
	want.Subjects = others
	return step{
		change: Change{Action: "update", Kind: "rolebinding", Name: name, When: when, Detail: "subjects others added kept: " + subjectsString(others)},
		line:   whenLine(when, fmt.Sprintf("update rolebinding %s: keep %s, bound by others", name, subjectsString(others))),
		do: func(ctx context.Context) error {
			if len(others) == len(b.Subjects) {
				return nil
			}
			_, err := c.RbacV1().RoleBindings(b.Namespace).Update(ctx, want, metav1.UpdateOptions{FieldManager: FieldManager})
			return err
		},
	}
}
