package k8s_event

import (
	"errors"
	"fmt"
	"testing"
)

type named string

func (n named) String() string { return "named:" + string(n) }

func TestAppendLine(t *testing.T) {
	for _, tc := range []struct {
		format    string
		formatted bool
		v         []any
	}{
		// The errors plugin.
		{"%d %s %s: %s", true, []any{2, "a.example.org.", "A", "read udp 10.0.0.5:41234->10.0.0.2:53: i/o timeout"}},
		{"plain text", true, nil},
		{"100%% of %v, %v", true, []any{"x", int64(-7)}},
		{"%s", true, []any{""}},
		{"%d %d %d %d %d %d %d %d %d", true, []any{int8(-1), int16(2), int32(3), int64(4), uint(5), uint8(6), uint16(7), uint32(8), uint64(9)}},
		// fmt's own: what the plain path does not take.
		{"%q", true, []any{"x"}},
		{"%5d|%-4s|%x", true, []any{1, "a", 255}},
		{"%s", true, []any{named("n")}},
		{"%s", true, []any{errors.New("an error")}},
		{"%s", true, []any{nil}},
		{"%d", true, []any{"not a number"}},
		{"%s %s", true, []any{"missing"}},
		{"%s", true, []any{"extra", "operand"}},
		{"trailing %", true, nil},
		{"%v", true, []any{1.5}},
		{"%!", true, nil},
		{"%ü", true, []any{"x"}},
		// The unformatted methods.
		{"", false, []any{"a", "b", "c"}},
		{"", false, []any{"a", 1, 2, "b"}},
		{"", false, []any{1, 2}},
		{"", false, []any{errors.New("e"), "s"}},
		{"", false, nil},
	} {
		var want []byte
		if tc.formatted {
			want = fmt.Appendf([]byte("p: "), tc.format, tc.v...)
		} else {
			want = fmt.Append([]byte("p: "), tc.v...)
		}
		if got := appendLine([]byte("p: "), tc.format, tc.formatted, tc.v); string(got) != string(want) {
			t.Errorf("appendLine(%q, %v, %#v) = %q, fmt gives %q", tc.format, tc.formatted, tc.v, got, want)
		}
	}
}

// TestAppendPlainTakes checks which lines take the path without fmt: a
// line that falls back to fmt is the same, only slower.
func TestAppendPlainTakes(t *testing.T) {
	for _, tc := range []struct {
		format string
		v      []any
		plain  bool
	}{
		{"%d %s %s: %s", []any{2, "a.example.org.", "A", "i/o timeout"}, true},
		{"%v %v %d", []any{"s", int64(1), uint8(2)}, true},
		{"no verbs, 100%%", nil, true},
		{"%x", []any{255}, false},
		{"%s", []any{7}, false},
		{"%d", []any{"7"}, false},
		{"%c", []any{uint8('x')}, false},
		{"%q", []any{"x"}, false},
		{"%s", []any{named("n")}, false},
		{"%s", []any{errors.New("e")}, false},
		{"%s %s", []any{"one"}, false},
		{"%s", []any{"one", "two"}, false},
		{"%", nil, false},
	} {
		out, ok := appendPlain([]byte("keep"), tc.format, tc.v)
		if ok != tc.plain {
			t.Errorf("appendPlain(%q, %#v) took it: %v, want %v", tc.format, tc.v, ok, tc.plain)
		}
		if !ok && string(out) != "keep" {
			t.Errorf("appendPlain(%q, %#v) declined but changed the buffer to %q", tc.format, tc.v, out)
		}
	}
	if _, ok := appendStrings(nil, []any{"a", "b"}); !ok {
		t.Error("appendStrings did not take strings")
	}
	if _, ok := appendStrings(nil, []any{"a", 1}); ok {
		t.Error("appendStrings took an integer")
	}
}

// FuzzAppendLine checks that every line is what fmt makes of it, whichever
// path it takes.
func FuzzAppendLine(f *testing.F) {
	f.Add("%d %s %s: %s", "a.example.org.", int64(2), uint8(0x55))
	f.Add("%v%%%d", "", int64(-1), uint8(0))
	f.Add("%s %q %5d", "x", int64(1), uint8(0xff))
	f.Fuzz(func(t *testing.T, format, s string, n int64, kinds uint8) {
		// Up to four operands; two bits of kinds choose the type of each.
		var v []any
		for i := range int(kinds>>6) + 1 {
			switch (kinds >> (2 * i)) & 3 {
			case 0:
				v = append(v, s)
			case 1:
				v = append(v, int(n))
			case 2:
				v = append(v, uint16(n))
			case 3:
				v = append(v, named(s))
			}
		}
		if got, want := appendLine(nil, format, true, v), fmt.Appendf(nil, format, v...); string(got) != string(want) {
			t.Errorf("appendLine(%q, %#v) = %q, fmt.Appendf gives %q", format, v, got, want)
		}
		if got, want := appendLine(nil, "", false, v), fmt.Append(nil, v...); string(got) != string(want) {
			t.Errorf("appendLine(%#v) = %q, fmt.Append gives %q", v, got, want)
		}
	})
}

// BenchmarkAppendLine compares, side by side, the plain path with fmt on
// the errors plugin's line.
//
//	go test -run '^$' -bench AppendLine -count 5 .
func BenchmarkAppendLine(b *testing.B) {
	const format = "%d %s %s: %s"
	v := []any{2, "a.example.org.", "A", "read udp 10.0.0.5:41234->10.0.0.2:53: i/o timeout"}
	for _, path := range []struct {
		name string
		fn   func([]byte) []byte
	}{
		{"plain", func(buf []byte) []byte { return appendLine(buf, format, true, v) }},
		{"fmt", func(buf []byte) []byte { return fmt.Appendf(buf, format, v...) }},
	} {
		b.Run(path.name, func(b *testing.B) {
			buf := make([]byte, 0, 256)
			for b.Loop() {
				buf = path.fn(buf[:0])
			}
		})
	}
}
