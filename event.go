package k8s_event

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	clog "github.com/coredns/coredns/plugin/pkg/log"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Downward-API environment variables that name the CoreDNS pod.
const (
	envPodName   = "COREDNS_POD_NAME"
	envNamespace = "COREDNS_NAMESPACE"
	envPodUID    = "COREDNS_POD_UID"
	envNodeName  = "COREDNS_NODE_NAME"
)

const (
	component = "CoreDNS"
	action    = "Logged"

	// maxMessageBytes is the events.k8s.io limit on a note; core/v1 has
	// none, but etcd and kubectl output are better off with it.
	maxMessageBytes = 1024
	truncMarker     = "... (truncated)"
	maxInstanceLen  = 128
	maxNameLen      = 253

	writeTimeout = 10 * time.Second
	fatalTimeout = 3 * time.Second
)

// podRef is the object events are about, and who reports them.
type podRef struct {
	ref  corev1.ObjectReference
	node string
}

// podFromEnv reads the downward-API variables. Without a pod name and
// namespace, events go to the default namespace, as the plugin always did.
func podFromEnv() podRef {
	name, ns := os.Getenv(envPodName), os.Getenv(envNamespace)
	node := os.Getenv(envNodeName)
	if name == "" || ns == "" {
		clog.Warningf("plugin/%s: %s or %s not set: events are reported on namespace/default", pluginName, envPodName, envNamespace)
		return podRef{ref: corev1.ObjectReference{Kind: "Namespace", APIVersion: "v1", Name: metav1.NamespaceDefault}, node: node}
	}
	return podRef{
		ref:  corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Name: name, Namespace: ns, UID: types.UID(os.Getenv(envPodUID))},
		node: node,
	}
}

// eventNamespace is where the events live: the pod's namespace, or default.
func (r podRef) eventNamespace() string {
	if r.ref.Namespace == "" {
		return metav1.NamespaceDefault
	}
	return r.ref.Namespace
}

// eventMessage makes a log line fit for an event: valid UTF-8 without NUL
// bytes, no trailing newline, at most maxMessageBytes, cut on a rune boundary
// with a visible marker.
func eventMessage(s string) string {
	s = strings.TrimRight(s, "\r\n")
	if !utf8.ValidString(s) {
		s = strings.ToValidUTF8(s, "\uFFFD")
	}
	if strings.IndexByte(s, 0) >= 0 {
		s = strings.ReplaceAll(s, "\x00", "\uFFFD")
	}
	if len(s) <= maxMessageBytes {
		return s
	}
	cut := maxMessageBytes - len(truncMarker)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + truncMarker
}

// eventNames hands out names in client-go's form, <object>.<hex time>, made
// strictly increasing so that two events never share one.
type eventNames struct {
	mu   sync.Mutex
	last int64
}

func (n *eventNames) next(object string, now time.Time) string {
	n.mu.Lock()
	t := max(now.UnixNano(), n.last+1)
	n.last = t
	n.mu.Unlock()
	suffix := fmt.Sprintf(".%x", t)
	if len(object)+len(suffix) > maxNameLen {
		object = strings.TrimRight(object[:maxNameLen-len(suffix)], ".-")
	}
	return object + suffix
}

// reference returns the involved object, looking the pod's UID up once when
// the downward API did not give it: without a UID `kubectl describe pod`
// does not list the events. A failed lookup is not an error.
func (p *pipeline) reference(ctx context.Context) corev1.ObjectReference {
	p.uidOnce.Do(func() {
		r := &p.pod.ref
		if r.Kind != "Pod" || r.UID != "" {
			return
		}
		ctx, cancel := context.WithTimeout(ctx, writeTimeout)
		defer cancel()
		pod, err := (*p.client.Load()).CoreV1().Pods(r.Namespace).Get(ctx, r.Name, metav1.GetOptions{})
		if err != nil {
			clog.Warningf("plugin/%s: %s not set and the pod's UID could not be read (%v): `kubectl describe pod` will not list the events", pluginName, envPodUID, err)
			return
		}
		r.UID = pod.UID
	})
	return p.pod.ref
}

