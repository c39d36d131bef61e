package install

import (
	"bytes"
	"context"
	"strings"
	"testing"

	authorizationv1 "k8s.io/api/authorization/v1"
	flowcontrolv1 "k8s.io/api/flowcontrol/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// serveFlowControl has the fake API server's discovery list
// flowcontrol.apiserver.k8s.io/v1, as every API server since 1.29 does.
func serveFlowControl(c *fake.Clientset) {
	c.Resources = append(c.Resources, &metav1.APIResourceList{GroupVersion: flowcontrolGV, APIResources: []metav1.APIResource{
		{Name: "flowschemas", Kind: "FlowSchema"},
		{Name: "prioritylevelconfigurations", Kind: "PriorityLevelConfiguration"},
	}})
}

// flowObjects are the FlowSchemas and levels there are, by name.
func flowObjects(t *testing.T, c *fake.Clientset) (fs map[string]flowcontrolv1.FlowSchema, pl map[string]flowcontrolv1.PriorityLevelConfiguration) {
	t.Helper()
	ctx := context.Background()
	fl, err := c.FlowcontrolV1().FlowSchemas().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pll, err := c.FlowcontrolV1().PriorityLevelConfigurations().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	fs, pl = map[string]flowcontrolv1.FlowSchema{}, map[string]flowcontrolv1.PriorityLevelConfiguration{}
	for _, x := range fl.Items {
		fs[x.Name] = x
	}
	for _, x := range pll.Items {
		pl[x.Name] = x
	}
	return fs, pl
}

// An install puts the event writes of the pods' ServiceAccount into a
// priority level of their own, by default, labelled as the tool's.
func TestInstallMakesThePriorityLevelByDefault(t *testing.T) {
	c := newClient(deployment(), configMap())
	if err := Install(context.Background(), c, Options{Image: image}); err != nil {
		t.Fatal(err)
	}
	fs, pl := flowObjects(t, c)
	level, ok := pl["k8s-event"]
	if !ok || level.Labels[managedByLabel] != FieldManager || level.Spec.Type != flowcontrolv1.PriorityLevelEnablementLimited {
		t.Fatalf("priority level k8s-event: %+v (found %v)", level, ok)
	}
	s, ok := fs["k8s-event-coredns"]
	if !ok || s.Spec.PriorityLevelConfiguration.Name != "k8s-event" || s.Spec.MatchingPrecedence >= 900 {
		t.Fatalf("flowschema k8s-event-coredns: %+v (found %v)", s.Spec, ok)
	}
	sa := s.Spec.Rules[0].Subjects[0].ServiceAccount
	if sa == nil || sa.Namespace != "kube-system" || sa.Name != "coredns" || s.Labels[DeploymentLabel] != "coredns" || s.Labels[NamespaceLabel] != "kube-system" {
		t.Errorf("flowschema subject %+v, labels %v", sa, s.Labels)
	}
}

// NoFlowControl (--flowcontrol=false) makes no FlowSchema and no level,
// and needs no flowcontrol v1.
func TestInstallWithoutFlowControlMakesNoPriorityLevel(t *testing.T) {
	c := newClient(deployment(), configMap())
	c.Resources = nil
	var out bytes.Buffer
	if err := Install(context.Background(), c, Options{Image: image, NoFlowControl: true, Out: &out}); err != nil {
		t.Fatal(err)
	}
	if fs, pl := flowObjects(t, c); len(fs) != 0 || len(pl) != 0 {
		t.Errorf("flowschemas %v, levels %v, want none", fs, pl)
	}
	if !strings.Contains(out.String(), "priority level: left out (--flowcontrol=false)") {
		t.Errorf("the run does not say the level is left out:\n%s", out.String())
	}
}

// An API server without flowcontrol v1 refuses the install before any
// write, naming the flag that goes without the level.
func TestInstallRefusedWithoutFlowControlV1(t *testing.T) {
	c := newClient(deployment(), configMap())
	c.Resources = nil
	w := writes(c)
	err := Install(context.Background(), c, Options{Image: image})
	if !IsRefused(err) || !strings.Contains(err.Error(), "flowcontrol.apiserver.k8s.io/v1") || !strings.Contains(err.Error(), "--flowcontrol=false") {
		t.Fatalf("install: %v, want refused, naming the API and --flowcontrol=false", err)
	}
	if len(*w) != 0 {
		t.Errorf("the refused install wrote %v", *w)
	}
}

// The permission preflight asks the cluster-scoped rights without a
// namespace, and names those missing before any write.
func TestInstallPreflightNamesTheMissingClusterScopedRights(t *testing.T) {
	c := newClient(deployment(), configMap())
	forbid(c, "create", "flowschemas")
	var asked []string
	c.PrependReactor("create", "selfsubjectaccessreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		at := a.(k8stesting.CreateAction).GetObject().(*authorizationv1.SelfSubjectAccessReview).Spec.ResourceAttributes
		if at.Group == flowcontrolAPI {
			asked = append(asked, at.Verb+" "+at.Resource+" in "+at.Namespace)
		}
		return false, nil, nil
	})
	w := writes(c)
	err := Install(context.Background(), c, Options{Image: image})
	if !IsRefused(err) || !strings.Contains(err.Error(), "create flowschemas.flowcontrol.apiserver.k8s.io: not granted cluster-wide") {
		t.Fatalf("install: %v, want refused, naming create flowschemas cluster-wide", err)
	}
	if len(*w) != 0 {
		t.Errorf("the refused install wrote %v", *w)
	}
	for _, a := range asked {
		if !strings.HasSuffix(a, " in ") {
			t.Errorf("review %q: asked in a namespace, where a RoleBinding would answer for a cluster-scoped object", a)
		}
	}
	if len(asked) == 0 {
		t.Error("no access review of flowcontrol rights")
	}
}

