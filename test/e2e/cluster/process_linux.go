package cluster

import "syscall"

// sysProcAttr makes the kernel kill the child when its parent dies, so a test
// binary that panics or times out leaves no server behind.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
