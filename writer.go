package k8s_event

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptrace"
	"strconv"
	"sync/atomic"
	"time"

	clog "github.com/coredns/coredns/plugin/pkg/log"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
)

// Writers do I/O only: a prepared request in, what happened out; the scheduler decides what the
// answer means. Each request runs in its own goroutine: one that hangs holds up only its event.

const (
	writeTimeout = 10 * time.Second
	fatalTimeout = 3 * time.Second
)

type verb uint8

const (
	verbCreate verb = iota
	verbPatch
	verbListPod // the pod, by a field selector on its name: needs list, as CoreDNS has
	verbGetPod  // the pod by name: needs get, tried when list is refused
	// The reads of the workload, for fleet (fleet.go): each by name, with get.
	verbGetReplicaSet
	verbGetDeployment
	verbGetDaemonSet
)

var verbNames = [...]string{"create", "patch", "list", "get", "get", "get", "get"}

// workloadResources are the apps/v1 resources the workload reads get.
var workloadResources = map[verb]string{
	verbGetReplicaSet: "replicasets",
	verbGetDeployment: "deployments",
	verbGetDaemonSet:  "daemonsets",
}

func (v verb) String() string { return verbNames[v] }

// request is one HTTP request, prepared whole by the scheduler.
type request struct {
	id        uint64
	verb      verb
	namespace string
	name      string        // of the event to patch, or of the pod to read
	event     *corev1.Event // create
	patch     []byte        // patch
}

// writeOutcome sorts an answer for the scheduler.
type writeOutcome uint8

const (
	writeOK      writeOutcome = iota
	writeGone                 // patch: the event is gone (expired, deleted): create it anew
	writeExists               // create: the name exists: an earlier create of ours, or another's
	writeRefused              // the API refused for good: 400, 403, 404, 422, other 4xx
	writeFailed               // may pass: no answer, 401, 408, 409, 429, 5xx
)

// result is what one request did.
type result struct {
	id         uint64
	outcome    writeOutcome
	reached    bool // the request reached the API: it cost a token
	unsure     bool // it reached the API and got no answer or a 5xx: it may have been applied
	retryAfter time.Duration
	err        error
	uid        types.UID             // of the pod, after a read
	owner      metav1.OwnerReference // the controller of the pod or ReplicaSet read; empty if none
	want       int                   // the pods the workload read wants
}

// do makes one request with client and tells what happened.
func do(ctx context.Context, client kubernetes.Interface, r request) result {
	start := time.Now() // real time, as the request's: for its duration's metric alone
	requestsInFlight.Inc()
	defer requestsInFlight.Dec()
	rc := client.CoreV1().RESTClient()
	var (
		req  *rest.Request
		into runtime.Object
		list corev1.PodList
		pod  corev1.Pod
		rs   appsv1.ReplicaSet
		dep  appsv1.Deployment
		ds   appsv1.DaemonSet
	)
	switch r.verb {
	case verbGetReplicaSet, verbGetDeployment, verbGetDaemonSet:
		req = client.AppsV1().RESTClient().Get().Namespace(r.namespace).
			Resource(workloadResources[r.verb]).Name(r.name)
		into = map[verb]runtime.Object{
			verbGetReplicaSet: &rs,
			verbGetDeployment: &dep,
			verbGetDaemonSet:  &ds,
		}[r.verb]
	case verbCreate:
		req = rc.Post().Namespace(r.namespace).Resource("events").Body(r.event)
	case verbPatch:
		req = rc.Patch(types.StrategicMergePatchType).Namespace(r.namespace).Resource("events").
			Name(r.name).Body(r.patch)
	case verbListPod:
		req = rc.Get().Namespace(r.namespace).Resource("pods").Param("fieldSelector",
			"metadata.name="+r.name)
		into = &list
	case verbGetPod:
		req = rc.Get().Namespace(r.namespace).Resource("pods").Name(r.name)
		into = &pod
	}
	reached, err := send(ctx, req.WarningHandler(warningCounter{r.verb}), into)
	if err == nil && r.verb == verbListPod {
		if len(list.Items) == 0 {
			err = apierrors.NewNotFound(corev1.Resource("pods"), r.name)
		} else {
			pod = list.Items[0]
		}
	}
	res := classify(reached, err)
	res.id, res.uid = r.id, pod.UID
	if err == nil {
		res.owner, res.want = wants(r.verb, &pod, &rs, &dep, &ds)
	}
	if apierrors.IsAlreadyExists(err) {
		res.outcome = writeExists
	}
	if res.outcome == writeRefused && r.verb == verbPatch && apierrors.IsNotFound(err) {
		res.outcome = writeGone
	}
	requestSeconds.WithLabelValues(r.verb.String()).Observe(time.Since(start).Seconds())
	return res
}

