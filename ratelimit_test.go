package k8s_event

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/klog/v2"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	k8stesting "k8s.io/client-go/testing"
)

var all = levelSet(1<<numLevels - 1)

func ln(l level, plugin, msg string, at time.Time) line {
	return line{level: l, plugin: "plugin/" + plugin + ": ", text: "plugin/" + plugin + ": " + msg, at: at}
}

// waitQueued waits for the delaying queue to hand over keys made due by a
// step of the fake clock; it moves them in its own goroutine.
func waitQueued(t *testing.T, p *pipeline) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for p.queue.Len() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("nothing became due")
		}
		time.Sleep(time.Millisecond)
	}
}

// writes counts the create and patch calls the API received.
func writes(client interface{ Actions() []k8stesting.Action }) (creates, patches int) {
	for _, a := range client.Actions() {
		switch a.GetVerb() {
		case "create":
			creates++
		case "patch":
			patches++
		}
	}
	return
}

func only(t *testing.T, evs []corev1.Event) corev1.Event {
	t.Helper()
	if len(evs) != 1 {
		t.Fatalf("got %d events, want 1: %+v", len(evs), evs)
	}
	return evs[0]
}

func TestRepeatsAreOneEventWithExactCount(t *testing.T) {
	p, client, clk := newTestPipeline(t, testConfig(all, 1, 25, 64))
	for range 50 {
		p.observe(ln(levelError, "errors", "2 example.org. A: i/o timeout", clk.Now()))
	}
	drain(p)
	ev := only(t, events(t, client))
	if ev.Count != 50 {
		t.Errorf("count %d, want 50", ev.Count)
	}
	if ev.Message != "plugin/errors: 2 example.org. A: i/o timeout" {
		t.Errorf("message %q", ev.Message)
	}
	if ev.Reason != "CoreDNSError" || ev.Type != "Warning" {
		t.Errorf("reason %s type %s", ev.Reason, ev.Type)
	}
	if ev.InvolvedObject != testPod.ref || ev.Namespace != "kube-system" {
		t.Errorf("involved object %+v in %s", ev.InvolvedObject, ev.Namespace)
	}
	if ev.Source.Component != "CoreDNS" || ev.Source.Host != "node-0" || ev.ReportingController != "CoreDNS" || ev.ReportingInstance != "coredns-0" {
		t.Errorf("source %+v reporting %s/%s", ev.Source, ev.ReportingController, ev.ReportingInstance)
	}
	if ev.FirstTimestamp.IsZero() || ev.LastTimestamp.IsZero() {
		t.Error("timestamps not set")
	}
	if c, pt := writes(client); c != 1 || pt != 0 {
		t.Errorf("%d creates %d patches, want 1 create", c, pt)
	}

	// Later repeats patch the same event with the running total.
	clk.Step(time.Minute)
	for range 3 {
		p.observe(ln(levelError, "errors", "2 example.org. A: i/o timeout", clk.Now()))
	}
	drain(p)
	ev = only(t, events(t, client))
	if ev.Count != 53 || !ev.LastTimestamp.Time.Equal(clk.Now().Truncate(time.Second)) {
		t.Errorf("count %d last %v, want 53 at %v", ev.Count, ev.LastTimestamp, clk.Now())
	}
	if c, pt := writes(client); c != 1 || pt != 1 {
		t.Errorf("%d creates %d patches, want 1 and 1", c, pt)
	}
}

func TestThrottledRepeatsAreCounted(t *testing.T) {
	p, client, clk := newTestPipeline(t, testConfig(all, 1.0/300, 1, 64))
	p.observe(ln(levelWarning, "forward", "no healthy upstream", clk.Now()))
	drain(p)
	before := testutil.ToFloat64(throttledTotal.WithLabelValues("CoreDNSWarning"))
	for range 7 {
		p.observe(ln(levelWarning, "forward", "no healthy upstream", clk.Now()))
	}
	drain(p) // the bucket is empty: nothing written, the key waits
	if n := only(t, events(t, client)).Count; n != 1 {
		t.Fatalf("count %d before the bucket refills, want 1", n)
	}
	if testutil.ToFloat64(throttledTotal.WithLabelValues("CoreDNSWarning")) <= before {
		t.Error("throttled_total did not rise")
	}
	clk.Step(300 * time.Second)
	waitQueued(t, p)
	drain(p)
	if n := only(t, events(t, client)).Count; n != 8 {
		t.Errorf("count %d after the bucket refilled, want 8", n)
	}
}

