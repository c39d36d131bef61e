package k8s_event

// tally is the account of the lines of one event. A line is seen once, then stays pending until it
// is carried by a successful write or dropped, with a reason, because no write will ever carry it.
// These four methods are the only code that moves lines, and they keep the process-wide metrics, so
// that at every quiet moment
//
//	sum(count of every event written) + pending_lines + dropped_total == lines_total
//
// (lines_total also counts a line between listener and correlator, not yet seen nor dropped).
type tally struct {
	seen    int64 // lines of this event
	carried int64 // lines in the count of the latest successful write
	dropped int64 // lines given up; once set, the event is never written again
}

// see counts one more line of the event as pending.
func (t *tally) see() {
	t.seen++
	pendingLines.Inc()
}

// pending is the number of lines no write has carried yet.
func (t *tally) pending() int64 { return t.seen - t.carried - t.dropped }

// carry records a successful write of count upTo: every line up to it is now in the API's count.
func (t *tally) carry(upTo int64) {
	if n := upTo - t.carried; n > 0 && t.dropped == 0 {
		t.carried = upTo
		pendingLines.Sub(float64(n))
	}
}

// drop gives up every pending line, counting it under reason.
func (t *tally) drop(reason dropReason) {
	if n := t.pending(); n > 0 {
		t.dropped += n
		droppedTotal[reason].Add(float64(n))
		pendingLines.Sub(float64(n))
	}
}
