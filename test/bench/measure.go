package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
)

// The k8s_event blocks of the measurements.
const (
	pluginDefault  = "k8s_event {\n        level error\n    }"
	pluginMemory   = "k8s_event {\n        level error\n        rate 1 25 4096\n    }"
	pluginGenerous = "k8s_event {\n        level error\n        rate 100 200\n    }"

	// The defaults of the plugin, which pluginDefault keeps.
	defaultQPS   = 1.0 / 300
	defaultBurst = 25
)

// throughput alternates runs with (A) and without (B) k8s_event, A B B A A
// B ..., a fresh CoreDNS for each, under a storm of distinct failing
// queries.
func (b *bench) throughput(ctx context.Context) error {
	ns := "bench-throughput"
	if _, err := b.kube.CreateNamespace(ctx, ns); err != nil {
		return err
	}
	// A discarded pair first: the control plane is still busy right after
	// it starts, and the first runs would pay for it.
	for _, plugin := range []string{pluginDefault, ""} {
		c, err := b.startCoreDNS(ctx, ns, plugin)
		if err != nil {
			return err
		}
		_, err = b.dnsperf(ctx, c, b.stormFile, "-l", "3")
		c.stop(b)
		if err != nil {
			return err
		}
	}
	var qps, cpu [2][]float64
	var lost [2]int64
	var queueFull float64
	plugins := [2]string{pluginDefault, ""}
	bins := [2]string{b.coredns, b.coredns}
	if b.baseline != "" {
		plugins[1], bins[1] = pluginDefault, b.baseline
		b.note("B is %s with k8s_event, not %s without: the A/B ratios compare two builds of the plugin.", b.baseline, b.coredns)
	}
	record := func(i, v int, r stormRun) {
		qps[v] = append(qps[v], r.qps)
		cpu[v] = append(cpu[v], r.cpu)
		lost[v] += r.lost
		queueFull += r.queueFull
		progress("   run %d %s: %.0f qps (%d sent, %d lost), CoreDNS CPU %.1f us/query",
			i+1, "AB"[v:v+1], r.qps, r.sent, r.lost, r.cpu)
	}
	for i := range b.runs {
		// A B, then B A: a steady drift of the machine's speed, or the
		// advantage of whichever starts first, falls on both alike.
		order := [2]int{0, 1}
		if i%2 == 1 {
			order = [2]int{1, 0}
		}
		if b.together {
			// A and B at once, each with its own dnsperf: whatever else
			// the machine does falls on both alike. Which starts first
			// alternates. Two copies of one build still give A about 1%
			// more CPU per query over 48 pairs (1.8% with A always
			// first): read A/B ratios against such an A/A run.
			var cs [2]*coreDNS
			for k, v := range order {
				c, err := b.startCoreDNSOf(ctx, bins[v], ns, plugins[v])
				if err != nil {
					for _, u := range order[:k] {
						cs[u].stop(b)
					}
					return err
				}
				cs[v] = c
			}
			var rs [2]stormRun
			var errs [2]error
			var wg sync.WaitGroup
			for _, v := range order {
				wg.Go(func() { rs[v], errs[v] = b.stormRun(ctx, cs[v], i, v) })
			}
			wg.Wait()
			for v := range cs {
				cs[v].stop(b)
			}
			if err := errors.Join(errs[:]...); err != nil {
				return err
			}
			for v := range rs {
				record(i, v, rs[v])
			}
			continue
		}
		for _, v := range order {
			c, err := b.startCoreDNSOf(ctx, bins[v], ns, plugins[v])
			if err != nil {
				return err
			}
			r, err := b.stormRun(ctx, c, i, v)
			c.stop(b)
			if err != nil {
				return err
			}
			record(i, v, r)
		}
	}
	a, bb := median(qps[0]), median(qps[1])
	ratio := a / bb
	b.add(row{
		metric: fmt.Sprintf("DNS QPS, error storm (median of %d x %s)", b.runs, b.storm),
		a:      fmt.Sprintf("%.0f", a),
		b:      fmt.Sprintf("%.0f", bb),
		ratio:  fmt.Sprintf("%.3f", ratio),
		bar:    "A/B >= 0.97",
		result: passFail(ratio >= 0.97),
	})
	var qpsRatios, cpuRatios []float64
	for i := range qps[0] {
		qpsRatios = append(qpsRatios, qps[0][i]/qps[1][i])
		cpuRatios = append(cpuRatios, cpu[0][i]/cpu[1][i])
	}
	b.add(row{
		metric: fmt.Sprintf("DNS QPS A/B of each pair (median of %d pairs)", b.runs),
		a:      "",
		b:      "",
		ratio:  fmt.Sprintf("%.3f", median(qpsRatios)),
		bar:    "(report)",
	})
	ca, cb := median(cpu[0]), median(cpu[1])
	b.add(row{
		metric: "CoreDNS CPU per query in those runs (us, median)",
		a:      fmt.Sprintf("%.1f", ca),
		b:      fmt.Sprintf("%.1f", cb),
		ratio:  fmt.Sprintf("%.3f", ca/cb),
		bar:    "(report)",
	})
	var pairs []string
	for i := range qps[0] {
		pairs = append(pairs, fmt.Sprintf("%.0f/%.0f qps, %.1f/%.1f us", qps[0][i], qps[1][i], cpu[0][i], cpu[1][i]))
	}
	b.note("Throughput pairs in order (A/B): %s; queries lost: A %d, B %d; lines dropped on a full queue in A: %.0f; median of the per-pair CPU ratios %.3f.",
		strings.Join(pairs, "; "), lost[0], lost[1], queueFull, median(cpuRatios))
	return nil
}