// wants is the controller of the object a read got, and the pods it wants: a ReplicaSet's
// replicas, a Deployment's replicas and maxSurge (the most pods a rollout runs at once), a
// DaemonSet's desiredNumberScheduled.
func wants(v verb, pod *corev1.Pod, rs *appsv1.ReplicaSet, dep *appsv1.Deployment,
	ds *appsv1.DaemonSet) (metav1.OwnerReference, int) {
	var owner metav1.OwnerReference
	controller := func(refs []metav1.OwnerReference) {
		ref := metav1.GetControllerOfNoCopy(&metav1.ObjectMeta{OwnerReferences: refs})
		if ref != nil {
			owner = *ref
		}
	}
	switch v {
	case verbListPod, verbGetPod:
		controller(pod.OwnerReferences)
	case verbGetReplicaSet:
		controller(rs.OwnerReferences)
		return owner, int(ptr.Deref(rs.Spec.Replicas, 1))
	case verbGetDeployment:
		replicas := int(ptr.Deref(dep.Spec.Replicas, 1))
		surge := 0
		if u := dep.Spec.Strategy.RollingUpdate; u != nil && u.MaxSurge != nil {
			surge, _ = intstr.GetScaledValueFromIntOrPercent(u.MaxSurge, replicas, true)
		}
		return owner, replicas + surge
	case verbGetDaemonSet:
		return owner, int(ds.Status.DesiredNumberScheduled)
	}
	return owner, 0
}

// send makes exactly one HTTP request: no client-go retry on Retry-After (a retry takes its own
// token), no client rate limiter (the buckets are the limit). reached tells whether its headers
// were written to a connection: a request that could not connect did not reach the API.
func send(ctx context.Context, req *rest.Request, into runtime.Object) (reached bool, err error) {
	var wrote atomic.Bool
	ctx = httptrace.WithClientTrace(ctx,
		&httptrace.ClientTrace{WroteHeaders: func() { wrote.Store(true) }})
	res := req.MaxRetries(0).Throttle(nil).Do(ctx)
	if into != nil {
		err = res.Into(into)
	} else {
		err = res.Error()
	}
	return wrote.Load(), err
}

// warningCounter counts the warnings of the API's answers. client-go's default handler logs them
// through klog, which CoreDNS's kubernetes plugin makes lines of a plugin: each warning would
// become an event whose write is warned about again. Set on every request, never as the
// process-wide default, which is the other plugins'.
type warningCounter struct{ verb verb }

func (w warningCounter) HandleWarningHeader(code int, _, message string) {
	if code == 299 && message != "" {
		apiWarnings.WithLabelValues(w.verb.String()).Inc()
	}
}

// classify sorts the answer to one request. A 4xx other than 401 (a
// rotated token), 408, 409 and 429 is final: a retry cannot change it.
func classify(reached bool, err error) result {
	res := result{reached: reached, err: err}
	if err == nil {
		return res
	}
	if s, ok := apierrors.SuggestsClientDelay(err); ok {
		res.retryAfter = time.Duration(s) * time.Second
	}
	switch code := statusCode(err); {
	case code == 0, code >= 500:
		// kube-apiserver answers 500 or 504 when etcd timed out, and etcd
		// may have committed: as unsure as no answer at all.
		res.outcome, res.unsure = writeFailed, reached
	case code < 400, code == http.StatusUnauthorized, code == http.StatusRequestTimeout,
		code == http.StatusConflict, code == http.StatusTooManyRequests:
		res.outcome = writeFailed
	default:
		res.outcome = writeRefused
	}
	return res
}

// statusCode is the HTTP status of a failed request, 0 when no answer came.
func statusCode(err error) int {
	var status apierrors.APIStatus
	if errors.As(err, &status) {
		return int(status.Status().Code)
	}
	return 0
}

// countAnswer counts an error answer: expected (normal, as the scheduler says), or a failure.
func countAnswer(res result, expected string) {
	if res.err == nil {
		return
	}
	code := strconv.Itoa(statusCode(res.err))
	if expected != "" {
		apiExpected.WithLabelValues(code, expected).Inc()
		return
	}
	apiErrors.WithLabelValues(code).Inc()
}

// rejectionLog words what the scheduler reports as the plugin's own log lines, through the
// package logger (a plugin logger would feed the listener): why writes fail, at most once a
// minute, with a hint of the cause, and that the pod cannot be read, which comes once (its read
// is given up once). report returns the line's write, nil if there is none to make.
type rejectionLog struct{ last time.Time }

func (r *rejectionLog) report(now time.Time, err error, namespace string) func() {
	var gone errUnreadable
	if errors.As(err, &gone) {
		return func() { clog.Warningf("plugin/%s: %v", pluginName, gone) }
	}
	var unknown errNoFleet
	if errors.As(err, &unknown) {
		return func() { clog.Warningf("plugin/%s: %v", pluginName, unknown) }
	}
	if err == nil || !r.last.IsZero() && now.Sub(r.last) < time.Minute {
		return nil
	}
	r.last = now
	hint := "will retry"
	switch {
	case apierrors.IsForbidden(err):
		hint = "grant create and patch on events in the core API group (\"\") to CoreDNS's " +
			"service account"
	case apierrors.IsNotFound(err):
		hint = fmt.Sprintf("does the namespace %q exist?", namespace)
	case apierrors.IsInvalid(err), apierrors.IsBadRequest(err):
		hint = "the event was refused as invalid"
	}
	return func() { clog.Errorf("plugin/%s: writing event: %v: %s", pluginName, err, hint) }
}
