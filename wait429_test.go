package k8s_event

import (
	"net/http"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/intstr"
	clocktesting "k8s.io/utils/clock/testing"
)

// TestQuietPluginsLineAnswered429WaitsOnlyTheHold: design.md, "The
// promises in full": "A 429 adds its hold and at most 2.4 s of gaps to every
// bound on a line's wait here, and a refill more for each 429 answered to a
// request of the line's reason while it waits". A 429 answered to a write
// reached the API server and took its token (tokens bound the requests that
// reach it), so the line's next try waits a refill: a quiet plugin's only
// line, no other plugin waiting, answered 429 twice (Retry-After 1 s), is
// bounded by one refill and its write's time, plus, for each 429, a refill,
// a hold of at most 1.2 s and 2.4 s of gaps; and by the largest bound shown
// while it waits.
func TestQuietPluginsLineAnswered429WaitsOnlyTheHold(t *testing.T) {
	const refill = 300 * time.Second
	h, api, clk := newTestHarness(t, testConfig(all, 1/refill.Seconds(), 1, 64))
	h.observe(ln(levelError, "errors", "zone example.org broken", clk.Now()))
	drain(h) // errors' event is written with the one token: nothing else waits
	var mu sync.Mutex
	answered := 0
	api.setFault(func(r apiRequest) fault {
		mu.Lock()
		defer mu.Unlock()
		if r.resource == "events" && r.verb == "create" && answered < 2 { // reload's, the only create
			answered++
			return fault{code: http.StatusTooManyRequests, retryAfter: 1}
		}
		return fault{}
	})
	h.advance(time.Second)
	logged := clk.Now()
	h.observe(ln(levelError, "reload", "Corefile changed but reload failed", logged))
	drain(h)
	wait, shown := untilWritten(h, clk, logged, 2*time.Hour, func() bool { return holds(api, "reload failed") }, nil)
	stated := refill + writeTimeout + 2*(refill+1200*time.Millisecond+2400*time.Millisecond)
	if wait > stated {
		t.Errorf("reload's line, answered 429 twice, is written %v after it was logged, past the "+
			"stated bound %v (one refill, its write; a refill, hold and gaps per 429)", wait, stated)
	}
	if wait > shown {
		t.Errorf("reload's line is written %v after it was logged, past the largest bound shown, %v",
			wait, shown)
	}
}

// TestQuietPluginsLineIsWrittenWhileReadsOfNAreAnswered429: design.md, "The
// promises in full": "A 429 adds its hold and at most 2.4 s of gaps to every
// bound on a line's wait here", and the bound with fleet once N is read is
// a refill of the share (where slower) per plugin waiting, plus the write's
// time. With N read once, and the workload's priority level answering 429 to
// the reads of the Deployment (the design measured workload-high rejecting
// such reads), a quiet plugin's only line, with nothing else waiting, is
// written within a refill, its write and the holds, not after every token
// went to a read of N answered 429.
func TestQuietPluginsLineIsWrittenWhileReadsOfNAreAnswered429(t *testing.T) {
	const refill = 300 * time.Second
	h, api, clk := withNRead(t, refill)
	api.setFault(func(r apiRequest) fault {
		if r.resource == "deployments" {
			return fault{code: http.StatusTooManyRequests, retryAfter: 1}
		}
		return fault{}
	})
	h.observe(ln(levelError, "errors", "zone example.net broken", clk.Now()))
	h.advance(refill) // errors' second line takes the refill: the bucket is empty, N 5 min old
	if !holds(api, "example.net broken") {
		t.Fatal("errors' second line is not written at the refill")
	}
	logged := clk.Now()
	h.observe(ln(levelError, "reload", "Corefile changed but reload failed", logged))
	drain(h)
	wait, shown := untilWritten(h, clk, logged, 2*time.Hour, func() bool { return holds(api, "reload failed") }, nil)
	stated := refill + writeTimeout + h.s.fleet.window() + 1200*time.Millisecond + 2400*time.Millisecond
	if wait > stated {
		t.Errorf("reload's line is written %v after it was logged (%d reads of the Deployment "+
			"answered 429 meanwhile), past the stated bound %v", wait, len(deploymentReads(api)),
			stated)
	}
	if wait > shown {
		t.Errorf("reload's line is written %v after it was logged, past the largest bound shown, %v",
			wait, shown)
	}
}

// deploymentReads are the requests the API was sent for the Deployment.
func deploymentReads(api *fakeAPI) []apiRequest {
	api.mu.Lock()
	defer api.mu.Unlock()
	var out []apiRequest
	for _, r := range api.requests {
		if r.resource == "deployments" {
			out = append(out, r)
		}
	}
	return out
}

