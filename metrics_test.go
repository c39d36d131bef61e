package k8s_event

import (
	"net/http"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
)

// expectedOutcomes are the outcomes of api_expected_total.
var expectedOutcomes = []string{"gone", "name_taken", "exists"}

// answers reads api_errors_total and api_expected_total for the codes and
// outcomes a write can meet.
func answers() map[string]float64 {
	m := map[string]float64{}
	for _, code := range []string{"403", "404", "409"} {
		m["errors/"+code] = testutil.ToFloat64(apiErrors.WithLabelValues(code))
		for _, outcome := range expectedOutcomes {
			m["expected/"+code+"/"+outcome] = testutil.ToFloat64(apiExpected.WithLabelValues(code, outcome))
		}
	}
	return m
}

// answersSince is what changed since before, without the zeroes.
func answersSince(before map[string]float64) map[string]float64 {
	d := map[string]float64{}
	for k, v := range answers() {
		if v != before[k] {
			d[k] = v - before[k]
		}
	}
	return d
}

func checkAnswers(t *testing.T, before map[string]float64, want map[string]float64) {
	t.Helper()
	got := answersSince(before)
	if len(got) != len(want) {
		t.Errorf("api answers counted %v, want %v", got, want)
		return
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("api answers counted %v, want %v", got, want)
			return
		}
	}
}

// TestExpiredEventIsNoError: the 404 of a patch of an expired event, which
// leads to a new create, is an expected answer, not a failed request.
func TestExpiredEventIsNoError(t *testing.T) {
	h, api, clk := newTestHarness(t, testConfig(all, 100, 100, 64))
	h.observe(ln(levelError, "errors", "expires", clk.Now()))
	drain(h)
	before := answers()
	api.expire()
	h.observe(ln(levelError, "errors", "expires", clk.Now()))
	drain(h)
	if ev := only(t, events(t, api)); ev.Count != 2 {
		t.Errorf("count %d, want 2", ev.Count)
	}
	checkAnswers(t, before, map[string]float64{"expected/404/gone": 1})
}

// TestNameRetakenIsNoError: the 409 of a first create whose name another
// event has, which leads to a create under a new name, is expected.
func TestNameRetakenIsNoError(t *testing.T) {
	h, api, clk := newTestHarness(t, testConfig(all, 100, 100, 64))
	h.s.names.tag = "" // so that the name is known in advance
	name := h.s.names.next(testRef.Name, clk.Now())
	h.s.names.last--
	api.mu.Lock()
	api.events["kube-system/"+name] = &corev1.Event{Message: "someone else's", Count: 7}
	api.mu.Unlock()
	before := answers()
	h.observe(ln(levelError, "errors", "mine", clk.Now()))
	drain(h)
	if n := len(events(t, api)); n != 2 {
		t.Errorf("%d events, want 2", n)
	}
	checkAnswers(t, before, map[string]float64{"expected/409/name_taken": 1})
}

// TestAppliedCreateIsNoError: the 409 of a retried create whose first try
// got no answer but was applied is expected; the unanswered try is not
// (it has no code: 0, not counted here).
func TestAppliedCreateIsNoError(t *testing.T) {
	h, api, clk := newTestHarness(t, testConfig(all, 100, 100, 64))
	first := true
	api.setFault(func(r apiRequest) (f fault) {
		if first {
			first, f = false, fault{lost: true, apply: true}
		}
		return f
	})
	before := answers()
	h.observe(ln(levelError, "errors", "slow", clk.Now()))
	drain(h)
	h.observe(ln(levelError, "errors", "slow", clk.Now()))
	h.advance(retryMax * 2)
	if ev := only(t, events(t, api)); ev.Count != 2 {
		t.Errorf("count %d, want 2", ev.Count)
	}
	checkAnswers(t, before, map[string]float64{"expected/409/exists": 1})
}

// TestRefusedWriteIsAnError: a 403 is a failed request, not an expected
// answer.
func TestRefusedWriteIsAnError(t *testing.T) {
	h, api, clk := newTestHarness(t, testConfig(all, 100, 100, 64))
	api.setFault(func(r apiRequest) fault { return fault{code: http.StatusForbidden} })
	before := answers()
	h.observe(ln(levelError, "errors", "denied", clk.Now()))
	drain(h)
	checkAnswers(t, before, map[string]float64{"errors/403": 1})
}

// requestsTimed is the count and sum of
// coredns_k8s_event_request_duration_seconds for verb.
func requestsTimed(t *testing.T, verb string) (count uint64, sum float64) {
	t.Helper()
	mfs, err := prometheus.DefaultGatherer.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "coredns_k8s_event_request_duration_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "verb" && l.GetValue() == verb {
					return m.GetHistogram().GetSampleCount(), m.GetHistogram().GetSampleSum()
				}
			}
		}
	}
	return 0, 0
}

// TestRequestsInFlightAndDuration: a request that hangs shows in
// coredns_k8s_event_requests_in_flight for as long as it hangs, and once
// it ends, answered or not, its time is in
// coredns_k8s_event_request_duration_seconds under its verb.
func TestRequestsInFlightAndDuration(t *testing.T) {
	p, api, _ := newTestPipeline(t, testConfig(all, 100, 100, 64))
	api.setFault(func(apiRequest) fault { return fault{hang: true} })
	// Requests of tests before this one end first, as their servers close.
	for wait := time.Now().Add(5 * time.Second); testutil.ToFloat64(requestsInFlight) != 0 && time.Now().Before(wait); {
		time.Sleep(time.Millisecond)
	}
	inFlight := testutil.ToFloat64(requestsInFlight)
	creates, took := requestsTimed(t, "create")
	p.start()
	p.listener.Errorf("plugin/errors: ", "upstream down")
	deadline := time.Now().Add(10 * time.Second)
	for testutil.ToFloat64(requestsInFlight) != inFlight+1 {
		if time.Now().After(deadline) {
			t.Fatalf("requests_in_flight %v while a create hangs, want %v", testutil.ToFloat64(requestsInFlight), inFlight+1)
		}
		time.Sleep(time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond) // it hangs still
	if got := testutil.ToFloat64(requestsInFlight); got != inFlight+1 {
		t.Errorf("requests_in_flight %v while the create hangs, want %v", got, inFlight+1)
	}
	if n, _ := requestsTimed(t, "create"); n != creates {
		t.Errorf("%d creates timed while the only one hangs, want %d", n, creates)
	}
	p.stop(200 * time.Millisecond) // the flush's time-out ends the hung create
	if got := testutil.ToFloat64(requestsInFlight); got != inFlight {
		t.Errorf("requests_in_flight %v once stop returned, want %v", got, inFlight)
	}
	n, sum := requestsTimed(t, "create")
	if n != creates+1 {
		t.Errorf("%d creates timed, want %d", n, creates+1)
	}
	if sum-took < 0.05 {
		t.Errorf("the hung create was timed at %vs, want at least the 50ms it hung", sum-took)
	}
}