func TestDistinctLinesAreCombined(t *testing.T) {
	p, client, clk := newTestPipeline(t, testConfig(all, 100, 100, 1024))
	before := testutil.ToFloat64(aggregatedTotal.WithLabelValues("error"))
	const n = 500
	for i := range n {
		p.observe(ln(levelError, "errors", fmt.Sprintf("2 q%d.example.org. A: i/o timeout", i), clk.Now()))
	}
	drain(p)
	evs := events(t, client)
	if len(evs) != combineAfter+1 {
		t.Fatalf("%d events, want %d distinct and one combined", len(evs), combineAfter)
	}
	var total int32
	var combined *corev1.Event
	for i := range evs {
		total += evs[i].Count
		if strings.HasPrefix(evs[i].Message, combinedPrefix) {
			combined = &evs[i]
		}
	}
	if total != n {
		t.Errorf("counts add up to %d, want %d", total, n)
	}
	if combined == nil || combined.Count != n-combineAfter || !strings.HasSuffix(combined.Message, fmt.Sprintf("q%d.example.org. A: i/o timeout", n-1)) {
		t.Fatalf("combined event %+v", combined)
	}
	if got := testutil.ToFloat64(aggregatedTotal.WithLabelValues("error")) - before; got != n-combineAfter {
		t.Errorf("aggregated_total rose by %v, want %d", got, n-combineAfter)
	}

	// Another plugin has a window of its own, and the window ends.
	p.observe(ln(levelError, "forward", "boom", clk.Now()))
	clk.Step(combineWindow + time.Second)
	p.observe(ln(levelError, "errors", "fresh line", clk.Now()))
	drain(p)
	if got := len(events(t, client)); got != combineAfter+3 {
		t.Errorf("%d events, want %d", got, combineAfter+3)
	}
}

func TestBucketsAreIndependent(t *testing.T) {
	p, client, clk := newTestPipeline(t, testConfig(all, 1.0/300, 2, 64))
	for i := range 20 {
		p.observe(ln(levelError, fmt.Sprint("p", i), "storm", clk.Now()))
	}
	drain(p)
	p.observe(ln(levelWarning, "reload", "warn", clk.Now()))
	p.observe(ln(levelInfo, "reload", "info", clk.Now()))
	drain(p)
	byReason := map[string]int{}
	for _, ev := range events(t, client) {
		byReason[ev.Reason]++
	}
	if byReason["CoreDNSError"] != 2 || byReason["CoreDNSWarning"] != 1 || byReason["CoreDNSInfo"] != 1 {
		t.Errorf("events by reason %v, want 2 errors (the burst), 1 warning, 1 info", byReason)
	}
}

// TestWritesStayWithinBound runs a storm of distinct and repeated lines for
// five simulated minutes, offering every dirty key to the writers each
// second, and checks the bucket's bound: burst + qps x T.
func TestWritesStayWithinBound(t *testing.T) {
	const qps, burst = 0.5, 5
	p, client, clk := newTestPipeline(t, testConfig(all, qps, burst, 4096))
	start := clk.Now()
	for s := range 120 {
		for i := range 20 {
			p.observe(ln(levelError, fmt.Sprint("p", i%15), fmt.Sprint("line ", i, s%3), clk.Now()))
		}
		drain(p)
		clk.Step(time.Second)
		p.mu.Lock()
		keys := p.cache.Keys()
		p.mu.Unlock()
		for _, k := range keys {
			p.sync(k)
		}
	}
	elapsed := clk.Since(start).Seconds()
	c, pt := writes(client)
	if bound := burst + qps*elapsed; float64(c+pt) > bound {
		t.Errorf("%d writes in %.0fs, bound %.0f", c+pt, elapsed, bound)
	}
	if want := int(qps * elapsed); c+pt < want {
		t.Errorf("only %d writes in %.0fs, want %d: the budget is not used", c+pt, elapsed, want)
	}
}

func TestEvictedUnwrittenLinesAreCounted(t *testing.T) {
	p, _, clk := newTestPipeline(t, testConfig(all, 1, 25, 2))
	before := testutil.ToFloat64(droppedVec.WithLabelValues(dropEvicted))
	p.observe(ln(levelError, "a", "one", clk.Now()))
	p.observe(ln(levelError, "a", "one", clk.Now()))
	p.observe(ln(levelError, "b", "two", clk.Now()))
	p.observe(ln(levelError, "c", "three", clk.Now())) // evicts a/one with 2 unwritten lines
	if got := testutil.ToFloat64(droppedVec.WithLabelValues(dropEvicted)) - before; got != 2 {
		t.Errorf("dropped{evicted} rose by %v, want 2", got)
	}
	drain(p)
}

