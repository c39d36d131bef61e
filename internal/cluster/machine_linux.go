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

var iptablesTables = []string{"filter", "nat", "mangle"}

func snapshotMachine() (*machine, error) {
	m := &machine{sysctls: map[string]string{}, rules: map[string]map[string]bool{}, cgroups: map[string]bool{}}
	for _, s := range kernelTunables {
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
