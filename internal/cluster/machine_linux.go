package cluster

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// machine is what a node may change on the machine, as it was before the
// node started, so that it can be put back.
type machine struct {
	sysctls  map[string]string          // path under /proc/sys -> value
	rules    map[string]map[string]bool // "iptables -t nat" -> lines of -S
	absent   []string                   // machine directories that did not exist
	cgroups  map[string]bool            // cgroup directories one level below each hierarchy
	cgroupFS []string                   // the hierarchies
	links    map[string]bool            // network interfaces
	netns    map[string]bool            // named network namespaces in netnsDir
	noNetns  bool                       // netnsDir did not exist
	loAddrs  map[string]bool            // addresses on lo, as ip -o addr shows them
}

// kernelTunables are the sysctls the kubelet sets when
// protectKernelDefaults is false.
var kernelTunables = []string{
	"vm/overcommit_memory", "vm/panic_on_oom",
	"kernel/panic", "kernel/panic_on_oops",
	"kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes",
}

// machineDirs are the directories outside its own that the kubelet,
// containerd, runc and CNI write to, whatever their configuration says.
var machineDirs = []string{
	"/var/lib/kubelet", "/var/log/pods", "/var/log/containers",
	"/var/lib/cni", "/run/containerd", "/run/nri", "/opt/containerd",
	"/usr/libexec/kubernetes", "/etc/cni", "/var/lib/containerd",
}

// networkTunables are the sysctls a node with a pod network sets (and
// kube-proxy could), where the kernel has them.
var networkTunables = []string{
	"net/ipv4/ip_forward", "net/ipv4/conf/all/route_localnet",
	"net/bridge/bridge-nf-call-iptables", "net/bridge/bridge-nf-call-ip6tables",
}

// netnsDir holds the network namespaces that containerd makes for pods.
const netnsDir = "/run/netns"

var iptablesTables = []string{"filter", "nat", "mangle"}

func snapshotMachine() (*machine, error) {
	m := &machine{sysctls: map[string]string{}, rules: map[string]map[string]bool{}, cgroups: map[string]bool{}}
	for _, s := range append(slices.Clone(kernelTunables), networkTunables...) {
		b, err := os.ReadFile("/proc/sys/" + s)
		if err != nil {
			continue // not every kernel has every tunable
		}
		m.sysctls[s] = strings.TrimSpace(string(b))
	}
	for _, d := range machineDirs {
		if _, err := os.Lstat(d); errors.Is(err, os.ErrNotExist) {
			m.absent = append(m.absent, d)
		}
	}
	for _, cmd := range iptablesCommands() {
		lines, err := iptablesRules(cmd)
		if err != nil {
			return nil, err
		}
		m.rules[cmd] = lines
	}
	var err error
	if m.links, m.netns, m.loAddrs, err = networkState(); err != nil {
		return nil, err
	}
	if _, statErr := os.Lstat(netnsDir); errors.Is(statErr, os.ErrNotExist) {
		m.noNetns = true
	}
	hierarchies, err := cgroupHierarchies()
	if err != nil {
		return nil, err
	}
	m.cgroupFS = hierarchies
	for _, h := range hierarchies {
		entries, _ := os.ReadDir(h)
		for _, e := range entries {
			if e.IsDir() {
				m.cgroups[filepath.Join(h, e.Name())] = true
			}
		}
	}
	return m, nil
}

// iptablesCommands are "iptables -t TABLE" for each table and family that
// this machine has.
func iptablesCommands() []string {
	var cmds []string
	for _, bin := range []string{"iptables", "ip6tables"} {
		if _, err := exec.LookPath(bin); err != nil {
			continue
		}
		for _, t := range iptablesTables {
			cmds = append(cmds, bin+" -t "+t)
		}
	}
	return cmds
}

func iptablesRules(cmd string) (map[string]bool, error) {
	args := strings.Fields(cmd)
	out, err := exec.Command(args[0], append(args[1:], "-w", "-S")...).Output()
	if err != nil {
		return nil, fmt.Errorf("%s -S: %w", cmd, err)
	}
	lines := map[string]bool{}
	for _, l := range strings.Split(string(out), "\n") {
		if l != "" {
			lines[l] = true
		}
	}
	return lines, nil
}

