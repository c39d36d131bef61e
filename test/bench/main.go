// Command bench measures the k8s_event plugin end to end: it starts etcd and
// kube-apiserver on loopback (internal/cluster), runs the CoreDNS of
// test/cmd/coredns with and without k8s_event, drives it with dnsperf and
// with logline's HTTP endpoint, and prints a summary table of the figures
// against the plugin's promises:
//
//  1. DNS throughput under an error storm, with / without k8s_event, >= 0.97;
//  2. event writes that the API server sees during a storm, <= BURST + QPS x T,
//     and the accounting lines = sum(count) + pending + dropped;
//  3. RSS growth from 100k to 1M distinct error lines, <= 16 MiB;
//  4. p99 latency from a logged line to its event on a watch, < 500 ms.
//
// With -micro it adds the medians of a `go test -bench` output to the table.
// It needs KUBE_APISERVER, ETCD and KUBECTL (hack/tools.sh env) and dnsperf.
// Every process it starts is stopped by its PID when it ends, also on error
// or interrupt.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/dnsops/k8s_event/internal/cluster"
)

type bench struct {
	kube       *cluster.Cluster
	coredns    string
	dnsperfBin string
	tmp        string
	procs      running

	runs     int
	storm    time.Duration
	budget   time.Duration
	clients  int
	maxQPS   int
	memSmall int
	memLarge int
	probes   int
	gap      time.Duration
	settle   time.Duration
	profile  string // directory for CPU profiles of CoreDNS, or ""
	together bool   // run A and B of a throughput pair at once
	baseline string // B of the throughput pairs: this CoreDNS with k8s_event, not -coredns without

	stormFile string
	loadStart string // /proc/loadavg when the bench started
	source    string // the commit measured
	rows      []row
	microRows []row // the go test -bench figures, last in the table
	notes     []string
}

// row is one line of the summary table.
type row struct {
	metric, a, b, ratio, bar, result string
}

