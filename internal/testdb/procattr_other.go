//go:build !linux

package testdb

import "syscall"

// sysProcAttr returns nil: this platform has no parent-death signal, so the child devdb process
// outlives the test process and must be stopped by hand.
func sysProcAttr() *syscall.SysProcAttr { return nil }

// processAlive reports true: without a probe, no directory is ever swept on this platform.
func processAlive(int) bool { return true }
