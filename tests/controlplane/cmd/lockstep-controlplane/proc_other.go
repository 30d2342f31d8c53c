//go:build !linux

package main

import "syscall"

// childProcAttr: without Linux's parent-death signal, components share the supervisor's
// process group, so killing the group stops everything.
func childProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{}
}
