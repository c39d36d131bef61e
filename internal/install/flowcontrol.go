package install

import (
	"context"
	"fmt"
	"strings"

	flowcontrolv1 "k8s.io/api/flowcontrol/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	manifests "github.com/dnsops/k8s_event/deploy"
)

// The priority level: the install puts the event writes of the workload's
// ServiceAccount into a priority level of their own at the API server (API
// Priority and Fairness), the FlowSchema and PriorityLevelConfiguration of
// deploy/k8s_event/flowcontrol, unless Options.NoFlowControl. Both are
// cluster-scoped: the install labels what it makes (the FlowSchema with
// the workload and its namespace; the level, which every FlowSchema of the
// tool shares, with the tool alone), and uninstall deletes only those, the
// level once no FlowSchema refers to it any more. Objects of those names
// without the labels are the operator's (the kustomize component, the helm
// manifest): kept as they are.

const (
	// NamespaceLabel names, on the cluster-scoped objects the install
	// makes, the namespace of the workload they are for.
	NamespaceLabel = "k8s-event.coredns.io/namespace"
	flowcontrolGV  = "flowcontrol.apiserver.k8s.io/v1"
	flowcontrolAPI = "flowcontrol.apiserver.k8s.io"
	// FlowControlFlag is the flag that installs without the priority level.
	FlowControlFlag = "--flowcontrol=false"
)

// FlowSchemaName is the name of the FlowSchema the install makes for the
// ServiceAccount sa of namespace ns: manifests.FlowSchemaName's in
// kube-system, the component's, and with the namespace in it elsewhere, as
// FlowSchemas are cluster-scoped.
func FlowSchemaName(ns, sa string) string {
	if ns == "kube-system" {
		return manifests.FlowSchemaName(sa)
	}
	return manifests.FlowSchemaName(ns + "-" + sa)
}

// flowControlObjects are the level and the FlowSchema for the ServiceAccount
// sa of workload in ns, with the install's labels.
func flowControlObjects(ns, workload, sa string) (*flowcontrolv1.PriorityLevelConfiguration, *flowcontrolv1.FlowSchema, error) {
	pl, fs, err := manifests.FlowControl(ns, sa)
	if err != nil {
		return nil, nil, err
	}
	pl.Labels = map[string]string{managedByLabel: FieldManager}
	fs.Name = FlowSchemaName(ns, sa)
	fs.Labels = map[string]string{managedByLabel: FieldManager, DeploymentLabel: workload, NamespaceLabel: ns}
	return pl, fs, nil
}

func levelIsOurs(m metav1.ObjectMeta) bool { return m.Labels[managedByLabel] == FieldManager }

func flowSchemaIsOurs(m metav1.ObjectMeta, ns, workload string) bool {
	return m.Labels[managedByLabel] == FieldManager && m.Labels[DeploymentLabel] == workload && m.Labels[NamespaceLabel] == ns
}

func flowRight(verb, resource, name string) right {
	return right{verb: verb, group: flowcontrolAPI, resource: resource, name: name, cluster: true}
}

// checkFlowControlAPI refuses an API server without flowcontrol v1 (before
// Kubernetes 1.29, or with the API turned off), naming the flag that goes
// without it.
func checkFlowControlAPI(c kubernetes.Interface) error {
	list, err := c.Discovery().ServerResourcesForGroupVersion(flowcontrolGV)
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("discovery of %s: %w", flowcontrolGV, err)
	}
	have := map[string]bool{}
	if list != nil {
		for _, r := range list.APIResources {
			have[r.Name] = true
		}
	}
	if !have["flowschemas"] || !have["prioritylevelconfigurations"] {
		return &RefusedError{[]string{fmt.Sprintf("the API server does not serve %s (flowschemas and prioritylevelconfigurations; Kubernetes 1.29 and later), where install gives CoreDNS's event writes a priority level of their own: install without it with %s (the plugin's rate and fleet bounds still hold)", flowcontrolGV, FlowControlFlag)}}
	}
	return nil
}

