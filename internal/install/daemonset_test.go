package install

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

var daemonSetsResource = appsv1.SchemeGroupVersion.WithResource("daemonsets")

// daemonSetOfNodes is CoreDNS run as a DaemonSet, from deployment(): the
// operator's updateStrategy is RollingUpdate with maxUnavailable 2.
func daemonSetOfNodes() *appsv1.DaemonSet {
	d := deployment()
	return &appsv1.DaemonSet{ObjectMeta: d.ObjectMeta, Spec: appsv1.DaemonSetSpec{
		Selector: d.Spec.Selector, Template: d.Spec.Template,
		UpdateStrategy: appsv1.DaemonSetUpdateStrategy{Type: appsv1.RollingUpdateDaemonSetStrategyType, RollingUpdate: &appsv1.RollingUpdateDaemonSet{
			MaxUnavailable: ptrTo(intstr.FromInt32(2)), MaxSurge: ptrTo(intstr.FromInt32(0)),
		}},
	}}
}

// dsController stands in for the DaemonSet controller and the kubelets
// of nodes nodes: on every read of the DaemonSet or list of its pods it
// makes the pod of a node that has none from the current template, and
// replaces the pods of other templates as the updateStrategy says: none
// under OnDelete; under RollingUpdate with maxSurge, a new pod beside the
// old one on up to maxSurge nodes at a time, the old one going once the
// new one has been available (Ready for minReadySeconds); with no surge,
// the old pods of up to maxUnavailable nodes at a time deleted while the
// others are available. A pod of image crash restarts and is never Ready.
type dsController struct {
	c     *fake.Clientset
	name  string
	nodes int
	crash string
	mu    sync.Mutex
	// batches are the updateStrategy and minReadySeconds each batch
	// started with; created the pods made of each image.
	batches []string
	created map[string]int
	readyAt map[string]time.Time
}

func newDSController(c *fake.Clientset, nodes int, crash string) *dsController {
	return newDSControllerOf(c, "coredns", nodes, crash)
}

// newDSControllerOf is the controller of the DaemonSet name.
func newDSControllerOf(c *fake.Clientset, name string, nodes int, crash string) *dsController {
	k := &dsController{c: c, name: name, nodes: nodes, crash: crash, created: map[string]int{}, readyAt: map[string]time.Time{}}
	syncOn := func(a k8stesting.Action) (bool, runtime.Object, error) {
		k.mu.Lock()
		defer k.mu.Unlock()
		obj, err := c.Tracker().Get(daemonSetsResource, a.GetNamespace(), k.name)
		if err == nil {
			k.sync(obj.(*appsv1.DaemonSet).DeepCopy())
		}
		return false, nil, nil
	}
	c.PrependReactor("get", "daemonsets", syncOn)
	c.PrependReactor("list", "pods", syncOn)
	return k
}

func templateHash(tmpl *corev1.PodTemplateSpec) string {
	b, _ := json.Marshal(tmpl)
	return fmt.Sprintf("%x", sha256.Sum256(b))[:10]
}

// available reports whether p has been Ready for minReady.
func (k *dsController) available(p *corev1.Pod, minReady int32) bool {
	at, ok := k.readyAt[p.Name]
	return ok && time.Since(at) >= time.Duration(minReady)*time.Second
}

// node is what runs on one node: its pod of the current template and its
// other pods.
type nodePods struct{ cur, old *corev1.Pod }

func (k *dsController) sync(ds *appsv1.DaemonSet) {
	hash := templateHash(&ds.Spec.Template)
	list, _ := k.c.Tracker().List(podsResource, corev1.SchemeGroupVersion.WithKind("Pod"), ds.Namespace)
	nodes := make([]nodePods, k.nodes)
	for _, p := range list.(*corev1.PodList).Items {
		var n int
		fmt.Sscanf(p.Spec.NodeName, "node-%d", &n)
		if p.Labels["hash"] == hash {
			nodes[n].cur = p.DeepCopy()
		} else {
			nodes[n].old = p.DeepCopy()
		}
	}
	minReady := ds.Spec.MinReadySeconds
	for i := range nodes {
		n := &nodes[i]
		switch {
		case n.cur == nil && n.old == nil:
			n.cur = k.newPod(ds, fmt.Sprintf("node-%d", i), hash)
		case n.cur != nil && n.old != nil && k.available(n.cur, minReady):
			_ = k.c.Tracker().Delete(podsResource, ds.Namespace, n.old.Name)
			n.old = nil
		}
	}
	if ds.Spec.UpdateStrategy.Type == appsv1.RollingUpdateDaemonSetStrategyType {
		k.roll(ds, nodes, hash)
	}
	var st appsv1.DaemonSetStatus
	st.DesiredNumberScheduled = int32(k.nodes)
	for _, n := range nodes {
		if n.cur != nil {
			st.UpdatedNumberScheduled++
		}
		if n.cur != nil && podReady(n.cur) || n.old != nil && podReady(n.old) {
			st.NumberReady++
		}
		if n.cur != nil && k.available(n.cur, minReady) || n.old != nil && k.available(n.old, minReady) {
			st.NumberAvailable++
		}
	}
	st.NumberUnavailable = st.DesiredNumberScheduled - st.NumberAvailable
	ds.Status = st
	_ = k.c.Tracker().Update(daemonSetsResource, ds, ds.Namespace)
}

