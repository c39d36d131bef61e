package install

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// nodeCacheImage is node-cache with k8s_event, built from the release
// upstream's manifest runs.
const nodeCacheImage = "registry.example/k8s-dns-node-cache:1.26.4-k8s-event-0.3.0"

// nodeLocalCluster is a cluster that runs upstream's node-local-dns of
// replace on nodes nodes, its pods made by the fake DaemonSet controller:
// the objects as the API server keeps them, with the defaults it gives
// the DaemonSet's updateStrategy.
func nodeLocalCluster(t *testing.T, replace []string, nodes int) (*fake.Clientset, *dsController) {
	t.Helper()
	_, _, objs := nodeLocalObjects(t, replace)
	for _, o := range withoutReconcile(objs) {
		if ds, ok := o.(*appsv1.DaemonSet); ok {
			ds.Spec.UpdateStrategy.Type = appsv1.RollingUpdateDaemonSetStrategyType
			ds.Spec.UpdateStrategy.RollingUpdate.MaxSurge = ptrTo(intstr.FromInt32(0))
		}
	}
	c := newClient(objs...)
	k := newDSControllerOf(c, "node-local-dns", nodes, "")
	getDSOf(t, c, "node-local-dns") // the pods of upstream's template
	return c, k
}

// startupEvents stands in for k8s_event on the pods of image: each pod's
// startup event is there from the read of its events after the first
// after; with after below 0, never. It returns the pods read without
// their event yet, each once.
func startupEvents(c *fake.Clientset, image string, after int) func() []string {
	var mu sync.Mutex
	reads := map[string]int{}
	c.PrependReactor("list", "events", func(a k8stesting.Action) (bool, runtime.Object, error) {
		name, ok := strings.CutPrefix(a.(k8stesting.ListAction).GetListRestrictions().Fields.String(), "involvedObject.name=")
		obj, err := c.Tracker().Get(podsResource, a.GetNamespace(), name)
		if !ok || err != nil || obj.(*corev1.Pod).Spec.Containers[0].Image != image {
			return false, nil, nil
		}
		p := obj.(*corev1.Pod)
		mu.Lock()
		defer mu.Unlock()
		if reads[p.Name]++; after >= 0 && reads[p.Name] == after+1 {
			_ = c.Tracker().Add(startupEvent(p.Name+".startup", *p, map[string]string{eventLabel: "info"}))
		}
		return false, nil, nil
	})
	return func() []string {
		mu.Lock()
		defer mu.Unlock()
		var out []string
		for name := range reads {
			out = append(out, name)
		}
		return out
	}
}

// clusterObjects are the objects of c but pods, events and revisions (what the
// controller and the pods make), each as JSON without what the API server
// sets (resourceVersion, generation, managedFields, status), by kind and
// name.
func clusterObjects(t *testing.T, c *fake.Clientset) map[string]string {
	t.Helper()
	ctx, all := context.Background(), metav1.ListOptions{}
	var lists []runtime.Object
	add := func(l runtime.Object, err error) {
		if err != nil {
			t.Fatal(err)
		}
		lists = append(lists, l)
	}
	add(c.CoreV1().ConfigMaps("").List(ctx, all))
	add(c.CoreV1().ServiceAccounts("").List(ctx, all))
	add(c.CoreV1().Services("").List(ctx, all))
	add(c.AppsV1().DaemonSets("").List(ctx, all))
	add(c.RbacV1().Roles("").List(ctx, all))
	add(c.RbacV1().RoleBindings("").List(ctx, all))
	add(c.FlowcontrolV1().FlowSchemas().List(ctx, all))
	add(c.FlowcontrolV1().PriorityLevelConfigurations().List(ctx, all))
	add(c.CoordinationV1().Leases("").List(ctx, all))
	out := map[string]string{}
	for _, l := range lists {
		items, err := meta.ExtractList(l)
		if err != nil {
			t.Fatal(err)
		}
		for _, it := range items {
			m, _ := meta.Accessor(it)
			m.SetResourceVersion("")
			m.SetGeneration(0)
			m.SetManagedFields(nil)
			var v map[string]any
			b, _ := json.Marshal(it)
			_ = json.Unmarshal(b, &v)
			delete(v, "status")
			b, _ = json.Marshal(v)
			out[strings.TrimSuffix(strings.TrimPrefix(typeName(l), "*v1."), "List")+" "+m.GetNamespace()+"/"+m.GetName()] = string(b)
		}
	}
	return out
}

func typeName(v any) string { return fmt.Sprintf("%T", v) }