// planFlowControl is the steps that make the level and then the
// FlowSchema (a FlowSchema that names a missing level is dangling), or
// none with NoFlowControl.
func (pl *planner) planFlowControl(ctx context.Context, c kubernetes.Interface, ns, workload, sa string) ([]step, error) {
	if pl.o.NoFlowControl {
		pl.rep.FlowControl = "left out (" + FlowControlFlag + ")"
		return nil, nil
	}
	if err := checkFlowControlAPI(c); err != nil {
		return nil, err
	}
	level, fs, err := flowControlObjects(ns, workload, sa)
	if err != nil {
		return nil, err
	}
	pl.rep.FlowControl = fmt.Sprintf("flowschema %s puts the event writes of serviceaccount %s/%s into priority level %s (%s)", fs.Name, ns, sa, level.Name, levelString(level))
	steps, err := planLevel(ctx, c, level)
	if err != nil {
		return nil, err
	}
	more, err := planFlowSchema(ctx, c, fs, ns, workload)
	return append(steps, more...), err
}

// levelString says a level's settings.
func levelString(pl *flowcontrolv1.PriorityLevelConfiguration) string {
	l := pl.Spec.Limited
	if l == nil || l.NominalConcurrencyShares == nil {
		return string(pl.Spec.Type)
	}
	s := fmt.Sprintf("%s, %d concurrency shares", pl.Spec.Type, *l.NominalConcurrencyShares)
	if q := l.LimitResponse.Queuing; q != nil {
		s += fmt.Sprintf(", %d queues of at most %d", q.Queues, q.QueueLengthLimit)
	}
	return s
}

// flowSchemaString says what a FlowSchema matches.
func flowSchemaString(fs *flowcontrolv1.FlowSchema) string {
	var subjects, verbs []string
	for _, rule := range fs.Spec.Rules {
		for _, s := range rule.Subjects {
			if s.ServiceAccount != nil {
				subjects = append(subjects, "serviceaccount "+s.ServiceAccount.Namespace+"/"+s.ServiceAccount.Name)
			}
		}
		for _, rr := range rule.ResourceRules {
			verbs = append(verbs, strings.Join(rr.Verbs, ", ")+" "+strings.Join(rr.Resources, ", "))
		}
	}
	return fmt.Sprintf("%s of %s, precedence %d, to level %s", strings.Join(verbs, "; "), strings.Join(subjects, ", "), fs.Spec.MatchingPrecedence, fs.Spec.PriorityLevelConfiguration.Name)
}

// planLevel says what the level needs: created, updated to the tool's
// settings, or kept (another's, or as it should be).
func planLevel(ctx context.Context, c kubernetes.Interface, pl *flowcontrolv1.PriorityLevelConfiguration) ([]step, error) {
	api := c.FlowcontrolV1().PriorityLevelConfigurations()
	const kind, res = "prioritylevelconfiguration", "prioritylevelconfigurations"
	have, err := api.Get(ctx, pl.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		create := func(dry []string) func(context.Context) error {
			return func(ctx context.Context) error {
				_, err := api.Create(ctx, pl, metav1.CreateOptions{FieldManager: FieldManager, DryRun: dry})
				return err
			}
		}
		return []step{{
			change: Change{Action: "create", Kind: kind, Name: pl.Name, Detail: levelString(pl)},
			line:   "create " + kind + " " + pl.Name,
			do:     create(nil), dry: create(dryAll),
			needs: []need{needs("create "+kind+" "+pl.Name, flowRight("create", res, ""), flowRight("delete", res, pl.Name))},
			undo:  func(ctx context.Context) error { return api.Delete(ctx, pl.Name, metav1.DeleteOptions{}) },
		}}, nil
	case err != nil:
		return nil, fmt.Errorf("%s %s: %w", kind, pl.Name, err)
	case !levelIsOurs(have.ObjectMeta):
		return []step{{
			change: Change{Action: "keep", Kind: kind, Name: pl.Name, Detail: fmt.Sprintf("not this tool's (no label %s=%s): kept as it is (%s)", managedByLabel, FieldManager, levelString(have))},
			line:   "keep " + kind + " " + pl.Name,
		}}, nil
	case equality.Semantic.DeepEqual(have.Spec, pl.Spec):
		return []step{{change: Change{Action: "keep", Kind: kind, Name: pl.Name, Detail: "there already"}, line: "keep " + kind + " " + pl.Name}}, nil
	}
	want := have.DeepCopy()
	want.Spec = pl.Spec
	update := func(dry []string) func(context.Context) error {
		return func(ctx context.Context) error {
			_, err := api.Update(ctx, want, metav1.UpdateOptions{FieldManager: FieldManager, DryRun: dry})
			return err
		}
	}
	return []step{{
		change: Change{Action: "update", Kind: kind, Name: pl.Name, Detail: "to " + levelString(pl) + " (was " + levelString(have) + ")"},
		line:   "update " + kind + " " + pl.Name,
		do:     update(nil), dry: update(dryAll),
		needs: []need{needs("update "+kind+" "+pl.Name, flowRight("update", res, pl.Name))},
	}}, nil
}

