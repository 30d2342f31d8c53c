package main

import "syscall"

// childProcAttr makes the kernel kill a component when the supervisor dies, however it
// dies (SIGKILL included), so no API server outlives its etcd.
func childProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