// roll starts the pods of the next batch, as far as the updateStrategy
// lets it.
func (k *dsController) roll(ds *appsv1.DaemonSet, nodes []nodePods, hash string) {
	ru := ds.Spec.UpdateStrategy.RollingUpdate
	// As the controller reads them: a percentage of the nodes, rounded
	// up; maxUnavailable 1 and maxSurge 0 when not set.
	scaled := func(v *intstr.IntOrString, def int) int {
		if v == nil {
			return def
		}
		n, _ := intstr.GetScaledValueFromIntOrPercent(v, k.nodes, true)
		return n
	}
	var surge, unavailable int
	if ru == nil {
		surge, unavailable = 0, 1
	} else {
		surge, unavailable = scaled(ru.MaxSurge, 0), scaled(ru.MaxUnavailable, 1)
	}
	surging, down := 0, 0
	for _, n := range nodes {
		if n.cur != nil && n.old != nil {
			surging++
		}
		if !(n.cur != nil && k.available(n.cur, ds.Spec.MinReadySeconds) || n.old != nil && k.available(n.old, ds.Spec.MinReadySeconds)) {
			down++
		}
	}
	started := false
	for i := range nodes {
		n := &nodes[i]
		if n.old == nil || n.cur != nil {
			continue
		}
		switch {
		case surge > 0 && surging < surge:
			n.cur = k.newPod(ds, fmt.Sprintf("node-%d", i), hash)
			surging++
		case surge == 0 && down < unavailable:
			_ = k.c.Tracker().Delete(podsResource, ds.Namespace, n.old.Name)
			n.old = nil
			n.cur = k.newPod(ds, fmt.Sprintf("node-%d", i), hash)
			down++
		default:
			continue
		}
		started = true
	}
	if started {
		k.batches = append(k.batches, fmt.Sprintf("%s minReadySeconds %d", updateStrategyString(ds.Spec.UpdateStrategy), ds.Spec.MinReadySeconds))
	}
}

func (k *dsController) newPod(ds *appsv1.DaemonSet, node, hash string) *corev1.Pod {
	img := ds.Spec.Template.Spec.Containers[0].Image
	k.created[img]++
	labels := map[string]string{"hash": hash}
	for key, v := range ds.Spec.Template.Labels {
		labels[key] = v
	}
	name := fmt.Sprintf("%s-%s-%s-%d", ds.Name, node, hash, k.created[img])
	// Each pod has a UID of its own, as the API server gives: an event names its pod by it.
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ds.Namespace, UID: types.UID("uid-" + name),
		Labels: labels, Annotations: ds.Spec.Template.Annotations}, Spec: *ds.Spec.Template.Spec.DeepCopy()}
	p.Spec.NodeName = node
	ready := img != k.crash
	cs := corev1.ContainerStatus{Name: p.Spec.Containers[0].Name, Ready: ready}
	cond := corev1.ConditionTrue
	if !ready {
		cs.RestartCount, cond = 3, corev1.ConditionFalse
		cs.LastTerminationState.Terminated = &corev1.ContainerStateTerminated{Reason: "Error", ExitCode: 1}
	} else {
		k.readyAt[p.Name] = time.Now()
	}
	p.Status.ContainerStatuses = []corev1.ContainerStatus{cs}
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: cond}}
	_ = k.c.Tracker().Add(p)
	return p
}

func getDS(t *testing.T, c *fake.Clientset) *appsv1.DaemonSet {
	t.Helper()
	return getDSOf(t, c, "coredns")
}

