package k8s_event

import (
	"fmt"
	"io"
	"log"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	clog "github.com/coredns/coredns/plugin/pkg/log"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// The listener runs inside DNS queries: these benchmarks give its cost per
// log line, with the scheduler and the writers running, as in CoreDNS. They
// call it through the log.Listener interface with the arguments in a slice,
// as CoreDNS's plugin loggers do.
//
//	go test -run '^$' -bench . -benchmem -count 3 .

// startedPipeline returns a running pipeline, stopped when the benchmark ends.
func startedPipeline(b *testing.B, cfg config) *pipeline {
	p, _, _ := newTestPipeline(b, cfg)
	p.start()
	b.Cleanup(func() { p.stop(time.Second) })
	return p
}

// pace yields until the queue is at most half full. The benchmark loops
// never block, and with as many of them as there are CPUs the scheduler
// would run only when the scheduler preempts one: the queue would stay full
// and the benchmark would time the drop path. A DNS server's goroutines wait
// on the network; pacing stands for that, and charges the correlator's work
// to the lines it takes: ns/op is then the cost of a line at the highest
// rate the pipeline sustains.
func pace(p *pipeline) {
	for len(p.listener.lines) > queueSize/2 {
		runtime.Gosched()
	}
}

// settle waits for the correlator to take every queued line, so that a
// benchmark pays for the lines it produced. It reports the lines the
// listener dropped all the same (dropped/op: dropped lines cost less than
// taken ones and flatter ns/op), and how often a writer found the bucket
// empty (throttled/op: near 0 when writers do not wake for every line).
func settle(b *testing.B, p *pipeline, droppedBefore, throttledBefore float64) {
	for len(p.listener.lines) > 0 {
		runtime.Gosched()
	}
	b.StopTimer()
	if d := testutil.ToFloat64(droppedTotal[dropQueueFull]) - droppedBefore; d > 0 {
		b.ReportMetric(d/float64(b.N), "dropped/op")
	}
	if d := testutil.ToFloat64(throttledTotal.WithLabelValues(levelError.reason())) - throttledBefore; d > 0 {
		b.ReportMetric(d/float64(b.N), "throttled/op")
	}
}

// goroutineIDs gives each benchmark goroutine its own range of line numbers.
var goroutineIDs atomic.Int64

// BenchmarkListenerDisabledLevel is the cost of a line at a level k8s_event
// does not take: what every query pays when a plugin logs at that level.
func BenchmarkListenerDisabledLevel(b *testing.B) {
	p, _, _ := newTestPipeline(b, testConfig(levelsOf(levelError), 1, 25, 4096))
	var l clog.Listener = p.listener
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		v := []any{"x"}
		for pb.Next() {
			l.Info("plugin/errors: ", v...)
		}
	})
	b.StopTimer()
	if n := len(p.listener.lines); n != 0 {
		b.Fatalf("expected no line queued, got %d", n)
	}
}

// BenchmarkListenerHandOff is what a query pays for a new line: the
// listener formats it and hands it off, with no goroutine competing for the
// CPU, so the figure is steady enough to compare builds. The loop empties
// the hand-off itself when it is full (its receives are counted too).
func BenchmarkListenerHandOff(b *testing.B) {
	p, _, _ := newTestPipeline(b, testConfig(levelsOf(levelError), 1, 25, 4096))
	var l clog.Listener = p.listener
	v := []any{nil}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		v[0] = i // boxing i is the logging plugin's allocation, not the listener's
		l.Errorf("plugin/errors: ", "%d example.org. A: i/o timeout", v...)
		if len(p.listener.lines) == queueSize {
			for range queueSize {
				<-p.listener.lines
			}
		}
	}
}

