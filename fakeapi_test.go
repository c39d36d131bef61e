package k8s_event

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"
)

// fakeAPI is a small kube-apiserver for unit tests: create and patch of
// core/v1 events, get and list (by a field selector on the name) of pods, get of apps/v1
// replicasets, deployments and daemonsets, served over HTTP to the real
// client-go. Contexts, time-outs, cancellation and client-go's handling of
// answers are therefore the real ones. A fault function may break any
// request: refuse the connection, answer with an error status, hang, reset
// the connection, answer late; a hung or reset request may still take
// effect, as on a real API server.
type fakeAPI struct {
	srv    *httptest.Server
	client kubernetes.Interface
	clock  clock.PassiveClock // stamps the requests

	closing   chan struct{}
	closeOnce sync.Once

	mu       sync.Mutex
	events   map[string]*corev1.Event // by namespace/name
	pods     map[string]*corev1.Pod
	apps     map[string]any    // apps/v1 objects, by resource/namespace/name
	reasons  map[string]string // the reason of every event name ever created
	plugins  map[string]string // the plugin of every event name ever created
	requests []apiRequest      // every request that reached the server
	refused  int               // requests refused before they left the client
	fault    func(apiRequest) fault
	sent     map[int]sentRequest // by request number, until the server reads it
	seq      int
	rv       int
}

// apiRequest is one request as the server saw it.
type apiRequest struct {
	verb     string // create, patch, get or list
	resource string // events or pods
	name     string // empty for a create
	reason   string // of the event written
	plugin   string // of the event written
	at       time.Time
	code     int // the status answered; 0 when none was
}

// fault is what happens to one request.
type fault struct {
	unsent     bool          // the connection is refused: the request never reaches the server
	code       int           // answer with this error status
	retryAfter int           // seconds, with code
	lost       bool          // it reaches the server and the answer is lost: a time-out at once
	hang       bool          // no answer until the client gives up
	reset      bool          // the connection is closed without an answer
	apply      bool          // with hang, reset or code: the request takes effect all the same
	delay      time.Duration // answer after this long
}

func newFakeAPI(t testing.TB, clk clock.PassiveClock) *fakeAPI {
	t.Helper()
	api, err := startFakeAPI(clk)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(api.close)
	return api
}

// close stops the server, ending the requests that hang.
func (api *fakeAPI) close() {
	api.closeOnce.Do(func() { close(api.closing) })
	api.srv.Close()
}

// startFakeAPI starts a fake API server; close stops it.
func startFakeAPI(clk clock.PassiveClock) (*fakeAPI, error) {
	api := &fakeAPI{clock: clk, events: map[string]*corev1.Event{}, pods: map[string]*corev1.Pod{}, apps: map[string]any{}, reasons: map[string]string{}, plugins: map[string]string{}, sent: map[int]sentRequest{}, closing: make(chan struct{})}
	api.srv = httptest.NewServer(http.HandlerFunc(api.serve))
	cfg := &rest.Config{
		Host: api.srv.URL, // client-go's defaults, as kubeapi leaves them: QPS 5, burst 10
		WrapTransport: func(rt http.RoundTripper) http.RoundTripper {
			return roundTripper(func(req *http.Request) (*http.Response, error) { return api.send(rt, req) })
		},
	}
	var err error
	if api.client, err = kubernetes.NewForConfig(cfg); err != nil {
		api.srv.Close()
		return nil, err
	}
	return api, nil
}

// send is the client's side of a request: its fault is drawn, and it is
// refused, lost or sent on rt to the server.
func (api *fakeAPI) send(rt http.RoundTripper, req *http.Request) (*http.Response, error) {
	seq, f := api.decide(req)
	switch {
	case f.unsent:
		return nil, errRefused
	case f.lost:
		return api.lose(rt, req, seq, f)
	}
	req = req.Clone(req.Context())
	req.Header.Set(faultHeader, strconv.Itoa(seq))
	return rt.RoundTrip(req)
}

