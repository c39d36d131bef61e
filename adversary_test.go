package k8s_event

import (
	"fmt"
	"net/http"
	"testing"
	"time"
)

// podReads counts the pod reads that reached the server.
func (api *fakeAPI) podReads() int {
	api.mu.Lock()
	defer api.mu.Unlock()
	n := 0
	for _, r := range api.requests {
		if r.resource == "pods" {
			n++
		}
	}
	return n
}

// TestFlushHonoursRetryAfterOfPodLookup: without COREDNS_POD_UID, the create
// first reads the pod. A 429 asking for 30 s on that read is a failed write
// like any other: in the flush at shutdown it is not tried again sooner
// than it asks (README, Shutdown), and every request made for an event
// takes a token of its bucket (README, Throttling: BURST + QPS x T).
func TestFlushHonoursRetryAfterOfPodLookup(t *testing.T) {
	// One token, refilled once an hour: the flush may send one request.
	p, api, clk := newTestPipeline(t, testConfig(all, 1.0/3600, 1, 64))
	p.flushPause = 10 * time.Millisecond
	ref := testRef
	ref.UID = ""
	p.pod.ref.Store(&ref)
	p.pod.lookup.Store(true)
	api.setFault(func(r apiRequest) fault {
		if r.resource == "pods" {
			return fault{code: http.StatusTooManyRequests, retryAfter: 30}
		}
		return fault{}
	})
	p.observe(ln(levelError, "errors", "busy", clk.Now()))
	p.stop(time.Second)
	if n := api.podReads(); n > 1 {
		t.Errorf("%d pod reads in a 1 s flush after a 429 asking for 30 s, with a bucket of 1 token: want at most 1", n)
	}
}

// TestPodLookupTakesTokens: the pod read is a request made for an event's
// create, and reaches the API server; the README bounds every such request
// by its bucket: at most BURST + QPS x T. A bucket of one token refilled
// once a day meets a pod read that fails with a 503 for an hour: the API
// server must see at most 1 + 1/24 requests, not one per lookup backoff.
func TestPodLookupTakesTokens(t *testing.T) {
	p, api, clk := newTestPipeline(t, testConfig(all, 1.0/86400, 1, 64))
	ref := testRef
	ref.UID = ""
	p.pod.ref.Store(&ref)
	p.pod.lookup.Store(true)
	api.setFault(func(r apiRequest) fault {
		if r.resource == "pods" {
			return fault{code: http.StatusServiceUnavailable}
		}
		return fault{}
	})
	p.observe(ln(levelError, "errors", "waits for the pod", clk.Now()))
	for range 3600 {
		due(p)
		clk.Step(time.Second)
	}
	c, pt := api.writes()
	if n := api.podReads() + c + pt; n > 1 {
		t.Errorf("%d requests for one event's bucket of 1 token (QPS 1/day) within an hour: %d pod reads, %d creates, %d patches",
			n, api.podReads(), c, pt)
	}
}

// TestFlushHonoursRetryAfterAskedBeforeStop: a write answered 429 with
// Retry-After: 30 just before shutdown must not be retried by the flush
// (README, Shutdown: "a failed write is tried again no sooner than it
// asks, and when it asks for longer than the flush has left, the event is
// not tried again and its lines are dropped at the end").
func TestFlushHonoursRetryAfterAskedBeforeStop(t *testing.T) {
	p, api, clk := newTestPipeline(t, testConfig(all, 100, 100, 64))
	p.flushPause = 10 * time.Millisecond
	before := readLedger()
	api.setFault(func(apiRequest) fault { return fault{code: http.StatusTooManyRequests, retryAfter: 30} })
	p.observe(ln(levelError, "errors", "busy", clk.Now()))
	drain(p)
	if c, _ := api.writes(); c != 1 {
		t.Fatalf("%d creates before stop, want 1", c)
	}
	clk.Step(time.Second) // 29 s of the Retry-After are left
	p.stop(2 * time.Second)
	if c, _ := api.writes(); c != 1 {
		t.Errorf("%d creates, want 1: the flush retried 1 s after a 429 asking for 30 s", c)
	}
	d := checkLedger(t, api, before, 1)
	if d.dropped[dropShutdown] != 1 {
		t.Errorf("dropped %v, want 1 at shutdown", d.dropped)
	}
}

// TestPodLookupAndCreateShareOneToken: with the pod read answered at once,
// the first create of an event with a bucket of one token (QPS 1/day)
// makes two requests that reach the API server: the bound of the README
// is 1.
func TestPodLookupAndCreateShareOneToken(t *testing.T) {
	p, api, clk := newTestPipeline(t, testConfig(all, 1.0/86400, 1, 64))
	ref := testRef
	ref.UID = ""
	p.pod.ref.Store(&ref)
	p.pod.lookup.Store(true)
	pod := corev1Pod
	pod.Name, pod.Namespace = testRef.Name, testRef.Namespace
	api.addPod(&pod)
	p.observe(ln(levelError, "errors", "first of its kind", clk.Now()))
	drain(p)
	c, pt := api.writes()
	if n := api.podReads() + c + pt; n > 1 {
		t.Errorf("%d requests reached the API server on a bucket of 1 token: %d pod reads, %d creates, %d patches",
			n, api.podReads(), c, pt)
	}
}

// TestReloadsRacingWritesAndStopKeepLedger: writers, the correlator,
// reloads that shrink and grow the cache, and stop all run at once against
// a slow but healthy API server. No answer is lost, so the ledger must be
// exact: sum(counts) + pending + dropped == lines.
func TestReloadsRacingWritesAndStopKeepLedger(t *testing.T) {
	for round := range 5 {
		p, api, clk := newTestPipeline(t, testConfig(all, 1000, 50, 4))
		api.setFault(func(apiRequest) fault { return fault{delay: 200 * time.Microsecond} })
		before := readLedger()
		p.start()
		const n = 400
		done := make(chan struct{})
		go func() {
			defer close(done)
			for i := range n {
				p.lines <- ln(levelError, "errors", fmt.Sprint("m", i%7), clk.Now())
			}
		}()
		stopReloads := make(chan struct{})
		reloaded := make(chan struct{})
		go func() {
			defer close(reloaded)
			for i := 0; ; i++ {
				select {
				case <-stopReloads:
					return
				default:
				}
				p.apply(testConfig(all, 1000, 50, 1+i%4), api.client)
				time.Sleep(100 * time.Microsecond)
			}
		}()
		<-done
		p.stop(2 * time.Second)
		close(stopReloads)
		<-reloaded
		d := readLedger().since(before)
		if got := countsIn(api) + d.pending + d.droppedAll(); got != n {
			t.Fatalf("round %d: counts %v + pending %v + dropped %v = %v, want %d lines",
				round, countsIn(api), d.pending, d.dropped, got, n)
		}
	}
}
