package install

import (
	"context"
	"fmt"
	"strings"

	authorizationv1 "k8s.io/api/authorization/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
)

// The right to finish: before its first write, a run asks the API server
// whether whoever runs it may make every write it needs, to the end and
// back (an access review per verb), and then has the API server try each
// write in order without keeping it (a server-side dry run), which also
// finds what no review can: RBAC's escalation check on a Role or a
// RoleBinding, and admission. A run that would be refused part way
// through changes nothing, and says what is missing.

// right is one verb on one kind of object, as an access review asks it.
type right struct {
	verb, group, resource, name string
	cluster                     bool // a cluster-scoped resource
}

func (x right) String() string {
	s := x.verb + " " + x.resource
	if x.group != "" {
		s += "." + x.group
	}
	if x.name != "" {
		s += " " + x.name
	}
	return s
}

// need is what one write needs: every right of all, or, when or is not
// empty, every right of or instead.
type need struct {
	why string
	all []right
	or  []right
}

func needs(why string, all ...right) need { return need{why: why, all: all} }

// dryWrite is the server-side dry run of one write, and the write it is.
type dryWrite struct {
	line string
	try  func(ctx context.Context) error
}

// dryAll is the dryRun value that has the API server check a write, run
// admission on it, and keep nothing.
var dryAll = []string{metav1.DryRunAll}

// access asks the API server each right of needs once, in namespace ns.
type access struct {
	c      kubernetes.Interface
	ns     string
	answer map[right]bool
}

// allowed is the access review's answer for x; a review that fails says
// nothing, and the dry run decides.
func (a *access) allowed(ctx context.Context, x right) (bool, error) {
	if v, ok := a.answer[x]; ok {
		return v, nil
	}
	ns := a.ns
	if x.cluster {
		ns = ""
	}
	rev := &authorizationv1.SelfSubjectAccessReview{Spec: authorizationv1.SelfSubjectAccessReviewSpec{
		ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: ns, Verb: x.verb, Group: x.group, Resource: x.resource, Name: x.name},
	}}
	got, err := a.c.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, rev, metav1.CreateOptions{})
	if err != nil {
		return true, err
	}
	ok := got.Status.Allowed && !got.Status.Denied
	a.answer[x] = ok
	return ok, nil
}

// missing are the rights of list that are not granted.
func (a *access) missing(ctx context.Context, list []right) ([]right, error) {
	var out []right
	for _, x := range list {
		ok, err := a.allowed(ctx, x)
		if err != nil {
			return nil, err
		}
		if !ok {
			out = append(out, x)
		}
	}
	return out, nil
}

// review says, need by need, what whoever runs this lacks.
func reviewAccess(ctx context.Context, c kubernetes.Interface, ns string, list []need) ([]string, error) {
	a := &access{c: c, ns: ns, answer: map[right]bool{}}
	var out []string
	for _, n := range list {
		miss, err := a.missing(ctx, n.all)
		if err != nil {
			return nil, fmt.Errorf("access review: %w", err)
		}
		if len(miss) == 0 {
			continue
		}
		if len(n.or) > 0 {
			alt, err := a.missing(ctx, n.or)
			if err != nil {
				return nil, fmt.Errorf("access review: %w", err)
			}
			if len(alt) == 0 {
				continue
			}
			out = append(out, fmt.Sprintf("%s needs %s, or %s: not granted %s", n.why, rightsString(miss), rightsString(alt), grantedWhere(miss, ns)))
			continue
		}
		out = append(out, fmt.Sprintf("%s needs %s: not granted %s", n.why, rightsString(miss), grantedWhere(miss, ns)))
	}
	return out, nil
}

func rightsString(list []right) string {
	s := make([]string, len(list))
	for i, x := range list {
		s[i] = x.String()
	}
	return strings.Join(s, " and ")
}

// tryWrites has the API server check each write in order, keeping none.
// A write it refuses (forbidden, invalid, denied by admission) is a
// reason the run must not start; any other failure is returned.
func tryWrites(ctx context.Context, writes []dryWrite) ([]string, error) {
	var refused []string
	for _, w := range writes {
		err := w.try(ctx)
		switch {
		case err == nil:
		case apierrors.IsForbidden(err) || apierrors.IsInvalid(err) || apierrors.IsBadRequest(err) || apierrors.IsMethodNotSupported(err):
			refused = append(refused, fmt.Sprintf("%s: the API server refuses it (server-side dry run): %v", w.line, err))
		default:
			return nil, fmt.Errorf("%s (server-side dry run): %w", w.line, err)
		}
	}
	return refused, nil
}

// rightToFinish runs the access review of needs and then the dry runs of
// writes, and says, with the run's report, whether the run may start: a
// RefusedError names every right missing and every write refused.
func (r *run) rightToFinish(ctx context.Context, c kubernetes.Interface, ns string, list []need, writes []dryWrite) error {
	missing, err := reviewAccess(ctx, c, ns, list)
	if err != nil {
		// An API server that answers no reviews: the dry runs decide.
		r.warn(err.Error())
	}
	refused, err := tryWrites(ctx, writes)
	if err != nil {
		return err
	}
	if len(missing) == 0 && len(refused) == 0 {
		r.res.Access = "every right the run needs is granted, and the API server accepts each write (server-side dry run)"
		if r.o.DryRun {
			r.printf("access: %s\n", r.res.Access)
		}
		return nil
	}
	r.res.Access = "refused before the first write"
	r.res.Missing = append(missing, refused...)
	return &RefusedError{Reasons: append(r.res.Missing[:len(r.res.Missing):len(r.res.Missing)], "nothing was changed: grant what is missing (deploy/kubectl-k8s-event/role.yaml lists what a run needs) and run again")}
}

