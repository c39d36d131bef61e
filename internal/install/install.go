// Package install adds k8s_event to the CoreDNS a cluster already runs, and
// takes it out again, changing only what k8s_event needs: the container's
// image, four downward-API variables, the Corefile the pods read (a
// ConfigMap of its own, named by its content, made from the operator's
// Corefile with kubeapi and k8s_event added) and a Role and RoleBinding
// that let the Deployment's ServiceAccount create and patch events. What
// it replaced is recorded in an annotation of the pod template, so that
// uninstalling gives back exactly that, and so that the record travels
// with the template through `kubectl rollout undo` and tools that rewrite
// the Deployment.
//
// What runs CoreDNS, a Deployment or a DaemonSet, is a workload
// (workload.go), of which deployment.go and daemonset.go are the kinds:
// the rest of the package names neither API type. A run goes through
// phases, one a file, each returning what the next takes: discover.go
// finds the workload and inspects it into a target, with the operator's
// ConfigMap; plan.go's planner works from that target (decide, without
// the API server but for a Deployment's nodes; then it reads the objects
// it would write), writes nothing, and returns the plan (the ConfigMap,
// the template, the rollout strategy, the RBAC, the priority level and
// the fleet's reads as steps) with its report, or refuses what must not
// be done; apply.go makes the plan's steps and returns what it went
// through; rollout.go waits for the rollout and puts back one that fails;
// report.go is what the run tells, from those values. run.go holds the
// run itself, which sequences the phases, reports and undoes; record.go
// what the install set and what it replaced.
package install

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
)

const (
	// Annotation on the pod template records what the install replaced.
	Annotation = "k8s-event.coredns.io/installed"
	// DeploymentLabel names, on the objects the install makes, the
	// Deployment they are for.
	DeploymentLabel = "k8s-event.coredns.io/deployment"
	managedByLabel  = "app.kubernetes.io/managed-by"
	// FieldManager is the name the install's writes are made under.
	FieldManager = "kubectl-k8s-event"
)

// ErrNoImage is an install without Options.Image: its message names the
// CoreDNS release the Deployment runs, and how to build k8s_event on it.
var ErrNoImage = errors.New("--image: not given")

// Options say which CoreDNS to change, and how.
type Options struct {
	// Namespace of the CoreDNS Deployment; kube-system when empty.
	Namespace string
	// Deployment is its name; when empty, the one Deployment in Namespace
	// labelled k8s-app=kube-dns (kubeadm, kind) or
	// app.kubernetes.io/name=coredns (the CoreDNS helm chart).
	Deployment string
	// Kind is the kind of the workload Deployment names: Deployment when
	// empty, or DaemonSet (--workload daemonset/NAME), whose rollout goes
	// a canary first, then batch by batch.
	Kind string
	// Container is the CoreDNS container's name; when empty, the one
	// named coredns, or the only one.
	Container string
	// Image is the CoreDNS image with k8s_event; install needs it, on
	// the CoreDNS release the Deployment runs (or Force).
	Image string
	// Options are the lines of the k8s_event block added to the
	// Corefile, e.g. "level info warning error"; none takes the
	// plugin's defaults.
	Options []string
	// DryRun prints what would change and changes nothing.
	DryRun bool
	// Wait, when positive, waits that long for the rollout.
	Wait time.Duration
	// Settle is how long the new pods must stay Ready without a restart
	// before the rollout counts as done (and its temporary strategy
	// goes): 20 s when zero, or the Deployment's minReadySeconds when
	// that is longer.
	Settle time.Duration
	// Out receives what is done (or, with DryRun, would be done).
	Out io.Writer
	// JSON writes one JSON document (a Result, or for status a
	// StatusReport) to Out in place of text.
	JSON bool
	// Force goes on where another owner keeps the Deployment (helm,
	// Argo CD, Flux, k3s, another server-side applier; never past a
	// refused layout such as the addon manager in Reconcile mode), where the Corefile's ConfigMap has keys that
	// another controller keeps current, where a run that does not wait
	// could take the Ready pods below their count, and where Image is
	// on another CoreDNS release than the one the Deployment runs.
	Force bool
	// NoFlowControl leaves out the priority level of the event writes
	// (flowcontrol.go), which install makes by default.
	NoFlowControl bool
	// NoFleet leaves out the fleet line install adds for a DaemonSet or a
	// Deployment of many replicas (fleet.go).
	NoFleet bool
}

