package k8s_event

import (
	"fmt"
	"io"
	"log"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	clog "github.com/coredns/coredns/plugin/pkg/log"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/apimachinery/pkg/util/validation"
)

var _ clog.Listener = (*pipeline)(nil)

const allLevels = levelSet(1<<numLevels - 1)

// notAFormat is a log message with verbs in it, as a DNS name or an error text
// can have; a variable, so that vet lets it through a Print call.
var notAFormat = "100%d done %s"

// nextLine takes the line waiting on p.lines, failing when there is none.
func nextLine(t *testing.T, p *pipeline) line {
	t.Helper()
	select {
	case ln := <-p.lines:
		return ln
	default:
		t.Fatal("expected a line on p.lines, found none")
		return line{}
	}
}

// linesCounted is the value of lines_total for every level.
func linesCounted() [numLevels]float64 {
	var n [numLevels]float64
	for l := range n {
		n[l] = testutil.ToFloat64(linesTotal[l])
	}
	return n
}

func TestListenerName(t *testing.T) {
	p, _, _ := newTestPipeline(t, testConfig(defaultLevels, 1, 1, 16))
	if got := p.Name(); got != "k8s_event" {
		t.Errorf("expected name %q, got %q", "k8s_event", got)
	}
}

func TestListenerMethods(t *testing.T) {
	const prefix = "plugin/errors: "
	tests := []struct {
		name     string
		log      func(p *pipeline)
		level    level
		expected string
	}{
		{"Debug", func(p *pipeline) { p.Debug(prefix, "a", 1, 2, "b") }, levelDebug, prefix + fmt.Sprint("a", 1, 2, "b")},
		{"Debugf", func(p *pipeline) { p.Debugf(prefix, "%d %s", 2, "x") }, levelDebug, prefix + "2 x"},
		{"Info", func(p *pipeline) { p.Info(prefix, "a", 1, 2, "b") }, levelInfo, prefix + fmt.Sprint("a", 1, 2, "b")},
		{"Infof", func(p *pipeline) { p.Infof(prefix, "%d %s", 2, "x") }, levelInfo, prefix + "2 x"},
		{"Warning", func(p *pipeline) { p.Warning(prefix, "a", 1, 2, "b") }, levelWarning, prefix + fmt.Sprint("a", 1, 2, "b")},
		{"Warningf", func(p *pipeline) { p.Warningf(prefix, "%d %s", 2, "x") }, levelWarning, prefix + "2 x"},
		{"Error", func(p *pipeline) { p.Error(prefix, "a", 1, 2, "b") }, levelError, prefix + fmt.Sprint("a", 1, 2, "b")},
		{"Errorf", func(p *pipeline) { p.Errorf(prefix, "%d %s", 2, "x") }, levelError, prefix + "2 x"},
		{"Error verbatim", func(p *pipeline) { p.Error(prefix, "100%d done %s") }, levelError, prefix + "100%d done %s"},
		{"Errorf missing operand", func(p *pipeline) { p.Errorf(prefix, "%d") }, levelError, prefix + "%!d(MISSING)"},
		{"Error no operand", func(p *pipeline) { p.Error(prefix) }, levelError, prefix},
	}
	for _, test := range tests {
		p, _, _ := newTestPipeline(t, testConfig(allLevels, 1, 1, 16))
		before := linesCounted()
		test.log(p)

		ln := nextLine(t, p)
		if ln.level != test.level {
			t.Errorf("%s: expected level %s, got %s", test.name, test.level, ln.level)
		}
		if ln.plugin != prefix {
			t.Errorf("%s: expected plugin %q, got %q", test.name, prefix, ln.plugin)
		}
		if ln.text != test.expected {
			t.Errorf("%s: expected text %q, got %q", test.name, test.expected, ln.text)
		}
		if !ln.at.Equal(epoch) {
			t.Errorf("%s: expected time %v, got %v", test.name, epoch, ln.at)
		}
		if n := len(p.lines); n != 0 {
			t.Errorf("%s: expected one line, got %d more", test.name, n)
		}
		if d := linesCounted()[test.level] - before[test.level]; d != 1 {
			t.Errorf("%s: expected lines_total{level=%q} to grow by 1, grew by %v", test.name, test.level, d)
		}
	}
}

