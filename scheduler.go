package k8s_event

import (
	"cmp"
	"container/heap"
	"container/list"
	"errors"
	"maps"
	"math"
	"math/rand/v2"
	"net/http"
	"slices"
	"time"
)

// The scheduler owns all the state that decides what to write next: entries, buckets, requests in
// flight, settling entries, ends, backoffs, Retry-Afters and the pod read. One goroutine
// (pipeline.go) hands it one message at a time, then asks what can be sent (dispatch); the stepped
// fault model drives these same methods on a fake clock. Shutdown is a mode (stop): no backoff
// waited out, creates not waiting for the UID, nothing sent after the deadline, and what is left
// dropped at the end.

const (
	// maxInFlight bounds the requests out at once for one bucket, beyond which only a plugin with
	// none out sends one: with numBuckets buckets, at most 48 requests and one a plugin in each,
	// each in a goroutine of its own, for at most writeTimeout. Tokens bound the requests that
	// reach the server; this bounds goroutines and memory whatever BURST is, and a slow write of a
	// loud plugin does not hold back a quiet one's.
	maxInFlight = 8
	// flushPause spaces the tries of a failed write in the flush at shutdown.
	flushPause = 200 * time.Millisecond
)

// flight is what the scheduler keeps of a request in flight.
type flight struct {
	j      *job // nil for a fatal line's create
	bucket level
	verb   verb
	name   string // of the event written
	count  int64  // the count written, from e.base
	full   bool   // the count is 2^31-1: the object is full
	retry  bool   // a create under a name tried before
	read   bool   // a read of the pod, made for a create
	fleet  bool   // a read of the workload, made for a write (fleet.go)
}

// job is what waits for a token or a time and is written: the lines of an event (an entry,
// correlator.go) or the end of a storm (a stormEnd, end.go). Each embeds its job, made with it:
// the queues and the timers hold jobs, and a job points back to what embeds it, so that the
// scheduler serves both kinds with no union on either and no interface call.
type job struct {
	key eventKey
	writeState
	slot  slot      // where it waits for a token or a time (queue.go)
	lines *entry    // the entry that embeds it; nil in an end's
	end   *stormEnd // the end that embeds it; nil in an entry's
}

// writeState is what the scheduler keeps of the writes of a job: a create in doubt, the backoff,
// the request in flight.
type writeState struct {
	tried    string    // the name of a create that reached the API and got no answer
	failures int       // consecutive failed writes, for the backoff
	retryAt  time.Time // no attempt before this: a backoff, a pause after a refusal
	asked    time.Time // no attempt before this, even at shutdown: the latest Retry-After
	inflight uint64    // the request in flight for it, 0 when none
	deferred bool      // found its bucket empty since its latest request
}

// objectState is what the scheduler keeps of the object of an event's lines, beside its
// writeState: an end is created once, and has none.
type objectState struct {
	name       string // the Event object's name once created
	triedCount int64  // the lines the create in tried carried, from the event's first
	// doubt is the count of the latest write that reached the API and got
	// no answer; zero once a later answer settled it.
	doubt int64
}

// newEntry is the entry of a new event of key, whose first line is at first.
func newEntry(key eventKey, first time.Time) *entry {
	e := &entry{job: job{key: key}, first: first}
	e.lines = e
	return e
}

type scheduler struct {
	set      config // rate and quiet; levels are the listener's
	corr     *correlator
	settling map[*entry]struct{} // evicted, their latest write unanswered: within cacheSize
	ends     ends
	buckets  [numBuckets]*bucket
	queues   [numBuckets]*tokenQueue // who takes each bucket's next token (queue.go)
	// entries waiting for a time: a backoff, a Retry-After, a quiet
	timers   jobHeap
	now      time.Time // of the message being handled
	flights  map[uint64]flight
	lastID   uint64
	pod      podIdentity
	push     pushback // the API server's 429s: every bucket waits
	fleet    *fleet   // the share of the fleet option, and the herd spread
	names    *eventNames
	rand     *rand.Rand
	doubtful int64 // lines dropped whose latest write may have landed unanswered
	settled  bool  // an evicted entry began to settle: it may be sent now
	// observed is the time of the latest line taken: a storm is not said to
	// end while lines of before its quiet may still be on their way.
	observed time.Time
	backlog  func() int             // lines waiting in the hand-off
	report   func(time.Time, error) // says why a write failed

	flushPause time.Duration
	stopping   bool
	expired    bool // the flush's deadline passed: nothing more is sent
	deadline   time.Time

	// answered429 is, by bucket, the 429s answered to its requests, and held the holds and gaps of
	// all 429s, since it last had no line waiting: the bound shown counts them (showDelays)
	answered429 [numBuckets]int
	held        [numBuckets]time.Duration
}