// planFlowSchema says what the FlowSchema needs, as planLevel does.
func planFlowSchema(ctx context.Context, c kubernetes.Interface, fs *flowcontrolv1.FlowSchema, ns, workload string) ([]step, error) {
	api := c.FlowcontrolV1().FlowSchemas()
	const kind, res = "flowschema", "flowschemas"
	have, err := api.Get(ctx, fs.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		create := func(dry []string) func(context.Context) error {
			return func(ctx context.Context) error {
				_, err := api.Create(ctx, fs, metav1.CreateOptions{FieldManager: FieldManager, DryRun: dry})
				return err
			}
		}
		return []step{{
			change: Change{Action: "create", Kind: kind, Name: fs.Name, Detail: flowSchemaString(fs)},
			line:   "create " + kind + " " + fs.Name,
			do:     create(nil), dry: create(dryAll),
			needs: []need{needs("create "+kind+" "+fs.Name, flowRight("create", res, ""), flowRight("delete", res, fs.Name))},
			undo:  func(ctx context.Context) error { return api.Delete(ctx, fs.Name, metav1.DeleteOptions{}) },
		}}, nil
	case err != nil:
		return nil, fmt.Errorf("%s %s: %w", kind, fs.Name, err)
	case !flowSchemaIsOurs(have.ObjectMeta, ns, workload):
		return []step{{
			change: Change{Action: "keep", Kind: kind, Name: fs.Name, Detail: fmt.Sprintf("not this tool's for %s/%s (labels %s, %s, %s): kept as it is (%s)", ns, workload, managedByLabel, DeploymentLabel, NamespaceLabel, flowSchemaString(have))},
			line:   "keep " + kind + " " + fs.Name,
		}}, nil
	case equality.Semantic.DeepEqual(have.Spec, fs.Spec):
		return []step{{change: Change{Action: "keep", Kind: kind, Name: fs.Name, Detail: "there already"}, line: "keep " + kind + " " + fs.Name}}, nil
	}
	want := have.DeepCopy()
	want.Spec = fs.Spec
	update := func(dry []string) func(context.Context) error {
		return func(ctx context.Context) error {
			_, err := api.Update(ctx, want, metav1.UpdateOptions{FieldManager: FieldManager, DryRun: dry})
			return err
		}
	}
	return []step{{
		change: Change{Action: "update", Kind: kind, Name: fs.Name, Detail: "to " + flowSchemaString(fs) + " (was " + flowSchemaString(have) + ")"},
		line:   "update " + kind + " " + fs.Name,
		do:     update(nil), dry: update(dryAll),
		needs: []need{needs("update "+kind+" "+fs.Name, flowRight("update", res, fs.Name))},
	}}, nil
}

// ownFlowSchemas are the FlowSchemas the install made for workload in ns;
// none where the API server serves no flowcontrol v1. ok is false where
// they cannot be listed (forbidden).
func ownFlowSchemas(ctx context.Context, c kubernetes.Interface, ns, workload string) (list []flowcontrolv1.FlowSchema, ok bool, err error) {
	sel := fmt.Sprintf("%s=%s,%s=%s,%s=%s", managedByLabel, FieldManager, DeploymentLabel, workload, NamespaceLabel, ns)
	got, err := c.FlowcontrolV1().FlowSchemas().List(ctx, metav1.ListOptions{LabelSelector: sel})
	switch {
	case apierrors.IsNotFound(err):
		return nil, true, nil
	case apierrors.IsForbidden(err):
		return nil, false, nil
	case err != nil:
		return nil, false, fmt.Errorf("listing flowschemas: %w", err)
	}
	for _, fs := range got.Items {
		if flowSchemaIsOurs(fs.ObjectMeta, ns, workload) {
			list = append(list, fs)
		}
	}
	return list, true, nil
}