// leaseNeeds are the rights the lock of a run needs: to take the Lease,
// renew it, take over one whose run died, and give it back.
func leaseNeeds(name string) []need {
	l := func(verb string) right {
		return right{verb: verb, group: "coordination.k8s.io", resource: "leases", name: name}
	}
	return []need{
		needs("taking lease "+name, right{verb: "create", group: "coordination.k8s.io", resource: "leases"}, l("get")),
		needs("renewing lease "+name, l("update")),
		needs("giving back lease "+name, l("delete")),
	}
}

// watchRollout is what a run needs to tell that the rollout of workload
// w finished and its pods settled: to read it and list its pods; for a
// DaemonSet, to delete its canary pod too.
func watchRollout(w workload) need {
	n := needs("waiting for the rollout of "+ref(w)+" and its pods to settle",
		right{verb: "get", group: "apps", resource: w.resource(), name: w.meta().Name}, right{verb: "list", resource: "pods"})
	if w.kind() == kindDaemonSet {
		n.all = append(n.all, right{verb: "delete", resource: "pods"})
	}
	return n
}

// installAccess is what an install needs and the dry runs of its writes,
// in the order it makes them: the Corefile ConfigMap, the Role and
// RoleBinding, the Deployment's patch.
func installAccess(c kubernetes.Interface, p *installPlan) ([]need, []dryWrite) {
	ns, name := p.w.meta().Namespace, p.w.meta().Name
	deploy := "patch " + ref(p.w)
	list := []need{
		needs(deploy+" (and put its strategy back after the rollout)", right{verb: "patch", group: "apps", resource: p.w.resource(), name: name}),
		watchRollout(p.w),
		needs("finding the ConfigMaps no revision reads", right{verb: "list", group: "apps", resource: p.w.revisionResource()}, right{verb: "list", resource: "configmaps"}),
	}
	var writes []dryWrite
	cm := "create configmap " + ns + "/" + p.gen.Name
	if !p.genThere {
		list = append(list, needs(cm, right{verb: "create", resource: "configmaps"}, right{verb: "delete", resource: "configmaps", name: p.gen.Name}))
		writes = append(writes, dryWrite{cm, func(ctx context.Context) error {
			_, err := c.CoreV1().ConfigMaps(ns).Create(ctx, p.gen, metav1.CreateOptions{FieldManager: FieldManager, DryRun: dryAll})
			return err
		}})
	}
	if len(p.prunes) > 0 || p.t.rec != nil {
		list = append(list, needs("deleting the Corefile ConfigMaps no revision reads", right{verb: "delete", resource: "configmaps"}))
	}
	for _, s := range p.rbac {
		for _, n := range s.needs {
			if n.why == "" {
				n.why = s.line
			}
			list = append(list, n)
		}
		if s.dry != nil {
			writes = append(writes, dryWrite{s.line, s.dry})
		}
	}
	if p.patch != nil {
		writes = append(writes, dryWrite{deploy, func(ctx context.Context) error {
			return p.w.patch(ctx, c, types.StrategicMergePatchType, p.patch.body, metav1.PatchOptions{FieldManager: FieldManager, DryRun: dryAll})
		}})
	}
	return list, writes
}

// installRights is rightToFinish for the install p plans.
func (r *run) installRights(ctx context.Context, c kubernetes.Interface, p *installPlan) error {
	list, writes := installAccess(c, p)
	return r.rightToFinish(ctx, c, p.w.meta().Namespace, list, writes)
}

// uninstallRights is rightToFinish for an uninstall that patches before
// with p.
func (r *run) uninstallRights(ctx context.Context, c kubernetes.Interface, before workload, p *patch) error {
	ns, name := before.meta().Namespace, before.meta().Name
	deploy := "patch " + ref(before)
	rb := func(verb, resource string) right {
		return right{verb: verb, group: "rbac.authorization.k8s.io", resource: resource, name: name + "-k8s-event"}
	}
	list := []need{
		needs(deploy+" (and put its strategy back after the rollout)", right{verb: "patch", group: "apps", resource: before.resource(), name: name}),
		watchRollout(before),
		needs("deleting the Corefile ConfigMaps no revision reads", right{verb: "list", group: "apps", resource: before.revisionResource()}, right{verb: "list", resource: "configmaps"}, right{verb: "delete", resource: "configmaps"}),
		needs("deleting the Role and RoleBinding the install made (or taking the ServiceAccount out of a RoleBinding others bound subjects with)", rb("delete", "rolebindings"), rb("update", "rolebindings"), rb("delete", "roles")),
		fleetNeeds(name),
	}
	list = append(list, r.flowControlNeeds(ctx, c, ns, name)...)
	writes := []dryWrite{{deploy, func(ctx context.Context) error {
		return before.patch(ctx, c, types.StrategicMergePatchType, p.body, metav1.PatchOptions{FieldManager: FieldManager, DryRun: dryAll})
	}}}
	return r.rightToFinish(ctx, c, ns, list, writes)
}

// grantedWhere says where the rights of list are asked: in namespace ns,
// or cluster-wide for cluster-scoped resources, which only a ClusterRole
// bound by a ClusterRoleBinding grants.
func grantedWhere(list []right, ns string) string {
	for _, x := range list {
		if !x.cluster {
			return "in namespace " + ns
		}
	}
	return "cluster-wide (a ClusterRole and a ClusterRoleBinding grant them)"
}