func newScheduler(set config, pod podIdentity, now time.Time) *scheduler {
	s := &scheduler{
		set:        set,
		settling:   map[*entry]struct{}{},
		timers:     jobHeap{less: byTime},
		now:        now,
		flights:    map[uint64]flight{},
		pod:        pod,
		names:      newEventNames(),
		rand:       rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64())),
		backlog:    func() int { return 0 },
		report:     func(time.Time, error) {},
		flushPause: flushPause,
	}
	podName := ""
	if pod.ref.Kind == "Pod" {
		podName = pod.ref.Name
	}
	s.fleet = newFleet(set.fleetQPS, set.fleetBurst, podName, now)
	s.corr = newCorrelator(set.cacheSize, s.evicted)
	s.corr.cache.others = func() int { return len(s.settling) + len(s.ends.list) }
	s.corr.cache.giveWay = s.giveWay
	s.corr.quiet = set.quiet
	for b := range s.buckets {
		s.buckets[b] = newBucket(set.qps, set.burst, now)
		s.queues[b] = newTokenQueue()
	}
	return s
}

// observe takes a line; true if its event had nothing pending or in flight: a request may go now.
func (s *scheduler) observe(ln line) bool {
	e := s.corr.observe(ln)
	if ln.at.After(s.observed) {
		s.observed = ln.at
	}
	if in := e.slot.in; in != nil && in != &s.timers {
		// Waiting for a token: its place is by when it began to wait, which
		// a line does not change, but its bucket may be empty by now.
		s.deferred(&e.job, e.key.level)
	} else {
		s.place(&e.job)
	}
	settled := s.settled
	s.settled = false
	return settled || e.pending() == 1 && e.inflight == 0
}

// apply takes new settings without losing what is pending.
func (s *scheduler) apply(set config, now time.Time) {
	s.now = now
	for _, b := range s.buckets {
		b.set(set.qps, set.burst, now)
	}
	s.set = set
	s.fleet.apply(set.fleetQPS, set.fleetBurst, now)
	s.corr.cache.resize(set.cacheSize)
	s.corr.quiet = set.quiet
	if set.quiet > 0 { // storms left unwatched while quiet was off are watched again
		for _, e := range s.corr.cache.values() {
			s.place(&e.job)
		}
	}
	oldest := func(a, b *entry) int {
		return cmp.Or(a.first.Compare(b.first), cmp.Compare(a.seq, b.seq))
	}
	for _, e := range slices.SortedFunc(maps.Keys(s.settling), oldest) {
		if s.corr.cache.units() <= set.cacheSize {
			break
		}
		// one in flight may land with every line: retire decides once it is back
		if e.inflight == 0 {
			delete(s.settling, e)
			s.unqueue(&e.job)
			s.drop(e, dropEvicted)
		}
	}
	s.trimEnds()
}

// giveWay frees a unit of CACHESIZE when the cache has no entry left to evict: the oldest settling
// entry not in flight is given up, its lines dropped as evicted; else the oldest end waiting and
// not in flight is forgotten (it carries no lines). False when all of them are in flight.
func (s *scheduler) giveWay() bool {
	var oldest *entry
	for e := range s.settling {
		if e.inflight == 0 && (oldest == nil ||
			cmp.Or(e.first.Compare(oldest.first), cmp.Compare(e.seq, oldest.seq)) < 0) {
			oldest = e
		}
	}
	if oldest != nil {
		delete(s.settling, oldest)
		s.unqueue(&oldest.job)
		s.drop(oldest, dropEvicted)
		return true
	}
	for _, e := range slices.Backward(s.ends.list) {
		if e.inflight == 0 { // the newest: the oldest ends are kept, as trim keeps them
			s.unqueue(&e.job)
			s.ends.remove(e)
			forgotten[e.key.level].Inc()
			return true
		}
	}
	return false
}