// A fatal line is written at once: CoreDNS exits when the listeners return.
func TestListenerFatal(t *testing.T) {
	for _, test := range []struct {
		name string
		log  func(p *pipeline)
	}{
		{"Fatal", func(p *pipeline) { p.Fatal("plugin/errors: ", "no ", "way 100%d") }},
		{"Fatalf", func(p *pipeline) { p.Fatalf("plugin/errors: ", "no way %d%%d", 100) }},
	} {
		p, client, _ := newTestPipeline(t, testConfig(allLevels, 1, 1, 16))
		before := linesCounted()
		test.log(p)

		if n := len(p.lines); n != 0 {
			t.Errorf("%s: expected no line queued, got %d", test.name, n)
		}
		if d := linesCounted()[levelFatal] - before[levelFatal]; d != 1 {
			t.Errorf("%s: expected lines_total{level=\"fatal\"} to grow by 1, grew by %v", test.name, d)
		}
		evs := events(t, client)
		if len(evs) != 1 {
			t.Fatalf("%s: expected 1 event, got %d", test.name, len(evs))
		}
		ev := evs[0]
		if ev.Reason != "CoreDNSFatal" || ev.Type != "Warning" || ev.Message != "plugin/errors: no way 100%d" || ev.Count != 1 {
			t.Errorf("%s: expected a CoreDNSFatal Warning %q with count 1, got %s %s %q with count %d",
				test.name, "plugin/errors: no way 100%d", ev.Reason, ev.Type, ev.Message, ev.Count)
		}
	}
}

func TestListenerLevelFilter(t *testing.T) {
	p, client, _ := newTestPipeline(t, testConfig(levelsOf(levelError), 1, 1, 16))
	before := linesCounted()

	p.Debug("plugin/errors: ", "x")
	p.Debugf("plugin/errors: ", "%s", "x")
	p.Info("plugin/errors: ", "x")
	p.Infof("plugin/errors: ", "%s", "x")
	p.Warning("plugin/errors: ", "x")
	p.Warningf("plugin/errors: ", "%s", "x")
	p.Fatal("plugin/errors: ", "x")
	p.Fatalf("plugin/errors: ", "%s", "x")

	if n := len(p.lines); n != 0 {
		t.Errorf("expected no line from disabled levels, got %d", n)
	}
	if after := linesCounted(); after != before {
		t.Errorf("expected lines_total unchanged, went from %v to %v", before, after)
	}
	if evs := events(t, client); len(evs) != 0 {
		t.Errorf("expected no event, got %d", len(evs))
	}

	p.Error("plugin/errors: ", "x")
	if ln := nextLine(t, p); ln.level != levelError {
		t.Errorf("expected an error line, got %s", ln.level)
	}

	// Levels follow apply, as on a reload.
	p.apply(testConfig(levelsOf(levelInfo), 1, 1, 16), client.client)
	p.Error("plugin/errors: ", "x")
	p.Info("plugin/errors: ", "x")
	if ln := nextLine(t, p); ln.level != levelInfo {
		t.Errorf("expected an info line, got %s", ln.level)
	}
	if n := len(p.lines); n != 0 {
		t.Errorf("expected no more lines, got %d", n)
	}
}

func TestListenerOwnPrefix(t *testing.T) {
	p, client, _ := newTestPipeline(t, testConfig(allLevels, 1, 1, 16))
	before := linesCounted()

	p.Error(ownPrefix, "x")
	p.Errorf(ownPrefix, "%s", "x")
	p.Warning("plugin/k8s_event: ", "x")
	p.Fatal(ownPrefix, "x")

	if n := len(p.lines); n != 0 {
		t.Errorf("expected the plugin's own lines to be ignored, got %d", n)
	}
	if after := linesCounted(); after != before {
		t.Errorf("expected lines_total unchanged, went from %v to %v", before, after)
	}
	if evs := events(t, client); len(evs) != 0 {
		t.Errorf("expected no event, got %d", len(evs))
	}
}

func TestListenerKeepsEachText(t *testing.T) {
	p, _, _ := newTestPipeline(t, testConfig(allLevels, 1, 1, 16))
	p.Error("plugin/errors: ", "first")
	p.Error("plugin/errors: ", "second")
	p.Error("plugin/errors: ", strings.Repeat("z", 100<<10))
	p.Error("plugin/errors: ", "third")
	for _, want := range []string{"first", "second", strings.Repeat("z", 100<<10), "third"} {
		if ln := nextLine(t, p); ln.text != "plugin/errors: "+want {
			t.Errorf("expected %.40q, got %.40q", "plugin/errors: "+want, ln.text)
		}
	}
}

