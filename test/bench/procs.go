package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/dnsops/k8s_event/test/plugin/logline"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/dnsops/k8s_event/internal/cluster"
)

// coreDNS is one CoreDNS process under measurement.
type coreDNS struct {
	*cluster.Process
	pod     *corev1.Pod
	dns     int
	logline string // host:port of logline's HTTP server
	metrics string // host:port of the prometheus plugin
	pprof   string // host:port of the pprof plugin, or ""
	dir     string
}

// running tracks every child this program started, so that all of them are
// stopped, by PID, whatever way the program ends.
type running struct {
	mu    sync.Mutex
	procs map[*cluster.Process]bool
}

func (r *running) add(p *cluster.Process) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.procs == nil {
		r.procs = map[*cluster.Process]bool{}
	}
	r.procs[p] = true
}

func (r *running) remove(p *cluster.Process) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.procs, p)
}

func (r *running) stopAll() {
	r.mu.Lock()
	ps := make([]*cluster.Process, 0, len(r.procs))
	for p := range r.procs {
		ps = append(ps, p)
	}
	r.procs = nil
	r.mu.Unlock()
	for _, p := range ps {
		p.Stop(10 * time.Second)
	}
}

const corefileTmpl = `.:%d {
    kubeapi {
        kubeconfig %s
    }
%s    prometheus %s
    errors
    logline %s
}
`

// startCoreDNS runs CoreDNS for a new Pod in ns. plugin is the k8s_event
// block, or "" for the baseline without the plugin.
func (b *bench) startCoreDNS(ctx context.Context, ns, plugin string) (*coreDNS, error) {
	return b.startCoreDNSOf(ctx, b.coredns, ns, plugin)
}

// startCoreDNSOf is startCoreDNS with the CoreDNS binary bin.
func (b *bench) startCoreDNSOf(ctx context.Context, bin, ns, plugin string) (*coreDNS, error) {
	pod, err := b.kube.CreatePod(ctx, ns, fmt.Sprintf("coredns-%d", time.Now().UnixNano()%1e9))
	if err != nil {
		return nil, err
	}
	c := &coreDNS{pod: pod}
	if c.dns, err = cluster.FreeDNSPort(); err != nil {
		return nil, err
	}
	if c.logline, err = freeAddr(); err != nil {
		return nil, err
	}
	if c.metrics, err = freeAddr(); err != nil {
		return nil, err
	}
	if c.dir, err = os.MkdirTemp(b.tmp, "coredns-"); err != nil {
		return nil, err
	}
	if plugin != "" {
		plugin = "    " + plugin + "\n"
	}
	if b.profile != "" {
		if c.pprof, err = freeAddr(); err != nil {
			return nil, err
		}
		plugin += "    pprof " + c.pprof + "\n"
	}
	conf := filepath.Join(c.dir, "Corefile")
	corefile := fmt.Sprintf(corefileTmpl, c.dns, b.kube.KubeconfigPath, plugin, c.metrics, c.logline)
	if err := os.WriteFile(conf, []byte(corefile), 0o644); err != nil {
		return nil, err
	}
	env := []string{
		"COREDNS_POD_NAME=" + pod.Name,
		"COREDNS_NAMESPACE=" + pod.Namespace,
		"COREDNS_POD_UID=" + string(pod.UID),
		"COREDNS_NODE_NAME=node-bench",
	}
	c.Process, err = cluster.StartProcess("coredns", filepath.Join(c.dir, "coredns.log"), env, bin, "-conf", conf)
	if err != nil {
		return nil, err
	}
	b.procs.add(c.Process)
	if err := c.waitUp(ctx); err != nil {
		c.stop(b)
		return nil, err
	}
	return c, nil
}

// waitUp waits until the DNS port and the metrics endpoint answer. It sends
// no DNS query: any query would log an error.
func (c *coreDNS) waitUp(ctx context.Context) error {
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(c.dns))
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		if c.Exited() {
			return false, fmt.Errorf("coredns exited with code %d", c.ExitCode())
		}
		conn, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			return false, nil
		}
		conn.Close()
		_, err = c.scrape(ctx)
		return err == nil, nil
	})
	if err != nil {
		return fmt.Errorf("coredns did not come up: %v\n%s", err, c.LogTail(30))
	}
	return nil
}

