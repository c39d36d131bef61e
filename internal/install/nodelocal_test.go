package install

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

const nodeLocalManifest = "cluster/addons/dns/nodelocaldns/nodelocaldns.yaml"

// nodeLocalVariants are upstream's node-local-dns manifest with its
// placeholders, and with them replaced as its README tells users (sed of
// __PILLAR__DNS__SERVER__, __PILLAR__LOCAL__DNS__ and
// __PILLAR__DNS__DOMAIN__; node-cache fills __PILLAR__CLUSTER__DNS__ and
// __PILLAR__UPSTREAM__SERVERS__ at start).
var nodeLocalVariants = map[string][]string{
	"placeholders": nil,
	"replaced": {
		"__PILLAR__DNS__SERVER__", "10.96.0.10",
		"__PILLAR__LOCAL__DNS__", "169.254.20.10",
		"__PILLAR__DNS__DOMAIN__", "cluster.local",
	},
}

// nodeLocalObjects are the DaemonSet and the ConfigMap of upstream's
// manifest, replaced as replace says.
func nodeLocalObjects(t *testing.T, replace []string) (*appsv1.DaemonSet, *corev1.ConfigMap, []runtime.Object) {
	t.Helper()
	objs := upstreamObjects(t, nodeLocalManifest, replace...)
	var ds *appsv1.DaemonSet
	var cm *corev1.ConfigMap
	for _, o := range objs {
		switch o := o.(type) {
		case *appsv1.DaemonSet:
			ds = o
		case *corev1.ConfigMap:
			cm = o
		}
	}
	if ds == nil || cm == nil {
		t.Fatalf("%s: no DaemonSet or ConfigMap among %d objects", nodeLocalManifest, len(objs))
	}
	return ds, cm, objs
}

// withoutReconcile is objs as a cluster runs node-local-dns of its own:
// without the addon manager's label.
func withoutReconcile(objs []runtime.Object) []runtime.Object {
	for _, o := range objs {
		if m, err := meta.Accessor(o); err == nil {
			labels := m.GetLabels()
			delete(labels, reconcileLabel)
			m.SetLabels(labels)
		}
	}
	return objs
}

// dsSubject is what the layout of ds is told from.
func dsSubject(ds *appsv1.DaemonSet, cm *corev1.ConfigMap) subject {
	return subject{kind: kindDaemonSet, meta: &ds.ObjectMeta, corefile: cm.Data["Corefile"], configMap: cm.Labels, program: programOf(&ds.Spec.Template.Spec)}
}

