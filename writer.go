package k8s_event

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptrace"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	clog "github.com/coredns/coredns/plugin/pkg/log"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// Downward-API environment variables that name the CoreDNS pod.
const (
	envPodName   = "COREDNS_POD_NAME"
	envNamespace = "COREDNS_NAMESPACE"
	envPodUID    = "COREDNS_POD_UID"
	envNodeName  = "COREDNS_NODE_NAME"
)

const (
	writeTimeout = 10 * time.Second
	fatalTimeout = 3 * time.Second
)

// podIdentity is the object events are about, and who reports them. When
// the downward API gave no UID, writers look it up before their first
// create: `kubectl describe pod` lists only events that carry it.
type podIdentity struct {
	ref  atomic.Pointer[corev1.ObjectReference] // replaced whole, never changed in place
	node string

	mu       sync.Mutex // one lookup at a time; never taken by the fatal path
	lookup   atomic.Bool
	nextTry  time.Time
	asked    time.Time // no lookup before this, even at shutdown: a Retry-After
	failures int
}

// podFromEnv reads the downward-API variables. Without a pod name and
// namespace, events go to the default namespace, as the plugin always did.
func podFromEnv() *podIdentity {
	name, ns := os.Getenv(envPodName), os.Getenv(envNamespace)
	id := &podIdentity{node: os.Getenv(envNodeName)}
	if name == "" || ns == "" {
		clog.Warningf("plugin/%s: %s or %s not set: events are reported on namespace/default", pluginName, envPodName, envNamespace)
		id.ref.Store(&corev1.ObjectReference{Kind: "Namespace", APIVersion: "v1", Name: metav1.NamespaceDefault})
		return id
	}
	ref := &corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Name: name, Namespace: ns, UID: types.UID(os.Getenv(envPodUID))}
	id.ref.Store(ref)
	id.lookup.Store(ref.UID == "")
	return id
}

// current is the reference as known now, without waiting for anything.
func (id *podIdentity) current() corev1.ObjectReference { return *id.ref.Load() }

// namespace is where the events live: the pod's namespace, or default.
func (id *podIdentity) namespace() string {
	if ns := id.ref.Load().Namespace; ns != "" {
		return ns
	}
	return metav1.NamespaceDefault
}

// lookupBusyWait is how long a create that found the pod's read in flight
// waits before it tries again.
const lookupBusyWait = time.Second

// errLookupPending says a create waits for the pod's UID.
var errLookupPending = errors.New("the pod's UID is not known yet")

// resolve returns the reference with the pod's UID, reading the pod once
// if needed. That read is a request of its own: it takes the write's token,
// and the create comes after it with another. A lookup that fails for a
// cause that may pass (no answer, 5xx, 401, 408, 409, 429) is tried again
// with a backoff, and the create waits; the flush at shutdown skips the
// backoff but not a Retry-After. One that the API answers for good (403:
// not allowed, 404: no such pod, any other 4xx such as 400, 410, 422) is
// given up, said once, and events go without the UID. With a nil result,
// no request was made and the create may go on with the reference.
func (id *podIdentity) resolve(ctx context.Context, p *pipeline, client kubernetes.Interface) (corev1.ObjectReference, *writeResult) {
	if !id.lookup.Load() {
		return id.current(), nil
	}
	// One read at a time. A create that finds one in flight does not wait
	// for it (it may hang, and the create holds a token meanwhile): it
	// hands its token back and is tried again shortly, as after a read due
	// later; in the flush at shutdown, where there is no later, it goes on
	// without the UID.
	if !id.mu.TryLock() {
		if p.flushing.Load() {
			return id.current(), nil
		}
		return id.current(), &writeResult{outcome: writeFailed, verb: "get", lookup: true, wait: lookupBusyWait, err: errLookupPending}
	}
	defer id.mu.Unlock()
	ref := id.current()
	if !id.lookup.Load() {
		return ref, nil
	}
	now := p.clock.Now()
	wait := id.nextTry.Sub(now)
	if p.flushing.Load() {
		wait = id.asked.Sub(now)
	}
	if wait > 0 {
		return ref, &writeResult{outcome: writeFailed, verb: "get", lookup: true, wait: wait, retryAfter: max(id.asked.Sub(now), 0), err: errLookupPending}
	}
	var pod corev1.Pod
	req := client.CoreV1().RESTClient().Get().Namespace(ref.Namespace).Resource("pods").Name(ref.Name)
	reached, err := send(ctx, req, &pod)
	res := &writeResult{verb: "get", lookup: true, reached: reached}
	if err == nil {
		ref.UID = pod.UID
		id.ref.Store(&ref)
		id.lookup.Store(false)
		return ref, res
	}
	countError(err)
	if final(err) {
		id.lookup.Store(false)
		clog.Warningf("plugin/%s: %s not set and the pod's UID cannot be read (%v): `kubectl describe pod` will not list the events", pluginName, envPodUID, err)
		return ref, res
	}
	id.failures++
	res.outcome, res.err, res.retryAfter = writeFailed, err, retryAfter(err)
	p.mu.Lock()
	res.wait = p.backoffFor(id.failures, res.retryAfter)
	p.mu.Unlock()
	id.nextTry, id.asked = now.Add(res.wait), now.Add(res.retryAfter)
	return ref, res
}