// trimEnds forgets the ends waiting beyond the limit and not in flight.
func (s *scheduler) trimEnds() {
	limit := s.endLimit()
	for _, e := range s.ends.list[min(limit, len(s.ends.list)):] {
		if e.inflight == 0 {
			s.unqueue(&e.job)
			forgotten[e.key.level].Inc()
		}
	}
	s.ends.trim(limit)
}

// endLimit is how many ends may wait: none while quiet is off, else those waiting and as many
// more as CACHESIZE has units free; the cached events, the settling ones and the ends share it.
func (s *scheduler) endLimit() int {
	if s.set.quiet <= 0 {
		return 0
	}
	// the units count the ends: a shrink of CACHESIZE below them forgets the newest not in flight
	return max(0, len(s.ends.list)+s.set.cacheSize-s.corr.cache.units())
}

// stop starts the flush: from now on no backoff is waited out, and nothing is sent after timeout.
func (s *scheduler) stop(now time.Time, timeout time.Duration) {
	s.stopping, s.deadline, s.now = true, now.Add(timeout), now
	for _, e := range slices.Clone(s.timers.es) { // those in flight get the flush's pause once back
		e.retryAt = time.Time{}
		s.place(e)
	}
	for _, e := range append(s.corr.cache.values(), slices.Collect(maps.Keys(s.settling))...) {
		if e.slot.recreate && e.slot.in != nil && e.slot.in != &s.timers {
			s.place(&e.job) // a re-create found gone before the flush goes first in it too
		}
	}
}

// expire says the flush's time is up: nothing more is sent.
func (s *scheduler) expire() { s.expired = true }

// finished tells, after a dispatch that returned reqs and wake, that the
// flush is over: nothing in flight, and nothing to send before the deadline.
func (s *scheduler) finished(reqs []request, wake time.Time) bool {
	if !s.stopping || len(s.flights) > 0 || len(reqs) > 0 {
		return false
	}
	return s.expired || wake.IsZero() || wake.After(s.deadline)
}

// dropRemaining drops what the flush left, with cause shutdown.
func (s *scheduler) dropRemaining() {
	for _, e := range s.corr.cache.values() {
		s.drop(e, dropShutdown)
	}
	for e := range s.settling {
		s.drop(e, dropShutdown)
	}
	clear(s.settling)
	s.ends.list = nil // they carry no lines: nothing to account for
}

// dispatch decides what can be sent now, takes a token for each request and returns them, with the
// time it must be asked again (zero: only when a message comes).
func (s *scheduler) dispatch(now time.Time) (reqs []request, wake time.Time) {
	if s.expired {
		return nil, time.Time{}
	}
	s.now = now
	soon := func(at time.Time) {
		if s.stopping && at.After(s.deadline) {
			return
		}
		if wake.IsZero() || at.Before(wake) {
			wake = at
		}
	}
	for s.timers.Len() > 0 && !s.timers.es[0].slot.at.After(now) {
		s.place(s.timers.es[0])
	}
	for b := levelFatal; b > levelDebug; b-- { // the most severe first, then the ends
		reqs = s.serve(b-1, now, reqs, soon)
	}
	reqs = s.serve(endBucket, now, reqs, soon)
	s.showDelays()
	if s.timers.Len() > 0 {
		soon(s.timers.es[0].slot.at)
	}
	return reqs, wake
}

