package k8s_event

import (
	"time"
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

var levelReasons = [numLevels]string{"CoreDNSDebug", "CoreDNSInfo", "CoreDNSWarning", "CoreDNSError", "CoreDNSFatal"}

func (l level) String() string { return levelNames[l] }

// reason is the event reason for lines of this level.
func (l level) reason() string { return levelReasons[l] }

// eventType is Normal for debug and info lines and Warning for the rest.
func (l level) eventType() string {
	if l <= levelInfo {
		return "Normal"
	}
	return "Warning"
}

// levelSet is a bit set of levels.
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

// ownPrefix is how CoreDNS names this plugin in a plugin logger's line. The
// plugin never logs through a plugin logger, but a line carrying this prefix is
// ignored all the same, so that no event can ever beget another.
const ownPrefix = "plugin/" + pluginName + ": "

// line is one captured log line on its way to the correlator.
type line struct {
	level  level
	plugin string // as CoreDNS passes it: "plugin/NAME: "
	text   string // the whole line without its level, "plugin/NAME: message"
	at     time.Time
}

// lineBuffer is the size of the listener's formatting buffer, on the stack
// of the goroutine that logs: longer lines go to the heap. A query's
// goroutine often comes to its first log call with its stack nearly full
// and grows it there. The buffer makes that happen as take starts, with few
// frames to walk in the copy, rather than deep in a formatter; CoreDNS's own
// formatting of the line then finds the room.
const lineBuffer = 512

// capture is the listener's only work. It runs inside whatever goroutine
// logged, often a DNS query. A line at a level that is off costs a bit test:
// capture is small enough to be inlined into each listener method.
func (p *pipeline) capture(l level, plugin string, format string, formatted bool, v []any) {
	if levelSet(p.levels.Load()).has(l) {
		p.take(l, plugin, format, formatted, v)
	}
}

// take formats a line and hands it off without blocking. It takes no lock,
// does no I/O and never logs.
func (p *pipeline) take(l level, plugin string, format string, formatted bool, v []any) {
	if plugin == ownPrefix {
		return
	}
	var stack [lineBuffer]byte
	buf := appendLine(append(stack[:0], plugin...), format, formatted, v)
	ln := line{level: l, plugin: plugin, text: string(buf), at: p.clock.Now()}
	linesTotal[l].Inc()

	if l == levelFatal {
		// CoreDNS calls os.Exit right after the listeners return.
		p.writeFatal(ln)
		return
	}
	select {
	case p.lines <- ln:
	default:
		droppedTotal[dropQueueFull].Inc()
	}
}

// The methods below make a pipeline a CoreDNS log listener (plugin/pkg/log.Listener).

// Name implements log.Listener. One name for the whole process: registering
// again replaces, it never adds a second listener.
func (p *pipeline) Name() string { return pluginName }

// Debug implements log.Listener.
func (p *pipeline) Debug(plugin string, v ...any) { p.capture(levelDebug, plugin, "", false, v) }

// Debugf implements log.Listener.
func (p *pipeline) Debugf(plugin, format string, v ...any) {
	p.capture(levelDebug, plugin, format, true, v)
}

// Info implements log.Listener.
func (p *pipeline) Info(plugin string, v ...any) { p.capture(levelInfo, plugin, "", false, v) }

// Infof implements log.Listener.
func (p *pipeline) Infof(plugin, format string, v ...any) {
	p.capture(levelInfo, plugin, format, true, v)
}

// Warning implements log.Listener.
func (p *pipeline) Warning(plugin string, v ...any) { p.capture(levelWarning, plugin, "", false, v) }

// Warningf implements log.Listener.
func (p *pipeline) Warningf(plugin, format string, v ...any) {
	p.capture(levelWarning, plugin, format, true, v)
}

// Error implements log.Listener.
func (p *pipeline) Error(plugin string, v ...any) { p.capture(levelError, plugin, "", false, v) }

// Errorf implements log.Listener.
func (p *pipeline) Errorf(plugin, format string, v ...any) {
	p.capture(levelError, plugin, format, true, v)
}

// Fatal implements log.Listener.
func (p *pipeline) Fatal(plugin string, v ...any) { p.capture(levelFatal, plugin, "", false, v) }

// Fatalf implements log.Listener.
func (p *pipeline) Fatalf(plugin, format string, v ...any) {
	p.capture(levelFatal, plugin, format, true, v)
}