// flowControlNeeds are the rights the uninstall needs to remove the
// FlowSchemas install made for workload in ns, and the level.
func (r *run) flowControlNeeds(ctx context.Context, c kubernetes.Interface, ns, workload string) []need {
	own, _, err := ownFlowSchemas(ctx, c, ns, workload)
	if err != nil || len(own) == 0 {
		return nil
	}
	var out []need
	for _, fs := range own {
		out = append(out, needs("deleting flowschema "+fs.Name+" that install made", flowRight("delete", "flowschemas", fs.Name)))
	}
	level := manifests.PriorityLevelName
	return append(out, needs("deleting priority level "+level+" once no FlowSchema refers to it", flowRight("list", "flowschemas", ""),
		flowRight("get", "prioritylevelconfigurations", level), flowRight("delete", "prioritylevelconfigurations", level)))
}

// flowControlRemoval is the deletes of the FlowSchemas install made for
// workload in ns, then of the level when it is the tool's and no
// FlowSchema refers to it any more (another workload's install shares
// it); the operator's stay. It warns, with no steps, when the FlowSchemas
// cannot be listed.
func flowControlRemoval(ctx context.Context, c kubernetes.Interface, ns, workload, when string) (steps []step, warning string, err error) {
	own, ok, err := ownFlowSchemas(ctx, c, ns, workload)
	if err != nil {
		return nil, "", err
	}
	if !ok {
		return nil, fmt.Sprintf("the FlowSchemas install made for %s/%s are not checked, as listing flowschemas.%s is forbidden (deploy/kubectl-k8s-event/role.yaml, its ClusterRole, grants it): any stay", ns, workload, flowcontrolAPI), nil
	}
	gone := map[string]bool{}
	for _, fs := range own {
		name, uid := fs.Name, fs.UID
		gone[name] = true
		steps = append(steps, deleteStep(Change{Action: "delete", Kind: "flowschema", Name: name, When: when, Detail: "made by install for " + ns + "/" + workload}, whenLine(when, "delete flowschema "+name), func(ctx context.Context) error {
			return c.FlowcontrolV1().FlowSchemas().Delete(ctx, name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
		}))
	}
	if len(own) == 0 {
		return nil, "", nil
	}
	more, err := levelRemoval(ctx, c, gone, when)
	return append(steps, more...), "", err
}

// levelRemoval is the delete of the tool's level unless a FlowSchema
// other than those of gone refers to it, or why it stays.
func levelRemoval(ctx context.Context, c kubernetes.Interface, gone map[string]bool, when string) ([]step, error) {
	name := manifests.PriorityLevelName
	keep := func(detail, line string) []step {
		return []step{{change: Change{Action: "keep", Kind: "prioritylevelconfiguration", Name: name, Detail: detail}, line: line}}
	}
	pl, err := c.FlowcontrolV1().PriorityLevelConfigurations().Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("prioritylevelconfiguration %s: %w", name, err)
	case !levelIsOurs(pl.ObjectMeta):
		return keep(fmt.Sprintf("not this tool's (no label %s=%s): kept", managedByLabel, FieldManager), "keep prioritylevelconfiguration "+name), nil
	}
	all, err := c.FlowcontrolV1().FlowSchemas().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing flowschemas: %w", err)
	}
	for _, fs := range all.Items {
		if !gone[fs.Name] && fs.Spec.PriorityLevelConfiguration.Name == name {
			return keep("flowschema "+fs.Name+" still refers to it: kept", "keep prioritylevelconfiguration "+name+": flowschema "+fs.Name+" still refers to it"), nil
		}
	}
	uid := pl.UID
	return []step{deleteStep(Change{Action: "delete", Kind: "prioritylevelconfiguration", Name: name, When: when, Detail: "made by install; no FlowSchema refers to it any more"}, whenLine(when, "delete prioritylevelconfiguration "+name), func(ctx context.Context) error {
		return c.FlowcontrolV1().PriorityLevelConfigurations().Delete(ctx, name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
	})}, nil
}