// serve hands the tokens of bucket b to the entries waiting, in turn.
func (s *scheduler) serve(b level, now time.Time, reqs []request, soon func(time.Time)) []request {
	q, bk := s.queues[b], s.buckets[b]
	for {
		e := q.head(bk.inFlight() >= maxInFlight)
		if e == nil {
			break // else a result comes, and asks again
		}
		if w := s.push.wait(now); w > 0 { // the API server asked the replica to wait
			soon(now.Add(w))
			break
		}
		read, fleetRead, stop := s.readsFirst(e, b, now, soon)
		if stop {
			break
		}
		write := !read && !fleetRead
		if !s.stopping { // the herd spread: reads of the pod and the workload too
			if w := s.fleet.herdWait(now, s.rand); w > 0 {
				soon(now.Add(w))
				break
			}
		}
		if write {
			if w := s.fleet.wait(b, now); w > 0 { // the share of the fleet is spent
				s.deferred(e, b)
				soon(now.Add(w))
				break
			}
		}
		if s.holding(b, e, now) {
			break
		}
		id := s.nextID()
		if fleetRead && s.fleet.n > 0 { // a read of a stale N: the read bucket's token alone
			s.push.sent(now, s.rand)
			s.flights[id] = flight{bucket: b, verb: s.fleet.next, fleet: true}
			reqs = append(reqs, s.fleet.read(id, s.pod.namespace(), now))
			continue
		}
		if !bk.take(id, now) {
			s.deferred(e, b)
			soon(now.Add(bk.wait(now)))
			break
		}
		s.push.sent(now, s.rand)
		if read { // e stays first in the queue until the read is back
			s.flights[id] = flight{bucket: b, verb: s.pod.verb, read: true}
			reqs = append(reqs, s.pod.read(id))
			continue
		}
		if fleetRead { // so does it for a read of the workload
			s.flights[id] = flight{bucket: b, verb: s.fleet.next, fleet: true}
			reqs = append(reqs, s.fleet.read(id, s.pod.namespace(), now))
			continue
		}
		s.fleet.take(b, id, now)
		s.fleet.wrote()
		if e.lines == nil || e.lines.name == "" {
			s.pod.wentWithout()
		}
		q.served(e, id)
		q.flying[e.key.plugin]++
		reqs = append(reqs, s.prepare(e, id, b, now))
	}
	return reqs
}

// readsFirst tells whether e's turn goes to a read of the pod (a create waits for, or makes,
// it) or of the workload's N, or whether the bucket waits (stop) for one of them.
func (s *scheduler) readsFirst(e *job, b level, now time.Time, soon func(time.Time)) (
	read, fleetRead, stop bool) {
	if e.lines == nil || e.lines.name == "" {
		w, must := s.pod.readDue(now, s.stopping)
		if must && w != 0 { // the bucket waits: until the read is written no event is
			if w > 0 {
				soon(now.Add(w))
			}
			return false, false, true
		}
		if must {
			return true, false, false
		}
	}
	w, due, must := s.fleet.readFor(b, now, s.stopping)
	if w > 0 { // the write waits for N, or a read of N comes then
		soon(now.Add(w))
	}
	if must {
		return false, false, true
	}
	// a stale N is read again only when the write has its token, which the read does not take
	// (the read bucket bounds those reads): the write goes with it, not a refill later
	stale := s.fleet.n > 0
	return false, s.fleetReadable(due && (!stale || s.buckets[b].wait(now) == 0), now), false
}

// fleetReadable tells that a read of the workload is due and can be made: without the pod's
// name there is no workload to read, said once.
func (s *scheduler) fleetReadable(due bool, now time.Time) bool {
	if due && s.fleet.name == "" {
		s.report(now, s.fleet.give(errors.New(envPodName+" or "+envNamespace+" is not set")))
		return false
	}
	return due
}

// holding tells that, in the flush, bucket b's last token waits for a patch in flight (for at most
// its time-out): should the event be gone, its re-create takes it, not e, which came after.
func (s *scheduler) holding(b level, e *job, now time.Time) bool {
	if !s.stopping || e.slot.recreate || !s.buckets[b].last(now) {
		return false
	}
	for _, f := range s.flights {
		if f.bucket == b && f.verb == verbPatch {
			return true
		}
	}
	return false
}