// errRefused is a connection refused: the request never left the client.
var errRefused = &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// faultHeader carries a request's number from the client to the server.
const faultHeader = "X-Fault-Seq"

// decide draws the fault of a request once, before it leaves the client:
// it is refused there, or numbered for the server to find its fault.
func (api *fakeAPI) decide(r *http.Request) (int, fault) {
	api.mu.Lock()
	defer api.mu.Unlock()
	var f fault
	if api.fault != nil {
		f = api.fault(api.describe(r, nil))
	}
	if f.unsent {
		api.refused++
		return 0, f
	}
	api.seq++
	api.sent[api.seq] = sentRequest{f, api.clock.Now()}
	return api.seq, f
}

// sentRequest is a request's fault and the time the client sent it.
type sentRequest struct {
	fault fault
	at    time.Time
}

// take hands over what the client decided for request seq. Called with
// api.mu held.
func (api *fakeAPI) take(seq int) (sentRequest, bool) {
	s, ok := api.sent[seq]
	delete(api.sent, seq)
	return s, ok
}

// lose is a request that reaches the API and gets no answer, at once
// rather than after a time-out: its headers are written (the client's
// trace hears so), it takes effect or not, and the answer is lost.
func (api *fakeAPI) lose(rt http.RoundTripper, req *http.Request, seq int, f fault) (*http.Response, error) {
	if trace := httptrace.ContextClientTrace(req.Context()); trace != nil && trace.WroteHeaders != nil {
		trace.WroteHeaders()
	}
	if f.apply {
		req = req.Clone(req.Context())
		req.Header.Set(faultHeader, strconv.Itoa(seq))
		if resp, err := rt.RoundTrip(req); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	} else {
		var body []byte
		if req.Body != nil {
			body, _ = io.ReadAll(req.Body)
		}
		r := httptest.NewRequest(req.Method, req.URL.String(), bytes.NewReader(body))
		var ev corev1.Event
		_ = json.Unmarshal(body, &ev)
		api.mu.Lock()
		req := api.describe(r, &ev)
		sent, _ := api.take(seq)
		req.at = sent.at
		api.requests = append(api.requests, req)
		api.mu.Unlock()
	}
	return nil, fmt.Errorf("read tcp: %w", os.ErrDeadlineExceeded)
}

func (api *fakeAPI) setFault(f func(apiRequest) fault) {
	api.mu.Lock()
	defer api.mu.Unlock()
	api.fault = f
}

// describe names a request by its method and path; reason is filled in
// for event writes. Called with api.mu held.
func (api *fakeAPI) describe(r *http.Request, ev *corev1.Event) apiRequest {
	// /api/v1/namespaces/NS/RESOURCE[/NAME], /apis/apps/v1/namespaces/NS/RESOURCE[/NAME]
	parts := pathParts(r)
	req := apiRequest{at: api.clock.Now()}
	if ev != nil {
		req.reason, req.plugin = ev.Reason, ev.Labels[labelPlugin]
	}
	if len(parts) >= 5 {
		req.resource = parts[4]
	}
	if len(parts) >= 6 {
		req.name = parts[5]
		if req.reason == "" {
			req.reason, req.plugin = api.reasons[parts[3]+"/"+req.name], api.plugins[parts[3]+"/"+req.name]
		}
	}
	switch r.Method {
	case http.MethodPost:
		req.verb = "create"
	case http.MethodPatch:
		req.verb = "patch"
	default:
		req.verb = "get"
		if req.name == "" {
			req.verb = "list"
		}
	}
	return req
}

// pathParts is a request's path from "api", as a core/v1 path has it.
func pathParts(r *http.Request) []string {
	parts := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
	if len(parts) > 0 && parts[0] == "apis" {
		parts = parts[1:]
	}
	return parts
}