// sameObjects says how after differs from before.
func sameObjects(before, after map[string]string) []string {
	var diff []string
	for k, v := range before {
		switch w, ok := after[k]; {
		case !ok:
			diff = append(diff, "gone: "+k)
		case w != v:
			diff = append(diff, "changed: "+k+"\n  before "+v+"\n  after  "+w)
		}
	}
	for k := range after {
		if _, ok := before[k]; !ok {
			diff = append(diff, "left: "+k)
		}
	}
	return diff
}

// node-local-dns named with --workload daemonset/node-local-dns, on
// upstream's manifest with its placeholders and with them replaced: the
// dry run says the whole plan and changes nothing; the install edits
// every block of the Corefile, grants the service account node-local-dns
// its events, its fleet reads and its priority level, adds fleet (a
// DaemonSet), and rolls the DaemonSet a canary under OnDelete then batch
// by batch with no surge (node-cache runs on the node's network); status
// says it installed; uninstall gives back every object as it was.
func TestNodeLocalDNSInstallsAndUninstallsThroughTheWholeRun(t *testing.T) {
	t.Parallel()
	for name, replace := range nodeLocalVariants {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			c, k := nodeLocalCluster(t, replace, 4)
			startupEvents(c, nodeCacheImage, 0)
			deleted := deletedPodsOf(c, "node-local-dns")
			before := clusterObjects(t, c)
			var out bytes.Buffer
			o := Options{Image: nodeCacheImage, Kind: kindDaemonSet, Deployment: "node-local-dns", Wait: 30 * time.Second, Settle: time.Second, Out: &out}

			dry := o
			dry.DryRun = true
			if err := Install(ctx, c, dry); err != nil {
				t.Fatalf("dry run: %v\n%s", err, out.String())
			}
			checkNodeLocalDryRun(t, out.String())
			if diff := sameObjects(before, clusterObjects(t, c)); len(diff) > 0 {
				t.Fatalf("the dry run changed objects:\n%s", strings.Join(diff, "\n"))
			}

			out.Reset()
			if err := Install(ctx, c, o); err != nil {
				t.Fatalf("install: %v\n%s", err, out.String())
			}
			checkNodeLocalInstalled(t, c, k, deleted(), out.String())

			out.Reset()
			if err := Uninstall(ctx, c, o); err != nil {
				t.Fatalf("uninstall: %v\n%s", err, out.String())
			}
			if diff := sameObjects(before, clusterObjects(t, c)); len(diff) > 0 {
				t.Errorf("uninstall did not give back every object as it was:\n%s\n%s", strings.Join(diff, "\n"), out.String())
			}
		})
	}
}

// checkNodeLocalDryRun checks that the dry run of node-local-dns's
// install says each write, and how it rolls.
func checkNodeLocalDryRun(t *testing.T, out string) {
	t.Helper()
	for _, want := range []string{
		"create configmap kube-system/node-local-dns-k8s-event-",
		"create role kube-system/node-local-dns-k8s-event",
		"serviceaccount kube-system/node-local-dns",
		"k8s-event-node-local-dns",
		"fleet 0.1 100 (a DaemonSet runs a replica on every node: 4 now)",
		"level info warning error",
		"create role kube-system/node-local-dns-k8s-event-fleet",
		"patch daemonset kube-system/node-local-dns",
		nodeCacheImage,
		"updateStrategy OnDelete: one pod deleted and replaced",
		"no surge",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the dry run does not say %q:\n%s", want, out)
		}
	}
	if n := len(regexp.MustCompile(`(?m)^\s*\+\s+kubeapi$`).FindAllString(out, -1)); n != 4 {
		t.Errorf("the dry run adds kubeapi to %d blocks, want 4:\n%s", n, out)
	}
	// Each block's added k8s_event stanza shows whole, its } included.
	if n := len(regexp.MustCompile(`(?m)^\s*\+\s+fleet 0\.1 100\n\s*\+\s+\}$`).FindAllString(out, -1)); n != 4 {
		t.Errorf("the dry run shows %d k8s_event stanzas whole, want 4:\n%s", n, out)
	}
}

