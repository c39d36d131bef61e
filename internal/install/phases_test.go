package install

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// changesOf are the changes steps say, in order.
func changesOf(steps []step) []Change {
	var out []Change
	for _, s := range steps {
		out = append(out, s.change)
	}
	return out
}

// noAPI is a client that fails every call, and records it.
func noAPI() *fake.Clientset {
	c := fake.NewClientset()
	c.PrependReactor("*", "*", func(a k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, fmt.Errorf("no call expected: %s %s", a.GetVerb(), a.GetResource().Resource)
	})
	return c
}

// The plan is worked out from what discovery found: the same target gives
// the same plan, what the pods will run is decided without a call to the
// API server, the plan only reads, and it does not read the workload or
// its ConfigMap again (they may be gone since).
func TestPlanIsAFunctionOfWhatDiscoveryFound(t *testing.T) {
	ctx := context.Background()
	o := &Options{Image: image}
	c := newClient(deployment(), configMap())
	found, err := discover(ctx, c, o)
	if err != nil {
		t.Fatal(err)
	}
	if found.source == nil || found.source.Name != "coredns" {
		t.Fatalf("discovery found the source ConfigMap %v, want kube-system/coredns", found.source)
	}
	plan := func(c kubernetes.Interface) (*installPlan, planReport) {
		t.Helper()
		pl := &planner{o: o, command: "install"}
		p, err := pl.planInstall(ctx, c, found)
		if err != nil {
			t.Fatal(err)
		}
		return p, pl.rep
	}
	p1, rep1 := plan(c)
	empty := newClient() // neither the Deployment nor its ConfigMap
	p2, rep2 := plan(empty)
	if !reflect.DeepEqual(rep1, rep2) {
		t.Errorf("the same discovery gave two reports:\n%+v\n%+v", rep1, rep2)
	}
	if !reflect.DeepEqual(p1.gen, p2.gen) || p1.ann != p2.ann || string(p1.patch.body) != string(p2.patch.body) {
		t.Errorf("the same discovery gave two plans of what the pods run")
	}
	if s1, s2 := changesOf(installSteps(c, p1, true)), changesOf(installSteps(empty, p2, true)); !reflect.DeepEqual(s1, s2) {
		t.Errorf("the same discovery gave two lists of writes:\n%+v\n%+v", s1, s2)
	}
	for _, a := range empty.Actions() {
		verb, res := a.GetVerb(), a.GetResource().Resource
		if verb != "get" && verb != "list" {
			t.Errorf("the plan wrote: %s %s", verb, res)
		}
		if res == "deployments" || res == "daemonsets" || (res == "configmaps" && verb == "get" && a.(k8stesting.GetAction).GetName() == "coredns") {
			t.Errorf("the plan read again what discovery found: %s %s", verb, res)
		}
	}
	if found.layout != nil {
		t.Errorf("the plan changed what discovery found: layout %q", found.layout.name)
	}

	// What the pods run, the ConfigMap they read and how they roll: from
	// the target alone.
	dead := noAPI()
	for range 2 {
		pl := &planner{o: o, command: "install"}
		p, want, err := pl.decide(ctx, dead, found)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(p.gen, p1.gen) || p.ann != p1.ann || !reflect.DeepEqual(pl.rep.Keys, rep1.Keys) || pl.rep.Rollout != rep1.Rollout {
			t.Errorf("decided without the API server: another plan")
		}
		if img := want.template().Spec.Containers[found.container].Image; img != image {
			t.Errorf("decided image %s, want %s", img, image)
		}
	}
	if n := len(dead.Actions()); n > 0 {
		t.Errorf("deciding what the pods run made %d calls: %v", n, dead.Actions())
	}
}

