package install

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/coredns/caddy/caddyfile"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// The fleet bound: for a layout that runs many replicas, a DaemonSet or a
// Deployment of more than FleetThreshold replicas, the install adds
// `fleet FleetQPS FleetBurst` to the k8s_event block, unless the
// operator's Corefile or --option has a fleet line (kept as written) or
// Options.NoFleet. Wherever the Corefile the pods read has fleet, the
// install grants the workload's ServiceAccount what the plugin reads N
// with (deploy/k8s_event/fleet): a Role of its own, get on the workload by
// name, and on ReplicaSets for a Deployment. The plugin finds the workload
// from its pod's controller, read with a list of pods: CoreDNS's own
// rights (system:coredns) allow it, but node-local-dns's service account
// has no rights at all, so for a DaemonSet the Role grants that list too.
//
// The values, for the whole fleet, per reason:
//   - BURST 100, four replicas' default bursts (rate's 25): a shared
//     failure still gets 100 events at once across the fleet, enough for
//     every plugin and shape of a reason to show, where 2,000 replicas
//     at the defaults could send 50,000;
//   - QPS 0.1, one event every 10 s for the fleet, 30 times one replica's
//     default refill (1/300): a lasting failure keeps being told, while
//     the fleet's writes no longer grow with N (the floor, one per
//     replica at first and one an hour, still does).
//
// The threshold: with 4 replicas or fewer the fleet's share (100/N + 1
// tokens, 0.1/N + 1/3600 a second) is no tighter than rate's defaults (25
// tokens, 1/300 a second) but for a surge pod, so fleet would change
// nothing there but add the reads of N and a Role. A DaemonSet runs one
// pod a node: always a fleet.
const (
	FleetThreshold = 4
	FleetQPS       = "0.1"
	FleetBurst     = 100
	// FleetFlag is the flag that installs without the fleet line.
	FleetFlag = "--fleet=false"
)

// fleetPlan is what the install does about fleet.
type fleetPlan struct {
	add string // the line the install adds; "" when none
	on  bool   // the Corefile the pods read has fleet: the rights are granted
}

// fleetFor is the fleet line the install gives a workload of kind with
// replicas, and why; "" when it gives none.
func fleetFor(kind string, replicas int) (line, why string) {
	line = fmt.Sprintf("fleet %s %d", FleetQPS, FleetBurst)
	switch {
	case kind == kindDaemonSet:
		return line, fmt.Sprintf("a DaemonSet runs a replica on every node: %d now", replicas)
	case replicas > FleetThreshold:
		return line, fmt.Sprintf("%d replicas, more than %d", replicas, FleetThreshold)
	}
	return "", fmt.Sprintf("%d replicas, %d or fewer: off (rate's bound per replica alone)", replicas, FleetThreshold)
}

// corefileFleet is the first fleet line of a k8s_event stanza of cf,
// itself or from a snippet it imports; "" when none.
func corefileFleet(cf *corefileText) string {
	return corefileLine(cf, "fleet")
}

// corefileLine is the first line of the property name of a k8s_event
// stanza of cf, itself or from a snippet it imports; "" when none.
func corefileLine(cf *corefileText, name string) string {
	if lines := corefileLines(cf, name); len(lines) > 0 {
		return lines[0]
	}
	return ""
}

// corefileLines are the lines of the property name of every k8s_event
// stanza of cf, itself or from a snippet it imports.
func corefileLines(cf *corefileText, name string) []string {
	var out []string
	for _, b := range cf.blocks {
		if b.parsed == nil {
			continue
		}
		d := caddyfile.NewDispenserTokens("Corefile", b.parsed.Tokens["k8s_event"])
		for d.Next() {
			for d.NextBlock() {
				if d.Val() == name {
					out = append(out, strings.Join(append([]string{name}, d.RemainingArgs()...), " "))
					continue
				}
				d.RemainingArgs()
			}
		}
	}
	return out
}

// optionFleet is the fleet line of the operator's --option lines; ""
// when none.
func optionFleet(options []string) string {
	return optionLine(options, "fleet")
}