// cgroupHierarchies are the mount points of cgroup v1 controllers and of
// the cgroup v2 hierarchy.
func cgroupHierarchies() ([]string, error) {
	mounts, err := mountInfo()
	if err != nil {
		return nil, err
	}
	var hs []string
	for _, mt := range mounts {
		if mt.fsType == "cgroup" || mt.fsType == "cgroup2" {
			hs = append(hs, mt.point)
		}
	}
	return hs, nil
}

type mount struct{ point, fsType string }

func mountInfo() ([]mount, error) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	var ms []mount
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		// ID PARENT MAJ:MIN ROOT POINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPER
		f := strings.Fields(sc.Text())
		sep := -1
		for i, x := range f {
			if x == "-" {
				sep = i
				break
			}
		}
		if len(f) < 5 || sep < 0 || sep+1 >= len(f) {
			continue
		}
		ms = append(ms, mount{point: unescapeMount(f[4]), fsType: f[sep+1]})
	}
	return ms, sc.Err()
}

// unescapeMount undoes the octal escapes of mountinfo (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// newCgroups are the cgroup directories made since the snapshot, one level
// below each hierarchy.
func (m *machine) newCgroups() []string {
	var dirs []string
	for _, h := range m.cgroupFS {
		entries, _ := os.ReadDir(h)
		for _, e := range entries {
			d := filepath.Join(h, e.Name())
			if e.IsDir() && !m.cgroups[d] {
				dirs = append(dirs, d)
			}
		}
	}
	return dirs
}

// killContainers kills, by PID, every process in a cgroup made since the
// snapshot (the kubelet's kubepods), and waits until they are gone.
func (m *machine) killContainers(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		pids := map[int]bool{}
		for _, d := range m.newCgroups() {
			_ = filepath.WalkDir(d, func(path string, e os.DirEntry, err error) error {
				if err != nil || e.Name() != "cgroup.procs" {
					return nil
				}
				b, _ := os.ReadFile(path)
				for _, f := range strings.Fields(string(b)) {
					if pid, err := strconv.Atoi(f); err == nil {
						pids[pid] = true
					}
				}
				return nil
			})
		}
		if len(pids) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("processes still in the node's cgroups after %v: %v", timeout, slices.Sorted(maps.Keys(pids)))
		}
		for pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// killShims kills, by PID, the containerd shims that serve socket: they
