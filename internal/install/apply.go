package install

import (
	"context"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
)

// applyInstall makes the changes up to the workload's patch, or with
// DryRun says them.
func (r *run) applyInstall(ctx context.Context, c kubernetes.Interface, p *installPlan) error {
	o, gen := r.o, p.gen
	ns := p.w.meta().Namespace
	if o.DryRun {
		r.printf("# dry run: nothing is changed\n")
	}
	r.printf("%s: image %s -> %s (CoreDNS %s -> %s)\n", ref(p.w), r.res.ImageBefore, r.res.ImageAfter, r.res.CoreDNSBefore, r.res.CoreDNSAfter)
	r.printf("configmap keys the pods read:\n%s", indent(strings.Join(r.res.Keys, "\n")))
	r.printf("rollout: %s\n%s", r.res.Rollout, r.extrasText())
	if p.genThere {
		r.change(Change{Action: "keep", Kind: "configmap", Name: ns + "/" + gen.Name, Detail: "there already"}, "configmap "+ns+"/"+gen.Name+" is there")
	} else {
		src := p.w.template().Spec.Volumes[p.t.volume].ConfigMap.Name
		if p.t.rec != nil && src == p.t.rec.ConfigMap {
			src = p.t.rec.Original.Volume.ConfigMap.Name
		}
		r.change(Change{Action: "create", Kind: "configmap", Name: ns + "/" + gen.Name, Detail: Diff(r.sourceText(ctx, c, ns, src, p.t.key), gen.Data[p.t.key])},
			fmt.Sprintf("create configmap %s/%s, the Corefile of %s with kubeapi and k8s_event", ns, gen.Name, src))
		if !o.DryRun {
			switch _, err := c.CoreV1().ConfigMaps(ns).Create(ctx, gen, metav1.CreateOptions{FieldManager: FieldManager}); {
			case err == nil:
				r.done = append(r.done, r.res.Changes[len(r.res.Changes)-1])
				r.created = append(r.created, undoStep{r.res.Changes[len(r.res.Changes)-1], func(ctx context.Context) error {
					// Unless the workload reads it all the same (a patch
					// that went through, its answer lost).
					now, err := p.w.get(ctx, c)
					switch {
					case err != nil:
						return err
					case slices.ContainsFunc(now.template().Spec.Volumes, func(v corev1.Volume) bool {
						return v.ConfigMap != nil && v.ConfigMap.Name == gen.Name
					}):
						return errKept
					}
					return c.CoreV1().ConfigMaps(ns).Delete(ctx, gen.Name, metav1.DeleteOptions{})
				}})
			case !apierrors.IsAlreadyExists(err):
				r.failed()
				return fmt.Errorf("create configmap %s/%s: %w", ns, gen.Name, err)
			}
		}
	}
	for _, s := range p.rbac {
		r.change(s.change, s.line)
		if !o.DryRun && s.do != nil {
			if err := s.do(ctx); err != nil {
				r.failed()
				return fmt.Errorf("%s: %w", s.line, err)
			}
			r.done = append(r.done, s.change)
			if s.undo != nil {
				r.created = append(r.created, undoStep{s.change, s.undo})
			}
		}
	}
	return r.applyPatch(ctx, c, p)
}

// applyPatch patches the workload, or with DryRun says the patch and
// what follows the rollout.
func (r *run) applyPatch(ctx context.Context, c kubernetes.Interface, p *installPlan) error {
	o, w, kind, name := r.o, p.w, kindName(p.w), nsName(p.w)
	ns := w.meta().Namespace
	if p.patch == nil {
		r.change(Change{Action: "keep", Kind: kind, Name: name, Detail: "has k8s_event already"}, ref(w)+" has k8s_event already")
		if p.release && !p.finish {
			r.change(Change{Action: "patch", Kind: kind, Name: name, Detail: "managedFields: the install's entry goes (a run was cut off before it gave up the fields it set)"}, "patch "+ref(w)+", giving up the install's field ownership")
		}
	} else {
		r.change(Change{Action: "patch", Kind: kind, Name: name, Detail: string(p.patch.display)}, "patch "+ref(w))
		if !o.DryRun {
			if err := w.patch(ctx, c, types.StrategicMergePatchType, p.patch.body, metav1.PatchOptions{FieldManager: FieldManager}); err != nil {
				r.failed()
				return fmt.Errorf("patch %s: %w", ref(w), err)
			}
		}
	}
	if p.strategy && o.DryRun {
		r.change(Change{Action: "patch", Kind: kind, Name: name, When: "after the rollout", Detail: "strategy back to " + p.before.rolloutString()},
			"after the rollout, patch "+ref(w))
	}
	if o.DryRun {
		for _, cm := range p.prunes {
			r.change(Change{Action: "delete", Kind: "configmap", Name: ns + "/" + cm, When: "after the rollout", Detail: "no revision of " + ref(w) + " reads it"}, "after the rollout, delete configmap "+ns+"/"+cm)
		}
	}
	return nil
}

// sourceText is the Corefile of the operator's ConfigMap, for the diff.
func (r *run) sourceText(ctx context.Context, c kubernetes.Interface, ns, name, key string) string {
	cm, err := c.CoreV1().ConfigMaps(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return ""
	}
	return cm.Data[key]
}
