package k8s_event

import (
	"fmt"
	"io"
	"log"
	"strings"
	"testing"
	"time"

	clog "github.com/coredns/coredns/plugin/pkg/log"
	"github.com/prometheus/client_golang/prometheus/testutil"
	clocktesting "k8s.io/utils/clock/testing"
)

var _ clog.Listener = (*listener)(nil)

// notAFormat is a log message with verbs in it, as a DNS name or an error text
// can have; a variable, so that vet lets it through a Print call.
var notAFormat = "100%d done %s"

// testListener is a listener on a fake clock at epoch, taking levels; the
// fatal lines it hands over are collected in fatals.
func testListener(levels levelSet) (*listener, *[]line) {
	var fatals []line
	h := newListener(clocktesting.NewFakeClock(epoch), func(ln line) { fatals = append(fatals, ln) })
	h.levels.Store(uint32(levels))
	return h, &fatals
}

// nextLine takes the line waiting on h.lines, failing when there is none.
func nextLine(t *testing.T, h *listener) line {
	t.Helper()
	select {
	case ln := <-h.lines:
		return ln
	default:
		t.Fatal("expected a line on the hand-off, found none")
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
	h, _ := testListener(defaultLevels)
	if got := h.Name(); got != "k8s_event" {
		t.Errorf("expected name %q, got %q", "k8s_event", got)
	}
}

func TestListenerMethods(t *testing.T) {
	const prefix = "plugin/errors: "
	tests := []struct {
		name     string
		log      func(h *listener)
		level    level
		expected string
	}{
		{"Debug", func(h *listener) { h.Debug(prefix, "a", 1, 2, "b") }, levelDebug, prefix + fmt.Sprint("a", 1, 2, "b")},
		{"Debugf", func(h *listener) { h.Debugf(prefix, "%d %s", 2, "x") }, levelDebug, prefix + "2 x"},
		{"Info", func(h *listener) { h.Info(prefix, "a", 1, 2, "b") }, levelInfo, prefix + fmt.Sprint("a", 1, 2, "b")},
		{"Infof", func(h *listener) { h.Infof(prefix, "%d %s", 2, "x") }, levelInfo, prefix + "2 x"},
		{"Warning", func(h *listener) { h.Warning(prefix, "a", 1, 2, "b") }, levelWarning, prefix + fmt.Sprint("a", 1, 2, "b")},
		{"Warningf", func(h *listener) { h.Warningf(prefix, "%d %s", 2, "x") }, levelWarning, prefix + "2 x"},
		{"Error", func(h *listener) { h.Error(prefix, "a", 1, 2, "b") }, levelError, prefix + fmt.Sprint("a", 1, 2, "b")},
		{"Errorf", func(h *listener) { h.Errorf(prefix, "%d %s", 2, "x") }, levelError, prefix + "2 x"},
		{"Error verbatim", func(h *listener) { h.Error(prefix, notAFormat) }, levelError, prefix + "100%d done %s"},
		{"Errorf missing operand", func(h *listener) { h.Errorf(prefix, "%d") }, levelError, prefix + "%!d(MISSING)"},
		{"Error no operand", func(h *listener) { h.Error(prefix) }, levelError, prefix},
	}
	for _, test := range tests {
		h, fatals := testListener(all)
		before := linesCounted()
		test.log(h)

		ln := nextLine(t, h)
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
		if n := len(h.lines); n != 0 {
			t.Errorf("%s: expected one line, got %d more", test.name, n)
		}
		if len(*fatals) != 0 {
			t.Errorf("%s: a line handed over as fatal", test.name)
		}
		if d := linesCounted()[test.level] - before[test.level]; d != 1 {
			t.Errorf("%s: expected lines_total{level=%q} to grow by 1, grew by %v", test.name, test.level, d)
		}
	}
}

// A fatal line is written at once, in the goroutine that logged it:
// CoreDNS exits when the listeners return.
func TestListenerFatal(t *testing.T) {
	for _, test := range []struct {
		name string
		log  func(h *harness)
	}{
		{"Fatal", func(h *harness) { h.Fatal("plugin/errors: ", "no ", "way 100%d") }},
		{"Fatalf", func(h *harness) { h.Fatalf("plugin/errors: ", "no way %d%%d", 100) }},
	} {
		h, api, _ := newTestHarness(t, testConfig(all, 1, 1, 16))
		before := linesCounted()
		test.log(h)

		if n := len(h.lines); n != 0 {
			t.Errorf("%s: expected no line queued, got %d", test.name, n)
		}
		if d := linesCounted()[levelFatal] - before[levelFatal]; d != 1 {
			t.Errorf("%s: expected lines_total{level=\"fatal\"} to grow by 1, grew by %v", test.name, d)
		}
		evs := events(t, api)
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
	h, api, _ := newTestHarness(t, testConfig(levelsOf(levelError), 1, 1, 16))
	before := linesCounted()

	h.Debug("plugin/errors: ", "x")
	h.Debugf("plugin/errors: ", "%s", "x")
	h.Info("plugin/errors: ", "x")
	h.Infof("plugin/errors: ", "%s", "x")
	h.Warning("plugin/errors: ", "x")
	h.Warningf("plugin/errors: ", "%s", "x")
	h.Fatal("plugin/errors: ", "x")
	h.Fatalf("plugin/errors: ", "%s", "x")

	if n := len(h.lines); n != 0 {
		t.Errorf("expected no line from disabled levels, got %d", n)
	}
	if after := linesCounted(); after != before {
		t.Errorf("expected lines_total unchanged, went from %v to %v", before, after)
	}
	if evs := events(t, api); len(evs) != 0 {
		t.Errorf("expected no event, got %d", len(evs))
	}

	h.Error("plugin/errors: ", "x")
	if ln := nextLine(t, h.listener); ln.level != levelError {
		t.Errorf("expected an error line, got %s", ln.level)
	}

	// Levels follow a reload.
	h.apply(testConfig(levelsOf(levelInfo), 1, 1, 16))
	h.Error("plugin/errors: ", "x")
	h.Info("plugin/errors: ", "x")
	if ln := nextLine(t, h.listener); ln.level != levelInfo {
		t.Errorf("expected an info line, got %s", ln.level)
	}
	if n := len(h.lines); n != 0 {
		t.Errorf("expected no more lines, got %d", n)
	}
}

// TestListenerOwnPrefix: a line with the plugin's own prefix is ignored,
// so that no event can ever beget another.
func TestListenerOwnPrefix(t *testing.T) {
	h, api, _ := newTestHarness(t, testConfig(all, 1, 1, 16))
	before := linesCounted()

	h.Error(ownPrefix, "x")
	h.Errorf(ownPrefix, "%s", "x")
	h.Warning("plugin/k8s_event: ", "x")
	h.Fatal(ownPrefix, "x")

	if n := len(h.lines); n != 0 {
		t.Errorf("expected the plugin's own lines to be ignored, got %d", n)
	}
	if after := linesCounted(); after != before {
		t.Errorf("expected lines_total unchanged, went from %v to %v", before, after)
	}
	if evs := events(t, api); len(evs) != 0 {
		t.Errorf("expected no event, got %d", len(evs))
	}
}

func TestListenerKeepsEachText(t *testing.T) {
	h, _ := testListener(all)
	h.Error("plugin/errors: ", "first")
	h.Error("plugin/errors: ", "second")
	h.Error("plugin/errors: ", strings.Repeat("z", 100<<10))
	h.Error("plugin/errors: ", "third")
	for _, want := range []string{"first", "second", strings.Repeat("z", 100<<10), "third"} {
		if ln := nextLine(t, h); ln.text != "plugin/errors: "+want {
			t.Errorf("expected %.40q, got %.40q", "plugin/errors: "+want, ln.text)
		}
	}
}

// TestListenerQueueFull: the hand-off never blocks the goroutine that
// logs; a line that finds it full is dropped, and counted.
func TestListenerQueueFull(t *testing.T) {
	h, _ := testListener(levelsOf(levelError))
	for range cap(h.lines) {
		h.Error("plugin/errors: ", "x")
	}
	dropped := testutil.ToFloat64(droppedTotal[dropQueueFull])
	counted := testutil.ToFloat64(linesTotal[levelError])

	done := make(chan struct{})
	go func() {
		h.Errorf("plugin/errors: ", "%s", "one too many")
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the listener blocked on a full queue")
	}

	if d := testutil.ToFloat64(droppedTotal[dropQueueFull]) - dropped; d != 1 {
		t.Errorf("expected dropped_total{cause=%q} to grow by 1, grew by %v", dropQueueFull, d)
	}
	if d := testutil.ToFloat64(linesTotal[levelError]) - counted; d != 1 {
		t.Errorf("expected lines_total{level=\"error\"} to grow by 1, grew by %v", d)
	}
	if n := len(h.lines); n != cap(h.lines) {
		t.Errorf("expected the queue to stay at %d, got %d", cap(h.lines), n)
	}
}

// TestListenerRegistered goes through CoreDNS's own plugin logger.
func TestListenerRegistered(t *testing.T) {
	h, _ := testListener(levelsOf(levelError, levelWarning))
	out := log.Writer()
	log.SetOutput(io.Discard)
	if err := clog.RegisterListener(h); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		clog.DeregisterListener(h)
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
		ln := nextLine(t, h)
		if ln.level != want.level || ln.plugin != "plugin/errors: " || ln.text != want.text {
			t.Errorf("expected %s %q, got %s %q (plugin %q)", want.level, want.text, ln.level, ln.text, ln.plugin)
		}
	}
	if n := len(h.lines); n != 0 {
		t.Errorf("expected no more lines, got %d", n)
	}
}
