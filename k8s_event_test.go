package k8s_event

import (
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/coredns/coredns/core/dnsserver"
	clog "github.com/coredns/coredns/plugin/pkg/log"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	clocktesting "k8s.io/utils/clock/testing"
)

func newTestBroadcaster(t *testing.T) *broadcaster {
	t.Helper()
	t.Setenv(envPodName, testRef.Name)
	t.Setenv(envNamespace, testRef.Namespace)
	t.Setenv(envPodUID, string(testRef.UID))
	t.Setenv(envNodeName, testNode)
	b := &broadcaster{clock: clocktesting.NewFakeClock(epoch)}
	t.Cleanup(func() {
		b.mu.Lock()
		b.attached = nil
		stop, _ := b.reconcileLocked()
		b.mu.Unlock()
		stop.finish()
	})
	return b
}

// newInstance builds an instance from Corefile stanzas, one per server block.
func newInstance(t *testing.T, api *fakeAPI, stanzas ...string) *instance {
	t.Helper()
	inst := &instance{client: api.client}
	for _, s := range stanzas {
		cfg, err := parse(newController(s))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := inst.addBlock(cfg, &dnsserver.Config{}); err != nil {
			t.Fatal(err)
		}
	}
	return inst
}

// waitEvents waits until the writers have posted what matches.
func waitEvents(t *testing.T, api *fakeAPI, ok func(counts map[string]int32) bool) map[string]int32 {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		counts := map[string]int32{}
		for _, ev := range events(t, api) {
			counts[ev.Message] += ev.Count
		}
		if ok(counts) {
			return counts
		}
		if time.Now().After(deadline) {
			t.Fatalf("events never matched: %v", counts)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// waitGoroutines waits until only the goroutines of the baseline are left;
// the fake API's connections are closed first, with their goroutines.
func waitGoroutines(t *testing.T, api *fakeAPI, baseline int) {
	t.Helper()
	api.srv.CloseClientConnections()
	deadline := time.Now().Add(10 * time.Second)
	for runtime.NumGoroutine() > baseline {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("%d goroutines, baseline %d\n%s", runtime.NumGoroutine(), baseline, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(5 * time.Millisecond)
	}
}

var pluginLog = clog.NewWithPlugin("errors")

func TestTwoBlocksOneEvent(t *testing.T) {
	b := newTestBroadcaster(t)
	client := newFakeAPI(t, clock.RealClock{})
	inst := newInstance(t, client, "k8s_event", "k8s_event {\n level info\n}")
	if err := b.attach(inst); err != nil {
		t.Fatal(err)
	}
	if err := b.attach(inst); err != nil { // a second block's startup
		t.Fatal(err)
	}
	pluginLog.Error("one line")
	pluginLog.Info("and one info")
	b.detach(inst)
	counts := waitEvents(t, client, func(map[string]int32) bool { return true })
	if counts["plugin/errors: one line"] != 1 || counts["plugin/errors: and one info"] != 1 || len(counts) != 2 {
		t.Errorf("events %v, want each line once", counts)
	}
}

func TestReloadKeepsOnePipeline(t *testing.T) {
	b := newTestBroadcaster(t)
	client := newFakeAPI(t, clock.RealClock{})
	baseline := runtime.NumGoroutine()
	old := newInstance(t, client, "k8s_event")
	if err := b.attach(old); err != nil {
		t.Fatal(err)
	}
	p := b.p
	pluginLog.Error("before")
	for range 100 {
		// New instance's OnStartup, then the old one's OnShutdown.
		next := newInstance(t, client, "k8s_event {\n level error info\n}")
		if err := b.attach(next); err != nil {
			t.Fatal(err)
		}
		b.detach(old)
		old = next
		pluginLog.Error("during")
	}
	if b.p != p {
		t.Fatal("a reload replaced the pipeline")
	}
	pluginLog.Info("after")
	waitEvents(t, client, func(c map[string]int32) bool {
		return c["plugin/errors: before"] == 1 && c["plugin/errors: during"] == 100 && c["plugin/errors: after"] == 1
	})
	b.detach(old)
	if b.p != nil {
		t.Fatal("pipeline still running after the last detach")
	}
	waitGoroutines(t, client, baseline)
}

func TestFailedReloadRestoresOldSettings(t *testing.T) {
	b := newTestBroadcaster(t)
	client := newFakeAPI(t, clock.RealClock{})
	baseline := runtime.NumGoroutine()
	old := newInstance(t, client, "k8s_event {\n level error\n}")
	if err := b.attach(old); err != nil {
		t.Fatal(err)
	}
	// The new instance starts up, then its servers fail: caddy forgets it
	// and runs the old instance's OnRestartFailed.
	failed := newInstance(t, client, "k8s_event {\n level info\n}")
	if err := b.attach(failed); err != nil {
		t.Fatal(err)
	}
	if !levelSet(b.p.levels.Load()).has(levelInfo) {
		t.Fatal("the new settings did not take over")
	}
	b.forgetAfter(old)
	if len(b.attached) != 1 || b.attached[0] != old {
		t.Fatalf("attached %v, want only the old instance", b.attached)
	}
	if got := levelSet(b.p.levels.Load()); got != 1<<levelError {
		t.Fatalf("levels %v after the failed reload, want error", got)
	}
	pluginLog.Error("still posting")
	pluginLog.Info("not posted")
	waitEvents(t, client, func(c map[string]int32) bool { return c["plugin/errors: still posting"] == 1 })
	b.detach(old)
	waitGoroutines(t, client, baseline)
	if _, ok := waitEvents(t, client, func(map[string]int32) bool { return true })["plugin/errors: not posted"]; ok {
		t.Error("an info line was posted with the old settings")
	}
}

func TestStartupNeedsKubeapi(t *testing.T) {
	inst := newInstance(t, newFakeAPI(t, clock.RealClock{}), "k8s_event")
	inst.client = nil
	err := inst.startup()
	if err == nil || !strings.Contains(err.Error(), "kubeapi plugin must be enabled in the same server block") {
		t.Fatalf("startup without kubeapi: %v", err)
	}
}

func TestWithoutPodEnvEventsGoToDefault(t *testing.T) {
	t.Setenv(envPodName, "")
	t.Setenv(envNamespace, "")
	pod := podFromEnv()
	if ref := pod.current(); ref.Kind != "Namespace" || ref.Name != "default" || pod.namespace() != "default" {
		t.Errorf("reference %+v in %s", ref, pod.namespace())
	}
}

func TestUIDLookedUpWhenMissing(t *testing.T) {
	t.Setenv(envPodName, "coredns-1")
	t.Setenv(envNamespace, "kube-system")
	t.Setenv(envPodUID, "")
	clk := clocktesting.NewFakeClock(epoch)
	api := newFakeAPI(t, clk)
	api.addPod(&corev1Pod)
	p := newPipeline(testConfig(all, 1, 25, 16), api.client, podFromEnv(), clk)
	t.Cleanup(func() { p.queue.ShutDown(); p.cancel() })
	p.observe(ln(levelError, "errors", "x", epoch))
	drain(p)
	if ev := only(t, events(t, api)); ev.InvolvedObject.UID != corev1Pod.UID {
		t.Errorf("uid %q, want %q", ev.InvolvedObject.UID, corev1Pod.UID)
	}
}

// TestUIDLookupRetried: a pod read that fails for a cause that may pass
// (500, 503, 408, 429) is tried again, and the event then carries the UID; one the
// API answers for good (403, 400, 410, 422) is given up, and events go
// without it.
func TestUIDLookupRetried(t *testing.T) {
	for _, tt := range []struct {
		code    int
		wantUID types.UID
	}{
		{http.StatusInternalServerError, corev1Pod.UID}, {http.StatusServiceUnavailable, corev1Pod.UID},
		{http.StatusRequestTimeout, corev1Pod.UID}, {http.StatusTooManyRequests, corev1Pod.UID},
		{http.StatusForbidden, ""}, {http.StatusBadRequest, ""}, {http.StatusGone, ""}, {http.StatusUnprocessableEntity, ""},
	} {
		clk := clocktesting.NewFakeClock(epoch)
		api := newFakeAPI(t, clk)
		api.addPod(&corev1Pod)
		failed := false
		api.setFault(func(r apiRequest) fault {
			if r.resource == "pods" && !failed {
				failed = true
				return fault{code: tt.code}
			}
			return fault{}
		})
		pod := &podIdentity{}
		ref := corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Name: corev1Pod.Name, Namespace: corev1Pod.Namespace}
		pod.ref.Store(&ref)
		pod.lookup.Store(true)
		p := newPipeline(testConfig(all, 100, 100, 16), api.client, pod, clk)
		t.Cleanup(func() { p.queue.ShutDown(); p.cancel() })
		p.observe(ln(levelError, "errors", "x", clk.Now()))
		drain(p)
		clk.Step(retryMax * 2)
		due(p)
		if ev := only(t, events(t, api)); ev.InvolvedObject.UID != tt.wantUID {
			t.Errorf("pod read answered %d first: uid %q, want %q", tt.code, ev.InvolvedObject.UID, tt.wantUID)
		}
	}
}

// TestExitKeepsListeningThroughLameduck: on SIGTERM the shutdown hooks run
// before the lameduck, while CoreDNS still answers and logs; what it logs
// then must still become events, written when the process exits.
func TestExitKeepsListeningThroughLameduck(t *testing.T) {
	b := newTestBroadcaster(t)
	client := newFakeAPI(t, clock.RealClock{})
	inst := newInstance(t, client, "k8s_event")
	if err := b.attach(inst); err != nil {
		t.Fatal(err)
	}
	pluginLog.Error("before the signal")
	b.exiting.Store(true) // caddy's shutdown event
	b.shutdown(inst)      // the shutdown hooks
	pluginLog.Error("during the lameduck")
	b.exit() // the process-exit hook: stops and flushes
	if b.p != nil {
		t.Fatal("pipeline still running after exit")
	}
	counts := waitEvents(t, client, func(map[string]int32) bool { return true })
	if counts["plugin/errors: before the signal"] != 1 || counts["plugin/errors: during the lameduck"] != 1 {
		t.Errorf("events %v, want both lines", counts)
	}
}

// TestReloadShutdownDetaches: without a signal, a shutdown hook is a
// reload's, and detaches at once.
func TestReloadShutdownDetaches(t *testing.T) {
	b := newTestBroadcaster(t)
	client := newFakeAPI(t, clock.RealClock{})
	inst := newInstance(t, client, "k8s_event")
	if err := b.attach(inst); err != nil {
		t.Fatal(err)
	}
	b.shutdown(inst)
	if b.p != nil {
		t.Fatal("pipeline still running after the last instance shut down")
	}
}
