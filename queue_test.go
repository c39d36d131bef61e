package k8s_event

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// tokenOrder is a reference for the order in which a bucket's entries take
// its tokens, as README.md and docs/design.md state it, which both fault
// models hold every dispatch to. It keeps its own record of who was
// served when, from the requests it is shown in the order they were handed
// out; of the scheduler it reads only what waits: the entries, their
// plugin, shape, whether written, whether settling, and the order in which
// they began to wait.
//
//   - Entries settling go first, the oldest first; outside the flush, a
//     re-create goes with them, first within its plugin.
//   - Then the plugins, least recently served first: a plugin served later
//     than another that waits does not go before it.
//   - Within a plugin its shapes the same way: a shape that has waited
//     without a break since it was served does not go again before another
//     shape of its plugin that has not been served since.
//   - Within a shape, new events (never written, or whose patch found them
//     gone) and updates alternate when both wait, new first: new whenever
//     the shape last served an update or starts anew, an update after a new
//     one while the shape waited without a break.
//   - Within each, the entry that began to wait first.
//
// A turn is the id of its request, on the count of the stamps at which
// entries begin to wait. A plugin whose patch found its event gone takes
// back the turn it had when that entry began to wait: its re-create goes
// before the plugins not served since, after those served since. So does a
// plugin whose turn went to an entry newer than the one that began its wait
// (the scheduler's choice, which the reference reads, checks and follows),
// once: its next turn goes to that entry, ahead of its shape's turn.
//
// A shape that waits again after a break starts anew, placed by its event
// served last, which the record cannot tell apart from a break: the checks
// that need a shape's continuity make them only when an entry of it has
// waited, untouched, since its latest serve.
type tokenOrder struct {
	buckets [numBuckets]*orderBucket
	gone    map[*job]bool // entries whose patch found the event gone, until served
}

type orderBucket struct {
	turn    uint64
	plugins map[string]uint64 // the turn each plugin was last served, or took back
	owed    map[string]*job   // the entry each plugin's next turn goes to, its place kept
	shapes  map[shapeID]*shapeTurn
}

type shapeID struct {
	plugin string
	shape  uint64
}

// shapeTurn is the record of a shape's latest serve.
type shapeTurn struct {
	turn  uint64
	fresh bool           // it served a new event
	left  map[*job]int64 // the jobs of the shape left waiting, with their lines then
}

func newTokenOrder() *tokenOrder {
	o := &tokenOrder{gone: map[*job]bool{}}
	for b := range o.buckets {
		o.buckets[b] = &orderBucket{plugins: map[string]uint64{}, shapes: map[shapeID]*shapeTurn{},
			owed: map[string]*job{}}
	}
	return o
}

// answered takes the answer to the request of e.
func (o *tokenOrder) answered(e *job, res result) {
	if e != nil && res.outcome == writeGone {
		o.gone[e] = true
	}
}

// resumed takes the answer to the request of e as the scheduler gets it: a plugin whose patch
// found its event gone takes back the turn it had when e began to wait.
func (o *tokenOrder) resumed(e *job, res result) {
	if e == nil || res.outcome != writeGone {
		return
	}
	b := o.buckets[bucketOf(e)]
	if x := b.owed[e.key.plugin]; x == nil || x.slot.owner == nil {
		b.owed[e.key.plugin] = e
	}
	if e.slot.stamp != 0 && e.slot.stamp < b.plugins[e.key.plugin] {
		b.plugins[e.key.plugin] = e.slot.stamp
	}
}

// reloaded forgets what a reload may have broken: every entry waits anew.
func (o *tokenOrder) reloaded() {
	for _, b := range o.buckets {
		for _, st := range b.shapes {
			st.left = nil
		}
	}
}

// dispatch runs a dispatch of s at now and checks its requests, in the
// order they were handed out. What waited when it began is what waits
// after it and what it served.
func (o *tokenOrder) dispatch(s *scheduler, now time.Time) ([]request, time.Time, error) {
	inFlush := map[*job]bool{} // in the flush, a re-create waits with the entries settling
	for e := range o.gone {
		if s.stopping && (e.slot.in == &s.queues[bucketOf(e)].first || e.slot.in == &s.timers) {
			inFlush[e] = true
		}
	}
	for b, bk := range o.buckets { // a place kept ends with its plugin's wait
		for p, x := range bk.owed {
			if q := s.queues[b].plugins[p]; q == nil || q.owed != x {
				delete(bk.owed, p)
			}
		}
	}
	reqs, wake := s.dispatch(now)
	return reqs, wake, o.dispatched(s, reqs, inFlush)
}