// TestLineWaitingForThePodsUIDIsWrittenWhileItsListIsAnswered429: README:
// "when COREDNS_POD_UID is unset, a refill and 10 s for each read of the pod
// left (two, a list then a get, until one is answered)"; design.md: "A 429
// adds its hold and at most 2.4 s of gaps to every bound on a line's wait
// here." With the list of pods answered 429 (Retry-After 1 s), as a
// saturated priority level answers CoreDNS's reads, the only line waits at
// most a refill and its write, the two reads' refills and times, and the
// holds: not every token spent on a list answered 429.
func TestLineWaitingForThePodsUIDIsWrittenWhileItsListIsAnswered429(t *testing.T) {
	const refill = 300 * time.Second
	h, api, clk := newPodHarness(t, testConfig(all, 1/refill.Seconds(), 1, 64))
	api.setFault(func(r apiRequest) fault {
		if r.resource == "pods" && r.verb == "list" {
			return fault{code: http.StatusTooManyRequests, retryAfter: 1}
		}
		return fault{}
	})
	logged := clk.Now()
	h.observe(ln(levelError, "errors", "upstream down", logged))
	drain(h)
	wait, shown := untilWritten(h, clk, logged, 2*time.Hour, func() bool { return holds(api, "upstream down") }, nil)
	reads := podReads(api)
	stated := refill + writeTimeout + 2*(refill+writeTimeout) +
		time.Duration(len(reads))*(1200*time.Millisecond+2400*time.Millisecond)
	if wait > stated {
		t.Errorf("the line is written %v after it was logged (%d reads of the pod: %v), past the "+
			"stated bound %v", wait, len(reads), reads[:min(len(reads), 6)], stated)
	}
	if wait > shown {
		t.Errorf("the line is written %v after it was logged, past the largest bound shown, %v",
			wait, shown)
	}
}

// TestQuietPluginsLineIsNotHeldARefillByAReadOfAStaleN: README: "with
// fleet, the refill is the share's where it is slower, and until N is read it
// adds W and a refill and 10 s for each of its reads left (three)". Once N is
// read, a quiet plugin's only line, nothing else waiting, waits one refill
// and its write (and W): the read of an N gone stale, which takes a token of
// the line's bucket, is not a second refill the bound does not count.
func TestQuietPluginsLineIsNotHeldARefillByAReadOfAStaleN(t *testing.T) {
	const refill = 300 * time.Second
	h, api, clk := withNRead(t, refill)
	h.observe(ln(levelError, "errors", "zone example.net broken", clk.Now()))
	h.advance(refill) // errors' second line takes the refill: the bucket is empty, N 5 min old
	logged := clk.Now()
	h.observe(ln(levelError, "reload", "Corefile changed but reload failed", logged))
	drain(h)
	for !holds(api, "reload failed") && clk.Since(logged) < 2*time.Hour {
		h.advance(time.Second)
	}
	wait := clk.Since(logged)
	if stated := refill + writeTimeout + h.s.fleet.window(); wait > stated {
		t.Errorf("reload's line is written %v after it was logged, past the stated bound %v; "+
			"reads: %v", wait, stated, reads(api))
	}
}

// TestCreatesWithoutTheUIDReadThePodAgainOncePerCreate: docs/design.md,
// "The pod's UID": after two reads answered 429 creates go without the UID,
// naming the pod by namespace and name; the read is made again, once its
// backoff passed, before the next create written since, and once it is
// answered the creates carry the UID.
func TestCreatesWithoutTheUIDReadThePodAgainOncePerCreate(t *testing.T) {
	h, api, clk := newPodHarness(t, testConfig(all, 100, 100, 64))
	api.setFault(func(r apiRequest) fault {
		if r.resource == "pods" {
			return fault{code: http.StatusTooManyRequests, retryAfter: 1}
		}
		return fault{}
	})
	h.observe(ln(levelError, "errors", "upstream A down", clk.Now()))
	h.advance(time.Minute)
	evs := events(t, api)
	if len(evs) != 1 || evs[0].InvolvedObject.UID != "" ||
		evs[0].InvolvedObject.Name != testRef.Name || evs[0].InvolvedObject.Namespace != testRef.Namespace {
		t.Fatalf("events %v after two reads answered 429, want one create naming the pod, no UID",
			evs)
	}
	if n := len(podReads(api)); n != 2 {
		t.Errorf("%d reads of the pod before the create, want 2", n)
	}
	api.setFault(nil)
	h.observe(ln(levelError, "errors", "upstream B down", clk.Now()))
	h.advance(time.Minute)
	if n := len(podReads(api)); n != 3 {
		t.Errorf("%d reads of the pod, want one more before the second create", n)
	}
	evs = events(t, api)
	if len(evs) != 2 || evs[1].InvolvedObject.UID != "uid-9" {
		t.Errorf("UIDs %v, want the second create to carry uid-9", uidsOf(evs))
	}
}

// withNRead is a harness with fleet 1 20 at a refill of refill, a Deployment of one replica,
// and N read once for a line of errors, written.
func withNRead(t *testing.T, refill time.Duration) (*harness, *fakeAPI, *clocktesting.FakeClock) {
	cfg := testConfig(all, 1/refill.Seconds(), 4, 256)
	cfg.fleetQPS, cfg.fleetBurst, cfg.fleetSet = 1, 20, true
	h, api, clk := newTestHarness(t, cfg)
	addDeployment(api, testRef.Name, 1, intstr.FromInt32(0))
	h.observe(ln(levelError, "errors", "zone example.org broken", clk.Now()))
	h.advance(time.Minute) // the herd's window, the three reads of N and the write
	if h.s.fleet.n != 1 || !holds(api, "broken") {
		t.Fatalf("N %d, errors' line written %v: want N 1 read and the line written",
			h.s.fleet.n, holds(api, "broken"))
	}
	return h, api, clk
}