// stormRun is one storm against one CoreDNS.
type stormRun struct {
	qps, cpu   float64 // cpu: CoreDNS's CPU per completed query, in microseconds
	sent, lost int64
	queueFull  float64 // lines the listener dropped on a full queue
}

// stormRun sends the storm to c for b.storm and reads its CPU time around
// it; with b.profile, it also writes a CPU profile of the run i of variant v.
func (b *bench) stormRun(ctx context.Context, c *coreDNS, i, v int) (stormRun, error) {
	profiled := make(chan error, 1)
	if b.profile != "" {
		go func() {
			path := filepath.Join(b.profile, fmt.Sprintf("cpu-%s%d.pprof", "AB"[v:v+1], i+1))
			profiled <- c.cpuProfile(ctx, b.storm-2*time.Second, path)
		}()
	} else {
		profiled <- nil
	}
	before, err := c.scrape(ctx)
	if err != nil {
		<-profiled
		return stormRun{}, err
	}
	p, err := b.dnsperf(ctx, c, b.stormFile, "-l", strconv.Itoa(int(b.storm.Seconds())))
	if perr := <-profiled; perr != nil && err == nil {
		err = perr
	}
	after, serr := c.scrape(ctx)
	if err == nil {
		err = serr
	}
	if err != nil {
		return stormRun{}, err
	}
	cpu := after.sum("process_cpu_seconds_total") - before.sum("process_cpu_seconds_total")
	return stormRun{
		qps: p.qps, cpu: cpu / float64(max(p.completed, 1)) * 1e6,
		sent: p.sent, lost: p.lost,
		queueFull: after.byLabel("coredns_k8s_event_dropped_total", "cause")["queue_full"],
	}, nil
}

// apiserverWrites is the number of event writes (POST, PATCH, PUT on events,
// any answer) that kube-apiserver has counted.
func (b *bench) apiserverWrites(ctx context.Context) (float64, error) {
	text, err := b.kube.MetricsText(ctx)
	if err != nil {
		return 0, err
	}
	return metrics(parseProm(text)).sum("apiserver_request_total", "resource", "events", "verb", "POST|PATCH|PUT"), nil
}