func getDSOf(t *testing.T, c *fake.Clientset, name string) *appsv1.DaemonSet {
	t.Helper()
	d, err := c.AppsV1().DaemonSets("kube-system").Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// deletedPods lists, in order, the pods the run deleted, with the
// updateStrategy the DaemonSet had then.
func deletedPods(c *fake.Clientset) func() []string {
	return deletedPodsOf(c, "coredns")
}

// deletedPodsOf is deletedPods of the DaemonSet name.
func deletedPodsOf(c *fake.Clientset, name string) func() []string {
	var mu sync.Mutex
	var out []string
	c.PrependReactor("delete", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		obj, _ := c.Tracker().Get(daemonSetsResource, "kube-system", name)
		mu.Lock()
		defer mu.Unlock()
		out = append(out, a.(k8stesting.DeleteAction).GetName()+" under "+updateStrategyString(obj.(*appsv1.DaemonSet).Spec.UpdateStrategy))
		return false, nil, nil
	})
	return func() []string { mu.Lock(); defer mu.Unlock(); return append([]string(nil), out...) }
}

// A DaemonSet rolls a canary first, then batch by batch with the
// operator's maxUnavailable as the batch, each batch held by
// minReadySeconds at the settle time; then the operator's updateStrategy
// and minReadySeconds are back as they were. On their own network the
// pods surge: the canary is one node's new pod beside its old one, and no
// pod is deleted before its replacement is available. On the node's
// network the canary is one pod deleted under OnDelete, and the batches
// go down maxUnavailable at a time. Uninstall goes the same way back.
func TestDaemonSetRollsACanaryThenBatchesAndPutsBackTheUpdateStrategy(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name          string
		hostNetwork   bool
		canary, batch string
		deleted       string
	}{
		{"own network", false, "RollingUpdate, maxSurge 1, maxUnavailable 0 minReadySeconds 1", "RollingUpdate, maxSurge 2, maxUnavailable 0 minReadySeconds 1", ""},
		{"host network", true, "", "RollingUpdate, maxSurge 0, maxUnavailable 2 minReadySeconds 1", "under OnDelete"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			stock := daemonSetOfNodes()
			stock.Spec.Template.Spec.HostNetwork = tc.hostNetwork
			c := newClient(stock.DeepCopy(), configMap())
			k := newDSController(c, 5, "")
			deleted := deletedPods(c)
			c.AppsV1().DaemonSets("kube-system").Get(ctx, "coredns", metav1.GetOptions{}) // the pods of the stock template
			var out bytes.Buffer
			o := Options{Image: image, Kind: kindDaemonSet, Deployment: "coredns", Wait: 30 * time.Second, Settle: time.Second, Out: &out}
			if err := Install(ctx, c, o); err != nil {
				t.Fatalf("install: %v\n%s", err, out.String())
			}
			got := getDS(t, c)
			if got.Spec.Template.Spec.Containers[0].Image != image {
				t.Errorf("image %s, want %s", got.Spec.Template.Spec.Containers[0].Image, image)
			}
			if !equalJSON(got.Spec.UpdateStrategy, stock.Spec.UpdateStrategy) || got.Spec.MinReadySeconds != 0 || got.Annotations[StrategyAnnotation] != "" {
				t.Errorf("updateStrategy %s, minReadySeconds %d, record %q: want the operator's as they were", updateStrategyString(got.Spec.UpdateStrategy), got.Spec.MinReadySeconds, got.Annotations[StrategyAnnotation])
			}
			dels := deleted()
			if tc.deleted == "" && len(dels) != 0 || tc.deleted != "" && (len(dels) != 1 || !strings.HasSuffix(dels[0], tc.deleted)) {
				t.Errorf("the run deleted %v: want %q", dels, tc.deleted)
			}
			k.mu.Lock()
			batches := k.batches
			k.mu.Unlock()
			rest := batches
			if tc.canary != "" {
				if len(batches) == 0 || batches[0] != tc.canary {
					t.Errorf("batches %q: want the canary first, %s", batches, tc.canary)
				}
				for len(rest) > 0 && rest[0] == tc.canary {
					rest = rest[1:]
				}
			}
			if len(rest) == 0 {
				t.Errorf("batches %q: want batches of %s after the canary", batches, tc.batch)
			}
			for _, b := range rest {
				if b != tc.batch {
					t.Errorf("batches %q: want each after the canary %s", batches, tc.batch)
				}
			}
			if k.created[image] != 5 {
				t.Errorf("%d pods of the new image made, want 5", k.created[image])
			}
			if !strings.Contains(out.String(), "canary: the new pod on node") || !strings.Contains(out.String(), "5 of 5 nodes run the new template") {
				t.Errorf("the run does not say its canary and batches:\n%s", out.String())
			}
			out.Reset()
			if err := Uninstall(ctx, c, o); err != nil {
				t.Fatalf("uninstall: %v\n%s", err, out.String())
			}
			got = getDS(t, c)
			if !equalJSON(got.Spec, stock.Spec) || got.Annotations[StrategyAnnotation] != "" {
				t.Errorf("after uninstall the spec is\n%s\nwant\n%s", specJSONOf(got.Spec), specJSONOf(stock.Spec))
			}
		})
	}
}