// checkNodeLocalInstalled checks what the install of node-local-dns
// left, and how it rolled.
func checkNodeLocalInstalled(t *testing.T, c *fake.Clientset, k *dsController, deleted []string, out string) {
	t.Helper()
	ctx := context.Background()
	ds := getDSOf(t, c, "node-local-dns")
	ctr := ds.Spec.Template.Spec.Containers[0]
	if ctr.Image != nodeCacheImage {
		t.Errorf("image %s, want %s", ctr.Image, nodeCacheImage)
	}
	if got := updateStrategyString(ds.Spec.UpdateStrategy); got != "RollingUpdate, maxSurge 0, maxUnavailable 10%" || ds.Spec.MinReadySeconds != 0 || ds.Annotations[StrategyAnnotation] != "" {
		t.Errorf("updateStrategy %s, minReadySeconds %d: want upstream's back", got, ds.Spec.MinReadySeconds)
	}
	vol := ds.Spec.Template.Spec.Volumes[slicesIndex(ds.Spec.Template.Spec.Volumes, "config-volume")].ConfigMap
	gen, err := c.CoreV1().ConfigMaps("kube-system").Get(ctx, vol.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("configmap the pods read: %v", err)
	}
	corefile := gen.Data["Corefile"]
	if strings.Count(corefile, "    kubeapi\n") != 4 || strings.Count(corefile, "k8s_event {\n") != 4 || strings.Count(corefile, "fleet 0.1 100\n") != 4 {
		t.Errorf("the Corefile the pods read has not kubeapi and k8s_event with fleet in every block:\n%s", corefile)
	}
	for _, name := range []string{"node-local-dns-k8s-event", "node-local-dns-k8s-event-fleet"} {
		rb, err := c.RbacV1().RoleBindings("kube-system").Get(ctx, name, metav1.GetOptions{})
		if err != nil || !bindsServiceAccount(rb, "kube-system", "node-local-dns") {
			t.Errorf("rolebinding %s: %v %+v", name, err, rb)
		}
	}
	role, err := c.RbacV1().Roles("kube-system").Get(ctx, "node-local-dns-k8s-event-fleet", metav1.GetOptions{})
	if err != nil || !strings.Contains(rulesString(role.Rules), "list pods; get daemonsets node-local-dns") {
		t.Errorf("fleet role: %v %+v", err, role)
	}
	fs, _ := flowObjects(t, c)
	if s, ok := fs["k8s-event-node-local-dns"]; !ok || !strings.Contains(flowSchemaString(&s), "serviceaccount kube-system/node-local-dns") {
		t.Errorf("flowschema k8s-event-node-local-dns: %v %+v", ok, s)
	}
	if len(deleted) != 1 || !strings.HasSuffix(deleted[0], "under OnDelete") {
		t.Errorf("the run deleted %q: want one canary under OnDelete", deleted)
	}
	k.mu.Lock()
	batches, made := k.batches, k.created[nodeCacheImage]
	k.mu.Unlock()
	for _, b := range batches {
		if b != "RollingUpdate, maxSurge 0, maxUnavailable 10% minReadySeconds 1" {
			t.Errorf("batches %q: want each with no surge, upstream's maxUnavailable, held by the settle time", batches)
			break
		}
	}
	if len(batches) == 0 || made != 4 {
		t.Errorf("batches %q, %d pods of the new image: want batches after the canary, one pod a node", batches, made)
	}
	if !strings.Contains(out, "canary: replacing pod") || !strings.Contains(out, "4 of 4 nodes run the new template") {
		t.Errorf("the run does not say its canary and batches:\n%s", out)
	}
	s, err := Status(ctx, c, Options{Kind: kindDaemonSet, Deployment: "node-local-dns"})
	if err != nil || s.State != StateInstalled || s.Layout != "node-local-dns" || len(s.Problems) > 0 {
		t.Errorf("status: %v %+v", err, s)
	}
}

func slicesIndex(vols []corev1.Volume, name string) int {
	for i, v := range vols {
		if v.Name == name {
			return i
		}
	}
	return 0
}

// A CoreDNS image named for node-local-dns is refused by Install with
// why, before any write, a dry run too; -o json says the refusal.
func TestNodeLocalDNSInstallRefusesACoreDNSImage(t *testing.T) {
	c, _ := nodeLocalCluster(t, nodeLocalVariants["replaced"], 2)
	before := clusterObjects(t, c)
	done := writes(c)
	for _, dry := range []bool{true, false} {
		var out bytes.Buffer
		err := Install(context.Background(), c, Options{Image: image, Kind: kindDaemonSet, Deployment: "node-local-dns", Wait: 10 * time.Second, DryRun: dry, Out: &out, JSON: true})
		if !IsRefused(err) || !strings.Contains(err.Error(), "is CoreDNS, not node-cache") || !strings.Contains(err.Error(), "interface and iptables rules") {
			t.Errorf("dry run %v: %v, want the refusal of a CoreDNS image", dry, err)
		}
		var res Result
		if json.Unmarshal(out.Bytes(), &res) != nil || !res.Refused || res.Layout != "node-local-dns" || res.Changes == nil {
			t.Errorf("dry run %v: -o json %s", dry, out.String())
		}
	}
	if len(*done) > 0 {
		t.Errorf("the refused runs wrote %q", *done)
	}
	if diff := sameObjects(before, clusterObjects(t, c)); len(diff) > 0 {
		t.Errorf("the refused runs changed objects:\n%s", strings.Join(diff, "\n"))
	}
}