// send makes exactly one HTTP request, without client-go's retries on
// Retry-After answers (a retry is a request, and takes its own token) and
// without the client's own rate limiter (5 requests a second by default, for
// all reasons together): the buckets are the limit. It tells whether the
// request reached the API: whether its headers were written to a
// connection. A request that could not connect did not.
func send(ctx context.Context, req *rest.Request, into runtime.Object) (reached bool, err error) {
	var wrote atomic.Bool
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{WroteHeaders: func() { wrote.Store(true) }})
	res := req.MaxRetries(0).Throttle(nil).Do(ctx)
	if into != nil {
		err = res.Into(into)
	} else {
		err = res.Error()
	}
	return wrote.Load(), err
}

type writeOutcome uint8

const (
	writeOK        writeOutcome = iota
	writeGone                   // patch: the event is gone (expired, deleted): create it anew
	writeExists                 // create: our earlier create that got no answer was applied
	writeNameTaken              // create: the name is another's; take a new one
	writeRefused                // the API refused for good: 400, 403, 404, 422, other 4xx
	writeFailed                 // may pass: no answer, 401, 408, 409, 429, 5xx
)

// writeResult is what a write did.
type writeResult struct {
	outcome    writeOutcome
	name, verb string
	reached    bool          // the request reached the API: it cost a token
	unsure     bool          // it reached the API and got no answer or a 5xx: it may have been applied
	lookup     bool          // the pod was read (writeOK: the create is still to make) or the lookup is due later
	wait       time.Duration // lookup: until the create may be tried again
	retryAfter time.Duration
	err        error
}

// write creates the event, or patches its count, last time and message.
// With lookup, a create first learns the pod's UID if that is still to do:
// that read is the write's one request, and the create is left to another.
func (p *pipeline) write(ctx context.Context, s writeSpec, lookup bool) writeResult {
	ctx, cancel := context.WithTimeout(ctx, p.writeTimeout)
	defer cancel()
	client := *p.client.Load()
	rc := client.CoreV1().RESTClient()
	ns := p.pod.namespace()
	if s.name != "" {
		req := rc.Patch(types.StrategicMergePatchType).Namespace(ns).Resource("events").Name(s.name).Body(countPatch(s))
		res := result(send(ctx, req, nil))
		res.name, res.verb = s.name, "patch"
		if res.outcome == writeRefused && apierrors.IsNotFound(res.err) {
			res.outcome = writeGone
		}
		countAnswer(res)
		return res
	}
	ref := p.pod.current()
	if lookup {
		var res *writeResult
		if ref, res = p.pod.resolve(ctx, p, client); res != nil {
			return *res
		}
	}
	name := s.tried
	if name == "" {
		name = p.names.next(ref.Name, p.clock.Now())
	}
	req := rc.Post().Namespace(ns).Resource("events").Body(newEvent(ref, p.pod.node, ns, name, s))
	res := result(send(ctx, req, nil))
	res.name, res.verb = name, "create"
	if apierrors.IsAlreadyExists(res.err) {
		// Names are unique to this process: a create under a name that
		// reached the API before is ours; a first create is not.
		res.outcome = writeNameTaken
		if s.tried != "" {
			res.outcome = writeExists
		}
	}
	countAnswer(res)
	return res
}