// showDelays shows, by reason, the oldest event never written, and the bound
// of a line waiting: a refill for each plugin waiting or served before the waiting plugin served
// last (it may log meanwhile), one more for each plugin waiting whose turn goes or went to a line
// newer than its oldest (it keeps its place, see keep: a re-create too) and one for a new event
// of its own plugin after it (new events go first within a plugin), the write, and a refill and
// a write's time for each read of the pod, and of N with fleet, left (once N is read, a stale
// N's read's time); and, since the reason last had no line waiting, a refill for each 429
// answered to its requests, and every 429's hold and gaps.
func (s *scheduler) showDelays() {
	for l := levelDebug; l < levelFatal; l++ {
		since := s.showPlugins(l)
		qps := s.set.qps
		if s.fleet.on() { // the share refills slower, and the herd's window comes first
			qps = min(qps, s.fleet.buckets[l].qps)
		}
		// each read left takes a token and its time: of the pod, a list then a get; of N, up to
		// three
		reads := float64(s.pod.readsLeft() + s.fleet.readsLeft())
		if since == 0 { // no line waits: the 429s of before hold none
			s.answered429[l], s.held[l] = 0, 0
		}
		q := s.queues[l]
		once, twice := q.ahead()
		turns := float64(max(once, 1)+twice+1) + reads
		turns += float64(s.answered429[l]) // each a token spent, a refill more
		refills := min(turns/qps, 365*24*3600)
		bound := time.Duration(refills*1e9) + writeTimeout*time.Duration(1+reads)
		bound += s.fleet.window() + s.held[l]
		if s.fleet.on() && s.fleet.n > 0 { // a write waits for the read of a stale N
			bound += writeTimeout
		}
		delays[l].since.Store(since)
		delays[l].bound.Store(int64(bound))
	}
}

// tooMany books a 429 answered to a request of bucket b for the bounds shown: its token spent,
// the bucket's line waits a refill more; every bucket waits its hold, at most 1.2 times the
// Retry-After (at least pushbackMin), and two gaps of at most 1.2 s.
func (s *scheduler) tooMany(b level, retryAfter time.Duration) {
	if b < levelFatal { // a fatal line's create waits for nothing, and an end shows no bound
		s.answered429[b]++
	}
	hold := max(retryAfter, pushbackMin)
	hold += hold/5 + 2*(pushbackGap+pushbackGap/5)
	for l := levelDebug; l < levelFatal; l++ {
		s.held[l] += hold
	}
}

// showPlugins shows, by plugin, the oldest event of reason l never written, for the plugins
// whose oldest changed, and returns the oldest of all: the unix nanoseconds of the wall time now
// less the time that passed since its first line (a step of the wall clock is no wait); 0 when
// none waits.
func (s *scheduler) showPlugins(l level) int64 {
	q := s.queues[l]
	for _, p := range q.changed {
		if p.age == nil {
			p.age = pluginAge(l, p.name)
		}
		p.age.Store(s.since(p.unwritten.Front()))
		p.changed = false
	}
	clear(q.changed)
	q.changed = q.changed[:0]
	return s.since(q.unwritten.Front())
}

// since is when the event of f, an element of a list of entries never written, began to wait on
// the wall clock now; 0 for nil.
func (s *scheduler) since(f *list.Element) int64 {
	if f == nil {
		return 0
	}
	return s.now.UnixNano() - int64(s.now.Sub(f.Value.(*entry).first))
}

// place puts e where it waits now: in its bucket's queue, in the timers,
// or nowhere when it has nothing to do. A storm whose quiet is up ends.
func (s *scheduler) place(e *job) {
	s.unqueue(e)
	if e.inflight != 0 {
		return
	}
	if l := e.lines; l != nil && (l.pending() == 0 || l.dropped > 0) {
		s.watch(l)
		return
	}
	at := slices.MaxFunc([]time.Time{e.retryAt, e.asked}, time.Time.Compare)
	switch {
	case s.stopping && at.After(s.deadline): // never sent: dropped when the flush ends
	case at.After(s.now):
		s.wait(e, at)
	default:
		if e.slot.stamp == 0 {
			e.slot.stamp = s.nextID() // increasing, as stamps must be
			if l := e.lines; l != nil && l.carried == 0 {
				s.queues[e.key.level].neverWritten(l)
			}
		}
		s.queue(e)
	}
}

