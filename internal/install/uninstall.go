package install

import (
	"context"
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
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
	var before *appsv1.Deployment
	var tmp *appsv1.DeploymentStrategy
	var t *target
	patched := false
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		r.restart()
		var err error
		if before, err = findDeployment(ctx, c, o); err != nil {
			return err
		}
		if t, err = inspect(before, o); err != nil {
			return err
		}
		ns := before.Namespace
		r.res.Deployment = ns + "/" + before.Name
		if o.DryRun {
			r.printf("# dry run: nothing is changed\n")
		}
		if t.rec == nil {
			r.change(Change{Action: "keep", Kind: "deployment", Name: ns + "/" + before.Name, Detail: "k8s_event was not installed by this tool"}, fmt.Sprintf("deployment %s/%s does not have k8s_event", ns, before.Name))
			return nil
		}
		orig := t.current()
		want := before.DeepCopy()
		tmpl := &want.Spec.Template
		delete(tmpl.Annotations, Annotation)
		if len(tmpl.Annotations) == 0 {
			tmpl.Annotations = nil
		}
		ctr := &tmpl.Spec.Containers[t.container]
		r.res.ImageBefore, r.res.ImageAfter = ctr.Image, orig.Image
		r.res.CoreDNSBefore, r.res.CoreDNSAfter = release(ctr.Image), release(orig.Image)
		ctr.Image = orig.Image
		ctr.Env = orig.Env
		tmpl.Spec.Volumes[t.volume] = orig.Volume
		var avail string
		tmp, avail = safeRollout(before)
		r.res.Rollout = avail
		if tmp != nil && o.Wait <= 0 {
			why := fmt.Sprintf("the rollout could take the Ready pods below their count (%s), and with --timeout 0 uninstall does not wait, so it could not put back a temporary strategy", avail)
			if !o.Force {
				return &RefusedError{[]string{why + ": give a --timeout, or --force to roll with the Deployment's own strategy"}}
			}
			r.warn("--force: " + why)
			tmp = nil
		}
		if tmp != nil {
			want.Spec.Strategy = *tmp
		}
		p, err := deploymentPatch(before, want)
		if err != nil || p == nil {
			return err
		}
		r.printf("deployment %s/%s: image %s -> %s (CoreDNS %s -> %s)\n", ns, before.Name, r.res.ImageBefore, r.res.ImageAfter, r.res.CoreDNSBefore, r.res.CoreDNSAfter)
		r.printf("rollout: %s\n", r.res.Rollout)
		r.change(Change{Action: "patch", Kind: "deployment", Name: ns + "/" + before.Name, Detail: string(p.display)}, fmt.Sprintf("patch deployment %s/%s", ns, before.Name))
		if !o.DryRun {
			if _, err := c.AppsV1().Deployments(ns).Patch(ctx, before.Name, types.StrategicMergePatchType, p.body, metav1.PatchOptions{FieldManager: FieldManager}); err != nil {
				return fmt.Errorf("patch deployment %s/%s: %w", ns, before.Name, err)
			}
			patched = true
		}
		return nil
	})
	if err != nil {
		return err
	}
	ns, name := before.Namespace, before.Name
	when := ""
	if patched || (o.DryRun && t.rec != nil) {
		when = "after the rollout"
	}
	if o.DryRun {
		if tmp != nil && t.rec != nil {
			r.change(Change{Action: "patch", Kind: "deployment", Name: ns + "/" + name, When: when, Detail: "strategy back to " + strategyString(before.Spec.Strategy)},
				fmt.Sprintf("%s, patch deployment %s/%s", when, ns, name))
		}
		unused, err := unusedConfigMaps(ctx, c, before, "")
		if err != nil {
			return err
		}
		for _, cm := range unused {
			r.change(Change{Action: "delete", Kind: "configmap", Name: ns + "/" + cm, When: when, Detail: "no revision of deployment " + name + " reads it"}, "delete configmap "+ns+"/"+cm)
		}
		return r.rbacRemoval(ctx, c, ns, name, when)
	}
	if patched {
		orig := t.current()
		verify := func(now *appsv1.Deployment) error {
			spec := &now.Spec.Template.Spec
			if _, ok := now.Spec.Template.Annotations[Annotation]; ok || t.container >= len(spec.Containers) || spec.Containers[t.container].Image != orig.Image {
				return fmt.Errorf("deployment %s/%s changed during the rollout%s: it is not what uninstall patched", ns, name, changedBy(now, t))
			}
			return nil
		}
		if err := r.rollout(ctx, c, before, tmp, verify, nil); err != nil {
			return err
		}
	} else if err := r.prune(ctx, c, ns, name, ""); err != nil {
		return err
	}
	return r.rbacRemoval(ctx, c, ns, name, "")
}

// rbacRemoval deletes the Role and RoleBinding the install made; those of
// the same names without its labels stay.
func (r *run) rbacRemoval(ctx context.Context, c kubernetes.Interface, ns, deployment, when string) error {
	name := deployment + "-k8s-event"
	for _, kind := range []string{"rolebinding", "role"} {
		var meta metav1.ObjectMeta
		var del func() error
		switch kind {
		case "rolebinding":
			b, err := c.RbacV1().RoleBindings(ns).Get(ctx, name, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				continue
			} else if err != nil {
				return err
			}
			meta = b.ObjectMeta
			del = func() error {
				return c.RbacV1().RoleBindings(ns).Delete(ctx, name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &b.UID}})
			}
		case "role":
			ro, err := c.RbacV1().Roles(ns).Get(ctx, name, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				continue
			} else if err != nil {
				return err
			}
			meta = ro.ObjectMeta
			del = func() error {
				return c.RbacV1().Roles(ns).Delete(ctx, name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &ro.UID}})
			}
		}
		if !ours(meta, deployment) {
			r.change(Change{Action: "keep", Kind: kind, Name: ns + "/" + name, Detail: fmt.Sprintf("not this tool's (no label %s=%s): kept", managedByLabel, FieldManager)}, fmt.Sprintf("keep %s %s/%s", kind, ns, name))
			continue
		}
		line := fmt.Sprintf("delete %s %s/%s", kind, ns, name)
		if when != "" {
			line = when + ", " + line
		}
		r.change(Change{Action: "delete", Kind: kind, Name: ns + "/" + name, When: when}, line)
		if !r.o.DryRun {
			if err := del(); err != nil && !apierrors.IsNotFound(err) {
				return err
			}
		}
	}
	return nil
}
