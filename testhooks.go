package main

import (
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/pulse-sidecar/pulse/httpapi"
	"github.com/pulse-sidecar/pulse/pulsetype"
)

// Test hooks: environment variables that only a binary built with -tags pulsetesthooks reads (see
// testHooksEnabled), for the tests that run the sidecar as a process (internal/testdb builds that binary).
// In-process tests pass the same hooks to serveWith directly. They are not configuration: config.Config
// does not know them and `pulse serve --help` does not list them.
const (
	// envTestClockSkew shifts this process's wall clock by a duration (as in "5m" or "-5m"), for tests of
	// replicas whose clocks differ.
	envTestClockSkew = "PULSE_TEST_CLOCK_SKEW"
	// envTestCrashAfterPublish ("true") makes the process SIGKILL itself 200 ms after its first publish is
	// durable, without fanning it out, for tests of a publisher that dies between commit and fan-out.
	envTestCrashAfterPublish = "PULSE_TEST_CRASH_AFTER_PUBLISH"
)

// testHooks returns the test hooks getenv sets (envTestClockSkew, envTestCrashAfterPublish) in a binary
// built with -tags pulsetesthooks, and the zero serveHooks in any other: a production binary ignores them.
// It returns an error naming the variable and its value when one does not parse.
func testHooks(getenv func(string) string) (serveHooks, error) {
	if !testHooksEnabled {
		return serveHooks{}, nil
	}
	return testHooksFromEnv(getenv)
}

// testHooksFromEnv parses the test hooks of getenv, whatever the build; unset variables leave their hook off.
func testHooksFromEnv(getenv func(string) string) (serveHooks, error) {
	var h serveHooks
	if v := getenv(envTestClockSkew); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			return h, fmt.Errorf("%s=%q is not a duration: %w", envTestClockSkew, v, err)
		}
		h.clockSkew = d
	}
	if v := getenv(envTestCrashAfterPublish); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return h, fmt.Errorf("%s=%q is not a boolean: %w", envTestCrashAfterPublish, v, err)
		}
		h.crashAfterPublish = b
	}
	return h, nil
}

// crashAfterPublish is the notifier of envTestCrashAfterPublish: it keeps a publish from the dispatcher and
// SIGKILLs the process once the publish had time to answer 202.
type crashAfterPublish struct{ httpapi.Notifier }

func (crashAfterPublish) Published([]*pulsetype.Event) {
	time.AfterFunc(200*time.Millisecond, func() {
		if p, err := os.FindProcess(os.Getpid()); err == nil {
			_ = p.Kill() // SIGKILL: no deferred function runs, as in a crash
		}
	})
}