// queue puts e, due now, in its bucket's queue: in the flush, a re-create goes first, before
// the events seen after it; an entry settling first within its plugin.
func (s *scheduler) queue(e *job) {
	q := s.queues[bucketOf(e)]
	if s.stopping && e.slot.recreate {
		q.pushFirst(e)
	} else {
		settling := false
		if e.lines != nil {
			_, settling = s.settling[e.lines]
		}
		q.push(e, settling)
	}
	s.deferred(e, bucketOf(e))
}

// watch waits for the quiet of e's storm, and ends it once it is up.
func (s *scheduler) watch(e *entry) {
	at, ok := quietAt(e, s.set.quiet)
	switch {
	case !ok:
	case at.After(s.now):
		s.wait(&e.job, at)
	case s.backlog() > 0 && s.observed.Before(at.Add(-handOffGrace)):
		s.wait(&e.job, s.now.Add(handOffWait)) // a line of before the quiet may be on its way
	default:
		n := len(s.ends.list)
		end := endOf(e, s.now)
		if s.set.quiet > 0 {
			s.corr.cache.place(e, false) // written now: no storm waiting, evicted before them
			s.corr.cache.makeRoom()      // by eviction, as for a new event
		}
		s.ends.add(end, s.endLimit())
		if len(s.ends.list) > n {
			s.place(&s.ends.list[n].job)
		}
	}
}

func (s *scheduler) wait(e *job, at time.Time) {
	e.slot.at = at
	heap.Push(&s.timers, e)
}

// unqueue takes e out of the heap it waits in, if any.
func (s *scheduler) unqueue(e *job) {
	switch {
	case e.slot.in == nil:
	case e.slot.in == &s.timers:
		heap.Remove(&s.timers, e.slot.index)
	default:
		s.queues[bucketOf(e)].remove(e)
	}
}

func bucketOf(e *job) level {
	if e.lines == nil {
		return endBucket
	}
	return e.key.level
}

func (s *scheduler) nextID() uint64 {
	s.lastID++
	return s.lastID
}

// deferred counts a job whose bucket b is empty now, once until its next request.
func (s *scheduler) deferred(e *job, b level) {
	if e.deferred || s.buckets[b].wait(s.now) == 0 {
		return
	}
	e.deferred = true
	if b == endBucket {
		throttledEnd[e.key.level].Inc()
	} else {
		throttled[b].Inc()
	}
}

// prepare makes the request that writes e, with the token id of bucket b.
func (s *scheduler) prepare(e *job, id uint64, b level, now time.Time) request {
	f := flight{j: e, bucket: b}
	var spec writeSpec
	if end := e.end; end != nil {
		spec = writeSpec{key: e.key, message: end.message, count: 1, first: end.at,
			last: end.at, end: true}
	} else {
		l := e.lines
		// An event's count is an int32: lines past it go to a new object.
		f.count = l.seen - l.base
		if f.full = f.count >= math.MaxInt32; f.full {
			f.count = math.MaxInt32
		}
		spec = writeSpec{key: e.key, message: l.note(), count: f.count, first: l.first,
			last: l.stamped, name: l.name}
	}
	e.inflight, e.deferred = id, false
	ns := s.pod.namespace()
	if spec.name != "" {
		f.verb, f.name = verbPatch, spec.name
		s.flights[id] = f
		return request{id: id, verb: verbPatch, namespace: ns, name: spec.name,
			patch: countPatch(spec)}
	}
	f.verb, f.name, f.retry = verbCreate, e.tried, e.tried != ""
	if f.name == "" {
		f.name = s.names.next(s.pod.ref.Name, now)
	}
	s.flights[id] = f
	return request{id: id, verb: verbCreate, namespace: ns, event: newEvent(s.pod.ref, s.pod.node,
		ns, f.name, spec)}
}