func specJSONOf(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// A canary that crash-loops fails the install: its template is put back,
// the canary pod replaced by one of the stock template, the operator's
// updateStrategy put back, and no other node saw the new image; on the
// pods' own network (a surge canary) and on the node's (OnDelete).
func TestDaemonSetCanaryThatCrashLoopsIsUndone(t *testing.T) {
	t.Parallel()
	for _, hostNetwork := range []bool{false, true} {
		ctx := context.Background()
		stock := daemonSetOfNodes()
		stock.Spec.Template.Spec.HostNetwork = hostNetwork
		c := newClient(stock.DeepCopy(), configMap())
		k := newDSController(c, 3, image)
		c.AppsV1().DaemonSets("kube-system").Get(ctx, "coredns", metav1.GetOptions{})
		var out bytes.Buffer
		err := Install(ctx, c, Options{Image: image, Kind: kindDaemonSet, Deployment: "coredns", Wait: 20 * time.Second, Settle: time.Second, Out: &out})
		if err == nil || !strings.Contains(err.Error(), "canary") || !strings.Contains(err.Error(), "back as it was") {
			t.Fatalf("hostNetwork %v: install with a crashing image: %v, want the canary to fail and the DaemonSet back\n%s", hostNetwork, err, out.String())
		}
		got := getDS(t, c)
		if !equalJSON(got.Spec, stock.Spec) || got.Annotations[StrategyAnnotation] != "" {
			t.Errorf("hostNetwork %v: after the failed canary the spec is\n%s\nwant\n%s", hostNetwork, specJSONOf(got.Spec), specJSONOf(stock.Spec))
		}
		k.mu.Lock()
		if k.created[image] != 1 {
			t.Errorf("hostNetwork %v: %d pods of the crashing image: want the canary alone", hostNetwork, k.created[image])
		}
		k.mu.Unlock()
		pods, _ := c.CoreV1().Pods("kube-system").List(ctx, metav1.ListOptions{})
		for _, p := range pods.Items {
			if p.Spec.Containers[0].Image == image {
				t.Errorf("hostNetwork %v: pod %s still runs the crashing image", hostNetwork, p.Name)
			}
		}
		if len(pods.Items) != 3 {
			t.Errorf("hostNetwork %v: %d pods, want one a node", hostNetwork, len(pods.Items))
		}
	}
}

// A surge pod cannot be placed beside the old one where the pods use the
// node's network or a host port: the batches then go down maxUnavailable
// at a time, with no surge.
func TestDaemonSetOnTheNodesNetworkRollsWithoutSurge(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*appsv1.DaemonSet)
		want string
	}{
		{"own network", func(*appsv1.DaemonSet) {}, "RollingUpdate, maxSurge 2, maxUnavailable 0"},
		{"host network", func(d *appsv1.DaemonSet) { d.Spec.Template.Spec.HostNetwork = true }, "RollingUpdate, maxSurge 0, maxUnavailable 2"},
		{"host port", func(d *appsv1.DaemonSet) {
			d.Spec.Template.Spec.Containers[0].Ports = []corev1.ContainerPort{{ContainerPort: 53, HostPort: 53, Protocol: corev1.ProtocolUDP}}
		}, "RollingUpdate, maxSurge 0, maxUnavailable 2"},
		{"OnDelete", func(d *appsv1.DaemonSet) {
			d.Spec.Template.Spec.HostNetwork = true
			d.Spec.UpdateStrategy = appsv1.DaemonSetUpdateStrategy{Type: appsv1.OnDeleteDaemonSetStrategyType}
		}, "RollingUpdate, maxSurge 0, maxUnavailable 1"},
	} {
		d := daemonSetOfNodes()
		tc.edit(d)
		if got := updateStrategyString(daemonSetOf(d).batchStrategy()); got != tc.want {
			t.Errorf("%s: batches with %s, want %s", tc.name, got, tc.want)
		}
	}
}