// optionLine is the line of the property name of the operator's
// --option lines; "" when none.
func optionLine(options []string, name string) string {
	for _, o := range options {
		if w := texts(lex(o)); len(w) > 0 && w[0] == name {
			return strings.Join(w, " ")
		}
	}
	return ""
}

// planFleet decides the fleet line for a workload of kind with replicas
// (a DaemonSet's desiredNumberScheduled) whose Corefile cf has read.
func (pl *planner) planFleet(kind string, replicas int, cf *corefileText) {
	pl.fleet = fleetPlan{}
	if own := optionFleet(pl.o.Options); own != "" {
		pl.fleet.on, pl.rep.Fleet = true, own+" (--option)"
		return
	}
	if own := corefileFleet(cf); own != "" {
		pl.fleet.on, pl.rep.Fleet = true, own+" (the Corefile's own line, kept)"
		return
	}
	line, why := fleetFor(kind, replicas)
	switch {
	case line == "":
		pl.rep.Fleet = why
	case pl.o.NoFleet:
		pl.rep.Fleet = "left out (" + FleetFlag + "; " + why + ")"
	default:
		if _, err := cf.splices(append(slices.Clone(pl.o.Options), line)); err != nil {
			pl.warn(fmt.Sprintf("fleet: not added (%s): %v", why, err))
			pl.rep.Fleet = "not added: " + err.Error()
			return
		}
		pl.fleet = fleetPlan{add: line, on: true}
		pl.rep.Fleet = line + " (" + why + ")"
	}
}

// options are the k8s_event lines the install writes: the operator's,
// and the level and fleet lines it adds.
func (pl *planner) options() []string {
	out := slices.Clone(pl.o.Options)
	if pl.level != "" {
		out = append(out, pl.level)
	}
	if pl.fleet.add != "" {
		out = append(out, pl.fleet.add)
	}
	return out
}

// fleetRBAC is the Role and RoleBinding that let sa read N for a workload
// of kind in ns.
func fleetRBAC(ns, workload, kind, sa string) (*rbacv1.Role, *rbacv1.RoleBinding) {
	meta := metav1.ObjectMeta{
		Name:      workload + "-k8s-event-fleet",
		Namespace: ns,
		Labels:    map[string]string{DeploymentLabel: workload, managedByLabel: FieldManager},
	}
	rules := []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"list"}},
		{APIGroups: []string{"apps"}, Resources: []string{"daemonsets"}, ResourceNames: []string{workload}, Verbs: []string{"get"}},
	}
	if kind != kindDaemonSet {
		rules = []rbacv1.PolicyRule{
			{APIGroups: []string{"apps"}, Resources: []string{"deployments"}, ResourceNames: []string{workload}, Verbs: []string{"get"}},
			{APIGroups: []string{"apps"}, Resources: []string{"replicasets"}, Verbs: []string{"get"}},
		}
	}
	role := &rbacv1.Role{TypeMeta: metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "Role"}, ObjectMeta: meta, Rules: rules}
	binding := &rbacv1.RoleBinding{
		TypeMeta:   metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "RoleBinding"},
		ObjectMeta: *meta.DeepCopy(),
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: meta.Name},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: sa, Namespace: ns}},
	}
	return role, binding
}

func rulesString(rules []rbacv1.PolicyRule) string {
	var s []string
	for _, x := range rules {
		w := strings.Join(x.Verbs, ", ") + " " + strings.Join(x.Resources, ", ")
		if len(x.ResourceNames) > 0 {
			w += " " + strings.Join(x.ResourceNames, ", ")
		}
		s = append(s, w)
	}
	return strings.Join(s, "; ")
}