func TestListenerQueueFull(t *testing.T) {
	p, _, _ := newTestPipeline(t, testConfig(levelsOf(levelError), 1, 1, 16))
	for range cap(p.lines) {
		p.Error("plugin/errors: ", "x")
	}
	dropped := testutil.ToFloat64(droppedTotal[dropQueueFull])
	counted := testutil.ToFloat64(linesTotal[levelError])

	done := make(chan struct{})
	go func() {
		p.Errorf("plugin/errors: ", "%s", "one too many")
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the listener blocked on a full queue")
	}

	if d := testutil.ToFloat64(droppedTotal[dropQueueFull]) - dropped; d != 1 {
		t.Errorf("expected dropped_total{reason=%q} to grow by 1, grew by %v", dropQueueFull, d)
	}
	if d := testutil.ToFloat64(linesTotal[levelError]) - counted; d != 1 {
		t.Errorf("expected lines_total{level=\"error\"} to grow by 1, grew by %v", d)
	}
	if n := len(p.lines); n != cap(p.lines) {
		t.Errorf("expected the queue to stay at %d, got %d", cap(p.lines), n)
	}
}

// TestListenerRegistered goes through CoreDNS's own plugin logger.
func TestListenerRegistered(t *testing.T) {
	p, _, _ := newTestPipeline(t, testConfig(levelsOf(levelError, levelWarning), 1, 1, 16))
	out := log.Writer()
	log.SetOutput(io.Discard)
	if err := clog.RegisterListener(p); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		clog.DeregisterListener(p)
		log.SetOutput(out)
	})

	logger := clog.NewWithPlugin("errors")
	logger.Errorf("%d %s", 2, "x")
	logger.Error(notAFormat)
	logger.Warning("example.org. ", 3)
	logger.Info("not enabled")
	clog.NewWithPlugin("k8s_event").Error("not for events")

	for _, want := range []struct {
		level level
		text  string
	}{
		{levelError, "plugin/errors: 2 x"},
		{levelError, "plugin/errors: 100%d done %s"},
		{levelWarning, "plugin/errors: example.org. 3"},
	} {
		ln := nextLine(t, p)
		if ln.level != want.level || ln.plugin != "plugin/errors: " || ln.text != want.text {
			t.Errorf("expected %s %q, got %s %q (plugin %q)", want.level, want.text, ln.level, ln.text, ln.plugin)
		}
	}
	if n := len(p.lines); n != 0 {
		t.Errorf("expected no more lines, got %d", n)
	}
}

func TestEventMessage(t *testing.T) {
	tests := []struct {
		name     string
		input    string
		expected string
	}{
		{"empty", "", ""},
		{"short", "plugin/errors: 2 example.org. A: i/o timeout", "plugin/errors: 2 example.org. A: i/o timeout"},
		{"percent", "plugin/errors: 100%d done %s", "plugin/errors: 100%d done %s"},
		{"trailing newline", "plugin/errors: x\n", "plugin/errors: x"},
		{"trailing newlines", "plugin/errors: x\n\n", "plugin/errors: x"},
		{"inner newline", "a\nb", "a\nb"},
		{"invalid UTF-8", "a\xffb", "a\uFFFDb"},
		{"invalid UTF-8 run", "a\xff\xfe\xfdb", "a\uFFFDb"},
		{"truncated rune", "a\xe6\x97", "a\uFFFD"},
		{"NUL", "a\x00b", "a\uFFFDb"},
		{"NULs and invalid UTF-8", "\x00\xff\x00", "\uFFFD\uFFFD\uFFFD"},
		{"exactly the limit", strings.Repeat("x", maxMessageBytes), strings.Repeat("x", maxMessageBytes)},
		{"the limit and a newline", strings.Repeat("x", maxMessageBytes) + "\n", strings.Repeat("x", maxMessageBytes)},
		{"one over the limit", strings.Repeat("x", maxMessageBytes+1), strings.Repeat("x", maxMessageBytes-len(truncMarker)) + truncMarker},
	}
	for _, test := range tests {
		if got := eventMessage(test.input); got != test.expected {
			t.Errorf("%s: expected %.60q, got %.60q", test.name, test.expected, got)
		}
	}
}

func TestEventMessageTruncated(t *testing.T) {
	tests := []struct {
		name  string
		input string
	}{
		{"ASCII", strings.Repeat("x", 5000)},
		{"2-byte runes", strings.Repeat("é", 2500)},
		{"3-byte runes", strings.Repeat("日", 1700)},
		{"4-byte runes", strings.Repeat("😀", 1300)},
		{"mixed runes", strings.Repeat("aé日😀", 400)},
		{"prefix shifts the runes", "plugin/errors: " + strings.Repeat("日", 1700)},
		{"trailing newline", strings.Repeat("é", 2500) + "\n"},
	}
	for _, test := range tests {
		got := eventMessage(test.input)
		if len(got) > maxMessageBytes {
			t.Errorf("%s: expected at most %d bytes, got %d", test.name, maxMessageBytes, len(got))
		}
		if len(got) < maxMessageBytes-(utf8.UTFMax-1) {
			t.Errorf("%s: expected the cut to lose less than a rune, got %d bytes", test.name, len(got))
		}
		if !utf8.ValidString(got) {
			t.Errorf("%s: expected valid UTF-8, got %q", test.name, got[len(got)-len(truncMarker)-8:])
		}
		kept, ok := strings.CutSuffix(got, truncMarker)
		if !ok {
			t.Errorf("%s: expected the message to end with %q, got %q", test.name, truncMarker, got[max(0, len(got)-20):])
		}
		if !strings.HasPrefix(test.input, kept) {
			t.Errorf("%s: expected the kept part to be a prefix of the input", test.name)
		}
	}
}

