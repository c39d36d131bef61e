package k8s_event

import (
	"fmt"
	"hash/maphash"
	"reflect"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"
)

// Lines as CoreDNS plugins log them, and their shapes.
var shapeTests = []struct {
	line, shape string
}{
	// errors: a timeout and a refusal from the same upstream are two shapes.
	{"plugin/errors: 2 a.example.org. A: read udp 10.0.0.5:41234->10.0.0.2:53: i/o timeout",
		"plugin/errors: <n> <name>. <type>: read udp <ip>-><ip>: i/o timeout"},
	{"plugin/errors: 2 b.example.net. AAAA: read udp 10.0.0.5:50112->10.0.0.2:53: i/o timeout",
		"plugin/errors: <n> <name>. <type>: read udp <ip>-><ip>: i/o timeout"},
	{"plugin/errors: 2 c.example.org. A: read udp 10.0.0.5:41235->10.0.0.3:53: read: connection refused",
		"plugin/errors: <n> <name>. <type>: read udp <ip>-><ip>: read: connection refused"},
	{"plugin/errors: 2 d.example.org. AAAA: dial udp [2001:db8::53]:53: connect: network is unreachable",
		"plugin/errors: <n> <name>. <type>: dial udp <ip>: connect: network is unreachable"},
	{"plugin/errors: 2 _dmarc.example.com. TXT: dial tcp [fd00::10]:53: i/o timeout",
		"plugin/errors: <n> <name>. <type>: dial tcp <ip>: i/o timeout"},
	// forward
	{"plugin/forward: no healthy upstream for 10.0.0.2:53 after 3 tries, last error: read udp [::1]:4412->[::1]:53: i/o timeout",
		"plugin/forward: no healthy upstream for <ip> after <n> tries, last error: read udp <ip>-><ip>: i/o timeout"},
	// reload
	{"plugin/reload: Running configuration SHA512 = 3c5e8a39af4d0fb2d5a6eb1a4e5b1c2a0f0e9d8c7b6a5f4e3d2c1b0a9f8e7d6c5b4a3f2e1d0c9b8a7f6e5d4c3b2a1f0e9d8c7b6a5f4e3d2c1b0a9f8e7d6c5",
		"plugin/reload: Running configuration SHA512 = <hex>"},
	{"plugin/reload: Corefile changed, reloading", "plugin/reload: Corefile changed, reloading"},
	// kubernetes (client-go through klog)
	{`plugin/kubernetes: pkg/mod/k8s.io/client-go@v0.37.1/tools/cache/reflector.go:566: failed to list *v1.Namespace: Get "https://10.96.0.1:443/api/v1/namespaces?limit=500&resourceVersion=0": dial tcp 10.96.0.1:443: i/o timeout`,
		`plugin/kubernetes: pkg/mod/k8s.io/client-go@v0.37.1/tools/cache/reflector.go:566: failed to list *v1.Namespace: Get "https://10.96.0.1:443/api/v1/namespaces?limit=500&resourceVersion=<n>": dial tcp <ip>: i/o timeout`},
	// health
	{`plugin/health: Local health request to "http://:8080/health" took more than 1s: 1.234567s`,
		`plugin/health: Local health request to "http://:8080/health" took more than <d>: <d>`},
	// cache
	{"plugin/cache: failed to prefetch a.example.org. A after 250ms", "plugin/cache: failed to prefetch <name>. <type> after <d>"},
	// dnssec
	{"plugin/dnssec: Failed to sign example.org. with key 12345: signature expired", "plugin/dnssec: Failed to sign <name>. with key <n>: signature expired"},
	// loop
	{`plugin/loop: Loop (127.0.0.1:53 -> :53) detected for zone ".", see https://coredns.io/plugins/loop#troubleshooting. Query: "HINFO 4547991504243258144.3688648895315093531."`,
		`plugin/loop: Loop (<ip> -> :<n>) detected for zone ".", see https://coredns.io/plugins/loop#troubleshooting. Query: "<type> <n>."`},
	// names as CoreDNS prints them, with escapes of the bytes that are not letters, digits, '-' or '_'
	{`plugin/errors: 2 a\001b.example.org. A: read udp 10.0.0.5:41234->10.0.0.2:53: i/o timeout`,
		"plugin/errors: <n> <name>. <type>: read udp <ip>-><ip>: i/o timeout"},
	{`plugin/errors: 2 a\.b\@c\255.example.org. A: i/o timeout`, "plugin/errors: <n> <name>. <type>: i/o timeout"},
	{`plugin/errors: 2 a\ b.example.org. A: i/o timeout`, "plugin/errors: <n> <name>. <type>: i/o timeout"},
	{`plugin/errors: 2 a\\.example.org. A: i/o timeout`, "plugin/errors: <n> <name>. <type>: i/o timeout"},
	{`plugin/errors: 2 ab\.. A: i/o timeout`, "plugin/errors: <n> <name>. <type>: i/o timeout"},
	{"plugin/errors: 2 " + escapedName + " A: i/o timeout", "plugin/errors: <n> <name>. <type>: i/o timeout"},
	{`not escapes: a\1.example.org a\`, `not escapes: a\1.example.org a\`},
	// identifiers
	{"request 0x1f2e id=42 uuid 123e4567-e89b-12d3-a456-426614174000 took 1m30s", "request <hex> id=<n> uuid <uuid> took <d>"},
	{"deadbeef accepted 12ab34cd", "deadbeef accepted <hex>"},
	// every token a client chooses: type, class, and any byte CoreDNS prints as it is in a label
	{"plugin/errors: 2 a.example. TYPE65280: i/o timeout", "plugin/errors: <n> <name>. <type>: i/o timeout"},
	{"plugin/log: [INFO] 10.0.0.9:53 - 7 \"NSEC3PARAM CLASS255 a.example. udp\"",
		"plugin/log: [INFO] <ip> - <n> \"<type> <class> <name>. udp\""},
	{"plugin/log: \"A IN b.example. udp\" NOERROR", "plugin/log: \"<type> <class> <name>. udp\" NOERROR"},
	{"plugin/errors: 2 a*b.example. A: i/o timeout", "plugin/errors: <n> <name>. <type>: i/o timeout"},
	{"plugin/errors: 2 x=y.example. A: i/o timeout", "plugin/errors: <n> <name>. <type>: i/o timeout"},
	{"plugin/errors: 2 a->b.example. A: i/o timeout", "plugin/errors: <n> <name>. <type>: i/o timeout"},
	{"failed to list *v1.Pod: TYPEZ CLASS65536 id=7", "failed to list *v1.Pod: TYPEZ CLASS65536 id=<n>"},
	{"", ""},
}

func TestLineShape(t *testing.T) {
	for _, tt := range shapeTests {
		if got := lineShape(tt.line); got != tt.shape {
			t.Errorf("lineShape(%q)\n got %q\nwant %q", tt.line, got, tt.shape)
		}
		if again := lineShape(tt.shape); again != tt.shape {
			t.Errorf("the shape of %q is %q, not itself", tt.shape, again)
		}
		if shapeHash(tt.line) != maphash.String(shapeSeed, tt.shape) {
			t.Errorf("shapeHash(%q) is not the hash of its shape", tt.line)
		}
	}
	if a, b := lineShape(shapeTests[0].line), lineShape(shapeTests[2].line); a == b {
		t.Errorf("a timeout and a refusal have one shape: %q", a)
	}
}

// FuzzLineShape: any line has a shape, the shape of a shape is itself, and
// the line is left as it was.
func FuzzLineShape(f *testing.F) {
	for _, tt := range shapeTests {
		f.Add(tt.line)
	}
	f.Add("[::1]:53 ::1 fe80::1%eth0 ::ffff:10.0.0.1 1.2.3.4.5 a..b -> -> a=b=c")
	for _, a := range adversarialLines {
		f.Add(a.line)
	}
	f.Fuzz(func(t *testing.T, line string) {
		before := strings.Clone(line)
		s := lineShape(line)
		if line != before {
			t.Fatalf("lineShape changed its input %q to %q", before, line)
		}
		if again := lineShape(s); again != s {
			t.Errorf("lineShape(%q) = %q, whose shape is %q", line, s, again)
		}
	})
}

// BenchmarkShapeHash is the correlator's cost of a combined line's shape.
func BenchmarkShapeHash(b *testing.B) {
	line := shapeTests[0].line
	b.ReportAllocs()
	b.SetBytes(int64(len(line)))
	for b.Loop() {
		shapeHash(line)
	}
}

// ordinaryLine is lines as CoreDNS plugins log them, joined up to n bytes.
func ordinaryLine(n int) string {
	var b strings.Builder
	for b.Len() < n {
		for _, tt := range shapeTests {
			b.WriteString(tt.line + " ")
		}
	}
	return b.String()[:n]
}

// adversarialLines are lines of 1 KiB made to find a superlinear path in
// the shape: chains and runs of what the shape looks for.
var adversarialLines = []struct{ name, line string }{
	{"numbers", strings.Repeat("1 ", 512)},
	{"names", strings.Repeat("a.b ", 256)},
	{"IPv6", strings.Repeat("::1 ", 256)},
	{"durations", strings.Repeat("1s ", 342)[:1024]},
	{"hex", strings.Repeat("0x1 ", 256)},
	{"arrows", strings.Repeat("1->", 342)[:1024]},
	{"address arrows", strings.Repeat("10.0.0.1:53->", 79)[:1024]},
	{"equals", strings.Repeat("a=", 512)},
	{"brackets", strings.Repeat("[", 1017) + "::1]:53"},
	{"brackets unclosed", strings.Repeat("[", 1024)},
	{"colons", strings.Repeat(":", 1023) + "1"},
	{"dots", strings.Repeat("a.", 512)},
	{"a duration", strings.Repeat("1h", 512)},
	{"closing", "a.b" + strings.Repeat(")", 1021)},
	{"escaped name", "plugin/errors: 2 " + escapedName + " A:"},
	{"escaped dots", strings.Repeat(`a\.`, 341) + "b"},
}

// escapedName is a name of 255 bytes, each of them one CoreDNS prints as
// an escape: 1004 characters.
var escapedName = strings.Repeat(strings.Repeat(`\001`, 63)+".", 3) + strings.Repeat(`\001`, 61) + "."

// BenchmarkShapeAdversarial: the shape of each adversarial line of 1 KiB,
// against that of an ordinary line of 1 KiB timed alternately in the same
// loop; x-ordinary is the ratio of their times.
func BenchmarkShapeAdversarial(b *testing.B) {
	ordinary := ordinaryLine(1024)
	for _, bm := range adversarialLines {
		if len(bm.line) != 1024 {
			b.Fatalf("%s: %d bytes, want 1024", bm.name, len(bm.line))
		}
		b.Run(bm.name, func(b *testing.B) {
			b.SetBytes(1024)
			var ord, adv time.Duration
			for b.Loop() {
				t0 := time.Now()
				shapeHash(ordinary)
				t1 := time.Now()
				shapeHash(bm.line)
				adv += time.Since(t1)
				ord += t1.Sub(t0)
			}
			b.ReportMetric(float64(adv)/float64(ord), "x-ordinary")
			b.ReportMetric(float64(adv.Nanoseconds())/float64(b.N), "ns/line")
		})
	}
}

// TestCombinedByShape: past the first distinct lines, a new line joins the
// combined event of its own shape, never another's; counts are exact and
// every message is a concrete line.
func TestCombinedByShape(t *testing.T) {
	p, api, clk := newTestHarness(t, testConfig(all, 1000, 1000, 4096))
	before := readLedger()
	timeout := func(i int) string {
		return fmt.Sprintf("2 q%d.example.org. A: read udp 10.0.0.5:%d->10.0.0.2:53: i/o timeout", i, 40000+i)
	}
	refused := func(i int) string {
		return fmt.Sprintf("2 r%d.example.net. AAAA: read udp 10.0.0.5:%d->10.0.0.3:53: read: connection refused", i, 50000+i)
	}
	for i := range 200 {
		p.observe(ln(levelError, "errors", timeout(i), clk.Now()))
		p.observe(ln(levelError, "errors", refused(i), clk.Now()))
	}
	drain(p)
	perShape := map[string]int32{}
	combined := 0
	for _, ev := range events(t, api) {
		msg := strings.Replace(ev.Message, combinedPrefix, "", 1)
		if msg != ev.Message {
			combined++
		}
		if strings.Contains(msg, "<") {
			t.Errorf("message %q is not a concrete line", ev.Message)
		}
		perShape[lineShape(msg)] += ev.Count
		if ev.Labels[labelPlugin] != "errors" || ev.Labels[labelLevel] != "error" {
			t.Errorf("labels %v", ev.Labels)
		}
	}
	want := map[string]int32{
		"plugin/errors: <n> <name>. <type>: read udp <ip>-><ip>: i/o timeout":              200,
		"plugin/errors: <n> <name>. <type>: read udp <ip>-><ip>: read: connection refused": 200,
	}
	if !reflect.DeepEqual(perShape, want) {
		t.Errorf("counts by shape %v, want %v", perShape, want)
	}
	if n := len(events(t, api)); combined != 2 || n != ownEvents+2 {
		t.Errorf("%d events, %d combined; want %d of their own and one combined per shape", n, combined, ownEvents)
	}
	checkLedger(t, api, before, 400)
}

// TestClientChosenTokensMakeOneShape: a client that picks, for each query, a query type never used
// before (printed TYPEnnn), a class, or a name with '*', '=' or "->" inside a label gets one shape
// for all of them; the event keeps the concrete line, so a failure of one type stays visible.
func TestClientChosenTokensMakeOneShape(t *testing.T) {
	h, api, clk := newTestHarness(t, testConfig(all, 1000, 1000, 4096))
	for i := range ownEvents {
		h.observe(ln(levelError, "errors", "upstream "+word(i)+" unhealthy", clk.Now()))
	}
	var lines []string
	for i := range 40 {
		lines = append(lines,
			fmt.Sprintf("2 q.example. TYPE%d: read udp 10.0.0.5:40000->10.0.0.2:53: i/o timeout", 65280+i),
			fmt.Sprintf("2 a*%d.example. A: read udp 10.0.0.5:40000->10.0.0.2:53: i/o timeout", i),
			fmt.Sprintf("2 k%d=v.example. A: read udp 10.0.0.5:40000->10.0.0.2:53: i/o timeout", i),
			fmt.Sprintf("2 a%d->b.example. AAAA: read udp 10.0.0.5:40000->10.0.0.2:53: i/o timeout", i))
	}
	for _, l := range lines {
		h.observe(ln(levelError, "errors", l, clk.Now()))
	}
	drain(h)
	shapes := map[string]bool{}
	for _, e := range h.s.corr.cache.values() {
		if e.key.combined() {
			shapes[lineShape(strings.TrimPrefix(e.message, e.key.plugin))] = true
		}
	}
	if len(shapes) != 1 {
		t.Errorf("%d shapes of one error for a client's tokens, want 1: %v", len(shapes), shapes)
	}
	types := 0
	for _, ev := range combinedOf(api.list()) {
		if strings.Contains(ev.Message, "<") {
			t.Errorf("combined event says %q, not a concrete line", ev.Message)
		}
		if strings.Contains(ev.Message, " TYPE65") {
			types++
		}
	}
	if types == 0 {
		t.Errorf("no event shows a line of a query type, though one was the latest of its shape")
	}
}

// TestShapesAreBounded: a plugin whose lines have ever new shapes makes at
// most ownEvents + maxShapes + 1 events per level and window.
func TestShapesAreBounded(t *testing.T) {
	p, api, clk := newTestHarness(t, testConfig(all, 1000, 1000, 4096))
	words := []string{"alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet", "kilo", "lima", "mike", "november", "oscar"}
	n := 0
	for _, a := range words {
		for _, b := range words {
			p.observe(ln(levelWarning, "forward", a+" went "+b, clk.Now()))
			n++
		}
	}
	drain(p)
	var total int32
	evs := events(t, api)
	for _, ev := range evs {
		total += ev.Count
	}
	if len(evs) != ownEvents+maxShapes+1 || total != int32(n) {
		t.Errorf("%d events with counts adding up to %d, want %d events and %d", len(evs), total, ownEvents+maxShapes+1, n)
	}
}

func TestPluginLabel(t *testing.T) {
	for prefix, want := range map[string]string{
		"plugin/errors: ":       "errors",
		"plugin/k8s_external: ": "k8s_external",
		"plugin/a b/c: ":        "a_b_c",
		"plugin/-x-: ":          "x",
		"plugin/: ":             "unknown",
		"plugin/" + strings.Repeat("z", 80) + ": ": strings.Repeat("z", 63),
	} {
		got := pluginLabel(prefix)
		if got != want {
			t.Errorf("pluginLabel(%q) = %q, want %q", prefix, got, want)
		}
		if errs := validation.IsValidLabelValue(got); len(errs) != 0 {
			t.Errorf("pluginLabel(%q) = %q: %v", prefix, got, errs)
		}
	}
}

// The query types and classes found without hashing take the placeholders of every other.
func TestQueryTypesAndClassesTakeTheirPlaceholders(t *testing.T) {
	for w, want := range rrWords {
		if got := rrShape(w); got != want {
			t.Errorf("rrShape(%q) = %q, want %q", w, got, want)
		}
	}
	for _, w := range []string{"", "a", "Aa", "AAAAA", "in", "TYPE65536", "CLASS"} {
		if got := rrShape(w); got != "" {
			t.Errorf("rrShape(%q) = %q, want none", w, got)
		}
	}
}