// outlive containerd on purpose.
func killShims(shim, socket string) {
	if shim == "" {
		return
	}
	procs, _ := filepath.Glob("/proc/[0-9]*")
	var left []int
	for _, p := range procs {
		pid, _ := strconv.Atoi(filepath.Base(p))
		exe, err := os.Readlink(p + "/exe")
		if err != nil || exe != shim {
			continue
		}
		cmdline, _ := os.ReadFile(p + "/cmdline")
		if !bytes.Contains(cmdline, []byte(socket)) {
			continue
		}
		if err := syscall.Kill(pid, syscall.SIGKILL); err == nil {
			left = append(left, pid)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for _, pid := range left {
		for syscall.Kill(pid, 0) == nil && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// restore unmounts what is mounted under dir or a machine directory,
// removes the cgroups and machine directories made since the snapshot,
// and puts the sysctls and iptables rules back.
func (m *machine) restore(dir string) error {
	var errs []error
	errs = append(errs, unmountUnder(append([]string{dir}, machineDirs...)))
	errs = append(errs, m.restoreNetwork())
	cgroups := m.newCgroups()
	for _, d := range cgroups {
		errs = append(errs, removeCgroup(d))
	}
	for _, d := range m.absent {
		errs = append(errs, os.RemoveAll(d))
	}
	for s, v := range m.sysctls {
		b, err := os.ReadFile("/proc/sys/" + s)
		if err == nil && strings.TrimSpace(string(b)) != v {
			errs = append(errs, os.WriteFile("/proc/sys/"+s, []byte(v), 0o644))
		}
	}
	for cmd, before := range m.rules {
		errs = append(errs, restoreRules(cmd, before))
	}
	return errors.Join(errs...)
}

// unmountUnder detaches every mount point under one of dirs, deepest first,
// until none is left (mounts can be stacked).
func unmountUnder(dirs []string) error {
	for range 10 {
		mounts, err := mountInfo()
		if err != nil {
			return err
		}
		var points []string
		for _, mt := range mounts {
			for _, d := range dirs {
				if mt.point == d || strings.HasPrefix(mt.point, d+"/") {
					points = append(points, mt.point)
					break
				}
			}
		}
		if len(points) == 0 {
			return nil
		}
		sort.Slice(points, func(i, j int) bool { return len(points[i]) > len(points[j]) })
		for _, p := range points {
			_ = syscall.Unmount(p, syscall.MNT_DETACH)
		}
	}
	return fmt.Errorf("mounts left under %v", dirs)
}

// removeCgroup removes a cgroup and its children, deepest first; their
// processes must be gone.
func removeCgroup(dir string) error {
	var dirs []string
	_ = filepath.WalkDir(dir, func(path string, e os.DirEntry, err error) error {
		if err == nil && e.IsDir() {
			dirs = append(dirs, path)
		}
		return nil
	})
	var last error
	for i := len(dirs) - 1; i >= 0; i-- {
		if err := syscall.Rmdir(dirs[i]); err != nil && !errors.Is(err, syscall.ENOENT) {
			last = fmt.Errorf("remove cgroup %s: %w", dirs[i], err)
		}
	}
	return last
}

// restoreRules deletes the rules and chains that cmd (e.g. "iptables -t
// nat") lists now and did not before.
func restoreRules(cmd string, before map[string]bool) error {
	now, err := iptablesRules(cmd)
	if err != nil {
		return err
	}
	args := strings.Fields(cmd)
	run := func(rule ...string) error {
		out, err := exec.Command(args[0], append(append(args[1:], "-w"), rule...)...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("%s %s: %w: %s", cmd, strings.Join(rule, " "), err, out)
		}
		return nil
	}
	var errs []error
	var chains []string
	for line := range now {
		if before[line] {
			continue
		}
		words := splitRule(line)
		switch {
		case len(words) > 1 && words[0] == "-A":
			words[0] = "-D"
			errs = append(errs, run(words...))
		case len(words) == 2 && words[0] == "-N":
			chains = append(chains, words[1])
		}
	}
	for _, c := range chains {
		errs = append(errs, run("-F", c))
	}
	for _, c := range chains {
		errs = append(errs, run("-X", c))
	}
	return errors.Join(errs...)
}

// splitRule splits a line of iptables -S into words, honouring the double
// quotes around comments.
func splitRule(line string) []string {
	var words []string
	var w strings.Builder
	quoted, inWord := false, false
	for i := 0; i < len(line); i++ {
		ch := line[i]
		switch {
		case ch == '\\' && quoted && i+1 < len(line):
			i++
			w.WriteByte(line[i])
		case ch == '"':
			quoted, inWord = !quoted, true
		case ch == ' ' && !quoted:
			if inWord {
				words = append(words, w.String())
				w.Reset()
				inWord = false
			}
		default:
			w.WriteByte(ch)
			inWord = true
		}
	}
	if inWord {
		words = append(words, w.String())
	}
	return words
}

// lockMachine takes the machine-wide lock of nodes: one node at a time may
// run on a machine, since they share port 53, the machine directories and
// the kernel's settings. It waits for the lock until ctx ends.
func lockMachine(ctx context.Context) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(os.TempDir(), "k8s_event-node.lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return f, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", f.Name(), err)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("another node runs on this machine: %w", ctx.Err())
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// networkState lists the network interfaces, the named network namespaces
// and the addresses on lo.
func networkState() (links, netns, loAddrs map[string]bool, err error) {
	links, netns, loAddrs = map[string]bool{}, map[string]bool{}, map[string]bool{}
	entries, err := os.ReadDir("/sys/class/net")
	if err != nil {
		return nil, nil, nil, err
	}
	for _, e := range entries {
		links[e.Name()] = true
	}
	entries, _ = os.ReadDir(netnsDir)
	for _, e := range entries {
		netns[e.Name()] = true
	}
	if _, lookErr := exec.LookPath("ip"); lookErr != nil {
		return links, netns, loAddrs, nil // nothing can have added one
	}
	out, err := exec.Command("ip", "-o", "addr", "show", "dev", "lo").Output()
	if err != nil {
		return nil, nil, nil, fmt.Errorf("ip addr show dev lo: %w", err)
	}
	for _, l := range strings.Split(string(out), "\n") {
		// 1: lo    inet 127.0.0.1/8 scope host lo ...
		if f := strings.Fields(l); len(f) >= 4 {
			loAddrs[f[3]] = true
		}
	}
	return links, netns, loAddrs, nil
}

// restoreNetwork removes the network namespaces, interfaces and addresses
// on lo made since the snapshot: a pod's namespace takes its veth pair
// with it, the bridge and the API server's address go by name.
func (m *machine) restoreNetwork() error {
	links, netns, loAddrs, err := networkState()
	if err != nil {
		return err
	}
	var errs []error
	for ns := range netns {
		if !m.netns[ns] {
			p := filepath.Join(netnsDir, ns)
			_ = syscall.Unmount(p, syscall.MNT_DETACH)
			errs = append(errs, os.Remove(p))
		}
	}
	if m.noNetns {
		_ = os.Remove(netnsDir) // unless something else made one since
	}
	for l := range links {
		if m.links[l] {
			continue
		}
		// A veth goes with its peer's namespace: it may be gone by now.
		if out, err := exec.Command("ip", "link", "delete", l).CombinedOutput(); err != nil && !strings.Contains(string(out), "Cannot find device") {
			errs = append(errs, fmt.Errorf("ip link delete %s: %w: %s", l, err, out))
		}
	}
	for a := range loAddrs {
		if !m.loAddrs[a] {
			if out, err := exec.Command("ip", "addr", "delete", a, "dev", "lo").CombinedOutput(); err != nil {
				errs = append(errs, fmt.Errorf("ip addr delete %s dev lo: %w: %s", a, err, out))
			}
		}
	}
	return errors.Join(errs...)
}

// preparePodNetwork sets what a pod network needs of the kernel: packets
// forwarded, bridged packets through iptables (kube-proxy's rules then
// see a pod's queries to a Service whose endpoint is on the same bridge),
// and addr on lo, where the pods reach the API server. restore undoes it.
func preparePodNetwork(addr string) error {
	if err := bridgeNetfilter(); err != nil {
		return err
	}
	for _, s := range []string{"net/ipv4/ip_forward", "net/bridge/bridge-nf-call-iptables"} {
		if err := os.WriteFile("/proc/sys/"+s, []byte("1"), 0o644); err != nil {
			return fmt.Errorf("sysctl %s=1: %w", s, err)
		}
	}
	out, err := exec.Command("ip", "-o", "addr", "show", "dev", "lo", "to", addr+"/32").Output()
	if err != nil || len(bytes.TrimSpace(out)) > 0 {
		return err
	}
	if out, err := exec.Command("ip", "addr", "add", addr+"/32", "dev", "lo").CombinedOutput(); err != nil {
		return fmt.Errorf("ip addr add %s/32 dev lo: %w: %s", addr, err, out)
	}
	return nil
}

// bridgeNetfilter makes sure that /proc/sys/net/bridge is there, loading
// br_netfilter when it is not, or says that it is missing.
func bridgeNetfilter() error {
	const dir = "/proc/sys/net/bridge"
	if _, err := os.Stat(dir); err == nil {
		return nil
	}
	out, err := exec.Command("modprobe", "br_netfilter").CombinedOutput()
	if _, statErr := os.Stat(dir); statErr != nil {
		return fmt.Errorf("%s is missing: the pod network needs the br_netfilter module (modprobe br_netfilter: %v %s)", dir, err, bytes.TrimSpace(out))
	}
	return nil
}