// node-local-dns is found by name, told by the node-cache it runs, and
// read as node-cache reads it: the Corefile is the template of the
// ConfigMap node-local-dns (key Corefile, mounted as Corefile.base), not
// the -conf that node-cache writes; the RBAC binds its service account.
func TestNodeLocalDNSIsFoundAndRead(t *testing.T) {
	for name, replace := range nodeLocalVariants {
		t.Run(name, func(t *testing.T) {
			_, _, objs := nodeLocalObjects(t, replace)
			c := newClient(withoutReconcile(objs)...)
			found := daemonSets(context.Background(), c, "kube-system", "node-local-dns")
			if len(found) != 1 {
				t.Fatalf("daemonSets: %d found", len(found))
			}
			ds := found[0].(*daemon).d
			cm, err := c.CoreV1().ConfigMaps("kube-system").Get(context.Background(), "node-local-dns", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			l := layoutOf(dsSubject(ds, cm))
			if l.name != "node-local-dns" || !l.everyBlock || !l.settleEvent || l.refused != "" {
				t.Errorf("layout %+v, want node-local-dns", l)
			}
			tg, err := inspect(found[0], &Options{})
			if err != nil {
				t.Fatal(err)
			}
			vol := ds.Spec.Template.Spec.Volumes[tg.volume]
			if tg.key != "Corefile" || tg.conf != "/etc/coredns/Corefile.base" || tg.mountDir != "/etc/coredns" || vol.ConfigMap.Name != "node-local-dns" {
				t.Errorf("read key %q at %q (mount %q) of configmap %s; want Corefile at /etc/coredns/Corefile.base of node-local-dns", tg.key, tg.conf, tg.mountDir, vol.ConfigMap.Name)
			}
			_, binding := rbacFor(&ds.ObjectMeta, ds.Spec.Template.Spec.ServiceAccountName)
			if !bindsServiceAccount(binding, "kube-system", "node-local-dns") || binding.Name != "node-local-dns-k8s-event" {
				t.Errorf("binding %s binds %s, want serviceaccount kube-system/node-local-dns", binding.Name, subjectsString(binding.Subjects))
			}
		})
	}
}

// nodeLocalBlocks are the server blocks of upstream's Corefile, as
// caddyfile reads their keys.
var nodeLocalBlocks = map[string][]string{
	"placeholders": {"__PILLAR__DNS__DOMAIN__:53", "in-addr.arpa:53", "ip6.arpa:53", ".:53"},
	"replaced":     {"cluster.local:53", "in-addr.arpa:53", "ip6.arpa:53", ".:53"},
}

// Each of the Corefile's four blocks gets kubeapi and k8s_event, in its
// indentation before its closing brace; every other byte, the
// __PILLAR__ placeholders included, stays, and the result loads.
func TestNodeLocalDNSCorefileGetsThePluginsInEveryBlock(t *testing.T) {
	for name, replace := range nodeLocalVariants {
		t.Run(name, func(t *testing.T) {
			_, cm, _ := nodeLocalObjects(t, replace)
			src := cm.Data["Corefile"]
			cf, err := parseCorefile(src, nil)
			if err != nil {
				t.Fatal(err)
			}
			cf.everyBlock = layoutByName(t, "node-local-dns").everyBlock
			out, err := cf.withPlugins(nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			if err := out.check(); err != nil {
				t.Errorf("the edited Corefile does not load: %v", err)
			}
			var keys []string
			for _, b := range out.parsed {
				keys = append(keys, strings.Join(b.Keys, " "))
				if stanzaCount(b.Tokens["kubeapi"]) != 1 || stanzaCount(b.Tokens["k8s_event"]) != 1 {
					t.Errorf("block %s: kubeapi %d, k8s_event %d times, want once each", b.Keys, stanzaCount(b.Tokens["kubeapi"]), stanzaCount(b.Tokens["k8s_event"]))
				}
			}
			if strings.Join(keys, "|") != strings.Join(nodeLocalBlocks[name], "|") {
				t.Errorf("blocks %q, want %q", keys, nodeLocalBlocks[name])
			}
			added := "    kubeapi\n    k8s_event\n"
			if n := strings.Count(out.src, added+"    }\n"); n != 4 {
				t.Errorf("%d blocks end with the plugins in their indentation, want 4:\n%s", n, out.src)
			}
			if back := strings.ReplaceAll(out.src, added, ""); back != src {
				t.Errorf("bytes other than the added lines changed:\n%s", out.src)
			}
			again, err := out.withPlugins(nil, nil)
			if err != nil || again.src != out.src {
				t.Errorf("a second edit: %v, changed:\n%s", err, again.src)
			}
			for _, p := range []string{"__PILLAR__CLUSTER__DNS__", "__PILLAR__UPSTREAM__SERVERS__", "__PILLAR__LOCAL__DNS__", "__PILLAR__DNS__SERVER__", "__PILLAR__DNS__DOMAIN__"} {
				if strings.Count(out.src, p) != strings.Count(src, p) {
					t.Errorf("placeholder %s: %d times, %d before", p, strings.Count(out.src, p), strings.Count(src, p))
				}
			}
		})
	}
}

// With options, each block's k8s_event stanza carries them; a layout
// without everyBlock edits only the first of these blocks (none has the
// kubernetes plugin).
func TestNodeLocalDNSCorefileTakesOptionsInEveryBlock(t *testing.T) {
	_, cm, _ := nodeLocalObjects(t, nil)
	src := cm.Data["Corefile"]
	for _, tc := range []struct {
		everyBlock bool
		blocks     int
	}{{true, 4}, {false, 1}} {
		cf, err := parseCorefile(src, nil)
		if err != nil {
			t.Fatal(err)
		}
		cf.everyBlock = tc.everyBlock
		out, err := cf.withPlugins([]string{"level info warning error"}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if n := strings.Count(out.src, "k8s_event {\n"); n != tc.blocks {
			t.Errorf("everyBlock %v: %d stanzas, want %d:\n%s", tc.everyBlock, n, tc.blocks, out.src)
		}
		if n := strings.Count(out.src, "level info warning error\n"); n != tc.blocks {
			t.Errorf("everyBlock %v: the option in %d stanzas, want %d", tc.everyBlock, n, tc.blocks)
		}
	}
}

func layoutByName(t *testing.T, name string) *layout {
	t.Helper()
	for i := range layouts {
		if layouts[i].name == name {
			return &layouts[i]
		}
	}
	t.Fatalf("no layout %q", name)
	return nil
}

// An image that is plainly CoreDNS, not node-cache, is refused for
// node-local-dns with why (node-cache sets up and takes down the node's
// interface and iptables rules); --force goes past it with a warning.
func TestNodeLocalDNSRefusesACoreDNSImage(t *testing.T) {
	l := layoutByName(t, "node-local-dns")
	for _, tc := range []struct {
		image   string
		refused bool
	}{
		{"coredns/coredns:1.13.1", true},
		{"registry.k8s.io/coredns/coredns:v1.12.0", true},
		{image, true}, // k8s_event's own image
		{"ghcr.io/dnsops/coredns-k8s-event:1.13.1-0.2.0-abc@sha256:0123", true},
		{"registry.k8s.io/dns/k8s-dns-node-cache:1.26.4", false},
		{"registry.example/k8s-dns-node-cache-k8s-event:1.26.4", false},
		{"registry.example/dns-cache:1", false}, // not plainly CoreDNS
	} {
		pl := &planner{o: &Options{Image: tc.image}}
		err := pl.imageRefusal(l)
		if tc.refused != (err != nil) {
			t.Errorf("%s: %v, want refused %v", tc.image, err, tc.refused)
			continue
		}
		if !tc.refused {
			continue
		}
		if !IsRefused(err) || !strings.Contains(err.Error(), "interface and iptables rules") || !strings.Contains(err.Error(), "takes them down when it stops") {
			t.Errorf("%s: %v, want a refusal that says why", tc.image, err)
		}
		forced := &planner{o: &Options{Image: tc.image, Force: true}}
		if err := forced.imageRefusal(l); err != nil || len(forced.rep.Warnings) != 1 || !strings.HasPrefix(forced.rep.Warnings[0], "--force: image ") {
			t.Errorf("%s with --force: %v, warnings %q; want a warning", tc.image, err, forced.rep.Warnings)
		}
	}
	if pl := (&planner{o: &Options{Image: "coredns/coredns:1.13.1"}}); pl.imageRefusal(layoutByName(t, "kubeadm, kind")) != nil {
		t.Errorf("a CoreDNS image refused where CoreDNS runs")
	}
}

// A node-cache image's tag is node-cache's release: no CoreDNS release
// is read from it.
func TestNodeCacheTagIsNotACoreDNSRelease(t *testing.T) {
	if got := release("registry.k8s.io/dns/k8s-dns-node-cache:1.26.4"); got != "unknown" {
		t.Errorf("release %q, want unknown", got)
	}
	if got := release("registry.k8s.io/coredns/coredns:v1.12.0"); got != "1.12.0" {
		t.Errorf("release %q, want 1.12.0", got)
	}
}

// node-local-dns whose objects carry the addon manager's Reconcile label
// (GKE's NodeLocal DNSCache, kube-up's addon), on the DaemonSet or on its
// ConfigMap alone, is refused with the vendor's way; kubespray's
// nodelocaldns carries the label without an addon manager, and is
// installed with a warning of kubespray's next run.
func TestNodeLocalDNSInReconcileModeIsRefused(t *testing.T) {
	for name, replace := range nodeLocalVariants {
		ds, cm, _ := nodeLocalObjects(t, replace)
		l := layoutOf(dsSubject(ds, cm))
		if l.name != "node-local-dns, addon manager (GKE, kube-up)" || !strings.Contains(l.refused, "--update-addons=NodeLocalDNS=") || !strings.Contains(l.refused, "/etc/kubernetes/addons") {
			t.Errorf("%s: layout %q, refused %q; want the addon manager's, with GKE's and kube-up's way", name, l.name, l.refused)
		}
		delete(ds.Labels, reconcileLabel)
		if l := layoutOf(dsSubject(ds, cm)); l.refused == "" {
			t.Errorf("%s: the ConfigMap's Reconcile label alone: layout %q not refused", name, l.name)
		}
		delete(cm.Labels, reconcileLabel)
		if l := layoutOf(dsSubject(ds, cm)); l.name != "node-local-dns" {
			t.Errorf("%s: without the label: layout %q", name, l.name)
		}
	}
	ds, cm, _ := nodeLocalObjects(t, nodeLocalVariants["replaced"])
	ds.Name, ds.Labels = "nodelocaldns", map[string]string{"k8s-app": "kube-dns", reconcileLabel: "Reconcile"}
	if l := layoutOf(dsSubject(ds, cm)); l.name != "kubespray node-local-dns" || l.refused != "" || !strings.Contains(l.warning, "kubespray") || !l.everyBlock {
		t.Errorf("kubespray's nodelocaldns: layout %+v", l)
	}
}

// Settled, for node-local-dns, waits for k8s_event's events on the new
// pods, told by their UID: an event of an earlier pod of that name, or
// another writer's, is none; pods with none by their due time fail,
// named, at once when their container started longer ago than the wait;
// an event that comes after a few reads settles.
func TestPluginEventsOnTheNewPods(t *testing.T) {
	pod := func(name, uid string) corev1.Pod {
		return corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "kube-system", UID: types.UID(uid)}}
	}
	ours := map[string]string{eventLabel: "warning", "coredns.io/plugin": "forward"}
	c := newClient(
		startupEvent("a.1", pod("nl-a", "uid-a"), ours),
		startupEvent("b.1", pod("nl-b", "uid-old-b"), ours), // an earlier pod of that name
		startupEvent("c.1", pod("nl-c", "uid-c"), nil),      // the kubelet's
	)
	ctx := context.Background()
	start := time.Now()
	err := pluginEvents(ctx, c, []corev1.Pod{pod("nl-a", "uid-a"), pod("nl-b", "uid-b"), pod("nl-c", "uid-c")}, nil, 1500*time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "no event of k8s_event on pod nl-b, nl-c within 1.5s") {
		t.Errorf("pods without their event: %v", err)
	}
	if took := time.Since(start); took < 1500*time.Millisecond {
		t.Errorf("gave up after %v, before the pods were due", took)
	}
	if err := pluginEvents(ctx, c, []corev1.Pod{pod("nl-a", "uid-a")}, nil, time.Minute); err != nil {
		t.Errorf("a pod with its event: %v", err)
	}

	late := pod("nl-d", "uid-d")
	reads := writesStartupEventOn(c, late, 3)
	if err := pluginEvents(ctx, c, []corev1.Pod{late}, nil, time.Minute); err != nil || *reads < 4 {
		t.Errorf("an event written after %d reads: %v", *reads, err)
	}
	cut, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	if err := pluginEvents(cut, c, []corev1.Pod{pod("nl-e", "uid-e")}, nil, time.Minute); err == nil || !strings.Contains(err.Error(), "the rollout's deadline") {
		t.Errorf("the deadline passed: %v", err)
	}

	// Due from its container's start: one that ran a while fails at once.
	old := pod("nl-f", "uid-f")
	old.Spec.Containers = []corev1.Container{{Name: "node-cache"}}
	old.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "node-cache", State: corev1.ContainerState{
		Running: &corev1.ContainerStateRunning{StartedAt: metav1.NewTime(time.Now().Add(-2 * time.Minute))},
	}}}
	start = time.Now()
	if err := pluginEvents(ctx, c, []corev1.Pod{old}, &target{}, time.Minute); err == nil || time.Since(start) > 10*time.Second {
		t.Errorf("a pod past its due time: %v after %v", err, time.Since(start))
	}

	tg := &target{layout: layoutByName(t, "node-local-dns")}
	if !tg.settlesOnEvent() || (&target{}).settlesOnEvent() {
		t.Errorf("settlesOnEvent: node-local-dns %v, another %v", tg.settlesOnEvent(), (&target{}).settlesOnEvent())
	}
}