func (api *fakeAPI) serve(w http.ResponseWriter, r *http.Request) {
	// Reading the whole body lets the server see the client go away.
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	var ev corev1.Event
	if r.Method == http.MethodPost {
		if err := json.Unmarshal(body, &ev); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
	}
	api.mu.Lock()
	req := api.describe(r, &ev)
	seq, _ := strconv.Atoi(r.Header.Get(faultHeader))
	sent, ok := api.take(seq)
	f := sent.fault
	if f.lost {
		f = fault{} // its answer is lost on the way back
	}
	if ok {
		// A request is stamped when it was sent: the server may read a
		// request the client gave up on only after the clock moved.
		req.at = sent.at
	}
	api.mu.Unlock()

	if f.delay > 0 {
		time.Sleep(f.delay)
	}
	code := 0
	if f.code != 0 && !f.hang && !f.reset {
		if f.apply { // committed, then answered with an error, as an etcd time-out is
			api.handle(httptest.NewRecorder(), r, req, &ev)
		}
		code = f.code
		writeStatus(w, f.code, f.retryAfter, req)
	} else {
		if f.hang || f.reset {
			if f.apply {
				api.handle(httptest.NewRecorder(), r, req, &ev)
			}
		} else {
			code = api.handle(w, r, req, &ev)
		}
	}
	req.code = code
	api.mu.Lock()
	api.requests = append(api.requests, req)
	api.mu.Unlock()
	switch {
	case f.hang:
		select {
		case <-r.Context().Done():
		case <-api.closing:
		}
	case f.reset:
		if hj, ok := w.(http.Hijacker); ok {
			if conn, _, err := hj.Hijack(); err == nil {
				conn.Close()
			}
		}
	}
}

// handle carries out a request that meets no fault, and returns its status.
func (api *fakeAPI) handle(w http.ResponseWriter, r *http.Request, req apiRequest, ev *corev1.Event) int {
	ns := pathParts(r)[3]
	api.mu.Lock()
	defer api.mu.Unlock()
	switch {
	case req.resource == "replicasets" || req.resource == "deployments" || req.resource == "daemonsets":
		obj, ok := api.apps[req.resource+"/"+ns+"/"+req.name]
		if !ok || req.verb != "get" {
			return writeStatus(w, http.StatusNotFound, 0, req)
		}
		return writeObject(w, http.StatusOK, obj)
	case req.resource == "pods" && req.verb == "list":
		list := corev1.PodList{TypeMeta: metav1.TypeMeta{Kind: "PodList", APIVersion: "v1"}}
		name := strings.TrimPrefix(r.URL.Query().Get("fieldSelector"), "metadata.name=")
		if pod, ok := api.pods[ns+"/"+name]; ok {
			list.Items = append(list.Items, *pod)
		}
		return writeObject(w, http.StatusOK, &list)
	case req.resource == "pods" && req.verb == "get":
		pod, ok := api.pods[ns+"/"+req.name]
		if !ok {
			return writeStatus(w, http.StatusNotFound, 0, req)
		}
		return writeObject(w, http.StatusOK, pod)
	case req.resource == "events" && req.verb == "create":
		key := ns + "/" + ev.Name
		if _, ok := api.events[key]; ok {
			return writeStatus(w, http.StatusConflict, 0, req)
		}
		api.rv++
		ev.ResourceVersion = strconv.Itoa(api.rv)
		ev.UID = types.UID(fmt.Sprint("event-", api.rv))
		api.events[key] = ev.DeepCopy()
		api.reasons[key] = ev.Reason
		api.plugins[key] = ev.Labels[labelPlugin]
		return writeObject(w, http.StatusCreated, ev)
	case req.resource == "events" && req.verb == "patch":
		stored, ok := api.events[ns+"/"+req.name]
		if !ok {
			return writeStatus(w, http.StatusNotFound, 0, req)
		}
		var patch struct {
			Count         *int32       `json:"count"`
			LastTimestamp *metav1.Time `json:"lastTimestamp"`
			Message       *string      `json:"message"`
		}
		if r.Header.Get("Content-Type") != string(types.StrategicMergePatchType) || json.NewDecoder(r.Body).Decode(&patch) != nil {
			return writeStatus(w, http.StatusBadRequest, 0, req)
		}
		if patch.Count != nil {
			stored.Count = *patch.Count
		}
		if patch.LastTimestamp != nil {
			stored.LastTimestamp = *patch.LastTimestamp
		}
		if patch.Message != nil {
			stored.Message = *patch.Message
		}
		api.rv++
		stored.ResourceVersion = strconv.Itoa(api.rv)
		return writeObject(w, http.StatusOK, stored)
	}
	return writeStatus(w, http.StatusMethodNotAllowed, 0, req)
}

