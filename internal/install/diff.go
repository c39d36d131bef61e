package install

import (
	"slices"
	"strings"
)

// maxEdits bounds the edit distance Diff searches, and with it the memory
// it takes (about maxEdits² words): two Corefiles further apart than that
// are shown as the lines between their common head and tail, removed and
// added.
const maxEdits = 1000

// Diff is a line diff of a and b: lines only in a start with "-", lines
// only in b with "+", lines in both with " ". Within each changed
// stretch, the added lines come first.
//
// It is Myers' O((N+M)D) algorithm, run only between the common head and
// tail, which are written straight out: an install adds a few lines to a
// Corefile that may be as large as a ConfigMap (1 MiB), so the time and
// the memory beyond the text itself follow the number of changed lines.
func Diff(a, b string) string {
	x, y := lines(a), lines(b)
	head := 0
	for head < len(x) && head < len(y) && x[head] == y[head] {
		head++
	}
	tail := 0
	for tail < len(x)-head && tail < len(y)-head && x[len(x)-1-tail] == y[len(y)-1-tail] {
		tail++
	}
	w := &diffWriter{}
	w.out.Grow(len(b) + 2*len(y) + 2*(len(x)-head-tail) + len(a)/16)
	for _, l := range y[:head] {
		w.same(l)
	}
	w.middle(x[head:len(x)-tail], y[head:len(y)-tail])
	for _, l := range y[len(y)-tail:] {
		w.same(l)
	}
	w.flush()
	return w.out.String()
}

func lines(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(strings.TrimSuffix(s, "\n"), "\n")
}

// diffWriter writes a diff; within a changed stretch, the added lines go
// first.
type diffWriter struct {
	out        strings.Builder
	adds, dels []string
}

func (w *diffWriter) same(l string) {
	w.flush()
	w.line("  ", l)
}

func (w *diffWriter) flush() {
	for _, l := range w.adds {
		w.line("+ ", l)
	}
	for _, l := range w.dels {
		w.line("- ", l)
	}
	w.adds, w.dels = w.adds[:0], w.dels[:0]
}

func (w *diffWriter) line(prefix, l string) {
	w.out.WriteString(prefix)
	w.out.WriteString(l)
	w.out.WriteByte('\n')
}

// middle writes the diff of x and y, which have no common head or tail.
func (w *diffWriter) middle(x, y []string) {
	trace, ok := shortestEdit(x, y)
	if !ok {
		// Too far apart to be worth the search: all of x goes, all of y
		// comes.
		w.adds = append(w.adds, y...)
		w.dels = append(w.dels, x...)
		return
	}
	script := backtrack(trace, len(x), len(y))
	slices.Reverse(script)
	joinAdded(script, y)
	for _, e := range script {
		switch e.op {
		case ' ':
			w.same(y[e.j])
		case '+':
			w.adds = append(w.adds, y[e.j])
		case '-':
			w.dels = append(w.dels, x[e.i])
		}
	}
}

// joinAdded slides each stretch of added lines up past the same lines
// before it, where those repeat its own last lines, when that joins it to
// the change before: an added stretch that ends as the line before it
// does ("}", the end of a block added before a block's end) then shows
// whole, not split around that line. script is in order, first edit
// first.
func joinAdded(script []edit, y []string) {
	for i := 1; i < len(script); i++ {
		if script[i].op != '+' || script[i-1].op != ' ' {
			continue
		}
		end := i
		for end < len(script) && script[end].op == '+' {
			end++
		}
		s := i
		for s > 0 && script[s-1].op == ' ' {
			s--
		}
		n := i - s
		if s == 0 || !slidable(script, y, i, end, n) {
			continue
		}
		same := slices.Clone(script[s:i])
		first := script[s].j
		for k := range end - i {
			script[s+k] = edit{op: '+', j: first + k}
		}
		for k, e := range same {
			script[s+end-i+k] = edit{op: ' ', i: e.i, j: first + end - i + k}
		}
	}
}

// slidable reports whether the n same lines before the added stretch
// script[i:end] repeat its last n lines.
func slidable(script []edit, y []string, i, end, n int) bool {
	for k := 1; k <= n; k++ {
		if y[script[i-k].j] != y[script[end-k].j] {
			return false
		}
	}
	return true
}

type edit struct {
	op   byte // ' ' both, '-' only in x, '+' only in y
	i, j int
}

// shortestEdit is Myers' forward search from x to y: v over the diagonals
// -d..d as each step d found it, up to the step that reaches the end; or
// false past maxEdits steps.
func shortestEdit(x, y []string) ([][]int, bool) {
	n, m := len(x), len(y)
	limit := min(n+m, maxEdits)
	off := limit + 1
	v := make([]int, 2*limit+3)
	var trace [][]int
	for d := 0; d <= limit; d++ {
		snap := make([]int, 2*d+1)
		copy(snap, v[off-d:off+d+1])
		trace = append(trace, snap)
		for k := -d; k <= d; k += 2 {
			var px int
			if k == -d || (k != d && v[off+k-1] < v[off+k+1]) {
				px = v[off+k+1]
			} else {
				px = v[off+k-1] + 1
			}
			py := px - k
			for px < n && py < m && x[px] == y[py] {
				px++
				py++
			}
			v[off+k] = px
			if px >= n && py >= m {
				return trace, true
			}
		}
	}
	return nil, false
}

// backtrack is the edit script that trace found from (0, 0) to (n, m),
// last edit first.
func backtrack(trace [][]int, n, m int) []edit {
	var rev []edit
	px, py := n, m
	for d := len(trace) - 1; d > 0; d-- {
		prev := trace[d]
		at := func(k int) int { return prev[k+d] }
		k := px - py
		pk := k - 1
		if k == -d || (k != d && at(k-1) < at(k+1)) {
			pk = k + 1
		}
		sx := at(pk)
		sy := sx - pk
		// The move from (sx, sy), then the snake to (px, py).
		mx, my := sx+1, sy
		if pk == k+1 {
			mx, my = sx, sy+1
		}
		for px > mx && py > my {
			px--
			py--
			rev = append(rev, edit{' ', px, py})
		}
		if pk == k+1 {
			rev = append(rev, edit{'+', 0, sy})
		} else {
			rev = append(rev, edit{'-', sx, 0})
		}
		px, py = sx, sy
	}
	for px > 0 && py > 0 {
		px--
		py--
		rev = append(rev, edit{' ', px, py})
	}
	return rev
}
