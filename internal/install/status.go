package install

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// States of StatusReport.
const (
	StateInstalled    = "installed"
	StateNotInstalled = "not installed"
	StatePartlyUndone = "partly undone"
	StateOther        = "installed by other means"
)

// StatusReport is what status finds: with Options.JSON it is written to
// Out as one JSON document.
type StatusReport struct {
	Deployment string `json:"deployment"`
	// Kind is the kind of the workload: Deployment or DaemonSet.
	Kind string `json:"kind"`
	// Layout is how the cluster runs CoreDNS: kubeadm, the CoreDNS helm
	// chart, k3s, and so on, or custom.
	Layout string `json:"layout"`
	// State is one of installed, not installed, partly undone, or
	// installed by other means.
	State string `json:"state"`
	Image string `json:"image"`
	// CoreDNS is the release Image runs, as its tag names it, or
	// "unknown"; BeforeCoreDNS the one BeforeImage runs.
	CoreDNS   string   `json:"coredns"`
	ConfigMap string   `json:"configMap"`
	Key       string   `json:"key"`
	Variables []string `json:"variables"`
	// BeforeImage and BeforeConfigMap are what the install replaced.
	BeforeImage     string `json:"beforeImage,omitempty"`
	BeforeConfigMap string `json:"beforeConfigMap,omitempty"`
	BeforeCoreDNS   string `json:"beforeCoredns,omitempty"`
	ServiceAccount  string `json:"serviceAccount"`
	// Role and RoleBinding are present, absent, or "not this tool's".
	Role        string `json:"role"`
	RoleBinding string `json:"roleBinding"`
	// FlowSchema and PriorityLevel say the priority level of the event
	// writes: the FlowSchema of ServiceAccount and the level it names,
	// each absent, present, or present and not this tool's.
	FlowSchema    string `json:"flowSchema"`
	PriorityLevel string `json:"priorityLevel"`
	// Fleet is the fleet line of the Corefile the pods read, and the
	// fleet's Role, or off.
	Fleet     string `json:"fleet"`
	Replicas  int32  `json:"replicas"`
	Ready     int32  `json:"ready"`
	Available int32  `json:"available"`
	RolledOut bool   `json:"rolledOut"`
	// Running is how many Ready pods run the installed template.
	Running int32 `json:"running"`
	// Problems are what keeps k8s_event from working as installed, each
	// with what to do.
	Problems []string `json:"problems,omitempty"`
	// Owners are the others that keep the Deployment as they want it.
	Owners []string `json:"owners,omitempty"`
	// Unread are the objects the one who runs status may not read (a
	// read-only role such as view reads no Role): what they hold is not
	// checked.
	Unread []string `json:"unread,omitempty"`
}

// Healthy reports whether k8s_event is installed and nothing is wrong:
// not when status could not read all it checks.
func (s *StatusReport) Healthy() bool {
	return s.State == StateInstalled && len(s.Problems) == 0 && len(s.Unread) == 0
}

// forbidden notes, when err is a 403, that what is not readable is not
// checked, and reports whether it was.
func (s *StatusReport) forbidden(err error, what string) bool {
	if !apierrors.IsForbidden(err) {
		return false
	}
	s.Unread = append(s.Unread, what)
	return true
}

// Status describes whether the Deployment that o names has k8s_event, and
// what keeps it from working.
func Status(ctx context.Context, c kubernetes.Interface, o Options) (*StatusReport, error) {
	t, err := findTarget(ctx, c, &o)
	if err != nil {
		return nil, err
	}
	d := t.w
	s := newStatusReport(t)
	if err := s.checkConfigMaps(ctx, c, t); err != nil {
		return nil, err
	}
	if err := s.checkRBAC(ctx, c, d.meta()); err != nil {
		return nil, err
	}
	if err := s.checkFlowControl(ctx, c, d.meta().Namespace, d.meta().Name); err != nil {
		return nil, err
	}
	s.checkFleet(ctx, c, d.meta().Namespace, d.meta().Name, t)
	s.checkRollout(ctx, c, d)
	if o.Out != nil {
		if o.JSON {
			b, _ := json.MarshalIndent(s, "", "  ")
			fmt.Fprintf(o.Out, "%s\n", b)
		} else {
			s.print(&o)
		}
	}
	return s, nil
}

// newStatusReport is what the workload itself says.
func newStatusReport(t *target) *StatusReport {
	d := t.w
	spec := &d.template().Spec
	ctr := spec.Containers[t.container]
	s := &StatusReport{
		Deployment: nsName(d), Kind: d.kind(), State: StateNotInstalled, Image: ctr.Image, CoreDNS: release(ctr.Image),
		ConfigMap: spec.Volumes[t.volume].ConfigMap.Name, Key: t.key, Variables: []string{},
		Replicas: d.replicas(), Ready: d.ready(), Available: d.available(), RolledOut: d.rolledOut(),
	}
	s.ServiceAccount = spec.ServiceAccountName
	if s.ServiceAccount == "" {
		s.ServiceAccount = "default"
	}
	for _, e := range ctr.Env {
		if isOurEnv(e.Name) {
			s.Variables = append(s.Variables, e.Name)
		}
	}
	return s
}

