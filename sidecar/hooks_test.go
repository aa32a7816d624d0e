package sidecar

import (
	"strings"
	"testing"
	"time"
)

// The test hooks parse as the configuration parsed them (a Go duration, a strconv boolean); a value that
// does not parse is an error naming the variable and the value.
func TestTestHooksFromEnv(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		env     map[string]string
		skew    time.Duration
		crash   bool
		backlog time.Duration
		err     string
	}{
		{env: map[string]string{EnvTestBacklogInterval: "200ms"}, backlog: 200 * time.Millisecond},
		{env: map[string]string{EnvTestBacklogInterval: "0s"}, err: `PULSE_TEST_BACKLOG_INTERVAL="0s" is not a positive duration`},
		{env: map[string]string{}},
		{env: map[string]string{EnvTestClockSkew: "5m"}, skew: 5 * time.Minute},
		{env: map[string]string{EnvTestClockSkew: "-5m", EnvTestCrashAfterPublish: "true"}, skew: -5 * time.Minute, crash: true},
		{env: map[string]string{EnvTestCrashAfterPublish: "0"}},
		{env: map[string]string{EnvTestClockSkew: "5 minutes"}, err: `PULSE_TEST_CLOCK_SKEW="5 minutes" is not a duration`},
		{env: map[string]string{EnvTestCrashAfterPublish: "yes"}, err: `PULSE_TEST_CRASH_AFTER_PUBLISH="yes" is not a boolean`},
	} {
		h, err := ParseTestHooks(func(k string) string { return c.env[k] })
		switch {
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
			t.Errorf("ParseTestHooks(%v) error = %v, want one containing %s", c.env, err, c.err)
		case c.err == "" && err != nil:
			t.Errorf("ParseTestHooks(%v) = %v", c.env, err)
		case c.err == "" && (h.ClockSkew != c.skew || h.CrashAfterPublish != c.crash || h.BacklogInterval != c.backlog):
			t.Errorf("ParseTestHooks(%v) = skew %v crash %v backlog %v, want skew %v crash %v backlog %v", c.env, h.ClockSkew, h.CrashAfterPublish,
				h.BacklogInterval, c.skew, c.crash, c.backlog)
		}
	}
}
