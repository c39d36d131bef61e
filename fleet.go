package k8s_event

import (
	"fmt"
	"math/rand/v2"
	"time"
)

// The fleet option bounds the event writes of every pod of this pod's workload together, per
// reason: each replica takes its share of QPS and BURST from N, the pods the workload wants (a
// Deployment's replicas plus its maxSurge, a DaemonSet's desiredNumberScheduled), plus a floor of
// one write at first and one every fleetFloor. A write takes a token of its reason's bucket of the
// rate option and one of its fleet bucket: fleet only tightens what rate allows.
//
// N is read only when a write is due and the last read is older than fleetStale: the pod's
// controller (a list of the pod, which CoreDNS's rights allow), then its ReplicaSet's, then the
// Deployment or the DaemonSet, with get; later reads get only the last. Reads take a token of the
// read bucket (fleetReads at once, one every fleetStale), so that the fleet reads the API server at
// most N x (fleetReads + T / fleetStale) times over any T with reads that succeed. A read that
// fails (no answer, a 5xx, a 429) gives its token back: the backoff paces those, 1 s doubling to
// a minute, at most 7 + T / 60 per replica while they fail (a 429 also holds the replica). The
// first finding takes three reads in a row, and an outage that took one of them would otherwise
// leave the replica on the floor alone for ten minutes after the API server's return. Reads
// refused for good (no rights, no such object, a workload of another kind) leave the rate bound
// alone in force, said once.
//
// The herd spread: at start and after an outage (no answer, a 5xx), the replica's first write
// waits a random part of a window of N / herdRate, at most herdMaxWindow, so that N replicas that
// saw the same outage do not all write at the API server's return.
//
// Owned by the scheduler's goroutine.
const (
	// fleetFloor spaces the writes that every replica keeps whatever its share: one per reason at
	// first, then one an hour, the API server's default --event-ttl, so that a failure that lasts
	// on one node keeps an event of it on that node's pod.
	fleetFloor = time.Hour
	// fleetStale is the age past which N is read again before a write.
	fleetStale = 10 * time.Minute
	// fleetReads is the reads the first finding of N takes: the pod, its ReplicaSet, the
	// Deployment.
	fleetReads = 3
	// herdRate is the first writes a second of the whole fleet, at start and after an outage.
	herdRate = 20.0
	// herdMaxWindow caps the herd's window: the spread is at most this long.
	herdMaxWindow = 30 * time.Second
)

type fleet struct {
	qps   float64 // for the whole fleet, per reason; 0: the option is not set
	burst int

	n       int       // the pods the workload wants; 0: not read yet
	readAt  time.Time // of n
	static  bool      // a pod of no controller: N is 1 for good
	next    verb      // the read to make: the pod, then its ReplicaSet, then the workload
	name    string    // of the object to read next
	reading uint64    // the read in flight, 0 when none
	nextTry time.Time // no read before this: a backoff
	asked   time.Time // no read before this: a Retry-After
	fails   int
	lost    bool // N cannot be read: the rate bound alone is in force
	gaveUp  bool // the last reads gave N up, and none has counted it since: shown by the metric

	buckets [numBuckets]*bucket // each replica's share, per reason
	reads   *bucket

	herdArmed bool      // the next write waits its part of the window
	herdAt    time.Time // when it may go, once drawn
}

func newFleet(qps float64, burst int, podName string, now time.Time) *fleet {
	reads := newBucket(1/fleetStale.Seconds(), fleetReads, now)
	f := &fleet{next: verbListPod, name: podName, herdArmed: true, reads: reads}
	f.apply(qps, burst, now)
	return f
}

// apply takes the option's values anew, as a reload does; qps 0 turns it off.
func (f *fleet) apply(qps float64, burst int, now time.Time) {
	f.qps, f.burst, f.lost = qps, burst, false // a reload tries the reads again
	f.reshare(false, now)
}

// reshare sets every bucket to the share of the N known; first: N was just read for the first
// time, and the buckets nothing took from start whole.
func (f *fleet) reshare(first bool, now time.Time) {
	qps, burst := f.share()
	for b, bk := range f.buckets {
		if bk == nil || first && bk.untouched(now) {
			f.buckets[b] = newShareBucket(qps, burst, now)
			continue
		}
		bk.setRate(qps, burst, now)
	}
	f.show()
}

// share is one replica's rate and burst: its part of QPS and BURST and the floor. Until N is read
// (a flush that does not wait for the read), the floor alone.
func (f *fleet) share() (qps, burst float64) {
	qps, burst = 1/fleetFloor.Seconds(), 1
	if f.n > 0 {
		qps += f.qps / float64(f.n)
		burst += float64(f.burst) / float64(f.n)
	}
	return qps, burst
}

// on tells that writes take fleet tokens.
func (f *fleet) on() bool { return f.qps > 0 && !f.lost }

// readDue tells whether a write must wait for N (mustWait; wait how long, -1 for the read in
// flight), and whether a read is to be made now. A write with an older N does not wait for the
// read; at shutdown nothing is read, and a write with no N takes the floor alone.
func (f *fleet) readDue(now time.Time, stopping bool) (wait time.Duration, read, mustWait bool) {
	if !f.on() || stopping || f.static || f.n > 0 && now.Sub(f.readAt) < fleetStale {
		return 0, false, false
	}
	if f.reading != 0 { // a write waits for the read in flight: N is at most fleetStale old
		return -1, false, true
	}
	w := max(f.nextTry.Sub(now), f.asked.Sub(now), f.reads.wait(now), 0)
	if w > 0 { // after a failed read or without read tokens, the floor alone meanwhile
		return w, false, f.n == 0 && f.fails == 0 && f.reads.wait(now) == 0
	}
	return 0, true, false
}