// planFleetRBAC is the steps that grant the fleet's reads, when the
// Corefile the pods read has fleet. Objects of those names without the
// install's labels are the operator's: kept as they are.
func (pl *planner) planFleetRBAC(ctx context.Context, c kubernetes.Interface, ns, workload, kind, sa string) ([]step, error) {
	if !pl.fleet.on {
		return nil, nil
	}
	role, binding := fleetRBAC(ns, workload, kind, sa)
	roles, bindings := c.RbacV1().Roles(ns), c.RbacV1().RoleBindings(ns)
	name := ns + "/" + role.Name
	var steps []step
	have, err := roles.Get(ctx, role.Name, metav1.GetOptions{})
	roleIsNew := apierrors.IsNotFound(err)
	switch {
	case roleIsNew:
		steps = append(steps, createStep("role", name, rulesString(role.Rules),
			func(ctx context.Context, dry []string) error {
				_, err := roles.Create(ctx, role, metav1.CreateOptions{FieldManager: FieldManager, DryRun: dry})
				return err
			},
			func(ctx context.Context) error { return roles.Delete(ctx, role.Name, metav1.DeleteOptions{}) },
			needs("create role "+name, rbacRight("create", "roles", ""), rbacRight("delete", "roles", role.Name))))
	case err != nil:
		return nil, err
	case !ours(have.ObjectMeta, workload):
		steps = append(steps, step{change: Change{Action: "keep", Kind: "role", Name: name, Detail: "not this tool's: kept as it is (fleet reads " + rulesString(role.Rules) + ")"}, line: "keep role " + name})
	case !equalJSON(have.Rules, role.Rules):
		steps = append(steps, updateRoleRules(roles, have, role.Rules))
	}
	hb, err := bindings.Get(ctx, binding.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		s := createStep("rolebinding", name, fmt.Sprintf("role %s to serviceaccount %s/%s", role.Name, ns, sa),
			func(ctx context.Context, dry []string) error {
				_, err := bindings.Create(ctx, binding, metav1.CreateOptions{FieldManager: FieldManager, DryRun: dry})
				return err
			},
			func(ctx context.Context) error { return bindings.Delete(ctx, binding.Name, metav1.DeleteOptions{}) },
			needs("create rolebinding "+name, rbacRight("create", "rolebindings", ""), rbacRight("delete", "rolebindings", binding.Name)))
		if roleIsNew {
			// The API server checks the binding against the Role, which the
			// dry run of the Role's create did not keep: the review asks it.
			s.dry = nil
			s.needs = append(s.needs, need{why: "binding role " + role.Name, all: []right{rbacRight("bind", "roles", role.Name)}, or: fleetRights(role.Rules)})
		}
		steps = append(steps, s)
	case err != nil:
		return nil, err
	case !ours(hb.ObjectMeta, workload):
		steps = append(steps, step{change: Change{Action: "keep", Kind: "rolebinding", Name: name, Detail: "not this tool's: kept as it is"}, line: "keep rolebinding " + name})
	case !bindsServiceAccount(hb, ns, sa):
		steps = append(steps, updateBinding(bindings, hb, binding.Subjects[0], "role "+role.Name+" to serviceaccount "+ns+"/"+sa)...)
	}
	return steps, nil
}

// fleetRights are the rights rules grant, as an access review asks them.
func fleetRights(rules []rbacv1.PolicyRule) []right {
	var out []right
	for _, x := range rules {
		name := ""
		if len(x.ResourceNames) > 0 {
			name = x.ResourceNames[0]
		}
		out = append(out, right{verb: x.Verbs[0], group: x.APIGroups[0], resource: x.Resources[0], name: name})
	}
	return out
}

// createStep is the step that creates kind name, its dry run, and the
// undo that deletes it.
func createStep(kind, name, detail string, create func(context.Context, []string) error, undo func(context.Context) error, n need) step {
	return step{
		change: Change{Action: "create", Kind: kind, Name: name, Detail: detail},
		line:   "create " + kind + " " + name,
		do:     func(ctx context.Context) error { return create(ctx, nil) },
		dry:    func(ctx context.Context) error { return create(ctx, dryAll) },
		needs:  []need{n}, undo: undo,
	}
}