func (o *tokenOrder) dispatched(s *scheduler, reqs []request, inFlush map[*job]bool) error {
	var waiting [numBuckets][]*job
	for _, e := range jobsOf(s) {
		if e.slot.in != nil && e.slot.in != &s.timers {
			waiting[bucketOf(e)] = append(waiting[bucketOf(e)], e)
		}
	}
	for _, r := range reqs {
		if f := s.flights[r.id]; f.j != nil && !f.read {
			waiting[f.bucket] = append(waiting[f.bucket], f.j)
		}
	}
	view := &orderView{gone: o.gone, inFlush: inFlush, s: s}

	for _, r := range reqs {
		f := s.flights[r.id]
		if f.j == nil || f.read {
			continue
		}
		w := waiting[f.bucket]
		view.bucket = f.bucket
		if err := o.buckets[f.bucket].served(f.j, w, view, r.id); err != nil {
			return fmt.Errorf("%s bucket, turn %d: %w", bucketName(f.bucket), o.buckets[f.bucket].turn, err)
		}
		delete(o.gone, f.j)
		for i, x := range w {
			if x == f.j {
				waiting[f.bucket] = append(w[:i:i], w[i+1:]...)
				break
			}
		}
	}
	return nil
}

// orderView is what the reference reads of the scheduler at a dispatch.
type orderView struct {
	gone, inFlush map[*job]bool
	s             *scheduler
	bucket        level
}

func (v *orderView) first(e *job) bool { return v.inFlush[e] }

// settling tells that e goes first within its plugin: it settles, or, outside the flush, it is
// a re-create.
func (v *orderView) settling(e *job) bool {
	_, ok := v.s.settling[e.lines]
	return (ok || v.gone[e]) && !v.inFlush[e]
}

// out tells that e's plugin has a request of its bucket in flight: with the
// bucket's requests at their cap, it waits for an answer, and may be passed.
func (v *orderView) out(e *job) bool {
	for _, f := range v.s.flights {
		if f.bucket == v.bucket && f.j != nil && f.j != e && f.j.key.plugin == e.key.plugin {
			return true
		}
	}
	return false
}

// turnShape is the shape of an entry's line, or a combined event's shape.
func turnShape(e *job) shapeID {
	if e.key.combined() {
		return shapeID{e.key.plugin, e.key.shape}
	}
	return shapeID{e.key.plugin, shapeHash(strings.TrimPrefix(e.key.message, e.key.plugin))}
}

// turnMember is the member of an entry's new events: the name its line is about.
func turnMember(e *job) string {
	if e.lines != nil && e.lines.group != nil {
		return e.lines.group.key.member
	}
	return e.key.member
}

// jobsOf lists the jobs of s: of its entries, cached or settling, and of its ends.
func jobsOf(s *scheduler) []*job {
	var js []*job
	for _, e := range entriesOf(s) {
		js = append(js, &e.job)
	}
	for _, e := range s.ends.list {
		js = append(js, &e.job)
	}
	return js
}

// jobText is what a job's event says: its latest line, or its end's message.
func jobText(j *job) string {
	if j.end != nil {
		return j.end.message
	}
	return j.lines.message
}

// jobSeen is the lines of a job's event; none for an end.
func jobSeen(j *job) int64 {
	if j.lines == nil {
		return 0
	}
	return j.lines.seen
}

