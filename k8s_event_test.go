package k8s_event

import (
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/coredns/coredns/core/dnsserver"
	clog "github.com/coredns/coredns/plugin/pkg/log"
	"k8s.io/utils/clock"
)

func newTestBroadcaster(t *testing.T) *broadcaster {
	t.Helper()
	t.Setenv(envPodName, testRef.Name)
	t.Setenv(envNamespace, testRef.Namespace)
	t.Setenv(envPodUID, string(testRef.UID))
	t.Setenv(envNodeName, testNode)
	b := &broadcaster{clock: clock.RealClock{}} // as global's: the tests wait in real time
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

// TestTwoBlocksOneEvent: two server blocks of one Corefile share one
// pipeline and one listener: a line is one event, whatever the blocks.
func TestTwoBlocksOneEvent(t *testing.T) {
	b := newTestBroadcaster(t)
	api := newFakeAPI(t, clock.RealClock{})
	inst := newInstance(t, api, "k8s_event", "k8s_event {\n level info\n}")
	if err := b.attach(inst); err != nil {
		t.Fatal(err)
	}
	if err := b.attach(inst); err != nil { // a second block's startup
		t.Fatal(err)
	}
	pluginLog.Error("one line")
	pluginLog.Info("and one info")
	b.detach(inst)
	counts := waitEvents(t, api, func(map[string]int32) bool { return true })
	if counts["plugin/errors: one line"] != 1 || counts["plugin/errors: and one info"] != 1 || len(counts) != 2 {
		t.Errorf("events %v, want each line once", counts)
	}
}

// TestReloadKeepsOnePipeline: a reload hands the new settings to the
// pipeline that runs, losing no line; the last detach stops it, and no
// goroutine of it is left.
func TestReloadKeepsOnePipeline(t *testing.T) {
	b := newTestBroadcaster(t)
	api := newFakeAPI(t, clock.RealClock{})
	baseline := runtime.NumGoroutine()
	// Each line may be a write of its own: the rate lets every one through.
	old := newInstance(t, api, "k8s_event {\n rate 1000 1000\n}")
	if err := b.attach(old); err != nil {
		t.Fatal(err)
	}
	p := b.p
	pluginLog.Error("before")
	for range 100 {
		// New instance's OnStartup, then the old one's OnShutdown.
		next := newInstance(t, api, "k8s_event {\n level error info\n rate 1000 1000\n}")
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
	waitEvents(t, api, func(c map[string]int32) bool {
		return c["plugin/errors: before"] == 1 && c["plugin/errors: during"] == 100 && c["plugin/errors: after"] == 1
	})
	b.detach(old)
	if b.p != nil {
		t.Fatal("pipeline still running after the last detach")
	}
	waitGoroutines(t, api, baseline)
}

// TestFailedReloadRestoresOldSettings: after a failed reload the instance
// that keeps running has its settings back, and the one that never
// started is forgotten.
func TestFailedReloadRestoresOldSettings(t *testing.T) {
	b := newTestBroadcaster(t)
	api := newFakeAPI(t, clock.RealClock{})
	baseline := runtime.NumGoroutine()
	old := newInstance(t, api, "k8s_event {\n level error\n}")
	if err := b.attach(old); err != nil {
		t.Fatal(err)
	}
	// The new instance starts up, then its servers fail: caddy forgets it
	// and runs the old instance's OnRestartFailed.
	failed := newInstance(t, api, "k8s_event {\n level info\n}")
	if err := b.attach(failed); err != nil {
		t.Fatal(err)
	}
	if !levelSet(b.p.listener.levels.Load()).has(levelInfo) {
		t.Fatal("the new settings did not take over")
	}
	b.forgetAfter(old)
	if len(b.attached) != 1 || b.attached[0] != old {
		t.Fatalf("attached %v, want only the old instance", b.attached)
	}
	if got := levelSet(b.p.listener.levels.Load()); got != 1<<levelError {
		t.Fatalf("levels %v after the failed reload, want error", got)
	}
	pluginLog.Error("still posting")
	pluginLog.Info("not posted")
	waitEvents(t, api, func(c map[string]int32) bool { return c["plugin/errors: still posting"] == 1 })
	b.detach(old)
	waitGoroutines(t, api, baseline)
	if _, ok := waitEvents(t, api, func(map[string]int32) bool { return true })["plugin/errors: not posted"]; ok {
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

// TestExitKeepsListeningThroughLameduck: on SIGTERM the shutdown hooks run
// before the lameduck, while CoreDNS still answers and logs; what it logs
// then must still become events, written when the process exits.
func TestExitKeepsListeningThroughLameduck(t *testing.T) {
	b := newTestBroadcaster(t)
	api := newFakeAPI(t, clock.RealClock{})
	inst := newInstance(t, api, "k8s_event")
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
	counts := waitEvents(t, api, func(map[string]int32) bool { return true })
	if counts["plugin/errors: before the signal"] != 1 || counts["plugin/errors: during the lameduck"] != 1 {
		t.Errorf("events %v, want both lines", counts)
	}
}

// TestReloadShutdownDetaches: without a signal, a shutdown hook is a
// reload's, and detaches at once.
func TestReloadShutdownDetaches(t *testing.T) {
	b := newTestBroadcaster(t)
	api := newFakeAPI(t, clock.RealClock{})
	inst := newInstance(t, api, "k8s_event")
	if err := b.attach(inst); err != nil {
		t.Fatal(err)
	}
	b.shutdown(inst)
	if b.p != nil {
		t.Fatal("pipeline still running after the last instance shut down")
	}
}

// TestExitWithNothingAttached: the process-exit hook of a process whose
// instances are all gone does nothing, and may run twice.
func TestExitWithNothingAttached(t *testing.T) {
	b := newTestBroadcaster(t)
	b.exit()
	b.exit()
	if b.p != nil {
		t.Fatal("exit started a pipeline")
	}
}

// TestWithoutPodEnvEventsGoToDefault: without the downward API's pod name
// and namespace, the process's events are reported on namespace/default.
func TestWithoutPodEnvEventsGoToDefault(t *testing.T) {
	b := newTestBroadcaster(t)
	t.Setenv(envPodName, "")
	t.Setenv(envNamespace, "")
	api := newFakeAPI(t, clock.RealClock{})
	inst := newInstance(t, api, "k8s_event")
	if err := b.attach(inst); err != nil {
		t.Fatal(err)
	}
	pluginLog.Error("no pod")
	b.detach(inst)
	ev := only(t, events(t, api))
	if ref := ev.InvolvedObject; ref.Kind != "Namespace" || ref.Name != "default" || ev.Namespace != "default" {
		t.Errorf("event about %+v in %q, want namespace/default", ref, ev.Namespace)
	}
}