// startupEvent is an event named name on p, labelled labels.
func startupEvent(name string, p corev1.Pod, labels map[string]string) *corev1.Event {
	return &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{Name: name, Namespace: p.Namespace, Labels: labels},
		InvolvedObject: corev1.ObjectReference{Kind: "Pod", Name: p.Name, Namespace: p.Namespace, UID: p.UID},
		Reason:         "CoreDNSInfo",
		Message:        startupLine,
	}
}

// writesStartupEventOn stands in for k8s_event on p: its startup event
// is there from the read of p's events after the first after. It returns
// the count of those reads.
func writesStartupEventOn(c *fake.Clientset, p corev1.Pod, after int) *int {
	var mu sync.Mutex
	reads := new(int)
	c.PrependReactor("list", "events", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.(k8stesting.ListAction).GetListRestrictions().Fields.String() != "involvedObject.name="+p.Name {
			return false, nil, nil
		}
		mu.Lock()
		defer mu.Unlock()
		if *reads++; *reads == after+1 {
			_ = c.Tracker().Add(startupEvent(p.Name+".startup", p, map[string]string{eventLabel: "info"}))
		}
		return false, nil, nil
	})
	return reads
}

// node-cache's Corefile template is where -basecorefile says, in any
// of the Go flag forms, or its default; CoreDNS's is its -conf.
func TestCorefilePathOfNodeCache(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-localip", "169.254.20.10", "-conf", "/etc/Corefile"}, "/etc/coredns/Corefile.base"},
		{[]string{"--localip=169.254.20.10", "-basecorefile", "/cfg/base"}, "/cfg/base"},
		{[]string{"-localip", "169.254.20.10", "--basecorefile=/cfg/base"}, "/cfg/base"},
		{[]string{"-conf", "/etc/coredns/Corefile"}, "/etc/coredns/Corefile"},
	} {
		if got := corefilePath(tc.args); got != tc.want {
			t.Errorf("%q: %q, want %q", tc.args, got, tc.want)
		}
	}
}