// apply returns what it went through, and the run's report, -o json
// included, is that value: the writes made, one there already, and not
// the write that failed nor what followed it; an undo for each write made.
func TestJSONReportIsWhatApplyReturned(t *testing.T) {
	ctx := context.Background()
	var ran, undone []string
	write := func(name string, err error) func(context.Context) error {
		return func(context.Context) error {
			ran = append(ran, name)
			return err
		}
	}
	steps := []step{
		{change: Change{Action: "create", Kind: "role", Name: "ns/a"}, line: "create role ns/a", do: write("a", nil),
			undo: func(context.Context) error { undone = append(undone, "a"); return nil }},
		{change: Change{Action: "keep", Kind: "rolebinding", Name: "ns/k", Detail: "there already"}, line: "keep rolebinding ns/k"},
		{change: Change{Action: "create", Kind: "configmap", Name: "ns/b"}, line: "create configmap ns/b", do: write("b", errKept),
			undo: func(context.Context) error { undone = append(undone, "b"); return nil }},
		{change: Change{Action: "patch", Kind: "deployment", Name: "ns/d"}, line: "patch deployment ns/d", do: write("d", errors.New("conflict"))},
		{change: Change{Action: "create", Kind: "role", Name: "ns/never"}, line: "create role ns/never", do: write("never", nil)},
	}

	dry, err := apply(ctx, steps, true)
	if err != nil || len(ran) > 0 || len(dry.steps) != len(steps) || dry.wrote() {
		t.Fatalf("dry run: %v, ran %q, %d steps, wrote %v", err, ran, len(dry.steps), dry.wrote())
	}

	a, err := apply(ctx, steps, false)
	if err == nil || !strings.Contains(err.Error(), "patch deployment ns/d: conflict") {
		t.Fatalf("apply: %v, want the patch's failure", err)
	}
	if !slices.Equal(ran, []string{"a", "b", "d"}) || !slices.Equal(a.written, []bool{true, false, false}) {
		t.Fatalf("apply ran %q and wrote %v", ran, a.written)
	}
	var out bytes.Buffer
	r := newRun(&Options{JSON: true, Out: &out}, "install")
	r.wrote(a)
	r.takeBack(ctx)
	if !slices.Equal(undone, []string{"a"}) {
		t.Errorf("taken back: %q, want only the write made", undone)
	}
	_ = r.finish(err)
	var res Result
	if err := json.Unmarshal(out.Bytes(), &res); err != nil {
		t.Fatalf("-o json: %v\n%s", err, out.String())
	}
	var got []string
	for _, ch := range res.Changes {
		got = append(got, ch.Action+" "+ch.Kind+" "+ch.Name)
	}
	want := []string{"create role ns/a", "keep rolebinding ns/k", "create configmap ns/b", "delete role ns/a"}
	if !slices.Equal(got, want) {
		t.Errorf("-o json changes:\n  %s\nwant\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
	if !strings.Contains(res.Error, "patch deployment ns/d") {
		t.Errorf("-o json error %q", res.Error)
	}
}

// reportedWrites records the writes c is asked for, but the lock's and
// the one that gives up the install's field ownership after a rollout,
// which no report lists, each as "VERB KIND": VERB create, delete or
// change (a patch or an update).
func reportedWrites(c *fake.Clientset) func() []string {
	var mu sync.Mutex
	var got []string
	c.PrependReactor("*", "*", func(a k8stesting.Action) (bool, runtime.Object, error) {
		verb, res := a.GetVerb(), a.GetResource().Resource
		if p, ok := a.(k8stesting.PatchAction); ok && strings.Contains(string(p.GetPatch()), `"managedFields"`) {
			return false, nil, nil
		}
		switch {
		case res == "selfsubjectaccessreviews" || res == "leases" || isDryRun(a):
		case verb == "create" || verb == "delete":
			mu.Lock()
			got = append(got, verb+" "+strings.TrimSuffix(res, "s"))
			mu.Unlock()
		case verb == "patch" || verb == "update":
			mu.Lock()
			got = append(got, "change "+strings.TrimSuffix(res, "s"))
			mu.Unlock()
		}
		return false, nil, nil
	})
	return func() []string {
		mu.Lock()
		defer mu.Unlock()
		out := slices.Clone(got)
		slices.Sort(out)
		got = nil
		return out
	}
}

// changesWritten are the changes of -o json out that are writes, as
// reportedWrites says them.
func changesWritten(t *testing.T, out []byte) []string {
	t.Helper()
	var res Result
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("-o json: %v\n%s", err, out)
	}
	var got []string
	for _, ch := range res.Changes {
		switch ch.Action {
		case "keep":
		case "create", "delete":
			got = append(got, ch.Action+" "+ch.Kind)
		default:
			got = append(got, "change "+ch.Kind)
		}
	}
	slices.Sort(got)
	return got
}

// Every write of a run, those during and after the rollout and those
// that put back a failed one included, is in its -o json, which is made
// of what the phases returned: a write made and not returned fails here.
// The runs: node-local-dns installed, uninstalled, and installed with an
// image whose pods crash (its canary fails and all is put back).
func TestEveryWriteOfARunIsInItsReport(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c, k := nodeLocalCluster(t, nodeLocalVariants["replaced"], 3)
	startupEvents(c, nodeCacheImage, 0)
	made := reportedWrites(c)
	o := Options{Image: nodeCacheImage, Kind: kindDaemonSet, Deployment: "node-local-dns", Wait: 30 * time.Second, Settle: time.Second, JSON: true}
	const crash = "registry.example/k8s-dns-node-cache:1.26.4-k8s-event-crash"
	for _, run := range []struct {
		name  string
		fails bool
		do    func(Options) error
	}{
		{"install", false, func(o Options) error { return Install(ctx, c, o) }},
		{"uninstall", false, func(o Options) error { return Uninstall(ctx, c, o) }},
		{"install that fails", true, func(o Options) error {
			k.mu.Lock()
			k.crash = crash
			k.mu.Unlock()
			o.Image = crash
			return Install(ctx, c, o)
		}},
	} {
		var out bytes.Buffer
		o.Out = &out
		if err := run.do(o); (err != nil) != run.fails {
			t.Fatalf("%s: %v\n%s", run.name, err, out.String())
		}
		wrote, said := made(), changesWritten(t, out.Bytes())
		if !slices.Equal(wrote, said) {
			t.Errorf("%s: the writes made and those -o json lists differ:\n  made %q\n  said %q", run.name, wrote, said)
		}
		if len(wrote) < 4 {
			t.Errorf("%s: %d writes: %q", run.name, len(wrote), wrote)
		}
	}
}