func main() {
	b := &bench{}
	flag.StringVar(&b.coredns, "coredns", "bin/coredns-e2e", "CoreDNS binary built from ./test/cmd/coredns")
	flag.StringVar(&b.dnsperfBin, "dnsperf", "dnsperf", "dnsperf binary")
	micro := flag.String("micro", "", "output of `go test -bench` to summarise (optional)")
	out := flag.String("out", "", "also write the report (Markdown) to this file")
	flag.IntVar(&b.runs, "runs", 3, "A/B pairs of the throughput measurement")
	flag.StringVar(&b.baseline, "baseline", "", "throughput: run B as this CoreDNS binary with k8s_event (another build of the plugin, e.g. the last release's), not -coredns without it: the ratios are then new over old")
	flag.BoolVar(&b.together, "together", false, "run the A and the B of each throughput pair at the same time, each with its own dnsperf, instead of one after the other (A B B A ...)")
	flag.DurationVar(&b.storm, "storm", 10*time.Second, "length of one throughput run")
	flag.DurationVar(&b.budget, "budget", 60*time.Second, "length of the storm of the write-budget measurement")
	flag.IntVar(&b.clients, "c", 4, "dnsperf clients (-c)")
	flag.IntVar(&b.maxQPS, "Q", 0, "dnsperf rate limit (-Q); 0 for none")
	flag.IntVar(&b.memSmall, "mem-small", 100_000, "distinct error lines before the first RSS reading")
	flag.IntVar(&b.memLarge, "mem-large", 1_000_000, "distinct error lines before the second RSS reading")
	flag.IntVar(&b.probes, "probes", 100, "lines of the latency measurement")
	flag.DurationVar(&b.gap, "gap", 250*time.Millisecond, "pause between the lines of the paced latency measurement")
	flag.DurationVar(&b.settle, "settle", 5*time.Second, "pause before reading RSS")
	flag.StringVar(&b.profile, "profile", "", "write a CPU profile of CoreDNS for every throughput run to this directory (adds pprof to the Corefile)")
	only := flag.String("only", "", "comma-separated measurements to run (throughput, budget, memory, latency); all when empty")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := b.run(ctx, *micro, *out, *only)
	stop()
	b.procs.stopAll()
	if b.kube != nil {
		b.kube.Stop()
	}
	if b.tmp != "" {
		os.RemoveAll(b.tmp)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func (b *bench) run(ctx context.Context, micro, out, only string) (err error) {
	defer func() {
		// A panic must not skip the cleanup in main.
		if r := recover(); r != nil {
			err = fmt.Errorf("panic: %v", r)
		}
	}()
	start := time.Now()
	b.loadStart = loadAvg()
	b.source = gitDescribe() // right after make built CoreDNS from the tree
	if b.coredns, err = filepath.Abs(b.coredns); err != nil {
		return err
	}
	if b.baseline != "" {
		if b.baseline, err = filepath.Abs(b.baseline); err != nil {
			return err
		}
	}
	if _, err := os.Stat(b.coredns); err != nil {
		return fmt.Errorf("%w (build it with: go build -o bin/coredns-e2e ./test/cmd/coredns)", err)
	}
	if b.dnsperfBin, err = exec.LookPath(b.dnsperfBin); err != nil {
		return fmt.Errorf("%w (install it with: hack/tools.sh dnsperf)", err)
	}
	if b.tmp, err = os.MkdirTemp("", "k8s_event-bench-"); err != nil {
		return err
	}

	if micro != "" {
		if err := b.micro(micro); err != nil {
			return err
		}
	}

	b.stormFile = filepath.Join(b.tmp, "storm.txt")
	if err := writeQueries(b.stormFile, "q", 0, 2_000_000); err != nil {
		return err
	}

	progress("starting etcd and kube-apiserver")
	if b.kube, err = cluster.New(ctx, cluster.Options{}); err != nil {
		return err
	}
	for _, m := range []struct {
		name string
		fn   func(context.Context) error
	}{
		{"throughput", b.throughput},
		{"budget", b.writeBudget},
		{"memory", b.memory},
		{"latency", b.latency},
	} {
		if only != "" && !slices.Contains(strings.Split(only, ","), m.name) {
			continue
		}
		t := time.Now()
		progress("== %s", m.name)
		if err := m.fn(ctx); err != nil {
			return fmt.Errorf("%s: %w", m.name, err)
		}
		progress("   %s took %s; load average %s", m.name, time.Since(t).Round(time.Second), loadAvg())
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}

	report := b.report(time.Since(start))
	fmt.Print("\n" + report)
	if out != "" {
		if err := os.WriteFile(out, []byte(report), 0o644); err != nil {
			return err
		}
	}
	return nil
}

func progress(format string, v ...any) {
	fmt.Fprintf(os.Stderr, "%s bench: %s\n", time.Now().UTC().Format("15:04:05"), fmt.Sprintf(format, v...))
}

func (b *bench) add(r row) { b.rows = append(b.rows, r) }

func (b *bench) note(format string, v ...any) { b.notes = append(b.notes, fmt.Sprintf(format, v...)) }

func passFail(ok bool) string {
	if ok {
		return "PASS"
	}
	return "FAIL"
}

const mib = 1 << 20

// report is the summary in Markdown, readable as it is in a terminal.
func (b *bench) report(took time.Duration) string {
	var s strings.Builder
	fmt.Fprintf(&s, "k8s_event benchmarks, %s\n\n", time.Now().UTC().Format("2006-01-02 15:04 MST"))
	fmt.Fprintf(&s, "machine: %d CPUs (nproc), %s, %s/%s, %s; bench took %s\n\n",
		runtime.NumCPU(), cpuModel(), runtime.GOOS, runtime.GOARCH, runtime.Version(), took.Round(time.Second))
	fmt.Fprintf(&s, "source: %s\n\n", b.source)
	fmt.Fprintf(&s, "load average (1, 5, 15 min): %s at the start, %s at the end\n\n", b.loadStart, loadAvg())
	header := row{"metric", "A (k8s_event)", "B / value", "ratio", "bar", "result"}
	rows := append(append([]row{header, {}}, b.rows...), b.microRows...)
	width := make([]int, 6)
	for _, r := range rows {
		for i, c := range r.cells() {
			width[i] = max(width[i], len(c))
		}
	}
	for i, r := range rows {
		cells := r.cells()
		if i == 1 {
			for j := range cells {
				cells[j] = strings.Repeat("-", width[j])
			}
		}
		s.WriteString("|")
		for j, c := range cells {
			fmt.Fprintf(&s, " %-*s |", width[j], c)
		}
		s.WriteString("\n")
	}
	if len(b.notes) > 0 {
		s.WriteString("\n")
		for _, n := range b.notes {
			s.WriteString("- " + n + "\n")
		}
	}
	return s.String()
}

func (r row) cells() []string { return []string{r.metric, r.a, r.b, r.ratio, r.bar, r.result} }

func cpuModel() string {
	data, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return "unknown CPU"
	}
	for _, ln := range strings.Split(string(data), "\n") {
		if k, v, ok := strings.Cut(ln, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "unknown CPU"
}

// gitDescribe names the commit that was measured; -dirty when tracked files
// had changes.
func gitDescribe() string {
	out, err := exec.Command("git", "describe", "--always", "--dirty").Output()
	if err != nil {
		return "unknown (not a git checkout)"
	}
	return "git " + strings.TrimSpace(string(out))
}

// loadAvg is the 1, 5 and 15 minute load averages, which tell how busy the
// machine was besides the bench.
func loadAvg() string {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(data))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// percentile is the nearest-rank percentile of xs.
func percentile(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	rank := int(p/100*float64(len(s)) + 0.999999)
	return s[min(max(rank, 1), len(s))-1]
}

var errNoBenchmarks = errors.New("no benchmark results")
