package k8s_event

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"github.com/prometheus/client_golang/prometheus/testutil"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	clocktesting "k8s.io/utils/clock/testing"
)

func statusError(code int) error {
	return &apierrors.StatusError{ErrStatus: metav1.Status{Status: metav1.StatusFailure, Code: int32(code), Reason: statusReasons[code]}}
}

// TestClassify: what a retry may change is retried, and what may have been
// applied is said to be unsure; 4xx but 401, 408, 409 and 429 are final.
func TestClassify(t *testing.T) {
	gr := schema.GroupResource{Resource: "events"}
	for _, tt := range []struct {
		name       string
		reached    bool
		err        error
		outcome    writeOutcome
		unsure     bool
		retryAfter time.Duration
	}{
		{"ok", true, nil, writeOK, false, 0},
		{"refused connection", false, errRefused, writeFailed, false, 0},
		{"no answer", true, fmt.Errorf("read tcp: %w", context.DeadlineExceeded), writeFailed, true, 0},
		{"500", true, apierrors.NewInternalError(errors.New("etcd")), writeFailed, true, 0},
		{"503", true, apierrors.NewServiceUnavailable("down"), writeFailed, true, 0},
		{"504", true, apierrors.NewTimeoutError("etcd", 0), writeFailed, true, 0},
		{"401", true, apierrors.NewUnauthorized("rotated"), writeFailed, false, 0},
		{"408", true, statusError(http.StatusRequestTimeout), writeFailed, false, 0},
		{"409", true, apierrors.NewConflict(gr, "x", errors.New("conflict")), writeFailed, false, 0},
		{"429", true, apierrors.NewTooManyRequests("busy", 7), writeFailed, false, 7 * time.Second},
		{"400", true, apierrors.NewBadRequest("bad"), writeRefused, false, 0},
		{"403", true, apierrors.NewForbidden(gr, "x", errors.New("rbac")), writeRefused, false, 0},
		{"404", true, apierrors.NewNotFound(gr, "x"), writeRefused, false, 0},
		{"422", true, apierrors.NewInvalid(schema.GroupKind{Kind: "Event"}, "x", nil), writeRefused, false, 0},
		{"418", true, statusError(http.StatusTeapot), writeRefused, false, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			res := classify(tt.reached, tt.err)
			if res.outcome != tt.outcome || res.unsure != tt.unsure || res.retryAfter != tt.retryAfter || res.reached != tt.reached {
				t.Errorf("outcome %d unsure %v retry after %v reached %v, want %d %v %v %v",
					res.outcome, res.unsure, res.retryAfter, res.reached, tt.outcome, tt.unsure, tt.retryAfter, tt.reached)
			}
		})
	}
}

// TestDoSortsAnswers: do tells a request that never left from one that
// got no answer, an event gone on patch from a name taken on create, and a
// pod not found by its list.
func TestDoSortsAnswers(t *testing.T) {
	h, api, clk := newTestHarness(t, testConfig(all, 100, 100, 64))
	spec := writeSpec{key: errorKey("x"), message: "plugin/errors: x", count: 1, first: clk.Now(), last: clk.Now()}
	create := request{id: 1, verb: verbCreate, namespace: "kube-system", event: newEvent(testRef, testNode, "kube-system", "ev-1", spec)}
	ctx := context.Background()
	if res := do(ctx, h.client, create); res.outcome != writeOK || !res.reached || res.id != 1 {
		t.Fatalf("create: %+v", res)
	}
	if res := do(ctx, h.client, create); res.outcome != writeExists {
		t.Errorf("create of a name taken: outcome %d, want writeExists", res.outcome)
	}
	patch := request{id: 2, verb: verbPatch, namespace: "kube-system", name: "ev-2", patch: countPatch(spec)}
	if res := do(ctx, h.client, patch); res.outcome != writeGone {
		t.Errorf("patch of an event gone: outcome %d, want writeGone", res.outcome)
	}
	list := request{id: 3, verb: verbListPod, namespace: "kube-system", name: "coredns-9"}
	if res := do(ctx, h.client, list); res.outcome != writeRefused || !apierrors.IsNotFound(res.err) {
		t.Errorf("list of no pod: outcome %d, %v, want not found", res.outcome, res.err)
	}
	api.setFault(func(apiRequest) fault { return fault{unsent: true} })
	if res := do(ctx, h.client, create); res.reached || res.outcome != writeFailed || res.unsure {
		t.Errorf("unsent: %+v", res)
	}
	api.setFault(func(apiRequest) fault { return fault{lost: true} })
	if res := do(ctx, h.client, patch); !res.reached || res.outcome != writeFailed || !res.unsure {
		t.Errorf("lost: %+v", res)
	}
}

