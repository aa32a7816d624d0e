//go:build linux || darwin || dragonfly || freebsd || netbsd || openbsd

package devdb

import (
	"errors"
	"os"
	"syscall"
)

// tryLock takes an exclusive flock(2) on f without waiting and reports whether another open file holds it.
// flock is used rather than a pid file created with O_EXCL because the kernel releases it when the holder
// exits, even on SIGKILL, so a crash never leaves a stale lock and a reused pid never fakes one.
func tryLock(f *os.File) (held bool, err error) {
	err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
	if errors.Is(err, syscall.EWOULDBLOCK) {
		return true, nil
	}
	return false, err
}