func (s *StatusReport) problem(format string, args ...any) {
	s.Problems = append(s.Problems, fmt.Sprintf(format, args...))
}

// checkConfigMaps sets the state from the install's record and the
// Corefile the pods read, and finds what is wrong with the ConfigMaps.
func (s *StatusReport) checkConfigMaps(ctx context.Context, c kubernetes.Interface, t *target) error {
	ns := t.w.meta().Namespace
	read, err := c.CoreV1().ConfigMaps(ns).Get(ctx, s.ConfigMap, metav1.GetOptions{})
	switch {
	case s.forbidden(err, "configmap "+ns+"/"+s.ConfigMap):
		read = nil
	case apierrors.IsNotFound(err):
		s.problem("configmap %s, which the pods read, is missing: new pods cannot start; run install again (or uninstall)", s.ConfigMap)
	case err != nil:
		return err
	}
	sub := subject{kind: t.w.kind(), meta: t.w.meta(), program: programOf(&t.w.template().Spec)}
	if read != nil {
		sub.corefile, sub.configMap = read.Data[t.key], read.Labels
	}
	l := layoutOf(sub)
	s.Layout, s.Owners = l.name, otherOwners(t.w, t, l)
	if l.refused != "" {
		s.Owners = append(s.Owners, l.refused)
	}
	switch {
	case t.rec != nil:
		s.State = StateInstalled
		s.BeforeImage, s.BeforeConfigMap = t.rec.Original.Image, t.rec.Original.Volume.ConfigMap.Name
		s.BeforeCoreDNS = release(s.BeforeImage)
		if s.ConfigMap == t.rec.ConfigMap && s.Image != t.rec.Image && repository(s.Image) == repository(t.rec.Image) {
			s.problem("the image is %s, another build of the one install set (%s), set since by hand: run install again with --image %s to record it; what install replaced (image %s) stays the original", s.Image, t.rec.Image, s.Image, s.BeforeImage)
		} else if s.Image != t.rec.Image || s.ConfigMap != t.rec.ConfigMap {
			s.State = StatePartlyUndone
			s.problem("the image or the configmap is no longer what install set (image %s, configmap %s): run install again, or uninstall", t.rec.Image, t.rec.ConfigMap)
		}
		if t.rec.Source != "" {
			return s.checkSource(ctx, c, ns, t.rec)
		}
	case read != nil && t.key != "" && hasPluginsWith(read.Data[t.key], t.mountedFiles(t.w.template().Spec.Volumes[t.volume], read.Data)):
		s.State = StateOther
	}
	return nil
}

// checkSource finds whether the operator's ConfigMap that the install
// started from is there and as it was.
func (s *StatusReport) checkSource(ctx context.Context, c kubernetes.Interface, ns string, rec *record) error {
	src, err := c.CoreV1().ConfigMaps(ns).Get(ctx, s.BeforeConfigMap, metav1.GetOptions{})
	switch {
	case s.forbidden(err, "configmap "+ns+"/"+s.BeforeConfigMap):
	case apierrors.IsNotFound(err):
		s.problem("configmap %s, the Corefile install started from, is gone: uninstall would point the pods at it", s.BeforeConfigMap)
	case err != nil:
		return err
	case mountedHash(rec.Original.Volume, src.Data, src.BinaryData) != rec.Source && contentHash(src.Data, src.BinaryData) != rec.Source:
		// An older install hashed every key; keys the pods do not mount
		// change nothing they read.
		what := "its content"
		for _, key := range extraKeys() {
			if _, ok := src.Data[key]; ok {
				what = fmt.Sprintf("its content (%s rewrites %s as nodes come and go)", extraKeyOwner(key), key)
			}
		}
		s.problem("configmap %s changed since the install (%s): the pods read the copy made then; run install again to roll them to it", s.BeforeConfigMap, what)
	}
	return nil
}

// checkRBAC finds the install's Role and RoleBinding, and whether they
// let the pods write events.
func (s *StatusReport) checkRBAC(ctx context.Context, c kubernetes.Interface, d *metav1.ObjectMeta) error {
	ns, name := d.Namespace, d.Name+"-k8s-event"
	role, err := c.RbacV1().Roles(ns).Get(ctx, name, metav1.GetOptions{})
	roleUnread := s.forbidden(err, "role "+ns+"/"+name)
	if s.Role, err = presence(err, func() metav1.ObjectMeta { return role.ObjectMeta }, d.Name); err != nil {
		return err
	}
	binding, err := c.RbacV1().RoleBindings(ns).Get(ctx, name, metav1.GetOptions{})
	bindingUnread := s.forbidden(err, "rolebinding "+ns+"/"+name)
	if s.RoleBinding, err = presence(err, func() metav1.ObjectMeta { return binding.ObjectMeta }, d.Name); err != nil {
		return err
	}
	if s.State != StateInstalled && s.State != StatePartlyUndone {
		return nil
	}
	switch {
	case roleUnread:
	case s.Role == "absent":
		s.problem("role %s/%s is missing: k8s_event gets 403 on events; run install again", ns, name)
	case !grantsEvents(role.Rules):
		s.problem("role %s/%s does not grant create and patch on events: k8s_event gets 403; run install again", ns, name)
	}
	switch {
	case bindingUnread:
	case s.RoleBinding == "absent":
		s.problem("rolebinding %s/%s is missing: k8s_event gets 403 on events; run install again", ns, name)
	case !bindsServiceAccount(binding, ns, s.ServiceAccount):
		s.problem("rolebinding %s/%s binds %s, but the pods run as serviceaccount %s/%s: k8s_event gets 403 on events; run install again", ns, name, subjectsString(binding.Subjects), ns, s.ServiceAccount)
	}
	return nil
}