func (o *Options) namespace() string {
	if o.Namespace == "" {
		return "kube-system"
	}
	return o.Namespace
}

func (o *Options) printf(format string, args ...any) {
	if o.Out != nil {
		fmt.Fprintf(o.Out, format, args...)
	}
}

// Install adds k8s_event to the CoreDNS Deployment that o names.
func Install(ctx context.Context, c kubernetes.Interface, o Options) error {
	r := newRun(&o, "install")
	return r.finish(r.install(ctx, c))
}

func (r *run) install(ctx context.Context, c kubernetes.Interface) error {
	o := r.o
	if err := checkOptionStanza(o.Options); err != nil {
		return err
	}
	unlock, held, err := lockDeployment(ctx, c, o)
	if err != nil {
		return err
	}
	defer unlock()
	var p *installPlan
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		r.restart()
		t, err := discover(ctx, c, o)
		if err != nil {
			return err
		}
		pl := r.planner()
		p, err = pl.planInstall(ctx, c, t)
		r.report(pl.rep)
		if err != nil {
			return err
		}
		if !o.DryRun {
			if err := r.installRights(ctx, c, p); err != nil {
				return err
			}
		}
		r.sayPlan(p)
		a, err := apply(ctx, installSteps(c, p, o.DryRun), o.DryRun)
		r.wrote(a)
		if err != nil || !o.DryRun {
			return err
		}
		return r.installRights(ctx, c, p)
	})
	if held != "" && err == nil {
		r.warn("the run would be refused now: " + held)
	}
	if err != nil {
		// Cut off before the Deployment was patched (an error, a refusal
		// on a retry, or interrupted): take back what the run created.
		r.takeBack(ctx)
	}
	if err != nil || o.DryRun {
		return err
	}
	if p.patch == nil && !p.finish {
		// Nothing rolls: finish what a run cut off after its rollout left,
		// and prune what the dry run said it would.
		if p.release {
			if err := releaseFields(ctx, c, p.w); err != nil {
				return fmt.Errorf("%s: giving up the install's field ownership: %w", ref(p.w), err)
			}
		}
		a, err := prune(ctx, c, p.w, p.gen.Name)
		r.wrote(a)
		return err
	}
	return r.rollout(ctx, c, p.before, p.strategy, p.t, installed(p, o.Image), p.gen)
}

// installed checks that the workload rolling out is the one install
// patched.
func installed(p *installPlan, image string) func(workload) error {
	return func(now workload) error {
		spec := &now.template().Spec
		if p.t.container >= len(spec.Containers) || p.t.volume >= len(spec.Volumes) || spec.Volumes[p.t.volume].ConfigMap == nil {
			return fmt.Errorf("%s changed during the rollout: its containers or volumes are not the ones install patched", ref(now))
		}
		img, cm := spec.Containers[p.t.container].Image, spec.Volumes[p.t.volume].ConfigMap.Name
		if img != image || cm != p.gen.Name || now.template().Annotations[Annotation] != p.ann {
			return fmt.Errorf("%s changed during the rollout%s: it runs image %s with configmap %s, not %s with %s; whatever changed it keeps CoreDNS as it wants: k8s_event is not installed", ref(now), changedBy(now, p.t), img, cm, image, p.gen.Name)
		}
		return nil
	}
}

// lockDeployment finds the Deployment and takes the lock that keeps other
// runs off it until unlock. A dry run takes none: held says which run
// holds it, as the real run would be refused now.
func lockDeployment(ctx context.Context, c kubernetes.Interface, o *Options) (unlock func(), held string, err error) {
	w, err := findWorkload(ctx, c, o)
	if err != nil {
		return nil, "", err
	}
	d := w.meta()
	if missing, err := reviewAccess(ctx, c, d.Namespace, leaseNeeds(d.Name+"-k8s-event")); err == nil && len(missing) > 0 {
		return nil, "", &RefusedError{append(missing, "nothing was changed: grant what is missing (deploy/kubectl-k8s-event/role.yaml lists what a run needs) and run again")}
	}
	if o.DryRun {
		return func() {}, leaseHeld(ctx, c, d.Namespace, d.Name), nil
	}
	unlock, err = lock(ctx, c, d.Namespace, d.Name)
	return unlock, "", err
}
