package install

import "strings"

// maxEdits bounds the edit distance Diff searches, and with it the memory
// it takes (about maxEdits² words): two Corefiles further apart than that
// are shown as the lines between their common head and tail, removed and
// added.
const maxEdits = 1000

// Diff is a line diff of a and b: lines only in a start with "-", lines
// only in b with "+", lines in both with " ". Lines that differ only in
// their indentation are the same: the Corefile parser writes its own.
// Within each changed stretch, the added lines come first.
//
// It is Myers' O((N+M)D) algorithm: an install adds a few lines to a
// Corefile that may be as large as a ConfigMap (1 MiB), so the time and
// memory follow the number of changed lines, not the product of the
// sizes.
func Diff(a, b string) string {
	x, y := lines(a), lines(b)
	eq := func(i, j int) bool { return strings.TrimSpace(x[i]) == strings.TrimSpace(y[j]) }
	var out strings.Builder
	var adds, dels []string
	flush := func() {
		for _, l := range adds {
			out.WriteString("+ " + l + "\n")
		}
		for _, l := range dels {
			out.WriteString("- " + l + "\n")
		}
		adds, dels = adds[:0], dels[:0]
	}
	for _, e := range editScript(len(x), len(y), eq) {
		switch e.op {
		case ' ':
			flush()
			out.WriteString("  " + y[e.j] + "\n")
		case '+':
			adds = append(adds, y[e.j])
		case '-':
			dels = append(dels, x[e.i])
		}
	}
	flush()
	return out.String()
}

func lines(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(strings.TrimSuffix(s, "\n"), "\n")
}

type edit struct {
	op   byte // ' ' both, '-' only in x, '+' only in y
	i, j int
}

// editScript is a shortest edit script from x (n lines) to y (m lines).
func editScript(n, m int, eq func(i, j int) bool) []edit {
	// The common head and tail cost nothing to set aside.
	head := 0
	for head < n && head < m && eq(head, head) {
		head++
	}
	tail := 0
	for tail < n-head && tail < m-head && eq(n-1-tail, m-1-tail) {
		tail++
	}
	var script []edit
	for i := 0; i < head; i++ {
		script = append(script, edit{' ', i, i})
	}
	script = append(script, myers(head, n-tail, head, m-tail, eq)...)
	for k := tail; k > 0; k-- {
		script = append(script, edit{' ', n - k, m - k})
	}
	return script
}

// myers is the shortest edit script from x[x0:x1] to y[y0:y1].
func myers(x0, x1, y0, y1 int, eq func(i, j int) bool) []edit {
	n, m := x1-x0, y1-y0
	limit := min(n+m, maxEdits)
	off := limit + 1
	v := make([]int, 2*limit+3)
	// trace[d] is v over the diagonals -d..d as step d found it.
	var trace [][]int
	found := -1
	for d := 0; d <= limit && found < 0; d++ {
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
			for px < n && py < m && eq(x0+px, y0+py) {
				px++
				py++
			}
			v[off+k] = px
			if px >= n && py >= m {
				found = d
				break
			}
		}
	}
	if found < 0 {
		// Too far apart to be worth the search: all of x goes, all of y
		// comes.
		var script []edit
		for j := y0; j < y1; j++ {
			script = append(script, edit{'+', 0, j})
		}
		for i := x0; i < x1; i++ {
			script = append(script, edit{'-', i, 0})
		}
		return script
	}
	var rev []edit
	px, py := n, m
	for d := found; d > 0; d-- {
		prev := trace[d]
		at := func(k int) int { return prev[k+d] }
		k := px - py
		var pk int
		if k == -d || (k != d && at(k-1) < at(k+1)) {
			pk = k + 1
		} else {
			pk = k - 1
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
			rev = append(rev, edit{' ', x0 + px, y0 + py})
		}
		if pk == k+1 {
			rev = append(rev, edit{'+', 0, y0 + sy})
		} else {
			rev = append(rev, edit{'-', x0 + sx, 0})
		}
		px, py = sx, sy
	}
	for px > 0 && py > 0 {
		px--
		py--
		rev = append(rev, edit{' ', x0 + px, y0 + py})
	}
	script := make([]edit, len(rev))
	for i, e := range rev {
		script[len(rev)-1-i] = e
	}
	return script
}
