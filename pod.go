package k8s_event

import (
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"time"

	clog "github.com/coredns/coredns/plugin/pkg/log"
	corev1 "k8s.io/api/core/v1"
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

// podIdentity is the object events are about, and who reports them. When the downward API gave no
// UID, the scheduler reads the pod before the first create, since `kubectl describe pod` lists only
// events that carry it. The read is a list of pods with a field selector on the name, which the
// rights CoreDNS has for its kubernetes plugin allow (list, watch); when list is refused, a get.
// Creates wait for at most two reads answered 429 (see tries).
// Owned by the scheduler's goroutine.
type podIdentity struct {
	ref  corev1.ObjectReference
	node string

	lookup   bool   // the UID is still to find
	verb     verb   // the read to make: verbListPod, then verbGetPod
	reading  uint64 // the read in flight, 0 when none
	nextTry  time.Time
	asked    time.Time // no read before this, even at shutdown: a Retry-After
	failures int
	// tries counts the reads answered 429 or refused; after podReadsTried of them creates no
	// longer wait: they go without the UID (the pod named by namespace and name), and the read is
	// made again, once due, before a create at most once per create written. A read with no answer
	// or a 5xx is waited for: the server is away, and a create would fail as well.
	tries int
	owed  bool // a create went without the UID since the latest read: one read may come first
}

// podReadsTried is the reads of the pod a create waits for at most: a list, then a list or a get.
const podReadsTried = 2

// podFromEnv reads the downward-API variables. Without a pod name and
// namespace, events go to the default namespace, as the plugin always did.
func podFromEnv() podIdentity {
	name, ns := os.Getenv(envPodName), os.Getenv(envNamespace)
	id := podIdentity{node: os.Getenv(envNodeName), verb: verbListPod}
	if name == "" || ns == "" {
		clog.Warningf("plugin/%s: %s or %s not set: events are reported on namespace/default",
			pluginName, envPodName, envNamespace)
		id.ref = corev1.ObjectReference{Kind: "Namespace", APIVersion: "v1",
			Name: metav1.NamespaceDefault}
		return id
	}
	id.ref = corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Name: name, Namespace: ns,
		UID: types.UID(os.Getenv(envPodUID))}
	id.lookup = id.ref.UID == ""
	return id
}

// namespace is where the events live: the pod's namespace, or default.
func (id *podIdentity) namespace() string {
	if id.ref.Namespace != "" {
		return id.ref.Namespace
	}
	return metav1.NamespaceDefault
}

// readDue tells whether a create must wait for the pod's read, and when a read may be made: now,
// later (wait), or not before the one in flight is back. At shutdown creates no longer wait for the
// read, only for a Retry-After it was answered: they go without the UID.
func (id *podIdentity) readDue(now time.Time, stopping bool) (wait time.Duration, mustWait bool) {
	if !id.lookup || stopping {
		return max(id.asked.Sub(now), 0), id.lookup && id.asked.After(now)
	}
	if id.reading != 0 {
		return -1, id.tries < podReadsTried
	}
	w := max(id.nextTry.Sub(now), id.asked.Sub(now), 0)
	if id.tries >= podReadsTried { // a read only before a create written since, and once due
		return w, id.owed && w == 0
	}
	return w, true
}

// wentWithout notes a create that left without the UID while it is still to find.
func (id *podIdentity) wentWithout() {
	if id.lookup {
		id.owed = true
	}
}

// readsLeft is how many reads a create may still wait for: a list refused is made again as a get.
func (id *podIdentity) readsLeft() int {
	switch {
	case !id.lookup:
		return 0
	case id.tries >= podReadsTried && id.owed:
		return 1
	case id.tries >= podReadsTried:
		return 0
	}
	return podReadsTried - id.tries
}

func (id *podIdentity) read(reqID uint64) request {
	id.reading = reqID
	return request{id: reqID, verb: id.verb, namespace: id.ref.Namespace, name: id.ref.Name}
}

// errUnreadable says that the pod's UID cannot be read: events go without it.
type errUnreadable struct{ err error }

func (e errUnreadable) Error() string {
	return fmt.Sprintf("%s not set and the pod's UID cannot be read (%v): `kubectl describe pod` "+
		"will not list the events", envPodUID, e.err)
}

// readDone takes the read's answer. A read refused for good with list is made again with get; one
// refused for good with get is given up, said once, and events go without the UID. Any other
// failure is tried again with a backoff. It returns the error to report.
func (id *podIdentity) readDone(res result, now time.Time, r *rand.Rand) error {
	id.reading = 0
	if res.err == nil {
		id.ref.UID, id.lookup = res.uid, false
		return nil
	}
	if statusCode(res.err) == http.StatusTooManyRequests || res.outcome == writeRefused {
		id.tries++ // the server is there, and writes may pass where reads do not
	}
	id.owed = false
	if res.outcome == writeRefused {
		if id.verb == verbListPod {
			id.verb = verbGetPod
			return nil
		}
		id.lookup = false
		return errUnreadable{res.err}
	}
	id.failures++
	id.nextTry, id.asked = now.Add(backoff(r, id.failures, res.retryAfter)), now.Add(res.retryAfter)
	return res.err
}