// fatal takes a token for a fatal line and makes its create; false when the bucket has none. It
// waits for nothing: not for the pod's UID, not for any other request.
func (s *scheduler) fatal(ln line, now time.Time) (request, bool) {
	id := s.nextID()
	bk := s.buckets[levelFatal]
	held := s.push.wait(now) > 0 || s.fleet.wait(levelFatal, now) > 0
	if held || bk.inFlight() >= maxInFlight || !bk.take(id, now) {
		throttled[levelFatal].Inc()
		return request{}, false
	}
	s.fleet.take(levelFatal, id, now)
	s.push.sent(now, s.rand)
	msg := eventMessage(ln.text)
	spec := writeSpec{key: eventKey{level: levelFatal, plugin: ln.plugin, message: msg},
		message: msg, count: 1, first: ln.at, last: ln.at}
	ns, name := s.pod.namespace(), s.names.next(s.pod.ref.Name, now)
	s.flights[id] = flight{bucket: levelFatal, verb: verbCreate, name: name}
	return request{id: id, verb: verbCreate, namespace: ns, event: newEvent(s.pod.ref, s.pod.node,
		ns, name, spec)}, true
}

func (s *scheduler) outcome(res result, now time.Time) {
	f, ok := s.flights[res.id]
	if !ok {
		return
	}
	delete(s.flights, res.id)
	s.now = now
	s.buckets[f.bucket].settle(res.id, res.reached, now)
	s.fleet.settle(f.bucket, res.id, res.reached, now)
	switch code := statusCode(res.err); {
	case code == http.StatusTooManyRequests:
		heldTotal.Add(s.push.tooMany(now, res.retryAfter, s.rand).Seconds())
		s.tooMany(f.bucket, res.retryAfter)
	case res.err != nil && (code == 0 || code >= 500): // the API server is away
		s.fleet.outage()
	case res.err == nil || code != 0: // answered, within the server's budget
		s.push.succeeded()
	}
	if q := s.queues[f.bucket]; f.j != nil { // its plugin has one fewer out
		f.j.inflight = 0
		if q.flying[f.j.key.plugin]--; q.flying[f.j.key.plugin] <= 0 {
			delete(q.flying, f.j.key.plugin)
		}
	}
	switch {
	case f.read:
		countAnswer(res, "")
		s.report(now, s.pod.readDone(res, now, s.rand))
	case f.fleet:
		countAnswer(res, "")
		s.report(now, s.fleet.readDone(f.verb, res, now, s.rand))
	case f.j == nil: // a fatal line's: its caller keeps its account
		if res.unsure {
			s.doubtful++
		}
		countAnswer(res, "")
		if res.err == nil {
			eventWrites.WithLabelValues(levelFatal.reason(), "create").Inc()
		}
	case f.j.end != nil:
		s.endDone(f.j.end, f, res, now)
	default:
		s.linesDone(f.j.lines, f, res, now)
		s.corr.cache.place(f.j.lines, false)
		s.retire(f.j.lines)
	}
}

// linesDone books the result of a write of an event's lines.
func (s *scheduler) linesDone(e *entry, f flight, res result, now time.Time) {
	expected := ""
	switch res.outcome {
	case writeOK:
		e.carry(e.base + f.count)
		e.name, e.tried, e.doubt, e.failures, e.retryAt, e.asked = f.name, "", 0, 0, time.Time{},
			time.Time{}
		e.stormWritten, e.slot.stamp = true, 0
		if f.full {
			e.base += f.count
			e.name = ""
		}
		eventWrites.WithLabelValues(e.key.level.reason(), f.verb.String()).Inc()
	case writeGone: // the event expired or was deleted: create it anew, in the patch's turn
		e.name, e.doubt, expected = "", 0, "gone"
		e.slot.recreate = true
		s.queues[e.key.level].resume(e)
	case writeExists:
		if f.retry { // a create that got no answer had been applied: patch it
			// the least it holds: an unanswered retry may have been the one applied
			e.carry(e.triedCount)
			e.name, e.tried, expected = f.name, "", "exists"
			e.stormWritten = true
		} else { // another writer's event has this name: take a new one
			e.tried, expected = "", "name_taken"
		}
	case writeRefused:
		e.retryAt = now.Add(rejectPause)
		if s.stopping {
			e.retryAt = s.deadline.Add(time.Nanosecond) // the flush does not try it again
		}
		s.report(now, res.err)
	default:
		if res.unsure {
			e.doubt = e.base + f.count
			if f.verb == verbCreate && !f.retry {
				// it may have been applied: retry under the same name
				e.tried, e.triedCount = f.name, e.doubt
			}
		}
		s.failed(&e.job, res, now)
	}
	if e.carried > 0 {
		s.forget(e)
	}
	countAnswer(res, expected)
}