// updateRoleRules is the step that sets the rules of the install's Role
// have.
func updateRoleRules(roles interface {
	Update(context.Context, *rbacv1.Role, metav1.UpdateOptions) (*rbacv1.Role, error)
}, have *rbacv1.Role, rules []rbacv1.PolicyRule) step {
	name := have.Namespace + "/" + have.Name
	want := have.DeepCopy()
	want.Rules = rules
	update := func(dry []string) func(context.Context) error {
		return func(ctx context.Context) error {
			_, err := roles.Update(ctx, want, metav1.UpdateOptions{FieldManager: FieldManager, DryRun: dry})
			return err
		}
	}
	return step{
		change: Change{Action: "update", Kind: "role", Name: name, Detail: "rules to " + rulesString(rules)},
		line:   "update role " + name,
		do:     update(nil), dry: update(dryAll),
		needs: []need{needs("update role "+name, rbacRight("update", "roles", have.Name))},
	}
}

// fleetNames are the names of the fleet's Role and RoleBinding of
// workload.
func fleetName(workload string) string { return workload + "-k8s-event-fleet" }

// fleetNeeds are the rights the uninstall needs to remove the fleet's
// Role and RoleBinding of workload in ns.
func fleetNeeds(workload string) need {
	n := fleetName(workload)
	return needs("deleting the fleet's Role and RoleBinding the install made", rbacRight("delete", "rolebindings", n), rbacRight("delete", "roles", n))
}

// fleetRemoval is the deletes of the fleet's RoleBinding and Role the
// install made for workload in ns; those without its labels stay.
func fleetRemoval(ctx context.Context, c kubernetes.Interface, ns, workload, when string) ([]step, error) {
	n := fleetName(workload)
	var steps []step
	b, err := c.RbacV1().RoleBindings(ns).Get(ctx, n, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
	case err != nil:
		return nil, err
	case ours(b.ObjectMeta, workload):
		uid := b.UID
		steps = append(steps, deleteStep(Change{Action: "delete", Kind: "rolebinding", Name: ns + "/" + n, When: when, Detail: "the fleet's reads"}, whenLine(when, "delete rolebinding "+ns+"/"+n), func(ctx context.Context) error {
			return c.RbacV1().RoleBindings(ns).Delete(ctx, n, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
		}))
	}
	ro, err := c.RbacV1().Roles(ns).Get(ctx, n, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
	case err != nil:
		return nil, err
	case ours(ro.ObjectMeta, workload):
		uid := ro.UID
		steps = append(steps, deleteStep(Change{Action: "delete", Kind: "role", Name: ns + "/" + n, When: when, Detail: "the fleet's reads"}, whenLine(when, "delete role "+ns+"/"+n), func(ctx context.Context) error {
			return c.RbacV1().Roles(ns).Delete(ctx, n, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
		}))
	}
	return steps, nil
}

// deleteStep is the step that deletes with del, said as ch and line: an
// object already gone counts as deleted.
func deleteStep(ch Change, line string, del func(context.Context) error) step {
	return step{change: ch, line: line, do: func(ctx context.Context) error {
		if err := del(ctx); err != nil && !apierrors.IsNotFound(err) {
			return err
		}
		return nil
	}}
}

// checkFleet finds the fleet line of the Corefile the pods read, and the
// fleet's Role.
func (s *StatusReport) checkFleet(ctx context.Context, c kubernetes.Interface, ns, workload string, t *target) {
	s.Fleet = "off"
	cm, err := c.CoreV1().ConfigMaps(ns).Get(ctx, s.ConfigMap, metav1.GetOptions{})
	if err != nil {
		s.Fleet = "not known (configmap " + s.ConfigMap + " not read)"
		return
	}
	cf, err := parseCorefile(cm.Data[t.key], t.mountedFiles(t.w.template().Spec.Volumes[t.volume], cm.Data))
	if err != nil {
		return
	}
	line := corefileFleet(cf)
	if line == "" {
		return
	}
	n := fleetName(workload)
	role, err := c.RbacV1().Roles(ns).Get(ctx, n, metav1.GetOptions{})
	what, err := presence(err, func() metav1.ObjectMeta { return role.ObjectMeta }, workload)
	if err != nil {
		what = err.Error()
	}
	s.Fleet = line + "; role " + ns + "/" + n + " " + what
}