// BenchmarkListenerNewLines logs a new line each time, as a plugin that puts
// the query name or the upstream's error in its message does.
func BenchmarkListenerNewLines(b *testing.B) {
	p := startedPipeline(b, testConfig(levelsOf(levelError), 1, 25, 4096))
	var l clog.Listener = p.listener
	dropped := testutil.ToFloat64(droppedTotal[dropQueueFull])
	throttled := testutil.ToFloat64(throttledTotal.WithLabelValues(levelError.reason()))
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := goroutineIDs.Add(1) << 32
		v := []any{nil}
		for pb.Next() {
			i++
			v[0] = i // boxing i is the logging plugin's allocation, not the listener's
			pace(p)
			l.Errorf("plugin/errors: ", "%d example.org. A: i/o timeout", v...)
		}
	})
	settle(b, p, dropped, throttled)
}

// BenchmarkListenerThrottled logs one line over and over while the bucket of
// its reason is empty: each line only adds to a count.
func BenchmarkListenerThrottled(b *testing.B) {
	cfg := testConfig(levelsOf(levelError), 1, 25, 4096)
	p := startedPipeline(b, cfg)
	var l clog.Listener = p.listener
	dropped := testutil.ToFloat64(droppedTotal[dropQueueFull])
	throttled := testutil.ToFloat64(throttledTotal.WithLabelValues(levelError.reason()))
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		v := []any{"2 example.org. A: read udp 10.0.0.1:43->10.0.0.2:53: i/o timeout"}
		for pb.Next() {
			pace(p)
			l.Error("plugin/errors: ", v...)
		}
	})
	settle(b, p, dropped, throttled)
}

// BenchmarkBaseline is a CoreDNS plugin logger call, writing to io.Discard,
// without and with k8s_event listening: the pairs give the listener's cost
// as a ratio of what logging costs anyway.
func BenchmarkBaseline(b *testing.B) {
	out := log.Writer()
	log.SetOutput(io.Discard)
	b.Cleanup(func() { log.SetOutput(out) })
	logger := clog.NewWithPlugin("errors")

	for _, lines := range []struct {
		name string
		log  func(i int)
	}{
		{"repeat", func(int) { logger.Error("2 example.org. A: read udp 10.0.0.1:43->10.0.0.2:53: i/o timeout") }},
		{"new", func(i int) { logger.Errorf("%d example.org. A: read udp 10.0.0.1:43->10.0.0.2:53: i/o timeout", i) }},
	} {
		b.Run(lines.name+"/logger", func(b *testing.B) {
			b.ReportAllocs()
			for i := range b.N {
				lines.log(i)
			}
		})
		b.Run(lines.name+"/logger+k8s_event", func(b *testing.B) {
			p := startedPipeline(b, testConfig(levelsOf(levelError, levelWarning), defaultQPS, defaultBurst, defaultCacheSize))
			if err := clog.RegisterListener(p.listener); err != nil {
				b.Fatal(err)
			}
			dropped := testutil.ToFloat64(droppedTotal[dropQueueFull])
			throttled := testutil.ToFloat64(throttledTotal.WithLabelValues(levelError.reason()))
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				pace(p)
				lines.log(i)
			}
			settle(b, p, dropped, throttled)
		})
	}
}

// BenchmarkCacheBytesPerEvent fills a cache of 4096 events (the default
// CACHESIZE) with distinct lines of a typical length (B/line), as many
// plugins log them, and reports the heap each cached event holds, its
// message included: CACHESIZE times B/event is what the cache takes; a
// longer message adds its length, up to the 1 KiB cap.
func BenchmarkCacheBytesPerEvent(b *testing.B) {
	const n = defaultCacheSize
	for range b.N {
		h := newHarness(b, testConfig(levelsOf(levelError), defaultQPS, defaultBurst, n))
		clk := h.clk
		lines := make([]line, n)
		for i := range lines {
			plugin := fmt.Sprintf("plugin/p%d: ", i) // one plugin each: no combining
			lines[i] = line{level: levelError, plugin: plugin, at: clk.Now(),
				text: plugin + fmt.Sprintf("2 q%06d.example.org. A: read udp 10.0.0.5:41234->10.0.0.2:53: i/o timeout", i)}
		}
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		for _, ln := range lines {
			ln.text = strings.Clone(ln.text) // the listener's allocation, which the event keeps
			h.observe(ln)
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/n, "B/event")
		b.ReportMetric(float64(len(lines[0].text)), "B/line")
		runtime.KeepAlive(h)
	}
}
