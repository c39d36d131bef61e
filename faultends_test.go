package k8s_event

import (
	"fmt"
	"time"
)

// The stepped fault model's check of ends (README, design.md): an end is
// decided only once its storm's last quiet held fewer lines than its
// threshold, max(2, 1 % of its peak), counted on the monotonic clock, and
// a storm ends at most once a rise: between two of its ends it rose above
// its threshold again, so that a quiet ending at one of its lines since the
// first end held 3 lines at least (lines of before that end among them).
// The model counts the lines of each storm itself, from the lines it
// logged.

// endWatch is the model's record of storms and their ends.
type endWatch struct {
	lines map[*entry][]time.Time // the lines of each entry, by when they were logged
	peak  map[*entry]int         // the most lines within a quiet the entry held
	ended map[*entry]time.Time   // each storm's latest end
	risen map[*entry]bool        // a quiet held 3 lines since the storm's latest end
	seen  map[*stormEnd]bool     // the ends looked at
	paced time.Duration          // the latest quiet that was on: flows count in it
	ends  int
}

func newEndWatch() *endWatch {
	return &endWatch{lines: map[*entry][]time.Time{}, peak: map[*entry]int{},
		ended: map[*entry]time.Time{}, seen: map[*stormEnd]bool{}, risen: map[*entry]bool{}}
}

// line records a line of e logged at at, with quiet in effect.
func (w *endWatch) line(e *entry, at time.Time, quiet time.Duration) {
	if e.key.level != levelWarning && e.key.level != levelError {
		return
	}
	if quiet > 0 {
		w.paced = quiet
	}
	lines := append(w.lines[e], at) // in the order logged: the monotonic clock only goes on
	i := 0
	for i < len(lines) && at.Sub(lines[i]) > keptLines {
		i++
	}
	w.lines[e] = lines[i:]
	if w.paced > 0 {
		n := w.within(e, at.Add(-w.paced-time.Nanosecond), at)
		w.peak[e] = max(w.peak[e], n)
		w.risen[e] = w.risen[e] || n >= 3
	}
}

// keptLines is how long the lines of an entry are kept: longer than any quiet of the model.
const keptLines = 10 * time.Minute

// within counts the lines of e logged in (from, to], on the monotonic clock, from < to.
func (w *endWatch) within(e *entry, from, to time.Time) int {
	n := 0
	lines := w.lines[e]
	for i := len(lines) - 1; i >= 0 && lines[i].After(from); i-- {
		if !lines[i].After(to) {
			n++
		}
	}
	return n
}

// check looks at the ends s has decided since it last looked.
func (w *endWatch) check(s *scheduler) error {
	for _, end := range s.ends.list {
		if w.seen[end] {
			continue
		}
		w.seen[end] = true
		w.ends++
		storm, ok := s.corr.cache.get(end.key)
		if !ok || s.set.quiet <= 0 {
			continue
		}
		at := end.at // its quiet is the one in effect: a flow of another waits for it
		thr := max(2, w.peak[storm]/100)
		if n := w.within(storm, at.Add(-handOffGrace-s.set.quiet), at); n >= thr {
			var ago []time.Duration
			for _, l := range w.lines[storm] {
				ago = append(ago, at.Sub(l))
			}
			return fmt.Errorf("end %q decided with %d lines in the last quiet (%v), threshold %d;"+
				" lines %v before it", end.message, n, s.set.quiet, thr, ago)
		}
		if last, ok := w.ended[storm]; ok && !w.risen[storm] {
			return fmt.Errorf("end %q decided with no quiet of 3 lines since the storm's last "+
				"end at %v: no rise", end.message, last)
		}
		w.risen[storm] = false
		w.ended[storm] = at
	}
	return nil
}