// A dry run says the level and the FlowSchema it would make, and the
// fleet line, and makes none.
func TestInstallDryRunSaysThePriorityLevelAndTheFleet(t *testing.T) {
	d := deployment()
	ten := int32(10)
	d.Spec.Replicas = &ten
	c := newClient(d, configMap())
	var out bytes.Buffer
	if err := Install(context.Background(), c, Options{Image: image, DryRun: true, Out: &out}); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"create prioritylevelconfiguration k8s-event: Limited, 2 concurrency shares, 4 queues of at most 16",
		"create flowschema k8s-event-coredns: create, patch, update events of serviceaccount kube-system/coredns, precedence 850, to level k8s-event",
		"fleet: fleet 0.1 100 (10 replicas, more than 4)",
		"+        fleet 0.1 100",
		"create role kube-system/coredns-k8s-event-fleet: get deployments coredns; get replicasets",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the dry run does not say %q:\n%s", want, out.String())
		}
	}
	if fs, pl := flowObjects(t, c); len(fs) != 0 || len(pl) != 0 {
		t.Errorf("the dry run made flowschemas %v, levels %v", fs, pl)
	}
}

// status says the FlowSchema, the level and the fleet line, and a
// FlowSchema whose level is gone.
func TestStatusSaysThePriorityLevelAndTheFleet(t *testing.T) {
	ctx := context.Background()
	d := deployment()
	ten := int32(10)
	d.Spec.Replicas = &ten
	c := newClient(d, configMap())
	if err := Install(ctx, c, Options{Image: image}); err != nil {
		t.Fatal(err)
	}
	text, _ := statusText(t, c)
	for _, want := range []string{
		"priority level: flowschema k8s-event-coredns present; prioritylevelconfiguration k8s-event present",
		"fleet: fleet 0.1 100; role kube-system/coredns-k8s-event-fleet present",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("status does not say %q:\n%s", want, text)
		}
	}
	if err := c.FlowcontrolV1().PriorityLevelConfigurations().Delete(ctx, "k8s-event", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	text, healthy := statusText(t, c)
	if healthy || !strings.Contains(text, "names priority level k8s-event, which is missing") {
		t.Errorf("status of a dangling FlowSchema:\n%s", text)
	}
}