func TestStopFlushesPending(t *testing.T) {
	p, client, clk := newTestPipeline(t, testConfig(all, 1, 25, 64))
	p.start()
	for range 5 {
		p.Error("plugin/errors: ", "flushed at stop")
	}
	p.Warning("plugin/health: ", "also flushed")
	p.stop(time.Minute)
	evs := events(t, client)
	if len(evs) != 2 {
		t.Fatalf("%d events after stop, want 2", len(evs))
	}
	for _, ev := range evs {
		if ev.Message == "plugin/errors: flushed at stop" && ev.Count != 5 {
			t.Errorf("count %d, want 5", ev.Count)
		}
	}
	_ = clk
}

func TestFatalIsWrittenBeforeReturning(t *testing.T) {
	p, client, _ := newTestPipeline(t, testConfig(levelSet(1<<levelFatal), 1, 25, 64))
	p.Fatalf("plugin/reload: ", "cannot %s", "go on")
	ev := only(t, events(t, client))
	if ev.Reason != "CoreDNSFatal" || ev.Type != "Warning" || ev.Message != "plugin/reload: cannot go on" || ev.Count != 1 {
		t.Errorf("fatal event %+v", ev)
	}
}

// TestCreateTimedOutButApplied: the API server applied a create whose answer
// never came; the retry must find that event, not make a second one.
func TestCreateTimedOutButApplied(t *testing.T) {
	p, client, clk := newTestPipeline(t, testConfig(all, 100, 100, 64))
	failed := false
	client.PrependReactor("create", "events", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if failed {
			return false, nil, nil
		}
		failed = true
		ev := a.(k8stesting.CreateAction).GetObject().(*corev1.Event)
		if err := client.Tracker().Create(corev1.SchemeGroupVersion.WithResource("events"), ev, ev.Namespace); err != nil {
			t.Fatal(err)
		}
		return true, nil, context.DeadlineExceeded
	})
	p.observe(ln(levelError, "errors", "slow", clk.Now()))
	drain(p)
	p.observe(ln(levelError, "errors", "slow", clk.Now()))
	clk.Step(retryMax * 2)
	waitQueued(t, p)
	drain(p)
	if ev := only(t, events(t, client)); ev.Count != 2 {
		t.Errorf("count %d, want 2", ev.Count)
	}
}

// TestRequestsLogNowhere: client-go logs about a request through its
// context's logger; a line it logged could come back as an event.
func TestRequestsLogNowhere(t *testing.T) {
	p, _, _ := newTestPipeline(t, testConfig(all, 1, 1, 1))
	if sink := klog.FromContext(p.ctx).GetSink(); sink != nil {
		t.Errorf("requests log through %T", sink)
	}
}

func TestForbiddenIsCountedAndPaused(t *testing.T) {
	p, client, clk := newTestPipeline(t, testConfig(all, 100, 100, 64))
	forbid := true
	client.PrependReactor("create", "events", func(k8stesting.Action) (bool, runtime.Object, error) {
		if !forbid {
			return false, nil, nil
		}
		return true, nil, apierrors.NewForbidden(corev1.Resource("events"), "", errors.New("no RBAC"))
	})
	before := testutil.ToFloat64(droppedVec.WithLabelValues(dropRejected))
	for range 3 {
		p.observe(ln(levelError, "errors", "denied", clk.Now()))
	}
	drain(p)
	if got := testutil.ToFloat64(droppedVec.WithLabelValues(dropRejected)) - before; got != 3 {
		t.Errorf("dropped{rejected} rose by %v, want 3", got)
	}
	attempts := func() int { c, _ := writes(client); return c }
	p.observe(ln(levelError, "errors", "denied", clk.Now()))
	drain(p)
	if n := attempts(); n != 1 {
		t.Fatalf("%d create attempts right after a 403, want 1: the key must pause", n)
	}
	forbid = false // RBAC fixed
	clk.Step(rejectPause)
	waitQueued(t, p)
	drain(p)
	if ev := only(t, events(t, client)); ev.Count != 4 {
		t.Errorf("count %d after RBAC was fixed, want 4 (every line ever seen)", ev.Count)
	}
}

func TestTooManyRequestsIsRetried(t *testing.T) {
	p, client, clk := newTestPipeline(t, testConfig(all, 100, 100, 64))
	refusals := 2
	client.PrependReactor("create", "events", func(k8stesting.Action) (bool, runtime.Object, error) {
		if refusals == 0 {
			return false, nil, nil
		}
		refusals--
		return true, nil, apierrors.NewTooManyRequests("slow down", 0)
	})
	for range 5 {
		p.observe(ln(levelWarning, "forward", "busy", clk.Now()))
	}
	drain(p)
	for len(events(t, client)) == 0 {
		clk.Step(retryMax + retryMax/5 + time.Second) // past any backoff with its jitter
		waitQueued(t, p)
		drain(p)
	}
	if ev := only(t, events(t, client)); ev.Count != 5 {
		t.Errorf("count %d, want 5", ev.Count)
	}
}
