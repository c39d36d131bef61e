package k8s_event

import (
	"net/http"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

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
	p, api, clk := newTestPipeline(t, testConfig(all, 100, 100, 64))
	p.observe(ln(levelError, "errors", "expires", clk.Now()))
	drain(p)
	before := answers()
	api.expire()
	p.observe(ln(levelError, "errors", "expires", clk.Now()))
	drain(p)
	if ev := only(t, events(t, api)); ev.Count != 2 {
		t.Errorf("count %d, want 2", ev.Count)
	}
	checkAnswers(t, before, map[string]float64{"expected/404/gone": 1})
}

// TestNameRetakenIsNoError: the 409 of a first create whose name another
// event has, which leads to a create under a new name, is expected.
func TestNameRetakenIsNoError(t *testing.T) {
	p, api, clk := newTestPipeline(t, testConfig(all, 100, 100, 64))
	p.names.tag = "" // so that the name is known in advance
	name := p.names.next(testRef.Name, clk.Now())
	p.names.last--
	api.mu.Lock()
	api.events["kube-system/"+name] = &corev1.Event{Message: "someone else's", Count: 7}
	api.mu.Unlock()
	before := answers()
	p.observe(ln(levelError, "errors", "mine", clk.Now()))
	drain(p)
	if n := len(events(t, api)); n != 2 {
		t.Errorf("%d events, want 2", n)
	}
	checkAnswers(t, before, map[string]float64{"expected/409/name_taken": 1})
}

// TestAppliedCreateIsNoError: the 409 of a retried create whose first try
// got no answer but was applied is expected; the unanswered try is not
// (it has no code: 0, not counted here).
func TestAppliedCreateIsNoError(t *testing.T) {
	p, api, clk := newTestPipeline(t, testConfig(all, 100, 100, 64))
	p.writeTimeout = 100 * time.Millisecond
	once := sync.Once{}
	api.setFault(func(r apiRequest) (f fault) {
		once.Do(func() { f = fault{hang: true, apply: true} })
		return f
	})
	before := answers()
	p.observe(ln(levelError, "errors", "slow", clk.Now()))
	drain(p)
	p.observe(ln(levelError, "errors", "slow", clk.Now()))
	clk.Step(retryMax * 2)
	due(p)
	if ev := only(t, events(t, api)); ev.Count != 2 {
		t.Errorf("count %d, want 2", ev.Count)
	}
	checkAnswers(t, before, map[string]float64{"expected/409/exists": 1})
}

// TestRefusedWriteIsAnError: a 403 is a failed request, not an expected
// answer.
func TestRefusedWriteIsAnError(t *testing.T) {
	p, api, clk := newTestPipeline(t, testConfig(all, 100, 100, 64))
	api.setFault(func(r apiRequest) fault { return fault{code: http.StatusForbidden} })
	before := answers()
	p.observe(ln(levelError, "errors", "denied", clk.Now()))
	drain(p)
	checkAnswers(t, before, map[string]float64{"errors/403": 1})
}