// served checks that e may take the token of the request id while the
// entries w wait, e among them, and records it. In the flush, the
// re-creates (first) go before any other; an entry settling, or a
// re-create outside the flush, goes first within its plugin.
func (b *orderBucket) served(e *job, w []*job, o *orderView, id uint64) error {
	fresh := func(x *job) bool { return x.lines == nil || x.lines.carried == 0 || o.gone[x] }
	if o.first(e) {
		for _, x := range w {
			if o.first(x) && x.slot.stamp < e.slot.stamp {
				return fmt.Errorf("re-create %q went before re-create %q, which waited longer", jobText(e), jobText(x))
			}
		}
		return nil
	}
	for _, x := range w {
		if o.first(x) && !o.out(x) {
			return fmt.Errorf("%q went before %q, a re-create in the flush", jobText(e), jobText(x))
		}
		if x.key.plugin == e.key.plugin && o.settling(x) && (!o.settling(e) || x.slot.stamp < e.slot.stamp) {
			return fmt.Errorf("%q went before %q, settling, of its plugin", jobText(e), jobText(x))
		}
		if x.key.plugin != e.key.plugin && b.plugins[x.key.plugin] < b.plugins[e.key.plugin] && !o.out(x) {
			return fmt.Errorf("plugin %q (served at turn %d) went before plugin %q (turn %d), which waits", e.key.plugin, b.plugins[e.key.plugin], x.key.plugin, b.plugins[x.key.plugin])
		}
	}
	if x := b.owed[e.key.plugin]; x != nil && x != e && !o.settling(e) && slices.Contains(w, x) {
		return fmt.Errorf("%q took the turn %q's plugin kept for it", jobText(e), jobText(x))
	}
	kept := b.owed[e.key.plugin] == e
	if kept { // an entry settling goes before it, and leaves it its place kept
		delete(b.owed, e.key.plugin)
	}
	defer b.keep(e, w, o, id)
	if o.settling(e) {
		b.turn = id
		b.plugins[e.key.plugin] = b.turn
		if o.gone[e] { // a re-create places its shape, should it wait again, at this turn
			b.shapes[turnShape(e)] = &shapeTurn{turn: id, fresh: true}
		}
		return nil
	}
	p, sh := e.key.plugin, turnShape(e)
	st := b.shapes[sh]
	if st == nil {
		st = &shapeTurn{}
		b.shapes[sh] = st
	}
	unbroken := false // the shape has waited without a break since its latest serve
	for _, x := range w {
		if n, ok := st.left[x]; ok && jobSeen(x) == n && !o.settling(x) {
			unbroken = true
		}
	}
	var news, updates int
	for _, x := range w {
		xs := turnShape(x)
		switch {
		case x.key.plugin != p:
		case kept: // a kept turn goes to its entry, ahead of its shape's turn
		case xs != sh:
			if other := b.shapes[xs]; unbroken && (other == nil || other.turn < st.turn) {
				return fmt.Errorf("a shape of %q served at turn %d went again before another of its shapes, which waits (%q)", p, st.turn, jobText(x))
			}
		case fresh(x) == fresh(e) && x.slot.stamp < e.slot.stamp &&
			(!fresh(e) || turnMember(x) == turnMember(e)):
			return fmt.Errorf("%q went before %q of its shape and kind, which began to wait first", jobText(e), jobText(x))
		case fresh(x):
			news++
		default:
			updates++
		}
	}
	if fresh(e) {
		news++
	} else {
		updates++
	}
	if news > 0 && updates > 0 && !kept {
		switch {
		case !st.fresh && !fresh(e):
			return fmt.Errorf("update %q went before a new event of its shape, which last served an update", jobText(e))
		case st.fresh && unbroken && fresh(e):
			return fmt.Errorf("new %q went right after a new event of its shape, while an update waited", jobText(e))
		}
	}
	b.turn = id
	b.plugins[p] = b.turn
	st.turn, st.fresh, st.left = b.turn, fresh(e), map[*job]int64{}
	for _, x := range w {
		if x != e && turnShape(x) == sh {
			st.left[x] = jobSeen(x)
		}
	}
	return nil
}

// keep keeps the place of e's plugin, just served, for the entry that began its wait (which the
// reference reads of the scheduler), if that entry waits and began to wait before e, and the
// plugin's next turn goes to no other: the plugin takes back the turn of that entry's stamp.
func (b *orderBucket) keep(e *job, w []*job, o *orderView, id uint64) {
	p := o.s.queues[o.bucket].plugins[e.key.plugin]
	if x := b.owed[e.key.plugin]; x != nil && slices.Contains(w, x) {
		return
	}
	x := p.opener
	if x == nil || x == e || !slices.Contains(w, x) || x.slot.stamp != p.openerStamp ||
		x.slot.stamp >= e.slot.stamp {
		return
	}
	b.owed[e.key.plugin] = x
	b.plugins[e.key.plugin] = min(b.plugins[e.key.plugin], x.slot.stamp)
}