func (c *coreDNS) stop(b *bench) {
	c.Stop(15 * time.Second)
	b.procs.remove(c.Process)
	os.RemoveAll(c.dir)
}

// scrape reads CoreDNS's /metrics.
func (c *coreDNS) scrape(ctx context.Context) (metrics, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	body, err := cluster.HTTPGet(ctx, "http://"+c.metrics+"/metrics")
	if err != nil {
		return nil, err
	}
	return parseProm(body), nil
}

// cpuProfile writes a CPU profile of the next d to path.
func (c *coreDNS) cpuProfile(ctx context.Context, d time.Duration, path string) error {
	ctx, cancel := context.WithTimeout(ctx, d+10*time.Second)
	defer cancel()
	u := fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", c.pprof, int(d.Seconds()))
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", u, resp.Status)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// logLine makes CoreDNS log body once at level through logline.
func (c *coreDNS) logLine(ctx context.Context, level, body string) error {
	return logline.Post(ctx, c.logline, level, 1, body)
}

// rss is the resident set size of the process, from /proc/PID/status.
func (c *coreDNS) rss() (int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", c.Pid()))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("no VmRSS in /proc/%d/status", c.Pid())
}

func freeAddr() (string, error) {
	port, err := cluster.FreePort()
	if err != nil {
		return "", err
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), nil
}

// perf is what dnsperf reports.
type perf struct {
	sent, completed, lost int64
	seconds, qps          float64
}

var (
	reSent      = regexp.MustCompile(`Queries sent:\s+(\d+)`)
	reCompleted = regexp.MustCompile(`Queries completed:\s+(\d+)`)
	reLost      = regexp.MustCompile(`Queries lost:\s+(\d+)`)
	reRunTime   = regexp.MustCompile(`Run time \(s\):\s+([0-9.]+)`)
	reQPS       = regexp.MustCompile(`Queries per second:\s+([0-9.]+)`)
)

// dnsperf runs dnsperf against c with the query file and extra arguments
// (-l SECONDS or -n 1) and parses its statistics.
func (b *bench) dnsperf(ctx context.Context, c *coreDNS, file string, extra ...string) (perf, error) {
	args := append([]string{"-s", "127.0.0.1", "-p", strconv.Itoa(c.dns), "-d", file, "-c", strconv.Itoa(b.clients)}, extra...)
	if b.maxQPS > 0 {
		args = append(args, "-Q", strconv.Itoa(b.maxQPS))
	}
	cmd := exec.CommandContext(ctx, b.dnsperfBin, args...)
	cmd.SysProcAttr = childAttr()
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	if err != nil {
		return perf{}, fmt.Errorf("dnsperf %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	var p perf
	text := string(out)
	get := func(re *regexp.Regexp) string {
		if m := re.FindStringSubmatch(text); m != nil {
			return m[1]
		}
		return ""
	}
	p.sent, _ = strconv.ParseInt(get(reSent), 10, 64)
	p.completed, _ = strconv.ParseInt(get(reCompleted), 10, 64)
	p.lost, _ = strconv.ParseInt(get(reLost), 10, 64)
	p.seconds, _ = strconv.ParseFloat(get(reRunTime), 64)
	if p.qps, err = strconv.ParseFloat(get(reQPS), 64); err != nil {
		return p, fmt.Errorf("dnsperf: no 'Queries per second' in its output:\n%s", text)
	}
	return p, nil
}

// writeQueries writes n distinct names under fail.logline., prefix0 to
// prefix(n-1), one "NAME A" a line.
func writeQueries(path, prefix string, from, n int) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := bufio.NewWriterSize(f, 1<<20)
	for i := from; i < from+n; i++ {
		w.WriteString(prefix)
		w.WriteString(strconv.Itoa(i))
		w.WriteString(".fail.logline. A\n")
	}
	if err := w.Flush(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
