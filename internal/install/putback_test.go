package install

import (
	"bytes"
	"context"
	corev1 "k8s.io/api/core/v1"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// A second install of node-local-dns, with the same image and then with a
// newer build, keeps k8s_event's levels with info (the first install
// added them, the operator set none), settles on the startup event, and
// uninstall then gives back every object as it was.
func TestNodeLocalDNSInstallAgainAndUpgradeKeepTheLevelsAndUninstallGivesAllBack(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const newer = "registry.example/k8s-dns-node-cache:1.26.4-k8s-event-0.3.1"
	c, _ := nodeLocalCluster(t, nodeLocalVariants["replaced"], 3)
	startupEvents(c, nodeCacheImage, 0)
	startupEvents(c, newer, 0)
	before := clusterObjects(t, c)
	var out bytes.Buffer
	o := Options{Image: nodeCacheImage, Kind: kindDaemonSet, Deployment: "node-local-dns", Wait: 30 * time.Second, Settle: time.Second, Out: &out}
	for i, img := range []string{nodeCacheImage, nodeCacheImage, newer} {
		out.Reset()
		o.Image = img
		if err := Install(ctx, c, o); err != nil {
			t.Fatalf("install %d (%s): %v\n%s", i+1, img, err, out.String())
		}
		cf := copiesOf(t, c)
		if n, blocks := strings.Count(cf, eventLevels), strings.Count(cf, "k8s_event"); n == 0 || n != blocks {
			t.Errorf("install %d: %d level lines with info for %d k8s_event stanzas:\n%s\n%s", i+1, n, blocks, cf, out.String())
		}
	}
	out.Reset()
	if err := Uninstall(ctx, c, o); err != nil {
		t.Fatalf("uninstall: %v\n%s", err, out.String())
	}
	if diff := sameObjects(before, clusterObjects(t, c)); len(diff) > 0 {
		t.Errorf("uninstall after install, install again and upgrade did not give back every object:\n%s\n%s", strings.Join(diff, "\n"), out.String())
	}
}

// copiesOf is the text of the ConfigMap copies install made for
// node-local-dns.
func copiesOf(t *testing.T, c *fake.Clientset) string {
	t.Helper()
	l, err := c.CoreV1().ConfigMaps("kube-system").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, cm := range l.Items {
		if strings.HasPrefix(cm.Name, "node-local-dns-k8s-event-") {
			for _, v := range cm.Data {
				b.WriteString(v)
			}
		}
	}
	return b.String()
}

// startupEventsOnNode stands in for k8s_event on the pods of image on
// node alone: k8s_event starts there and not on the other nodes.
func startupEventsOnNode(c *fake.Clientset, image, node string) *[]string {
	var mu sync.Mutex
	var read []string
	// The API server's field selector: the events of the pod named alone
	// (the fake's tracker does not filter on fields). The one below,
	// prepended after it, runs first.
	c.PrependReactor("list", "events", func(a k8stesting.Action) (bool, runtime.Object, error) {
		name, ok := strings.CutPrefix(a.(k8stesting.ListAction).GetListRestrictions().Fields.String(), "involvedObject.name=")
		if !ok {
			return false, nil, nil
		}
		all, err := c.Tracker().List(eventsResource, eventsKind, a.GetNamespace())
		if err != nil {
			return true, nil, err
		}
		l := all.(*corev1.EventList)
		kept := l.Items[:0]
		for _, e := range l.Items {
			if e.InvolvedObject.Name == name {
				kept = append(kept, e)
			}
		}
		l.Items = kept
		return true, l, nil
	})
	c.PrependReactor("list", "events", func(a k8stesting.Action) (bool, runtime.Object, error) {
		name, ok := strings.CutPrefix(a.(k8stesting.ListAction).GetListRestrictions().Fields.String(), "involvedObject.name=")
		obj, err := c.Tracker().Get(podsResource, a.GetNamespace(), name)
		if !ok || err != nil {
			return false, nil, nil
		}
		p := obj.(*corev1.Pod)
		mu.Lock()
		read = append(read, p.Name)
		mu.Unlock()
		if p.Spec.Containers[0].Image != image || p.Spec.NodeName != node {
			return false, nil, nil
		}
		mu.Lock()
		defer mu.Unlock()
		_ = c.Tracker().Add(startupEvent(p.Name+".startup", *p, map[string]string{eventLabel: "info"}))
		return false, nil, nil
	})
	return &read
}

var (
	eventsResource = corev1.SchemeGroupVersion.WithResource("events")
	eventsKind     = corev1.SchemeGroupVersion.WithKind("Event")
)

// A node-local-dns rollout whose canary writes its startup event but
// whose next batch does not fails, and is put back whole: every object
// as it was (the DaemonSet's image, template, strategy, minReadySeconds;
// the ConfigMap copy gone), and a run again after it does the same.
func TestNodeLocalDNSBatchWithoutTheStartupEventIsPutBackWhole(t *testing.T) {
	defer func(w, h time.Duration, p time.Duration) { eventWrite, eventHerd, eventPoll = w, h, p }(eventWrite, eventHerd, eventPoll)
	eventWrite, eventHerd, eventPoll = 300*time.Millisecond, 0, 100*time.Millisecond
	ctx := context.Background()
	c, _ := nodeLocalCluster(t, nodeLocalVariants["replaced"], 3)
	read := startupEventsOnNode(c, nodeCacheImage, "node-0")
	before := clusterObjects(t, c)
	var out bytes.Buffer
	o := Options{Image: nodeCacheImage, Kind: kindDaemonSet, Deployment: "node-local-dns", Wait: 30 * time.Second, Settle: time.Second, Out: &out}
	for i := 1; i <= 2; i++ {
		out.Reset()
		err := Install(ctx, c, o)
		if err == nil || !strings.Contains(err.Error(), "no event of k8s_event on pod node-local-dns-node-1") {
			t.Fatalf("install %d with no startup event past node-0: %v\n%s\nevents read of pods: %q", i, err, out.String(), *read)
		}
		if diff := sameObjects(before, clusterObjects(t, c)); len(diff) > 0 {
			t.Errorf("install %d: the failed rollout was not put back:\n%s\n%v\n%s", i, strings.Join(diff, "\n"), err, out.String())
		}
		if ds := getDSOf(t, c, "node-local-dns"); ds.Spec.Template.Spec.Containers[0].Image == nodeCacheImage {
			t.Errorf("install %d: the DaemonSet runs %s still", i, nodeCacheImage)
		}
	}
}

// After a node-local-dns install whose batch wrote no startup event was
// put back, nothing of the install is left: uninstall finds nothing to
// undo or finish, and -o json lists no write (the put back left no "run
// cut off" behind).
func TestUninstallAfterAPutBackOfNodeLocalDNSHasNothingToFinish(t *testing.T) {
	defer func(w, h time.Duration, p time.Duration) { eventWrite, eventHerd, eventPoll = w, h, p }(eventWrite, eventHerd, eventPoll)
	eventWrite, eventHerd, eventPoll = 300*time.Millisecond, 0, 100*time.Millisecond
	ctx := context.Background()
	c, _ := nodeLocalCluster(t, nodeLocalVariants["replaced"], 3)
	startupEventsOnNode(c, nodeCacheImage, "node-0")
	o := Options{Image: nodeCacheImage, Kind: kindDaemonSet, Deployment: "node-local-dns", Wait: 30 * time.Second, Settle: time.Second, JSON: true}
	var out bytes.Buffer
	o.Out = &out
	if err := Install(ctx, c, o); err == nil {
		t.Fatalf("install with no startup event past node-0 went through\n%s", out.String())
	}
	out.Reset()
	if err := Uninstall(ctx, c, o); err != nil {
		t.Fatalf("uninstall: %v\n%s", err, out.String())
	}
	if said := changesWritten(t, out.Bytes()); len(said) > 0 {
		t.Errorf("uninstall after a put back lists writes %q:\n%s", said, out.String())
	}
}

// A node-local-dns install whose batch writes no startup event is put
// back and gives up the install's field ownership of the DaemonSet, as a
// rollout that went through does: the next server-side apply (helm 4)
// sets those fields without a conflict, and uninstall has nothing to
// finish.
func TestNodeLocalDNSPutBackGivesUpTheInstallsFieldOwnership(t *testing.T) {
	defer func(w, h time.Duration, p time.Duration) { eventWrite, eventHerd, eventPoll = w, h, p }(eventWrite, eventHerd, eventPoll)
	eventWrite, eventHerd, eventPoll = 300*time.Millisecond, 0, 100*time.Millisecond
	ctx := context.Background()
	c, _ := nodeLocalCluster(t, nodeLocalVariants["replaced"], 3)
	startupEventsOnNode(c, nodeCacheImage, "node-0")
	var out bytes.Buffer
	o := Options{Image: nodeCacheImage, Kind: kindDaemonSet, Deployment: "node-local-dns", Wait: 30 * time.Second, Settle: time.Second, Out: &out}
	if err := Install(ctx, c, o); err == nil {
		t.Fatalf("install with no startup event past node-0 went through\n%s", out.String())
	}
	ds := getDSOf(t, c, "node-local-dns")
	for _, m := range ds.ManagedFields {
		if m.Manager == FieldManager {
			t.Errorf("after the put back, the DaemonSet's managedFields still hold the install's entry (%s %s):\n%s", m.Manager, m.Operation, out.String())
		}
	}
}