// TestOneRequestPerToken: client-go would retry a 429 with Retry-After
// inside one call, up to ten times; every retry is a request that reaches
// the API, so each takes its own token and none is made inside a call.
func TestOneRequestPerToken(t *testing.T) {
	h, api, clk := newTestHarness(t, testConfig(all, 1e-6, 3, 64))
	api.setFault(func(r apiRequest) fault { return fault{code: http.StatusTooManyRequests, retryAfter: 1} })
	h.observe(ln(levelError, "errors", "busy", clk.Now()))
	start := time.Now()
	for range 10 {
		h.advance(retryMax * 2)
	}
	if c, _ := api.writes(); c != 3 {
		t.Errorf("%d requests reached the API, want 3: the burst", c)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("three answers of 429 asking for 1 s took %v: the client waited them out itself", took)
	}
}

// TestNoClientRateLimiter: the client's own rate limiter (5 a second,
// burst 10, for all reasons together) would hold up requests the buckets
// allow: none is in the way.
func TestNoClientRateLimiter(t *testing.T) {
	h, api, clk := newTestHarness(t, testConfig(all, 1000, 100, 1024))
	for i := range 40 {
		h.observe(ln(levelError, fmt.Sprint("p", i), "line", clk.Now()))
	}
	start := time.Now()
	drain(h)
	if took := time.Since(start); took > 3*time.Second {
		t.Errorf("40 creates took %v: a client rate limiter of 5 a second is in the way", took)
	}
	if c, _ := api.writes(); c != 40 {
		t.Errorf("%d creates, want 40", c)
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

// TestAPIWarningsAreCountedNeverLogged: warnings the API server sends back
// with its answers are counted by verb and reach no logger, not even klog,
// which CoreDNS's kubernetes plugin routes into its own plugin logger: a
// warning logged there would become an event whose write is warned about
// again.
func TestAPIWarningsAreCountedNeverLogged(t *testing.T) {
	logged := captureLog(t)
	var klogged logCapture
	klog.SetLogger(funcr.New(func(prefix, args string) { fmt.Fprintln(&klogged, prefix, args) }, funcr.Options{}))
	t.Cleanup(klog.ClearLogger)

	clk := clocktesting.NewFakeClock(epoch)
	api := newFakeAPI(t, clk)
	api.addPod(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: testRef.Name, Namespace: testRef.Namespace, UID: testRef.UID}})
	client, err := kubernetes.NewForConfig(&rest.Config{
		Host: api.srv.URL,
		WrapTransport: func(rt http.RoundTripper) http.RoundTripper {
			return roundTripper(func(req *http.Request) (*http.Response, error) {
				res, err := rt.RoundTrip(req)
				if err == nil {
					res.Header.Add("Warning", `299 - "events in this namespace are audited"`)
				}
				return res, err
			})
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	spec := writeSpec{key: errorKey("x"), message: "plugin/errors: x", count: 1, first: clk.Now(), last: clk.Now()}
	ns := testRef.Namespace
	for _, r := range []request{
		{id: 1, verb: verbCreate, namespace: ns, event: newEvent(testRef, testNode, ns, "ev-1", spec)},
		{id: 2, verb: verbPatch, namespace: ns, name: "ev-1", patch: countPatch(spec)},
		{id: 3, verb: verbListPod, namespace: ns, name: testRef.Name},
		{id: 4, verb: verbGetPod, namespace: ns, name: testRef.Name},
	} {
		before := testutil.ToFloat64(apiWarnings.WithLabelValues(r.verb.String()))
		if res := do(context.Background(), client, r); res.err != nil {
			t.Fatalf("%v: %v", r.verb, res.err)
		}
		if d := testutil.ToFloat64(apiWarnings.WithLabelValues(r.verb.String())) - before; d != 1 {
			t.Errorf("%v: api_warnings_total moved by %v, want 1", r.verb, d)
		}
	}
	if out := klogged.String() + logged.String(); out != "" {
		t.Errorf("warnings were logged:\n%s", out)
	}
}

// TestRejectionLogOncePerMinute: why writes fail is said at most once a
// minute, with a hint of the cause.
func TestRejectionLogOncePerMinute(t *testing.T) {
	logged := captureLog(t)
	var r rejectionLog
	say := func(now time.Time, err error) {
		if f := r.report(now, err, "ns"); f != nil {
			f()
		}
	}
	err := errors.New("boom")
	say(epoch, nil) // nothing to say
	for i := range 10 {
		say(epoch.Add(time.Duration(i)*time.Second), err)
	}
	say(epoch.Add(time.Minute), apierrors.NewForbidden(schema.GroupResource{Resource: "events"}, "x", errors.New("rbac")))
	out := logged.String()
	n := strings.Count(out, "writing event: ")
	if n != 2 {
		t.Errorf("%d lines in 70 s, want 2:\n%s", n, out)
	}
	if !strings.Contains(out, "boom: will retry") || !strings.Contains(out, "grant create and patch on events") {
		t.Errorf("no hint of the causes:\n%s", out)
	}
}

// TestRefusalSaidInTheLog: a refusal met by the pipeline is said through
// the package logger, once a minute, with its hint.
func TestRefusalSaidInTheLog(t *testing.T) {
	p, api, _ := newTestPipeline(t, testConfig(all, 100, 100, 64))
	logged := captureLog(t)
	api.setFault(func(apiRequest) fault { return fault{code: http.StatusForbidden} })
	p.start()
	for i := range 3 {
		p.listener.Errorf("plugin/errors: ", "refused %d", i)
	}
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if c, _ := api.writes(); c == 3 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	p.stop(100 * time.Millisecond)
	if n := strings.Count(logged.String(), "grant create and patch on events"); n != 1 {
		t.Errorf("said %d times why the writes failed, want once:\n%s", n, logged.String())
	}
}

// TestRetryAfterIsNotRetriedInsideACall: client-go retries an answer with a Retry-After up to 10
// times inside one call unless told not to; every request here is made once, so that each try
// takes a token and the 429's hold applies to the next.
func TestRetryAfterIsNotRetriedInsideACall(t *testing.T) {
	h, api, clk := newTestHarness(t, testConfig(all, 100, 100, 64))
	api.setFault(func(apiRequest) fault { return fault{code: http.StatusTooManyRequests, retryAfter: 1} })
	h.observe(ln(levelError, "errors", "busy", clk.Now()))
	start := time.Now()
	drain(h)
	if n := len(requestTimes(api)); n != 1 {
		t.Errorf("%d requests reached the API for one write, want 1", n)
	}
	if took := time.Since(start); took > 900*time.Millisecond {
		t.Errorf("the call took %v: it waited out a Retry-After inside", took)
	}
}

// TestWorkloadReadsWhatItWants: N of a Deployment is its replicas plus maxSurge, a percentage
// rounded up; of a DaemonSet its desiredNumberScheduled; a pod's controller is its owner.
func TestWorkloadReadsWhatItWants(t *testing.T) {
	api := newFakeAPI(t, clocktesting.NewFakeClock(epoch))
	addDeployment(api, testRef.Name, 10, intstr.FromString("25%"))
	api.addApp("daemonsets", &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Name: "node-local-dns", Namespace: testRef.Namespace},
		Status:     appsv1.DaemonSetStatus{DesiredNumberScheduled: 4999},
	})
	ctx := context.Background()
	for _, tt := range []struct {
		verb  verb
		name  string
		owner string
		want  int
	}{
		{verbListPod, testRef.Name, "ReplicaSet/coredns-5d78c9869d", 0},
		{verbGetReplicaSet, "coredns-5d78c9869d", "Deployment/coredns", 10},
		{verbGetDeployment, "coredns", "/", 13},
		{verbGetDaemonSet, "node-local-dns", "/", 4999},
	} {
		res := do(ctx, api.client, request{verb: tt.verb, namespace: testRef.Namespace, name: tt.name})
		if res.err != nil || res.owner.Kind+"/"+res.owner.Name != tt.owner || res.want != tt.want {
			t.Errorf("%v %s: owner %s/%s, wants %d, error %v; want %s, %d",
				tt.verb, tt.name, res.owner.Kind, res.owner.Name, res.want, res.err, tt.owner, tt.want)
		}
	}
}
