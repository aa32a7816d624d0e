package testdb

import (
	"errors"
	"syscall"
)

// sysProcAttr makes the child process receive SIGKILL when its parent (the test process) dies.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}

// processAlive reports whether a process with this pid exists (signal 0 probes without sending).
func processAlive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}