// A rollout of node-local-dns whose new pods write no startup event
// fails at the canary, named, once the canary's due time has passed, and
// is put back: the objects are as they were. Where the events come after
// a few reads, the rollout settles.
func TestNodeLocalDNSSettlesOnlyWithTheStartupEvent(t *testing.T) {
	// Not parallel: the wait for the event, shortened.
	defer func(w, h time.Duration, p time.Duration) { eventWrite, eventHerd, eventPoll = w, h, p }(eventWrite, eventHerd, eventPoll)
	eventWrite, eventHerd, eventPoll = 200*time.Millisecond, 0, 100*time.Millisecond
	ctx := context.Background()
	o := Options{Image: nodeCacheImage, Kind: kindDaemonSet, Deployment: "node-local-dns", Wait: 30 * time.Second, Settle: time.Second}

	c, _ := nodeLocalCluster(t, nodeLocalVariants["replaced"], 3)
	read := startupEvents(c, nodeCacheImage, -1)
	before := clusterObjects(t, c)
	var out bytes.Buffer
	o.Out = &out
	err := Install(ctx, c, o)
	if err == nil || !strings.Contains(err.Error(), "the canary on node") || !strings.Contains(err.Error(), "no event of k8s_event on pod node-local-dns-node-") || !strings.Contains(err.Error(), "is back as it was") {
		t.Fatalf("install without startup events: %v\n%s", err, out.String())
	}
	if got := read(); len(got) != 1 {
		t.Errorf("events read of pods %q: want the canary's alone", got)
	}
	if diff := sameObjects(before, clusterObjects(t, c)); len(diff) > 0 {
		t.Errorf("the failed rollout was not put back:\n%s\n%s", strings.Join(diff, "\n"), out.String())
	}
	if ds := getDSOf(t, c, "node-local-dns"); ds.Spec.Template.Spec.Containers[0].Image == nodeCacheImage {
		t.Errorf("the DaemonSet runs %s still", nodeCacheImage)
	}

	c, _ = nodeLocalCluster(t, nodeLocalVariants["replaced"], 3)
	startupEvents(c, nodeCacheImage, 3)
	out.Reset()
	eventWrite = 5 * time.Second
	if err := Install(ctx, c, o); err != nil {
		t.Fatalf("install with events after three reads: %v\n%s", err, out.String())
	}
}

// A plan where k8s_event would not write the startup event is refused,
// naming why: levels without info, by --option or the Corefile's own
// k8s_event, or no reload to log the line. With --force it is a warning,
// and the rollout settles on readiness and restarts, saying so.
func TestNodeLocalDNSRefusesAPlanWithoutTheStartupEvent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	noReload := func(cm *corev1.ConfigMap) {
		cm.Data["Corefile"] = strings.ReplaceAll(cm.Data["Corefile"], "    reload\n", "")
	}
	ownLevel := func(cm *corev1.ConfigMap) {
		cm.Data["Corefile"] = strings.Replace(cm.Data["Corefile"], "    reload\n", "    reload\n    k8s_event {\n        level error\n    }\n", 1)
	}
	for _, tc := range []struct {
		name    string
		options []string
		edit    func(*corev1.ConfigMap)
		want    string
	}{
		{"option", []string{"level warning error"}, nil, `--option "level warning error" sets k8s_event's levels without info`},
		{"corefile", nil, ownLevel, `the Corefile's k8s_event sets "level error" without info`},
		{"reload", nil, noReload, "the Corefile has no reload directive in a server block"},
	} {
		c, _ := nodeLocalCluster(t, nodeLocalVariants["replaced"], 2)
		if tc.edit != nil {
			cm, err := c.CoreV1().ConfigMaps("kube-system").Get(ctx, "node-local-dns", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			tc.edit(cm)
			if _, err := c.CoreV1().ConfigMaps("kube-system").Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		o := Options{Image: nodeCacheImage, Kind: kindDaemonSet, Deployment: "node-local-dns", Wait: 30 * time.Second, Settle: time.Second, Options: tc.options}
		var out bytes.Buffer
		o.Out, o.DryRun = &out, true
		err := Install(ctx, c, o)
		if !IsRefused(err) || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "plugin/reload: Running configuration SHA512") || !strings.Contains(err.Error(), "--force") {
			t.Errorf("%s: %v, want the refusal saying %q", tc.name, err, tc.want)
		}
		out.Reset()
		o.Force, o.DryRun = true, false
		if err := Install(ctx, c, o); err != nil {
			t.Fatalf("%s, --force: %v\n%s", tc.name, err, out.String())
		}
		if !strings.Contains(out.String(), "warning: --force: "+tc.want) || !strings.Contains(out.String(), "no startup event waited for (--force went past") {
			t.Errorf("%s, --force: the run does not say it settled without the event:\n%s", tc.name, out.String())
		}
	}
}
