package testdb

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"
)

const (
	// readyPrefix starts the line `pulse devdb` prints once it accepts connections (devdb.ReadyPrefix;
	// not imported, to keep FerretDB out of the test binaries).
	readyPrefix = "devdb: "
	// startTimeout bounds how long startServer waits for that line.
	startTimeout = 3 * time.Minute
	// logTail is how many bytes of the child's log an error message quotes.
	logTail = 4 << 10
)

// startServer starts `pulse devdb` as a child process that dies with this process and returns the
// URI it prints. It returns an error, with the tail of the child's log, if the child cannot be
// started, exits, or prints no URI within startTimeout.
func startServer() (string, error) {
	bin, err := binaryOnce()
	if err != nil {
		return "", err
	}
	dir, err := procDirOnce()
	if err != nil {
		return "", err
	}
	args := []string{"devdb", "--listen", "127.0.0.1:0", "--data-dir", filepath.Join(dir, "data")}
	if pg := os.Getenv(EnvPostgresURL); pg != "" {
		args = append(args, "--postgresql-url", pg)
	}

	logPath := filepath.Join(dir, "devdb.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return "", fmt.Errorf("devdb log: %w", err)
	}
	defer logFile.Close() // the child has its own descriptor
	stdoutR, stdoutW, err := os.Pipe()
	if err != nil {
		return "", fmt.Errorf("devdb stdout pipe: %w", err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = stdoutW, logFile
	cmd.SysProcAttr = sysProcAttr()

	started := make(chan error, 1)
	exited := make(chan error, 1)
	done := make(chan struct{})
	go func() {
		// The parent-death signal is sent when the thread that forked the child exits, not only the
		// process: keep this goroutine on its thread, and the thread alive, until the child is gone.
		runtime.LockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		stateMu.Lock()
		child, childDone = cmd.Process, done
		stateMu.Unlock()
		started <- nil
		exited <- cmd.Wait()
		close(done)
	}()
	err = <-started
	_ = stdoutW.Close()
	if err != nil {
		_ = stdoutR.Close()
		return "", fmt.Errorf("start %s: %w", bin, err)
	}

	uris := make(chan string, 1)
	go func() {
		defer stdoutR.Close()
		sc := bufio.NewScanner(stdoutR)
		for sc.Scan() {
			if uri, ok := strings.CutPrefix(sc.Text(), readyPrefix); ok {
				uris <- uri
				break
			}
		}
		_, _ = io.Copy(io.Discard, stdoutR) // never let the child block on a full pipe
	}()

	timer := time.NewTimer(startTimeout)
	defer timer.Stop()
	select {
	case uri := <-uris:
		return uri, nil
	case err := <-exited:
		return "", fmt.Errorf("%s devdb exited before printing its URI: %v\n%s", bin, err, readTail(logPath))
	case <-timer.C:
		_ = cmd.Process.Kill()
		return "", fmt.Errorf("%s devdb printed no URI within %s\n%s", bin, startTimeout, readTail(logPath))
	}
}

// readTail returns the last logTail bytes of the file at path, or why it could not be read.
func readTail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(log %s: %v)", path, err)
	}
	if len(b) > logTail {
		b = b[len(b)-logTail:]
	}
	return fmt.Sprintf("log %s:\n%s", path, bytes.TrimSpace(b))
}

// makeProcessDir removes the directories left by test processes that are gone, then creates this
// process's directory, named dirPrefix + pid + "-" + random.
// It fails unless Main runs the tests, since nothing else would remove the directory.
func makeProcessDir() (string, error) {
	if !mainRunning.Load() {
		return "", errors.New("the test package's TestMain must call testdb.Main (func TestMain(m *testing.M) { os.Exit(testdb.Main(m)) }), which removes the temporary directory")
	}
	sweepDeadProcessDirs()
	dir, err := os.MkdirTemp("", dirPrefix+strconv.Itoa(os.Getpid())+"-")
	if err != nil {
		return "", fmt.Errorf("temp dir: %w", err)
	}
	stateMu.Lock()
	procDir = dir
	stateMu.Unlock()
	return dir, nil
}

// sweepDeadProcessDirs removes every dirPrefix directory in the temp directory whose owner process
// no longer exists: those of test processes that died before Main could clean up. Errors are
// ignored: the sweep is best effort.
func sweepDeadProcessDirs() {
	entries, err := os.ReadDir(os.TempDir())
	if err != nil {
		return
	}
	for _, e := range entries {
		rest, ok := strings.CutPrefix(e.Name(), dirPrefix)
		if !ok || !e.IsDir() {
			continue
		}
		pidText, _, ok := strings.Cut(rest, "-")
		pid, err := strconv.Atoi(pidText)
		if !ok || err != nil || pid == os.Getpid() || processAlive(pid) {
			continue
		}
		_ = os.RemoveAll(filepath.Join(os.TempDir(), e.Name()))
	}
}