// endDone books the result of a write of an end.
func (s *scheduler) endDone(e *stormEnd, f flight, res result, now time.Time) {
	expected, waits := "", false
	switch {
	case res.outcome == writeExists && !f.retry: // the name is another's: take a new one
		e.tried, expected, waits = "", "name_taken", true
	case res.outcome == writeOK, res.outcome == writeExists:
		if res.outcome == writeExists {
			expected = "exists" // written by an earlier try
		}
		s.ends.remove(e)
		e.tried = ""
		eventWrites.WithLabelValues(endReason(e.key.level), "create").Inc()
		ended[e.key.level].Inc()
	case res.outcome == writeRefused: // said once in the log; the end is given up
		s.ends.remove(e)
		s.report(now, res.err)
	default:
		if res.unsure {
			e.tried = f.name // it may have been applied: retry under the same name
		}
		s.failed(&e.job, res, now)
		waits = true
	}
	countAnswer(res, expected)
	if waits {
		s.place(&e.job)
	}
	// A reload during the request may have turned quiet off or shrunk the cache: trim again.
	s.trimEnds()
}

// failed books a write a retry may pass: after a backoff or the flush's pause, and any Retry-After.
func (s *scheduler) failed(e *job, res result, now time.Time) {
	e.asked = now.Add(res.retryAfter)
	e.failures++
	if s.stopping {
		e.retryAt = now.Add(max(s.flushPause, res.retryAfter))
	} else {
		e.retryAt = now.Add(backoff(s.rand, e.failures, res.retryAfter))
	}
	s.report(now, res.err)
}

// evicted retires e, which left the cache. It gets no more lines: its note is kept as its message,
// and its summary and flow go, so that an entry settling holds no more than its text.
func (s *scheduler) evicted(e *entry) {
	e.evicted = true
	if e.hitters != nil {
		e.message = e.note()
	}
	e.hitters, e.flow = nil, nil
	s.retire(e)
}

// retire decides the fate of an evicted entry once no write of it is in flight: its pending lines
// are dropped, unless its latest write got no answer; then it stays, for as long as there is room,
// until one more write settles what the API holds.
func (s *scheduler) retire(e *entry) {
	if !e.evicted || e.inflight != 0 {
		s.place(&e.job)
		return
	}
	if e.doubt > 0 && e.pending() > 0 {
		// A reload that shrank the cache left an entry in flight settling
		// beyond the new size: it goes once its write is back.
		// It takes a unit of the cache's size, freed if need be by a written event or a
		// storm waiting for its end, never by a line to write.
		_, ok := s.settling[e]
		for !ok && s.corr.cache.units() >= s.set.cacheSize && s.corr.cache.evictWritten() {
		}
		units := s.corr.cache.units()
		if ok && units <= s.set.cacheSize ||
			!ok && units < s.set.cacheSize {
			s.settling[e] = struct{}{}
			s.settled = true
			s.place(&e.job)
			return
		}
	}
	delete(s.settling, e)
	s.unqueue(&e.job)
	s.drop(e, dropEvicted)
}

func (s *scheduler) drop(e *entry, reason dropReason) {
	if e.doubt > 0 && e.pending() > 0 {
		s.doubtful += min(e.doubt-e.carried, e.pending())
	}
	e.tally.drop(reason)
	s.forget(e)
}

// forget takes e out of its bucket's list of the entries never written.
func (s *scheduler) forget(e *entry) {
	s.queues[e.key.level].written(e)
}