// Uninstall deletes the FlowSchema and the level install made; the
// operator's FlowSchemas, one of the tool's name among them, stay, and so
// does a level another install's FlowSchema still refers to.
func TestUninstallRemovesThePriorityLevelAndKeepsTheOperatorsFlowSchemas(t *testing.T) {
	ctx := context.Background()
	mine := &flowcontrolv1.FlowSchema{ObjectMeta: metav1.ObjectMeta{Name: "dns-mine"},
		Spec: flowcontrolv1.FlowSchemaSpec{PriorityLevelConfiguration: flowcontrolv1.PriorityLevelConfigurationReference{Name: "workload-high"}}}
	c := newClient(deployment(), configMap(), mine)
	if err := Install(ctx, c, Options{Image: image}); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := Uninstall(ctx, c, Options{DryRun: true, Out: &out}); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"delete flowschema k8s-event-coredns", "delete prioritylevelconfiguration k8s-event"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the uninstall's dry run does not say %q:\n%s", want, out.String())
		}
	}
	if err := Uninstall(ctx, c, Options{}); err != nil {
		t.Fatal(err)
	}
	fs, pl := flowObjects(t, c)
	if _, ok := fs["dns-mine"]; !ok || len(fs) != 1 || len(pl) != 0 {
		t.Errorf("after uninstall: flowschemas %v, levels %v; want dns-mine alone", names(fs), names(pl))
	}

	// The operator's FlowSchema of the tool's name (the kustomize
	// component), and the tool's level shared with another install.
	theirs := &flowcontrolv1.FlowSchema{ObjectMeta: metav1.ObjectMeta{Name: "k8s-event-coredns"},
		Spec: flowcontrolv1.FlowSchemaSpec{PriorityLevelConfiguration: flowcontrolv1.PriorityLevelConfigurationReference{Name: "k8s-event"}}}
	other := &flowcontrolv1.FlowSchema{ObjectMeta: metav1.ObjectMeta{Name: "k8s-event-dns-coredns", Labels: map[string]string{managedByLabel: FieldManager, DeploymentLabel: "coredns", NamespaceLabel: "dns"}},
		Spec: flowcontrolv1.FlowSchemaSpec{PriorityLevelConfiguration: flowcontrolv1.PriorityLevelConfigurationReference{Name: "k8s-event"}}}
	c = newClient(deployment(), configMap(), theirs, other)
	if err := Install(ctx, c, Options{Image: image}); err != nil {
		t.Fatal(err)
	}
	if err := Uninstall(ctx, c, Options{}); err != nil {
		t.Fatal(err)
	}
	fs, pl = flowObjects(t, c)
	if len(fs) != 2 || len(pl) != 1 || fs["k8s-event-coredns"].Labels[managedByLabel] != "" {
		t.Errorf("after uninstall: flowschemas %v, levels %v; want the operator's, the other install's and the level", names(fs), names(pl))
	}
}

func names[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// A runner without the ClusterRole (an install with --flowcontrol=false)
// still uninstalls, and status stays healthy: what it may not read of the
// priority level is said, not counted against it.
func TestWithoutTheClusterRoleUninstallAndStatusGoOn(t *testing.T) {
	ctx := context.Background()
	c := newClient(deployment(), configMap())
	if err := Install(ctx, c, Options{Image: image, NoFlowControl: true}); err != nil {
		t.Fatal(err)
	}
	for _, res := range []string{"flowschemas", "prioritylevelconfigurations"} {
		for _, verb := range []string{"get", "list", "delete"} {
			forbid(c, verb, res)
		}
	}
	text, healthy := statusText(t, c)
	if !healthy || !strings.Contains(text, "flowschema k8s-event-coredns not readable (forbidden)") {
		t.Errorf("status without the ClusterRole (healthy %v):\n%s", healthy, text)
	}
	var out bytes.Buffer
	if err := Uninstall(ctx, c, Options{Out: &out}); err != nil {
		t.Fatalf("uninstall without the ClusterRole: %v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "listing flowschemas.flowcontrol.apiserver.k8s.io is forbidden") {
		t.Errorf("uninstall does not say what it could not check:\n%s", out.String())
	}
}