// result sorts the answer to one request.
func result(reached bool, err error) writeResult {
	res := writeResult{reached: reached, err: err}
	if err == nil {
		return res
	}
	res.retryAfter = retryAfter(err)
	code := statusCode(err)
	if code == 0 {
		res.outcome, res.unsure = writeFailed, reached
		return res
	}
	switch {
	case code >= 500:
		// kube-apiserver answers 500 or 504 when etcd timed out, and etcd
		// may have committed: as unsure as no answer at all.
		res.outcome, res.unsure = writeFailed, reached
	case code == http.StatusUnauthorized, // a rotated token: the next request reads the new one
		code == http.StatusRequestTimeout, code == http.StatusConflict,
		code == http.StatusTooManyRequests:
		res.outcome = writeFailed
	default:
		res.outcome = writeRefused
	}
	return res
}

// final tells an answer that a retry cannot change: a 4xx other than 401
// (a rotated token), 408, 409 and 429.
func final(err error) bool {
	switch code := statusCode(err); code {
	case http.StatusUnauthorized, http.StatusRequestTimeout, http.StatusConflict, http.StatusTooManyRequests:
		return false
	default:
		return code >= 400 && code < 500
	}
}

// statusCode is the HTTP status of a failed request, 0 when no answer came.
func statusCode(err error) int {
	var status apierrors.APIStatus
	if errors.As(err, &status) {
		return int(status.Status().Code)
	}
	return 0
}

// countError counts a failed request by its HTTP status, 0 for no answer.
func countError(err error) {
	apiErrors.WithLabelValues(strconv.Itoa(statusCode(err))).Inc()
}

func retryAfter(err error) time.Duration {
	if s, ok := apierrors.SuggestsClientDelay(err); ok {
		return time.Duration(s) * time.Second
	}
	return 0
}

// writeFatal posts a fatal line at once: CoreDNS exits right after the
// listeners return, so nothing queued would ever be written. It takes a
// token of the fatal bucket like any write, waits for no other write and
// for no UID lookup, and gives up after fatalTimeout.
func (p *pipeline) writeFatal(ln line) {
	var t tally
	t.see()
	p.mu.Lock()
	_, ok := p.reserve(levelFatal, nil, p.clock.Now())
	p.mu.Unlock()
	if !ok {
		throttled[levelFatal].Inc()
		t.drop(dropThrottled)
		return
	}
	ctx, cancel := context.WithTimeout(p.ctx, p.fatalTimeout)
	defer cancel()
	msg := eventMessage(ln.text)
	res := p.write(ctx, writeSpec{key: eventKey{level: levelFatal, plugin: ln.plugin, message: msg}, message: msg, count: 1, first: ln.at, last: ln.at}, false)
	p.mu.Lock()
	p.spend(levelFatal, p.clock.Now(), res.reached)
	if res.unsure {
		p.doubtful++
	}
	p.mu.Unlock()
	if res.outcome != writeOK {
		t.drop(dropFailed)
		return
	}
	t.carry(1)
	eventWrites.WithLabelValues(levelFatal.reason(), res.verb).Inc()
}

// rejectionLog says why writes fail, at most once a minute, through the
// package logger: a plugin logger would feed the listener.
type rejectionLog struct {
	mu   sync.Mutex
	last time.Time
}

func (r *rejectionLog) report(now time.Time, err error, namespace string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.last.IsZero() && now.Sub(r.last) < time.Minute {
		return
	}
	r.last = now
	hint := "will retry"
	switch {
	case apierrors.IsForbidden(err):
		hint = "grant create and patch on events in the core API group (\"\") to CoreDNS's service account"
	case apierrors.IsNotFound(err):
		hint = fmt.Sprintf("does the namespace %q exist?", namespace)
	case apierrors.IsInvalid(err), apierrors.IsBadRequest(err):
		hint = "the event was refused as invalid"
	}
	clog.Errorf("plugin/%s: writing event: %v: %s", pluginName, err, hint)
}