// A node-cache tag is node-cache's release: the release check compares
// it, and warns only when the new image is not tagged from it.
func TestNodeCacheReleaseIsChecked(t *testing.T) {
	const running = "registry.k8s.io/dns/k8s-dns-node-cache:1.26.4"
	for img, warns := range map[string]bool{
		"registry.example/k8s-dns-node-cache:1.26.4-k8s-event-0.3.0": false,
		"registry.example/k8s-dns-node-cache:1.26.4":                 false,
		"registry.example/k8s-dns-node-cache:1.25.0-k8s-event":       true,
		"registry.example/k8s-dns-node-cache:1.26.40":                true,
	} {
		pl := &planner{o: &Options{Image: img}}
		refuse, err := pl.checkRelease(&target{w: daemonSetOf(&appsv1.DaemonSet{})}, running)
		if err != nil || len(refuse) > 0 || (len(pl.rep.Warnings) > 0) != warns {
			t.Errorf("%s: %v, %q, warnings %q; want a warning %v", img, err, refuse, pl.rep.Warnings, warns)
		}
		if pl.rep.CoreDNSBefore != "unknown" || pl.rep.CoreDNSAfter != "unknown" {
			t.Errorf("%s: CoreDNS %s -> %s read from node-cache tags", img, pl.rep.CoreDNSBefore, pl.rep.CoreDNSAfter)
		}
	}
}