// readFor is readDue for a write of bucket b: a stale N is read again only for a write its share
// lets go, so that a replica on its floor reads N once per write, not every fleetStale.
func (f *fleet) readFor(b level, now time.Time, stopping bool) (time.Duration, bool, bool) {
	wait, read, mustWait := f.readDue(now, stopping)
	return wait, read && (f.n == 0 || f.wait(b, now) == 0), mustWait
}

func (f *fleet) read(reqID uint64, namespace string, now time.Time) request {
	f.reading = reqID
	f.reads.take(reqID, now)
	return request{id: reqID, verb: f.next, namespace: namespace, name: f.name}
}

// errNoFleet says that N cannot be read: the rate bound alone is in force.
type errNoFleet struct{ err error }

func (e errNoFleet) Error() string {
	return fmt.Sprintf("fleet: the pods of this pod's workload cannot be counted (%v): "+
		"only rate bounds the writes", e.err)
}

// readDone takes a read's answer, and returns the error to report.
func (f *fleet) readDone(v verb, res result, now time.Time, r *rand.Rand) error {
	f.reading = 0
	f.settleRead(res, now)
	if res.err != nil {
		if res.outcome == writeRefused {
			return f.give(res.err)
		}
		f.fails++
		f.nextTry, f.asked = now.Add(backoff(r, f.fails, res.retryAfter)), now.Add(res.retryAfter)
		return res.err
	}
	f.fails = 0
	kind := res.owner.Kind
	switch {
	case v == verbGetDaemonSet && res.want == 0: // its controller has not counted it yet
		f.fails++
		f.nextTry = now.Add(backoff(r, f.fails, 0))
		return nil
	case v == verbGetDeployment, v == verbGetDaemonSet, v == verbGetReplicaSet && kind == "":
		f.counted(max(res.want, 1), now)
	case v == verbListPod && kind == "":
		f.static = true
		f.counted(1, now)
	case v == verbListPod && kind == "ReplicaSet":
		f.next, f.name = verbGetReplicaSet, res.owner.Name
	case v == verbListPod && kind == "DaemonSet":
		f.next, f.name = verbGetDaemonSet, res.owner.Name
	case v == verbGetReplicaSet && kind == "Deployment":
		f.next, f.name = verbGetDeployment, res.owner.Name
	default:
		return f.give(fmt.Errorf("%s %s is controlled by a %s", v.String(), f.name, kind))
	}
	return nil
}

// settleRead ends a read's token: spent if the read found what it asked, given back (as if never
// made) if it failed, when the backoff alone paces the reads, and a 429 the pushback.
func (f *fleet) settleRead(res result, now time.Time) {
	f.reads.settle(res.id, res.reached && res.err == nil, now)
}

// give gives N up: the rate bound alone, said once.
func (f *fleet) give(err error) error {
	f.lost, f.gaveUp = true, true
	f.show()
	return errNoFleet{err}
}

// counted takes N, read at now.
func (f *fleet) counted(n int, now time.Time) {
	first := f.n == 0
	f.n, f.readAt, f.gaveUp = n, now, false
	f.reshare(first, now)
}

// wait is how long a write of bucket b waits for a token; 0 when it has one.
func (f *fleet) wait(b level, now time.Time) time.Duration {
	if !f.on() {
		return 0
	}
	return f.buckets[b].wait(now)
}

// take takes a token of bucket b for request id, which wait said there is.
func (f *fleet) take(b level, id uint64, now time.Time) {
	if f.on() {
		f.buckets[b].take(id, now)
	}
}

// settle ends request id of bucket b, as the bucket's settle does.
func (f *fleet) settle(b level, id uint64, reached bool, now time.Time) {
	f.buckets[b].settle(id, reached, now)
}

// window is the herd's window: N / herdRate, at most herdMaxWindow; the most while N is not
// known, and none without the option.
func (f *fleet) window() time.Duration {
	switch {
	case !f.on():
		return 0
	case f.n == 0:
		return herdMaxWindow
	}
	return min(time.Duration(float64(f.n)/herdRate*float64(time.Second)), herdMaxWindow)
}

// readsLeft is the reads of N a write may still wait for: none once N is read (a later read
// does not hold a write that has an N), else the reads from the next one to the workload's.
func (f *fleet) readsLeft() int {
	switch {
	case !f.on() || f.static || f.n > 0:
		return 0
	case f.next == verbListPod:
		return fleetReads
	case f.next == verbGetReplicaSet:
		return 2
	}
	return 1
}

// herdWait is how long the next write waits for its part of the window; 0 when it may go.
func (f *fleet) herdWait(now time.Time, r *rand.Rand) time.Duration {
	if !f.herdArmed {
		return 0
	}
	if !f.on() { // without fleet (or N given up) there is no spread
		f.herdArmed, f.herdAt = false, time.Time{}
		return 0
	}
	if f.herdAt.IsZero() {
		w := f.window()
		if w <= 0 {
			f.herdArmed = false
			return 0
		}
		f.herdAt = now.Add(time.Duration(r.Int64N(int64(w))))
	}
	return max(f.herdAt.Sub(now), 0)
}

// wrote notes a write that left: the spread is over until the next outage.
func (f *fleet) wrote() { f.herdArmed, f.herdAt = false, time.Time{} }

// outage notes an answer that says the API server is away: the next request, a read or a write,
// waits a new part of the window.
func (f *fleet) outage() { f.herdArmed, f.herdAt = true, time.Time{} }

// show sets the fleet's metrics.
func (f *fleet) show() {
	n, lost := 0.0, 0.0
	if f.on() {
		n = float64(f.n)
	}
	if f.qps > 0 && f.gaveUp {
		lost = 1
	}
	fleetReplicas.Set(n)
	fleetUncounted.Set(lost)
}