// writeBudget runs one long storm with the default rate and counts the event
// writes that the API server sees, then checks that every captured line is
// accounted for.
func (b *bench) writeBudget(ctx context.Context) error {
	ns := "bench-budget"
	if _, err := b.kube.CreateNamespace(ctx, ns); err != nil {
		return err
	}
	c, err := b.startCoreDNS(ctx, ns, pluginDefault)
	if err != nil {
		return err
	}
	defer c.stop(b)

	before, err := b.apiserverWrites(ctx)
	if err != nil {
		return err
	}
	t0 := time.Now()
	p, err := b.dnsperf(ctx, c, b.stormFile, "-l", strconv.Itoa(int(b.budget.Seconds())))
	if err != nil {
		return err
	}
	// Writes in flight at the end of the storm land within a moment.
	time.Sleep(2 * time.Second)
	after, err := b.apiserverWrites(ctx)
	if err != nil {
		return err
	}
	elapsed := time.Since(t0)
	writes := after - before
	bound := math.Floor(defaultBurst + defaultQPS*elapsed.Seconds())
	b.add(row{
		metric: fmt.Sprintf("event writes seen by kube-apiserver, %s storm", b.budget),
		a:      fmt.Sprintf("%.0f", writes),
		b:      fmt.Sprintf("bound %.0f", bound),
		ratio:  fmt.Sprintf("%.2f", writes/bound),
		bar:    "writes <= 25 + T/300",
		result: passFail(writes <= bound),
	})

	// The accounting: read the plugin's metrics, the events, and the metrics
	// again, until no write happened in between.
	var m metrics
	var evs []corev1.Event
	consistent := false
	for range 10 {
		m1, err := c.scrape(ctx)
		if err != nil {
			return err
		}
		list, err := b.kube.Clientset.CoreV1().Events(ns).List(ctx, metav1.ListOptions{
			FieldSelector: "involvedObject.uid=" + string(c.pod.UID),
		})
		if err != nil {
			return err
		}
		m2, err := c.scrape(ctx)
		if err != nil {
			return err
		}
		w1, w2 := m1.sum("coredns_k8s_event_writes_total"), m2.sum("coredns_k8s_event_writes_total")
		p1, p2 := m1.sum("coredns_k8s_event_pending_lines"), m2.sum("coredns_k8s_event_pending_lines")
		m, evs = m2, list.Items
		if w1 == w2 && p1 == p2 {
			consistent = true
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	var counts int64
	for _, e := range evs {
		counts += int64(e.Count)
	}
	lines := m.sum("coredns_k8s_event_lines_total", "level", "error")
	pending := m.sum("coredns_k8s_event_pending_lines")
	dropped := m.byLabel("coredns_k8s_event_dropped_total", "cause")
	droppedSum := 0.0
	var dropTexts []string
	for _, r := range []string{"queue_full", "evicted", "shutdown", "throttled", "failed"} {
		droppedSum += dropped[r]
		dropTexts = append(dropTexts, fmt.Sprintf("%s %.0f", r, dropped[r]))
	}
	throttled := m.sum("coredns_k8s_event_throttled_total", "reason", "CoreDNSError")
	pluginWrites := m.sum("coredns_k8s_event_writes_total")
	accounted := float64(counts) + pending + droppedSum
	b.add(row{
		metric: "lines = sum(count) + pending + dropped",
		a:      fmt.Sprintf("%.0f", lines),
		b:      fmt.Sprintf("%d + %.0f + %.0f = %.0f", counts, pending, droppedSum, accounted),
		ratio:  fmt.Sprintf("%.4f", accounted/lines),
		bar:    "equal",
		result: passFail(consistent && accounted == lines),
	})
	b.note("Write budget storm: %.0f QPS for %.1f s (%d queries, %d lost); %d events in the namespace; "+
		"plugin: writes_total %.0f, throttled_total{reason=\"CoreDNSError\"} %.0f, aggregated_total %.0f, dropped %s; "+
		"api_errors_total %.0f; snapshot consistent: %v.",
		p.qps, p.seconds, p.sent, p.lost, len(evs), pluginWrites, throttled,
		m.sum("coredns_k8s_event_aggregated_total"), strings.Join(dropTexts, ", "),
		m.sum("coredns_k8s_event_api_errors_total"), consistent)
	return nil
}

// memory reads CoreDNS's RSS after memSmall and after memLarge distinct
// error lines, with k8s_event (cache 4096) and without it.
func (b *bench) memory(ctx context.Context) error {
	ns := "bench-memory"
	if _, err := b.kube.CreateNamespace(ctx, ns); err != nil {
		return err
	}
	small := filepath.Join(b.tmp, "mem-small.txt")
	rest := filepath.Join(b.tmp, "mem-rest.txt")
	if err := writeQueries(small, "m", 0, b.memSmall); err != nil {
		return err
	}
	if err := writeQueries(rest, "m", b.memSmall, b.memLarge-b.memSmall); err != nil {
		return err
	}
	defer os.Remove(small)
	defer os.Remove(rest)

	type reading struct {
		rssSmall, rssLarge int64
		heapLarge          float64
		lines              float64
		answered           int64
	}
	var r [2]reading
	for v, plugin := range []string{pluginMemory, ""} {
		c, err := b.startCoreDNS(ctx, ns, plugin)
		if err != nil {
			return err
		}
		err = func() error {
			defer c.stop(b)
			p1, err := b.dnsperf(ctx, c, small, "-n", "1")
			if err != nil {
				return err
			}
			time.Sleep(b.settle)
			if r[v].rssSmall, err = c.rss(); err != nil {
				return err
			}
			p2, err := b.dnsperf(ctx, c, rest, "-n", "1")
			if err != nil {
				return err
			}
			time.Sleep(b.settle)
			if r[v].rssLarge, err = c.rss(); err != nil {
				return err
			}
			m, err := c.scrape(ctx)
			if err != nil {
				return err
			}
			r[v].heapLarge = m.sum("go_memstats_heap_inuse_bytes")
			r[v].lines = m.sum("coredns_k8s_event_lines_total", "level", "error")
			r[v].answered = p1.completed + p2.completed
			progress("   %s: RSS %.1f MiB after %d queries, %.1f MiB after %d (%.0f and %.0f qps)",
				"AB"[v:v+1], float64(r[v].rssSmall)/mib, p1.completed, float64(r[v].rssLarge)/mib,
				r[v].answered, p1.qps, p2.qps)
			return nil
		}()
		if err != nil {
			return err
		}
	}
	growth := float64(r[0].rssLarge-r[0].rssSmall) / mib
	baseGrowth := float64(r[1].rssLarge-r[1].rssSmall) / mib
	b.add(row{
		metric: fmt.Sprintf("RSS growth %dk -> %dk error lines (MiB)", b.memSmall/1000, b.memLarge/1000),
		a:      fmt.Sprintf("%.1f", growth),
		b:      fmt.Sprintf("%.1f", baseGrowth),
		ratio:  "",
		bar:    "A <= 16 MiB",
		result: passFail(growth <= 16),
	})
	b.add(row{
		metric: fmt.Sprintf("RSS after %dk error lines (MiB)", b.memLarge/1000),
		a:      fmt.Sprintf("%.1f", float64(r[0].rssLarge)/mib),
		b:      fmt.Sprintf("%.1f", float64(r[1].rssLarge)/mib),
		ratio:  fmt.Sprintf("%.3f", float64(r[0].rssLarge)/float64(r[1].rssLarge)),
		bar:    "(report)",
		result: "",
	})
	b.note("Memory: A = `rate 1 25 4096`, %.0f lines captured, %d queries answered; B = no k8s_event, %d answered. "+
		"RSS (VmRSS) read %s after dnsperf ends; RSS after %dk: A %.1f MiB, B %.1f MiB; Go heap in use after %dk: A %.1f MiB, B %.1f MiB.",
		r[0].lines, r[0].answered, r[1].answered, b.settle, b.memSmall/1000,
		float64(r[0].rssSmall)/mib, float64(r[1].rssSmall)/mib, b.memLarge/1000, r[0].heapLarge/mib, r[1].heapLarge/mib)
	return nil
}

// latency logs probes lines one at a time and times each until a watch on
// the namespace's events shows it: first back to back (the next line as soon
// as the previous one is seen), then, with a fresh CoreDNS, paced with a gap
// between lines.
func (b *bench) latency(ctx context.Context) error {
	ns := "bench-latency"
	if _, err := b.kube.CreateNamespace(ctx, ns); err != nil {
		return err
	}
	for _, gap := range []time.Duration{0, b.gap} {
		lat, types, missed, err := b.probe(ctx, ns, gap)
		if err != nil {
			return err
		}
		how := "back to back"
		if gap > 0 {
			how = fmt.Sprintf("%s apart", gap)
		}
		p50, p99 := percentile(lat, 50), percentile(lat, 99)
		b.add(row{
			metric: fmt.Sprintf("line -> event on a watch, p50 (ms, %d lines %s)", b.probes, how),
			a:      fmt.Sprintf("%.1f", p50),
			bar:    "(report)",
		})
		r := row{
			metric: fmt.Sprintf("line -> event on a watch, p99 (ms, %d lines %s)", b.probes, how),
			a:      fmt.Sprintf("%.1f", p99),
			bar:    "(report)",
		}
		if gap == 0 {
			r.bar, r.result = "p99 < 500 ms", passFail(missed == 0 && p99 < 500)
		}
		b.add(r)
		fast := 0
		for _, l := range lat {
			if l < 50 {
				fast++
			}
		}
		b.note("Latency, %s (`rate 100 200`): %d lines seen as ADDED, %d as MODIFIED (from the 11th distinct line on, "+
			"lines join the combined event, which is patched), %d not seen within 5 s; %d under 50 ms; max %.1f ms.",
			how, types[watch.Added], types[watch.Modified], missed, fast, percentile(lat, 100))
	}
	return nil
}

// probe runs a fresh CoreDNS and logs b.probes distinct lines through it,
// waiting for each to be seen and then gap before the next. It returns the
// latencies in milliseconds.
func (b *bench) probe(ctx context.Context, ns string, gap time.Duration) (lat []float64, types map[watch.EventType]int, missed int, err error) {
	c, err := b.startCoreDNS(ctx, ns, pluginGenerous)
	if err != nil {
		return nil, nil, 0, err
	}
	defer c.stop(b)

	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w, err := b.kube.Clientset.CoreV1().Events(ns).Watch(wctx, metav1.ListOptions{
		FieldSelector: "involvedObject.uid=" + string(c.pod.UID),
	})
	if err != nil {
		return nil, nil, 0, err
	}
	defer w.Stop()
	type seen struct {
		at      time.Time
		typ     watch.EventType
		message string
	}
	seenc := make(chan seen, 4096)
	go func() {
		defer close(seenc)
		for ev := range w.ResultChan() {
			if e, ok := ev.Object.(*corev1.Event); ok && (ev.Type == watch.Added || ev.Type == watch.Modified) {
				select {
				case seenc <- seen{time.Now(), ev.Type, e.Message}:
				case <-wctx.Done():
					return
				}
			}
		}
	}()

	types = map[watch.EventType]int{}
	tag := strconv.FormatInt(time.Now().UnixNano()%1e6, 36)
	for i := range b.probes {
		body := fmt.Sprintf("latency probe %s %04d", tag, i)
		sent := time.Now()
		if err := c.logLine(ctx, "error", body); err != nil {
			return nil, nil, 0, err
		}
		deadline := time.After(5 * time.Second)
	wait:
		for {
			select {
			case s, ok := <-seenc:
				if !ok {
					return nil, nil, 0, fmt.Errorf("the watch of events ended")
				}
				if strings.HasSuffix(s.message, body) {
					lat = append(lat, float64(s.at.Sub(sent))/float64(time.Millisecond))
					types[s.typ]++
					break wait
				}
			case <-deadline:
				missed++
				break wait
			case <-ctx.Done():
				return nil, nil, 0, ctx.Err()
			}
		}
		if gap > 0 {
			time.Sleep(gap)
		}
	}
	return lat, types, missed, nil
}

// micro summarises the output of `go test -bench -count N`: the median of
// each figure of each benchmark.
func (b *bench) micro(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	type figures struct{ ns, bytes, allocs []float64 }
	byName := map[string]*figures{}
	var order []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 4 || !strings.HasPrefix(fields[0], "Benchmark") {
			continue
		}
		fg := byName[fields[0]]
		if fg == nil {
			fg = &figures{}
			byName[fields[0]] = fg
			order = append(order, fields[0])
		}
		for i := 2; i+1 < len(fields); i += 2 {
			v, err := strconv.ParseFloat(fields[i], 64)
			if err != nil {
				continue
			}
			switch fields[i+1] {
			case "ns/op":
				fg.ns = append(fg.ns, v)
			case "B/op":
				fg.bytes = append(fg.bytes, v)
			case "allocs/op":
				fg.allocs = append(fg.allocs, v)
			}
		}
	}
	if err := sc.Err(); err != nil {
		return err
	}
	if len(order) == 0 {
		b.note("Micro-benchmarks: %v in %s.", errNoBenchmarks, path)
		return nil
	}
	for _, name := range order {
		fg := byName[name]
		b.microRows = append(b.microRows, row{
			metric: fmt.Sprintf("%s (median of %d)", name, len(fg.ns)),
			a:      fmt.Sprintf("%.1f ns/op", median(fg.ns)),
			b:      fmt.Sprintf("%.0f B/op, %.0f allocs/op", median(fg.bytes), median(fg.allocs)),
			bar:    "(report)",
		})
	}
	return nil
}
