package k8s_event

import "testing"

// TestTally: lines move from seen to carried or dropped, each once, and
// the metrics follow.
func TestTally(t *testing.T) {
	before := readLedger()
	var tl tally
	for range 5 {
		tl.see()
	}
	tl.carry(3)
	if tl.pending() != 2 {
		t.Fatalf("pending %d after 5 seen and 3 carried", tl.pending())
	}
	tl.drop(dropEvicted)
	tl.drop(dropEvicted)
	tl.carry(5)
	if tl.pending() != 0 || tl.carried != 3 || tl.dropped != 2 {
		t.Errorf("after drops and a late carry: %+v, pending %d", tl, tl.pending())
	}
	if d := readLedger().since(before); d.pending != 0 || d.dropped[dropEvicted] != 2 || d.lines != 0 {
		t.Errorf("metrics moved by pending %v dropped %v", d.pending, d.dropped)
	}
}
