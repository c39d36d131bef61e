package k8s_event

import (
	"sync/atomic"
	"time"

	"k8s.io/utils/clock"
)

// level is a CoreDNS log level that can become an event reason.
type level uint8

const (
	levelDebug level = iota
	levelInfo
	levelWarning
	levelError
	levelFatal
	numLevels
)

var levelNames = [numLevels]string{"debug", "info", "warning", "error", "fatal"}
var levelReasons = [numLevels]string{"CoreDNSDebug", "CoreDNSInfo", "CoreDNSWarning",
	"CoreDNSError", "CoreDNSFatal"}

func (l level) String() string { return levelNames[l] }
func (l level) reason() string { return levelReasons[l] }

func (l level) eventType() string {
	if l <= levelInfo {
		return "Normal"
	}
	return "Warning"
}

type levelSet uint32

func (s levelSet) has(l level) bool { return s&(1<<l) != 0 }

func (s levelSet) String() string {
	out := ""
	for l := level(0); l < numLevels; l++ {
		if s.has(l) {
			if out != "" {
				out += " "
			}
			out += l.String()
		}
	}
	return out
}

// ownPrefix is how CoreDNS names this plugin in a plugin logger's line. The plugin never logs
// through one, but a line with this prefix is ignored all the same: no event can beget another.
const ownPrefix = "plugin/" + pluginName + ": "

// line is one captured log line on its way to the scheduler.
type line struct {
	level  level
	plugin string // as CoreDNS passes it: "plugin/NAME: "
	text   string // the whole line without its level, "plugin/NAME: message"
	at     time.Time
}

// lineBuffer is the size of the listener's formatting buffer, on the stack of the goroutine that
// logs: longer lines go to the heap. A query's goroutine often comes to its first log call with its
// stack nearly full and grows it there. The buffer makes that happen as take starts, with few
// frames to copy, rather than deep in a formatter; CoreDNS's formatting then finds the room.
const lineBuffer = 512

// listener is the CoreDNS log listener: it runs inside whatever goroutine logged, often a DNS
// query, and only hands lines to the scheduler's goroutine. A fatal line, which cannot wait
// (CoreDNS exits right after the listeners return), goes to fatal, which writes it at once.
type listener struct {
	levels atomic.Uint32 // levelSet
	clock  clock.PassiveClock
	lines  chan line
	fatal  func(line)
}

func newListener(clk clock.PassiveClock, fatal func(line)) *listener {
	return &listener{clock: clk, lines: make(chan line, queueSize), fatal: fatal}
}

// queueSize bounds the lines waiting between the listener and the scheduler.
const queueSize = 1024

// capture is the listener's only work. A line at a level that is off costs a bit test: capture is
// small enough to be inlined into each listener method.
func (h *listener) capture(l level, plugin string, format string, formatted bool, v []any) {
	if levelSet(h.levels.Load()).has(l) {
		h.take(l, plugin, format, formatted, v)
	}
}

// take formats a line and hands it off without blocking: no lock, no I/O, never a log line.
func (h *listener) take(l level, plugin string, format string, formatted bool, v []any) {
	if plugin == ownPrefix {
		return
	}
	var stack [lineBuffer]byte
	buf := appendLine(append(stack[:0], plugin...), format, formatted, v)
	ln := line{level: l, plugin: plugin, text: string(buf), at: h.clock.Now()}
	linesTotal[l].Inc()
	if l == levelFatal {
		h.fatal(ln)
		return
	}
	select {
	case h.lines <- ln:
	default:
		droppedTotal[dropQueueFull].Inc()
	}
}

// The methods below make a listener a CoreDNS log listener (plugin/pkg/log.Listener). One name
// for the whole process: registering again replaces, it never adds a second listener.
func (h *listener) Name() string { return pluginName }

func (h *listener) Debug(plugin string, v ...any) { h.capture(levelDebug, plugin, "", false, v) }
func (h *listener) Debugf(plugin, format string, v ...any) {
	h.capture(levelDebug, plugin, format, true, v)
}

func (h *listener) Info(plugin string, v ...any) { h.capture(levelInfo, plugin, "", false, v) }
func (h *listener) Infof(plugin, format string, v ...any) {
	h.capture(levelInfo, plugin, format, true, v)
}

func (h *listener) Warning(plugin string, v ...any) {
	h.capture(levelWarning, plugin, "", false,
		v)
}
func (h *listener) Warningf(plugin, format string, v ...any) {
	h.capture(levelWarning, plugin, format, true, v)
}

func (h *listener) Error(plugin string, v ...any) { h.capture(levelError, plugin, "", false, v) }
func (h *listener) Errorf(plugin, format string, v ...any) {
	h.capture(levelError, plugin, format, true, v)
}

func (h *listener) Fatal(plugin string, v ...any) { h.capture(levelFatal, plugin, "", false, v) }
func (h *listener) Fatalf(plugin, format string, v ...any) {
	h.capture(levelFatal, plugin, format, true, v)
}
