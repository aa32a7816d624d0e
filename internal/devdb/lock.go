package devdb

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// LockFileName is the file in the data directory that a running Server holds locked.
const LockFileName = "pulse.lock"

// ErrDataDirLocked is wrapped by the error of Start when another process (or another Server in this process)
// holds the data directory.
var ErrDataDirLocked = errors.New("data directory in use")

// LockedError is the error of Start when the data directory is held: Holder is what the holder wrote in the
// lock file, its pid and command ("12345 pulse devdb"), or empty when it could not be read.
type LockedError struct {
	Dir, Holder string
}

func (e *LockedError) Error() string {
	holder := "another process"
	if e.Holder != "" {
		pid, cmd, _ := strings.Cut(e.Holder, " ")
		holder = "process " + pid
		if cmd != "" {
			holder += " (" + cmd + ")"
		}
	}
	return fmt.Sprintf("data directory %s is in use by %s, which holds %s", e.Dir, holder, filepath.Join(e.Dir, LockFileName))
}

func (e *LockedError) Unwrap() error { return ErrDataDirLocked }

// dirLock is an exclusive lock on a data directory, held until release.
type dirLock struct{ f *os.File }

// lockDir takes the exclusive lock of dir without waiting and writes this process's pid and command into
// the lock file. It returns a *LockedError when another holder has it.
func lockDir(dir string) (*dirLock, error) {
	path := filepath.Join(dir, LockFileName)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open lock file: %w", err)
	}
	held, err := tryLock(f)
	if err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	if held {
		b, _ := os.ReadFile(path)
		_ = f.Close()
		return nil, &LockedError{Dir: dir, Holder: string(bytes.TrimSpace(b))}
	}
	if err := f.Truncate(0); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("write lock file: %w", err)
	}
	if _, err := f.WriteAt([]byte(strconv.Itoa(os.Getpid())+" "+command()+"\n"), 0); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("write lock file: %w", err)
	}
	return &dirLock{f: f}, nil
}

// release gives the lock up; the lock file stays (removing it would race with a process locking it).
func (l *dirLock) release() {
	if l != nil {
		_ = l.f.Close()
	}
}

// command returns the program's name and subcommand ("pulse devdb"), never its flags, which may hold
// credentials.
func command() string {
	cmd := filepath.Base(os.Args[0])
	if len(os.Args) > 1 && !strings.HasPrefix(os.Args[1], "-") {
		cmd += " " + os.Args[1]
	}
	return cmd
}