// An operator's OnDelete is theirs: the run rolls with its canary and
// batches, and OnDelete is back after, exactly.
func TestDaemonSetKeepsTheOperatorsOnDelete(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	stock := daemonSetOfNodes()
	stock.Spec.UpdateStrategy = appsv1.DaemonSetUpdateStrategy{Type: appsv1.OnDeleteDaemonSetStrategyType}
	stock.Spec.MinReadySeconds = 0
	c := newClient(stock.DeepCopy(), configMap())
	newDSController(c, 2, "")
	c.AppsV1().DaemonSets("kube-system").Get(ctx, "coredns", metav1.GetOptions{})
	var out bytes.Buffer
	if err := Install(ctx, c, Options{Image: image, Kind: kindDaemonSet, Deployment: "coredns", Wait: 20 * time.Second, Settle: time.Second, Out: &out}); err != nil {
		t.Fatalf("install: %v\n%s", err, out.String())
	}
	got := getDS(t, c)
	if !equalJSON(got.Spec.UpdateStrategy, stock.Spec.UpdateStrategy) || got.Annotations[StrategyAnnotation] != "" {
		t.Errorf("updateStrategy %s, want OnDelete as the operator had it", specJSONOf(got.Spec.UpdateStrategy))
	}
}

// A run killed during a DaemonSet's rollout leaves its record of the
// operator's updateStrategy beside the temporary one (OnDelete): status
// names it, and the next install finishes the rollout and puts the
// operator's updateStrategy and minReadySeconds back exactly.
func TestDaemonSetRunCutOffDuringItsRolloutIsFinished(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	stock := daemonSetOfNodes()
	stock.Spec.MinReadySeconds = 0
	c := newClient(stock.DeepCopy(), configMap())
	newDSController(c, 2, "")
	c.AppsV1().DaemonSets("kube-system").Get(ctx, "coredns", metav1.GetOptions{})
	var out bytes.Buffer
	o := Options{Image: image, Kind: kindDaemonSet, Deployment: "coredns", Wait: 20 * time.Second, Settle: time.Second, Out: &out}
	if err := Install(ctx, c, o); err != nil {
		t.Fatalf("install: %v\n%s", err, out.String())
	}
	// What a run killed after its patch leaves: OnDelete, the raised
	// minReadySeconds, and the record.
	cut := getDS(t, c)
	tmp := appsv1.DaemonSetUpdateStrategy{Type: appsv1.OnDeleteDaemonSetStrategyType}
	recordRollout(&cut.ObjectMeta, cut.Spec.UpdateStrategy, cut.Spec.MinReadySeconds, tmp, 1)
	cut.Spec.UpdateStrategy, cut.Spec.MinReadySeconds = tmp, 1
	if _, err := c.AppsV1().DaemonSets("kube-system").Update(ctx, cut, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	s, err := Status(ctx, c, Options{Kind: kindDaemonSet, Deployment: "coredns"})
	if err != nil || !strings.Contains(strings.Join(s.Problems, "\n"), "a run was cut off during its rollout: the DaemonSet rolls with the updateStrategy it set (OnDelete) in place of yours (RollingUpdate, maxSurge 0, maxUnavailable 2)") {
		t.Errorf("status of a run cut off: %v %+v", err, s)
	}
	out.Reset()
	if err := Install(ctx, c, o); err != nil {
		t.Fatalf("install after the cut: %v\n%s", err, out.String())
	}
	got := getDS(t, c)
	if !equalJSON(got.Spec.UpdateStrategy, stock.Spec.UpdateStrategy) || got.Spec.MinReadySeconds != 0 || got.Annotations[StrategyAnnotation] != "" {
		t.Errorf("after the next install: updateStrategy %s, minReadySeconds %d, record %q: want the operator's\n%s", updateStrategyString(got.Spec.UpdateStrategy), got.Spec.MinReadySeconds, got.Annotations[StrategyAnnotation], out.String())
	}
	if s, err := Status(ctx, c, Options{Kind: kindDaemonSet, Deployment: "coredns"}); err != nil || s.State != StateInstalled || s.Kind != kindDaemonSet || len(s.Problems) > 0 {
		t.Errorf("status after the next install: %v %+v", err, s)
	}
}