// checkRollout finds pods that are not Ready and a rollout that does not
// progress.
func (s *StatusReport) checkRollout(ctx context.Context, c kubernetes.Interface, w workload) {
	d := w.meta()
	if why := w.interruptedRollout(); why != "" {
		if held := leaseHeld(ctx, c, d.Namespace, d.Name); held != "" {
			why += " (unless that run still runs: " + held + ")"
		}
		s.problem("%s", why)
	}
	if fieldsHeld(d) {
		why := fmt.Sprintf("a run was cut off after its rollout, before it gave up the fields it set (managedFields of %s): the next server-side apply (helm 4, kubectl apply --server-side) conflicts; run install again to finish it", FieldManager)
		if held := leaseHeld(ctx, c, d.Namespace, d.Name); held != "" {
			why += " (unless that run still runs: " + held + ")"
		}
		s.problem("%s", why)
	}
	if why := podTrouble(ctx, c, w); len(why) > 0 {
		s.problem("pods not Ready: %s", strings.Join(why, "; "))
	}
	s.checkInstalledPods(ctx, c, w)
	for _, why := range w.stalled() {
		s.problem("the rollout does not progress (%s): kubectl -n %s describe %s", why, d.Namespace, kubectlRef(w))
	}
}

func (s *StatusReport) print(o *Options) {
	p := func(format string, args ...any) { fmt.Fprintf(o.Out, format, args...) }
	p("%s %s (%s): k8s_event %s\n", strings.ToLower(s.Kind), s.Deployment, s.Layout, s.State)
	p("  image %s (CoreDNS %s)\n", s.Image, s.CoreDNS)
	p("  Corefile: configmap %s, key %s\n", s.ConfigMap, s.Key)
	p("  downward-API variables: %s\n", strings.Join(s.Variables, " "))
	if s.BeforeImage != "" {
		p("  before the install: image %s (CoreDNS %s), configmap %s\n", s.BeforeImage, s.BeforeCoreDNS, s.BeforeConfigMap)
	}
	p("  serviceaccount %s; role %s; rolebinding %s\n", s.ServiceAccount, s.Role, s.RoleBinding)
	p("  priority level: %s; %s\n", s.FlowSchema, s.PriorityLevel)
	p("  fleet: %s\n", s.Fleet)
	rolled := "rolling out"
	if s.RolledOut {
		rolled = "rolled out"
	}
	p("  replicas: %d ready, %d available of %d, %s\n", s.Ready, s.Available, s.Replicas, rolled)
	if s.BeforeImage != "" {
		p("  pods Ready with the installed template: %d\n", s.Running)
	}
	for _, w := range s.Owners {
		p("  managed elsewhere: %s\n", w)
	}
	for _, w := range s.Problems {
		p("  problem: %s\n", w)
	}
	if len(s.Unread) > 0 {
		p("  not checked, as reading it is forbidden: %s\n", strings.Join(s.Unread, ", "))
	}
}

// presence says whether an object the install makes is there (err is its
// read's), and whether it carries the install's labels.
func presence(err error, meta func() metav1.ObjectMeta, deployment string) (string, error) {
	return objectPresence(err, func() bool { return ours(meta(), deployment) }, "not this tool's")
}

// checkInstalledPods counts the Ready pods that run the installed template
// (they carry its record), and finds too few where the rollout will not
// bring more: a paused Deployment, or one that says it rolled out.
func (s *StatusReport) checkInstalledPods(ctx context.Context, c kubernetes.Interface, w workload) {
	d := w.meta()
	rec, ok := w.template().Annotations[Annotation]
	if !ok {
		return
	}
	sel, err := metav1.LabelSelectorAsSelector(w.selector())
	if err != nil {
		return
	}
	list, err := pods(ctx, c, w)
	if err != nil {
		return
	}
	live := 0
	for _, p := range list {
		if p.DeletionTimestamp != nil {
			continue
		}
		live++
		if podReady(&p) && p.Annotations[Annotation] == rec {
			s.Running++
		}
	}
	switch {
	case s.Running >= s.Replicas:
	case w.paused():
		s.problem("%s is paused: %d of %d pods run the installed template; kubectl -n %s rollout resume %s", ref(w), s.Running, s.Replicas, d.Namespace, kubectlRef(w))
	case s.RolledOut && live > 0:
		s.problem("the rollout reads as done, but %d of %d pods run the installed template: kubectl -n %s get pods -l %s", s.Running, s.Replicas, d.Namespace, sel.String())
	}
}