// NUL bytes grow threefold into U+FFFD: the limit holds after replacing.
func TestEventMessageReplacedThenTruncated(t *testing.T) {
	for _, input := range []string{strings.Repeat("\x00", 1000), strings.Repeat("a\xff", 1000)} {
		got := eventMessage(input)
		if len(got) > maxMessageBytes || !utf8.ValidString(got) || strings.IndexByte(got, 0) >= 0 {
			t.Errorf("%.20q: expected at most %d bytes of valid UTF-8 without NUL, got %d bytes", input, maxMessageBytes, len(got))
		}
		if !strings.HasSuffix(got, truncMarker) {
			t.Errorf("%.20q: expected the message to end with %q", input, truncMarker)
		}
	}
}

// nameTime is the time encoded in an event name.
func nameTime(t *testing.T, name string) int64 {
	t.Helper()
	i := strings.LastIndexByte(name, '.')
	n, err := strconv.ParseInt(name[i+1:], 16, 64)
	if err != nil {
		t.Fatalf("name %q: %v", name, err)
	}
	return n
}

func TestEventNamesIncrease(t *testing.T) {
	var names eventNames
	seen := map[string]bool{}
	last := int64(0)
	times := []time.Time{epoch, epoch, epoch, epoch.Add(-time.Hour), epoch, epoch.Add(time.Nanosecond), epoch.Add(time.Second), epoch.Add(time.Second)}
	for i, now := range times {
		name := names.next("coredns-0", now)
		if seen[name] {
			t.Errorf("call %d: name %q given twice", i, name)
		}
		seen[name] = true
		if !strings.HasPrefix(name, "coredns-0.") {
			t.Errorf("call %d: expected %q to start with %q", i, name, "coredns-0.")
		}
		n := nameTime(t, name)
		if n <= last {
			t.Errorf("call %d: expected %q to sort after the last name (%x)", i, name, last)
		}
		if n < now.UnixNano() {
			t.Errorf("call %d: expected %q not to be before %v", i, name, now)
		}
		last = n
	}
	if first := names.next("x", epoch.Add(time.Minute)); nameTime(t, first) != epoch.Add(time.Minute).UnixNano() {
		t.Errorf("expected the name to follow the clock once it is ahead, got %q", first)
	}
}

func TestEventNamesLong(t *testing.T) {
	long := func(sep string) string { return strings.Repeat("a", 235) + sep + strings.Repeat("b", 14) }
	tests := []struct {
		name   string
		object string
	}{
		{"short", "coredns-0"},
		{"253 letters", strings.Repeat("a", 253)},
		{"250 letters", strings.Repeat("a", 250)},
		{"cut on a dash", long("-")},
		{"cut on a dot", long(".")},
		{"labels", strings.Repeat(strings.Repeat("c", 62)+".", 4)[:250]},
	}
	for _, test := range tests {
		if errs := validation.IsDNS1123Subdomain(test.object); len(errs) != 0 {
			t.Fatalf("%s: the object name is not valid itself: %v", test.name, errs)
		}
		var names eventNames
		got := map[string]bool{}
		for range 3 {
			name := names.next(test.object, epoch)
			if len(name) > maxNameLen {
				t.Errorf("%s: expected at most %d characters, got %d", test.name, maxNameLen, len(name))
			}
			if errs := validation.IsDNS1123Subdomain(name); len(errs) != 0 {
				t.Errorf("%s: %q is not a DNS subdomain: %v", test.name, name, errs)
			}
			if got[name] {
				t.Errorf("%s: name %q given twice", test.name, name)
			}
			got[name] = true
		}
	}
}

func TestEventNamesConcurrent(t *testing.T) {
	var names eventNames
	const goroutines, each = 4, 500
	got := make(chan string, goroutines*each)
	var wg sync.WaitGroup
	for range goroutines {
		wg.Go(func() {
			for range each {
				got <- names.next("coredns-0", epoch)
			}
		})
	}
	wg.Wait()
	close(got)
	seen := map[string]bool{}
	for name := range got {
		if seen[name] {
			t.Fatalf("name %q given twice", name)
		}
		seen[name] = true
	}
}
