package sidecar

import (
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/pulse-sidecar/pulse/httpapi"
	"github.com/pulse-sidecar/pulse/pulsetype"
)

// Test hooks: environment variables that only a pulse binary built with -tags pulsetesthooks reads (package
// main decides), for the tests that run the sidecar as a process (internal/testdb builds that binary).
// In-process tests set TestHooks in Options directly. They are not configuration: config.Config does not
// know them and `pulse serve --help` does not list them.
const (
	// EnvTestClockSkew shifts the process's wall clock by a duration (as in "5m" or "-5m"), for tests of
	// replicas whose clocks differ.
	EnvTestClockSkew = "PULSE_TEST_CLOCK_SKEW"
	// EnvTestCrashAfterPublish ("true") makes the process SIGKILL itself 200 ms after its first publish is
	// durable, without fanning it out, for tests of a publisher that dies between commit and fan-out.
	EnvTestCrashAfterPublish = "PULSE_TEST_CRASH_AFTER_PUBLISH"
	// EnvTestBacklogInterval sets the period of the backlog check (pulse.backlog.high) to a duration (as in
	// "200ms") instead of opsevents.DefaultBacklogInterval, so a test sees an alert raised and cleared within
	// seconds.
	EnvTestBacklogInterval = "PULSE_TEST_BACKLOG_INTERVAL"
)

// TestHooks bend a sidecar for a test; the zero value changes nothing.
type TestHooks struct {
	ClockSkew         time.Duration // shifts the local clock (EnvTestClockSkew)
	CrashAfterPublish bool          // SIGKILL 200 ms after the first publish, before its fan-out (EnvTestCrashAfterPublish)
	BacklogInterval   time.Duration // the backlog check's period; 0: opsevents.DefaultBacklogInterval (EnvTestBacklogInterval)
	StartTimeout      time.Duration // the bound of the start's work after the schema; 0: 30 s (in-process tests only)
}

// ParseTestHooks parses the test hooks getenv sets, whatever the build; unset variables leave their hook
// off. It returns an error naming the variable and its value when one does not parse (a Go duration, a
// strconv boolean).
func ParseTestHooks(getenv func(string) string) (TestHooks, error) {
	var h TestHooks
	if v := getenv(EnvTestClockSkew); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			return h, fmt.Errorf("%s=%q is not a duration: %w", EnvTestClockSkew, v, err)
		}
		h.ClockSkew = d
	}
	if v := getenv(EnvTestBacklogInterval); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			return h, fmt.Errorf("%s=%q is not a positive duration", EnvTestBacklogInterval, v)
		}
		h.BacklogInterval = d
	}
	if v := getenv(EnvTestCrashAfterPublish); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return h, fmt.Errorf("%s=%q is not a boolean: %w", EnvTestCrashAfterPublish, v, err)
		}
		h.CrashAfterPublish = b
	}
	return h, nil
}

// crashAfterPublish is the notifier of TestHooks.CrashAfterPublish: it keeps a publish from the dispatcher
// and SIGKILLs the process once the publish had time to answer 202.
type crashAfterPublish struct{ httpapi.Notifier }

func (crashAfterPublish) Published([]*pulsetype.Event) {
	time.AfterFunc(200*time.Millisecond, func() {
		if p, err := os.FindProcess(os.Getpid()); err == nil {
			_ = p.Kill() // SIGKILL: no deferred function runs, as in a crash
		}
	})
}
