package k8s_event

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	clocktesting "k8s.io/utils/clock/testing"
)

// newPodHarness is a harness whose pod's UID is still to read, on an API
// that holds the pod (uid-9) and another of its namespace.
func newPodHarness(t *testing.T, cfg config) (*harness, *fakeAPI, *clocktesting.FakeClock) {
	t.Helper()
	clk := clocktesting.NewFakeClock(epoch)
	api := newFakeAPI(t, clk)
	api.addPod(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: testRef.Name, Namespace: testRef.Namespace, UID: "uid-9"}})
	api.addPod(&corev1Pod)
	return newHarnessOn(t, cfg, api, clk, testPodWithoutUID()), api, clk
}

// podReads lists the verbs of the pod reads that reached the API.
func podReads(api *fakeAPI) []string {
	api.mu.Lock()
	defer api.mu.Unlock()
	var out []string
	for _, r := range api.requests {
		if r.resource == "pods" {
			out = append(out, r.verb)
		}
	}
	return out
}

func uidsOf(evs []corev1.Event) []types.UID {
	var out []types.UID
	for _, ev := range evs {
		out = append(out, ev.InvolvedObject.UID)
	}
	return out
}

// recordURLs makes h's requests through a client of api that records the
// path and query of each.
func recordURLs(t *testing.T, h *harness, api *fakeAPI) func() []*url.URL {
	t.Helper()
	var mu sync.Mutex
	var urls []*url.URL
	client, err := kubernetes.NewForConfig(&rest.Config{
		Host: api.srv.URL,
		WrapTransport: func(rt http.RoundTripper) http.RoundTripper {
			return roundTripper(func(req *http.Request) (*http.Response, error) {
				mu.Lock()
				urls = append(urls, req.URL)
				mu.Unlock()
				return api.send(rt, req)
			})
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	h.client = client
	return func() []*url.URL {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(urls)
	}
}

// TestPodUIDReadByList: without COREDNS_POD_UID, the pod is read once,
// with a list by a field selector on its name, which CoreDNS's rights for
// the kubernetes plugin allow; every create carries its UID.
func TestPodUIDReadByList(t *testing.T) {
	h, api, clk := newPodHarness(t, testConfig(all, 100, 100, 64))
	urls := recordURLs(t, h, api)
	h.observe(ln(levelError, "errors", "a", clk.Now()))
	h.observe(ln(levelWarning, "forward", "b", clk.Now()))
	drain(h)
	h.observe(ln(levelError, "errors", "c", clk.Now()))
	drain(h)
	if got := strings.Join(podReads(api), " "); got != "list" {
		t.Errorf("pod reads %q, want one list", got)
	}
	reads := 0
	for _, u := range urls() {
		if !strings.Contains(u.Path, "/pods") {
			continue
		}
		if reads++; u.Path != "/api/v1/namespaces/kube-system/pods" || u.Query().Get("fieldSelector") != "metadata.name="+testRef.Name {
			t.Errorf("the pod is read with %s?%s, want a list of kube-system's pods with fieldSelector metadata.name=%s", u.Path, u.RawQuery, testRef.Name)
		}
	}
	if reads != 1 {
		t.Errorf("%d pod reads made, want 1", reads)
	}
	evs := events(t, api)
	if len(evs) != 3 {
		t.Fatalf("%d events, want 3", len(evs))
	}
	for _, uid := range uidsOf(evs) {
		if uid != "uid-9" {
			t.Errorf("UIDs %v, want uid-9 on every event", uidsOf(evs))
			break
		}
	}
}

// TestPodUIDReadByGetWhenListRefused: when list is refused, the pod is
// read with get.
func TestPodUIDReadByGetWhenListRefused(t *testing.T) {
	h, api, clk := newPodHarness(t, testConfig(all, 100, 100, 64))
	api.setFault(func(r apiRequest) fault {
		if r.resource == "pods" && r.verb == "list" {
			return fault{code: http.StatusForbidden}
		}
		return fault{}
	})
	h.observe(ln(levelError, "errors", "a", clk.Now()))
	drain(h)
	if got := strings.Join(podReads(api), " "); got != "list get" {
		t.Errorf("pod reads %q, want a list, then a get", got)
	}
	if ev := only(t, events(t, api)); ev.InvolvedObject.UID != "uid-9" {
		t.Errorf("UID %q, want uid-9", ev.InvolvedObject.UID)
	}
	if len(h.reports) != 0 {
		t.Errorf("a list refused and a get allowed said as a failure: %v", h.reports)
	}
}

// TestPodUIDUnreadable: with list and get refused, events go without the
// UID, the pod is not read again, and it is said once.
func TestPodUIDUnreadable(t *testing.T) {
	h, api, clk := newPodHarness(t, testConfig(all, 100, 100, 64))
	api.setFault(func(r apiRequest) fault {
		if r.resource == "pods" {
			return fault{code: http.StatusForbidden}
		}
		return fault{}
	})
	for i := range 3 {
		h.observe(ln(levelError, "errors", fmt.Sprint("line ", i), clk.Now()))
	}
	drain(h)
	h.advance(time.Hour)
	h.observe(ln(levelError, "errors", "later", clk.Now()))
	drain(h)
	if got := strings.Join(podReads(api), " "); got != "list get" {
		t.Errorf("pod reads %q, want a list and a get, once", got)
	}
	evs := events(t, api)
	if len(evs) != 4 {
		t.Fatalf("%d events, want 4", len(evs))
	}
	for _, uid := range uidsOf(evs) {
		if uid != "" {
			t.Errorf("UIDs %v, want none", uidsOf(evs))
			break
		}
	}
	var gone errUnreadable
	if len(h.reports) != 1 || !errors.As(h.reports[0], &gone) {
		t.Errorf("said %v, want once that the UID cannot be read", h.reports)
	}
	var r rejectionLog
	logged := captureLog(t)
	r.report(clk.Now(), h.reports[0], "ns")()
	if !strings.Contains(logged.String(), "COREDNS_POD_UID not set and the pod's UID cannot be read") {
		t.Errorf("logged %q", logged.String())
	}
}

// TestPodReadRetriedWithBackoff: a read that fails with a 503 is tried
// again with backoff; the creates wait for it without counting failures of
// their own, and all land within one maximal backoff of the API's return.
func TestPodReadRetriedWithBackoff(t *testing.T) {
	h, api, clk := newPodHarness(t, testConfig(all, 100, 100, 64))
	api.setFault(func(r apiRequest) fault {
		if r.resource == "pods" {
			return fault{code: http.StatusServiceUnavailable}
		}
		return fault{}
	})
	for _, m := range []string{"a", "b", "c"} {
		h.observe(ln(levelError, "errors", m, clk.Now()))
	}
	h.advance(10 * time.Minute)
	if c, pt := api.writes(); c+pt != 0 {
		t.Errorf("%d creates and %d patches while the pod's UID was still to read", c, pt)
	}
	// 1 + 2 + 4 + ... + 64 s, then one a minute: 7 and 8 more, with jitter.
	if n := len(podReads(api)); n < 10 || n > 16 {
		t.Errorf("%d pod reads in ten minutes of 503, want about 15: a backoff from 1 s to 1 min", n)
	}
	for _, e := range h.s.corr.cache.values() {
		if e.failures > 0 || !e.retryAt.IsZero() {
			t.Errorf("event %q booked %d failures of its own while the read was failing", e.message, e.failures)
		}
	}
	api.setFault(nil)
	back := clk.Now()
	for len(events(t, api)) < 3 && clk.Since(back) < 5*time.Minute {
		h.advance(time.Second)
	}
	if took := clk.Since(back); took > retryMax+retryMax/5 {
		t.Errorf("every event written %v after the API's return, promised within %v", took, retryMax+retryMax/5)
	}
	for _, uid := range uidsOf(events(t, api)) {
		if uid != "uid-9" {
			t.Errorf("UIDs %v, want uid-9", uidsOf(events(t, api)))
			break
		}
	}
}

// TestPodReadHonoursRetryAfter: a read answered 429 is not made again
// before the Retry-After.
func TestPodReadHonoursRetryAfter(t *testing.T) {
	h, api, clk := newPodHarness(t, testConfig(all, 100, 100, 64))
	api.setFault(firstOnly(fault{code: http.StatusTooManyRequests, retryAfter: 30}))
	h.observe(ln(levelError, "errors", "a", clk.Now()))
	drain(h)
	h.advance(30*time.Second - time.Millisecond)
	if n := len(podReads(api)); n != 1 {
		t.Errorf("%d pod reads before the 30 s the API asked for, want 1", n)
	}
	// the hold's jitter (a fifth), then the gaps after a 429 (at most 2.4 s), and a write's time
	h.advance(30*time.Second/5 + 2400*time.Millisecond + time.Second)
	if ev := only(t, events(t, api)); ev.InvolvedObject.UID != "uid-9" {
		t.Errorf("UID %q, want uid-9", ev.InvolvedObject.UID)
	}
}

// TestCreatesDoNotWaitForThePodAtShutdown: in the flush, creates go
// without the UID rather than wait for a read: one not yet made is not
// made, and one that hangs holds up no create.
func TestCreatesDoNotWaitForThePodAtShutdown(t *testing.T) {
	t.Run("not yet read", func(t *testing.T) {
		// One token, refilled once an hour: the flush may send one request.
		h, api, clk := newPodHarness(t, testConfig(all, 1.0/3600, 1, 64))
		before := readLedger()
		api.setFault(func(r apiRequest) fault {
			if r.resource == "pods" {
				return fault{code: http.StatusTooManyRequests, retryAfter: 30}
			}
			return fault{}
		})
		h.observe(ln(levelError, "errors", "busy", clk.Now()))
		h.stop(time.Second)
		if n := len(podReads(api)); n != 0 {
			t.Errorf("%d pod reads in the flush, want none", n)
		}
		if ev := only(t, events(t, api)); ev.InvolvedObject.UID != "" {
			t.Errorf("UID %q, want none", ev.InvolvedObject.UID)
		}
		checkLedger(t, api, before, 1)
	})
	t.Run("read hangs", func(t *testing.T) {
		h, api, clk := newPodHarness(t, testConfig(all, 100, 100, 64))
		h.lostAfter = writeTimeout
		api.setFault(func(r apiRequest) fault { return fault{lost: r.resource == "pods"} })
		h.observe(ln(levelError, "errors", "a", clk.Now()))
		drain(h) // the read hangs: the create waits for it
		if c, _ := api.writes(); c != 0 {
			t.Fatalf("%d creates while the read is in flight", c)
		}
		h.observe(ln(levelError, "errors", "b", clk.Now()))
		start := clk.Now()
		h.stop(5 * time.Second)
		if n := len(events(t, api)); n != 2 {
			t.Errorf("%d events in the flush with the read hung, want 2", n)
		}
		at := reachedAt(api, "CoreDNSError")
		if len(at) != 2 || at[1].Sub(start) > 0 {
			t.Errorf("creates reached the API at %v, want both at once at stop (%v)", at, start)
		}
	})
}

// TestPodReadTakesTheCreatesToken: the read of the pod is a request made
// for an event's create, and takes a token of its bucket: with one token
// refilled once a day, the API sees the read and nothing else for a day,
// then the create.
func TestPodReadTakesTheCreatesToken(t *testing.T) {
	t.Run("answered", func(t *testing.T) {
		h, api, clk := newPodHarness(t, testConfig(all, 1.0/86400, 1, 64))
		h.observe(ln(levelError, "errors", "first of its kind", clk.Now()))
		h.advance(time.Hour)
		c, pt := api.writes()
		if n := len(podReads(api)) + c + pt; n != 1 {
			t.Errorf("%d requests reached the API on a bucket of 1 token: %d pod reads, %d creates, %d patches", n, len(podReads(api)), c, pt)
		}
		h.advance(24 * time.Hour)
		if ev := only(t, events(t, api)); ev.InvolvedObject.UID != "uid-9" {
			t.Errorf("UID %q, want uid-9", ev.InvolvedObject.UID)
		}
	})
	t.Run("503", func(t *testing.T) {
		h, api, clk := newPodHarness(t, testConfig(all, 1.0/86400, 1, 64))
		api.setFault(func(r apiRequest) fault {
			if r.resource == "pods" {
				return fault{code: http.StatusServiceUnavailable}
			}
			return fault{}
		})
		h.observe(ln(levelError, "errors", "waits for the pod", clk.Now()))
		h.advance(time.Hour)
		c, pt := api.writes()
		if n := len(podReads(api)) + c + pt; n != 1 {
			t.Errorf("%d requests within an hour on a bucket of 1 token (QPS 1/day): %d pod reads, %d creates, %d patches", n, len(podReads(api)), c, pt)
		}
	})
}

// TestPodFromEnv: the downward API's variables name the pod; without a
// UID it is to be read; without a name or namespace, events go to
// namespace/default.
func TestPodFromEnv(t *testing.T) {
	t.Setenv(envPodName, "coredns-0")
	t.Setenv(envNamespace, "kube-system")
	t.Setenv(envPodUID, "uid-0")
	t.Setenv(envNodeName, "node-0")
	id := podFromEnv()
	if id.ref != testRef || id.node != "node-0" || id.lookup {
		t.Errorf("with every variable: %+v", id)
	}
	t.Setenv(envPodUID, "")
	if id := podFromEnv(); !id.lookup || id.ref.UID != "" || id.verb != verbListPod {
		t.Errorf("without the UID: %+v, want it read with list", id)
	}
	for _, unset := range []string{envPodName, envNamespace} {
		t.Run(unset, func(t *testing.T) {
			t.Setenv(unset, "")
			id := podFromEnv()
			if id.ref.Kind != "Namespace" || id.ref.Name != "default" || id.lookup || id.namespace() != "default" {
				t.Errorf("without %s: %+v", unset, id)
			}
		})
	}
}
