package install

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"strings"
	"testing"
)

// applyDiff rebuilds both sides of a Diff.
func applyDiff(d string) (a, b string) {
	var x, y strings.Builder
	for _, l := range strings.Split(strings.TrimSuffix(d, "\n"), "\n") {
		if l == "" {
			continue
		}
		switch l[0] {
		case ' ':
			x.WriteString(l[2:] + "\n")
			y.WriteString(l[2:] + "\n")
		case '-':
			x.WriteString(l[2:] + "\n")
		case '+':
			y.WriteString(l[2:] + "\n")
		}
	}
	return x.String(), y.String()
}

// Both sides come back from the diff, and the diff is no longer than the
// changes made.
func TestDiffRebuildsBothSides(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for range 300 {
		var a []string
		for range r.IntN(30) {
			a = append(a, fmt.Sprint("l", r.IntN(8)))
		}
		b := append([]string(nil), a...)
		changes := r.IntN(6)
		for range changes {
			i := r.IntN(len(b) + 1)
			if r.IntN(2) == 0 || len(b) == 0 || i == len(b) {
				b = append(b[:i], append([]string{fmt.Sprint("n", r.IntN(8))}, b[i:]...)...)
			} else {
				b = append(b[:i], b[i+1:]...)
			}
		}
		as, bs := strings.Join(a, "\n")+"\n", strings.Join(b, "\n")+"\n"
		if len(a) == 0 {
			as = ""
		}
		if len(b) == 0 {
			bs = ""
		}
		d := Diff(as, bs)
		x, y := applyDiff(d)
		if strings.TrimSpace(x) != strings.TrimSpace(as) || strings.TrimSpace(y) != strings.TrimSpace(bs) {
			t.Fatalf("Diff(%q, %q) =\n%s", as, bs, d)
		}
		if n := strings.Count(d, "\n+ ") + strings.Count(d, "\n- ") + btoi(strings.HasPrefix(d, "+ ") || strings.HasPrefix(d, "- ")); n > changes {
			t.Fatalf("Diff(%q, %q) has %d changed lines for %d changes:\n%s", as, bs, n, changes, d)
		}
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// A large Corefile is diffed in memory that follows its size and the
// change, not the square of its lines.
func TestDiffLargeCorefileMemory(t *testing.T) {
	var b strings.Builder
	for i := 0; b.Len() < 145<<10; i++ {
		fmt.Fprintf(&b, "zone%d.example:53 {\n    forward . 10.0.%d.%d\n}\n", i, i/250%250, i%250)
	}
	a := b.String()
	out, _, err := AddPlugins(".:53 {\n    kubernetes cluster.local\n}\n"+a, nil)
	if err != nil {
		t.Fatal(err)
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	d := Diff(".:53 {\n    kubernetes cluster.local\n}\n"+a, out)
	runtime.ReadMemStats(&after)
	// The diff itself is about the Corefile's size, and the lines of
	// both sides twice that where lines are short (3 to 4 times in all).
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 6*uint64(len(a)) {
		t.Errorf("Diff of a %d KB Corefile allocated %d KB, more than 6 times its size", len(a)>>10, alloc>>10)
	}
	if !strings.Contains(d, "+     k8s_event") {
		t.Errorf("the diff lacks the added line")
	}
}

func TestDiff(t *testing.T) {
	got := Diff("a\nb\nc\n", "a\nx\nc\nd\n")
	want := "  a\n+ x\n- b\n  c\n+ d\n"
	if got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
}

// A block added at the end of blocks that end as it does shows whole in
// each, not split around the line they share.
func TestDiffShowsAnAddedBlockWhole(t *testing.T) {
	a := "a {\n    x\n}\nb {\n    y\n}\n"
	b := "a {\n    x\n    k {\n    }\n}\nb {\n    y\n    k {\n    }\n}\n"
	a, b = strings.ReplaceAll(a, "\n}", "\n    }"), strings.ReplaceAll(b, "\n}", "\n    }")
	got := Diff(a, b)
	want := "  a {\n      x\n+     k {\n+     }\n      }\n  b {\n      y\n+     k {\n+     }\n      }\n"
	if got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
}

// BenchmarkDiff is the diff of an install on a Corefile near the
// ConfigMap size limit (1 MiB).
func BenchmarkDiff(b *testing.B) {
	var sb strings.Builder
	for i := 0; sb.Len() < 1<<20; i++ {
		fmt.Fprintf(&sb, "zone%d.example:53 {\n    forward . 10.0.%d.%d\n}\n", i, i/250%250, i%250)
	}
	a := ".:53 {\n    kubernetes cluster.local\n}\n" + sb.String()
	out, _, err := AddPlugins(a, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for range b.N {
		Diff(a, out)
	}
}