func (p *pipeline) newEvent(ref corev1.ObjectReference, name string, l level, e entry) *corev1.Event {
	instance := ref.Name
	if len(instance) > maxInstanceLen {
		instance = instance[:maxInstanceLen]
	}
	return &corev1.Event{
		ObjectMeta:          metav1.ObjectMeta{Name: name, Namespace: p.pod.eventNamespace()},
		InvolvedObject:      ref,
		Reason:              l.reason(),
		Message:             e.message,
		Type:                l.eventType(),
		Source:              corev1.EventSource{Component: component, Host: p.pod.node},
		FirstTimestamp:      metav1.NewTime(e.first),
		LastTimestamp:       metav1.NewTime(e.last),
		Count:               clampCount(e.count),
		Action:              action,
		ReportingController: component,
		ReportingInstance:   instance,
	}
}

func clampCount(n int64) int32 { return int32(min(n, math.MaxInt32)) }

// errGone says the event to patch no longer exists; errExists says that a
// create whose outcome was unknown had in fact been applied.
var (
	errGone   = errors.New("event gone")
	errExists = errors.New("event exists")
)

// write creates the event, or patches its count, last time and message.
func (p *pipeline) write(key eventKey, e entry) (name, verb string, err error) {
	ctx, cancel := context.WithTimeout(p.ctx, writeTimeout)
	defer cancel()
	client := *p.client.Load()
	events := client.CoreV1().Events(p.pod.eventNamespace())
	if key.combined() {
		e.message = eventMessage(combinedPrefix + e.message)
	}
	if e.name != "" {
		patch, _ := json.Marshal(map[string]any{
			"count":         clampCount(e.count),
			"lastTimestamp": metav1.NewTime(e.last),
			"message":       e.message,
		})
		_, err = events.Patch(ctx, e.name, types.StrategicMergePatchType, patch, metav1.PatchOptions{})
		if apierrors.IsNotFound(err) {
			err = errGone
		}
		return e.name, "patch", err
	}
	name = e.tried
	if name == "" {
		name = p.names.next(p.pod.ref.Name, p.clock.Now())
	}
	_, err = events.Create(ctx, p.newEvent(p.reference(ctx), name, key.level, e), metav1.CreateOptions{})
	if e.tried != "" && apierrors.IsAlreadyExists(err) {
		err = errExists
	}
	return name, "create", err
}

// writeFatal posts a fatal line at once: CoreDNS exits right after the
// listeners return, so nothing queued would ever be written.
func (p *pipeline) writeFatal(ln line) {
	now := p.clock.Now()
	if !p.buckets[levelFatal].AllowN(now, 1) {
		throttled[levelFatal].Inc()
		droppedVec.WithLabelValues(dropShutdown).Inc()
		return
	}
	ctx, cancel := context.WithTimeout(p.ctx, fatalTimeout)
	defer cancel()
	e := entry{message: eventMessage(ln.text), count: 1, first: ln.at, last: ln.at}
	client := *p.client.Load()
	ev := p.newEvent(p.reference(ctx), p.names.next(p.pod.ref.Name, now), levelFatal, e)
	if _, err := client.CoreV1().Events(ev.Namespace).Create(ctx, ev, metav1.CreateOptions{}); err != nil {
		classify(err)
		droppedVec.WithLabelValues(dropRejected).Inc()
		return
	}
	eventWrites.WithLabelValues(levelFatal.reason(), "create").Inc()
}

type writeOutcome int

const (
	writeOK       writeOutcome = iota
	writeGone                  // patch target missing: create anew
	writeExists                // an earlier create was applied: patch it
	writeRejected              // the API refused for good: 4xx other than 408/409/429
	writeRetry                 // the API may take it later: 5xx, 408, 409, 429
	writeUnsent                // no answer from the API: transport error or time-out
)

// classify sorts a write error and counts it by status code.
func classify(err error) writeOutcome {
	if err == nil {
		return writeOK
	}
	if errors.Is(err, errGone) {
		apiErrors.WithLabelValues("404").Inc()
		return writeGone
	}
	if errors.Is(err, errExists) {
		apiErrors.WithLabelValues("409").Inc()
		return writeExists
	}
	var status apierrors.APIStatus
	if !errors.As(err, &status) || status.Status().Code == 0 {
		apiErrors.WithLabelValues("0").Inc()
		var netErr net.Error
		if errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &netErr) && netErr.Timeout()) {
			return writeRetry // the API may have seen it
		}
		return writeUnsent
	}
	code := int(status.Status().Code)
	apiErrors.WithLabelValues(fmt.Sprint(code)).Inc()
	switch {
	case code == http.StatusRequestTimeout, code == http.StatusConflict, code == http.StatusTooManyRequests, code >= 500:
		return writeRetry
	default:
		return writeRejected
	}
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