func whenLine(when, line string) string {
	if when == "" {
		return line
	}
	return when + ", " + line
}

// checkFlowControl finds the FlowSchema of the pods' ServiceAccount and
// the level, and a FlowSchema that names a level that is gone.
func (s *StatusReport) checkFlowControl(ctx context.Context, c kubernetes.Interface, ns, workload string) error {
	name := FlowSchemaName(ns, s.ServiceAccount)
	fs, err := c.FlowcontrolV1().FlowSchemas().Get(ctx, name, metav1.GetOptions{})
	fsThere := err == nil
	s.FlowSchema, err = clusterPresence(err, func() bool { return flowSchemaIsOurs(fs.ObjectMeta, ns, workload) })
	if err != nil {
		return err
	}
	s.FlowSchema = "flowschema " + name + " " + s.FlowSchema
	level := manifests.PriorityLevelName
	if fsThere {
		level = fs.Spec.PriorityLevelConfiguration.Name
	}
	pl, err := c.FlowcontrolV1().PriorityLevelConfigurations().Get(ctx, level, metav1.GetOptions{})
	plAbsent := apierrors.IsNotFound(err)
	s.PriorityLevel, err = clusterPresence(err, func() bool { return levelIsOurs(pl.ObjectMeta) })
	if err != nil {
		return err
	}
	s.PriorityLevel = "prioritylevelconfiguration " + level + " " + s.PriorityLevel
	if fsThere && plAbsent {
		s.problem("flowschema %s names priority level %s, which is missing: the event writes go to the next FlowSchema that matches (kube-system-service-accounts); run install again", name, level)
	}
	return nil
}

// clusterPresence says whether a cluster-scoped object is there (err is
// its read's; a server without flowcontrol v1 answers 404), and whether
// it is the tool's. A read that is forbidden is said, not counted among
// what status could not check: the runner's ClusterRole is optional.
func clusterPresence(err error, ours func() bool) (string, error) {
	return objectPresence(err, ours, "present, not this tool's")
}

// objectPresence says "absent", "not readable (forbidden)", notOurs when
// ours says the object is another's, or "present", from err, its read's.
func objectPresence(err error, ours func() bool, notOurs string) (string, error) {
	switch {
	case apierrors.IsNotFound(err):
		return "absent", nil
	case apierrors.IsForbidden(err):
		return "not readable (forbidden)", nil
	case err != nil:
		return "", err
	case !ours():
		return notOurs, nil
	}
	return "present", nil
}

// planExtras is steps followed by the priority level's and the fleet's
// steps for workload of kind in ns, whose pods run as sa.
func (pl *planner) planExtras(ctx context.Context, c kubernetes.Interface, steps []step, ns, workload, kind, sa string) ([]step, error) {
	flow, err := pl.planFlowControl(ctx, c, ns, workload, sa)
	if err != nil {
		return nil, err
	}
	fleet, err := pl.planFleetRBAC(ctx, c, ns, workload, kind, sa)
	if err != nil {
		return nil, err
	}
	return append(append(steps, flow...), fleet...), nil
}

// extrasText says the priority level and the fleet line the install
// sets, a line each.
func (r *run) extrasText() string {
	var s string
	if r.res.FlowControl != "" {
		s += "priority level: " + r.res.FlowControl + "\n"
	}
	if r.res.Fleet != "" {
		s += "fleet: " + r.res.Fleet + "\n"
	}
	return s
}

// extrasRemoval removes what the install made of the priority level and
// the fleet's reads for workload in ns (with a dry run, says it), and
// reports what it went through.
func (r *run) extrasRemoval(ctx context.Context, c kubernetes.Interface, ns, workload, when string) error {
	steps, err := fleetRemoval(ctx, c, ns, workload, when)
	if err != nil {
		return err
	}
	more, warning, err := flowControlRemoval(ctx, c, ns, workload, when)
	if err != nil {
		return err
	}
	if warning != "" {
		r.warn(warning)
	}
	a, err := apply(ctx, append(steps, more...), r.o.DryRun)
	r.wrote(a)
	return err
}
