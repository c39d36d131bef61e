package main

import "syscall"

// childAttr makes the kernel kill a child when this program dies, so that an
// interrupted or crashed bench leaves no dnsperf behind.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