func writeObject(w http.ResponseWriter, code int, obj any) int {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(obj)
	return code
}

var statusReasons = map[int]metav1.StatusReason{
	400: metav1.StatusReasonBadRequest, 401: metav1.StatusReasonUnauthorized, 403: metav1.StatusReasonForbidden,
	404: metav1.StatusReasonNotFound, 408: metav1.StatusReasonTimeout, 422: metav1.StatusReasonInvalid,
	429: metav1.StatusReasonTooManyRequests, 500: metav1.StatusReasonInternalError,
	503: metav1.StatusReasonServiceUnavailable, 504: metav1.StatusReasonTimeout,
}

// writeStatus answers with an error status as kube-apiserver does.
func writeStatus(w http.ResponseWriter, code, retryAfter int, req apiRequest) int {
	reason := statusReasons[code]
	if code == http.StatusConflict {
		reason = metav1.StatusReasonConflict
		if req.verb == "create" {
			reason = metav1.StatusReasonAlreadyExists
		}
	}
	st := metav1.Status{
		TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
		Status:   metav1.StatusFailure,
		Message:  fmt.Sprintf("%s %s %q: injected %d", req.verb, req.resource, req.name, code),
		Reason:   reason,
		Code:     int32(code),
		Details:  &metav1.StatusDetails{Name: req.name, Kind: req.resource},
	}
	if retryAfter > 0 {
		st.Details.RetryAfterSeconds = int32(retryAfter)
		w.Header().Set("Retry-After", strconv.Itoa(retryAfter))
	}
	return writeObject(w, code, st)
}

// list returns the events stored, sorted by nothing in particular.
func (api *fakeAPI) list() []corev1.Event {
	api.mu.Lock()
	defer api.mu.Unlock()
	out := make([]corev1.Event, 0, len(api.events))
	for _, ev := range api.events {
		out = append(out, *ev.DeepCopy())
	}
	return out
}

// writes counts the event creates and patches that reached the server.
func (api *fakeAPI) writes() (creates, patches int) {
	api.mu.Lock()
	defer api.mu.Unlock()
	for _, r := range api.requests {
		switch {
		case r.resource != "events":
		case r.verb == "create":
			creates++
		case r.verb == "patch":
			patches++
		}
	}
	return creates, patches
}

// expire deletes every event, as the API server's event TTL does, and
// returns the sum of their counts.
func (api *fakeAPI) expire() (counts int64) {
	api.mu.Lock()
	defer api.mu.Unlock()
	for _, ev := range api.events {
		counts += int64(ev.Count)
	}
	clear(api.events)
	return counts
}

// addApp stores an apps/v1 object of resource (replicasets, deployments, daemonsets).
func (api *fakeAPI) addApp(resource string, obj metav1.Object) {
	api.mu.Lock()
	defer api.mu.Unlock()
	api.apps[resource+"/"+obj.GetNamespace()+"/"+obj.GetName()] = obj
}

func (api *fakeAPI) addPod(pod *corev1.Pod) {
	api.mu.Lock()
	defer api.mu.Unlock()
	api.pods[pod.Namespace+"/"+pod.Name] = pod.DeepCopy()
}
