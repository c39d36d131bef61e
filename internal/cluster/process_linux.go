package cluster

import "syscall"

// sysProcAttr puts the child in its own process group, so that Ctrl-C in a
// terminal reaches only our process, which stops its children in order; and
// it makes the kernel kill the child when its parent dies, so a test binary
// that panics or times out leaves no server behind.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
