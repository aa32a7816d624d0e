package main

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"
)

// The test hooks parse as the configuration parsed them (a Go duration, a strconv boolean); a value that
// does not parse is an error naming the variable and the value.
func TestTestHooksFromEnv(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		env   map[string]string
		skew  time.Duration
		crash bool
		err   string
	}{
		{env: map[string]string{}},
		{env: map[string]string{envTestClockSkew: "5m"}, skew: 5 * time.Minute},
		{env: map[string]string{envTestClockSkew: "-5m", envTestCrashAfterPublish: "true"}, skew: -5 * time.Minute, crash: true},
		{env: map[string]string{envTestCrashAfterPublish: "0"}},
		{env: map[string]string{envTestClockSkew: "5 minutes"}, err: `PULSE_TEST_CLOCK_SKEW="5 minutes" is not a duration`},
		{env: map[string]string{envTestCrashAfterPublish: "yes"}, err: `PULSE_TEST_CRASH_AFTER_PUBLISH="yes" is not a boolean`},
	} {
		h, err := testHooksFromEnv(func(k string) string { return c.env[k] })
		switch {
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
			t.Errorf("testHooksFromEnv(%v) error = %v, want one containing %s", c.env, err, c.err)
		case c.err == "" && err != nil:
			t.Errorf("testHooksFromEnv(%v) = %v", c.env, err)
		case c.err == "" && (h.clockSkew != c.skew || h.crashAfterPublish != c.crash):
			t.Errorf("testHooksFromEnv(%v) = skew %v crash %v, want skew %v crash %v", c.env, h.clockSkew, h.crashAfterPublish, c.skew, c.crash)
		}
	}
}

// `pulse serve` honours PULSE_TEST_CLOCK_SKEW only in a binary built with -tags pulsetesthooks (the one
// internal/testdb builds): run, as main calls it, logs the skew's warning exactly when the tag is set, while a
// sidecar given the hook through serveHooks always does.
func TestTestHooksNeedTheBuildTag(t *testing.T) {
	b := setup(t)
	env := b.fastEnv()
	env[envTestClockSkew] = "5m"
	env[envTestCrashAfterPublish] = "false"
	const warning = "PULSE_TEST_CLOCK_SKEW shifts this process's clock"
	if hooked := b.start(env); !strings.Contains(hooked.logs.String(), warning) {
		t.Fatalf("a sidecar given the clock skew through serveHooks did not log %q:\n%s", warning, hooked.logs.String())
	}
	viaRun := b.startWith(env, func(ctx context.Context, getenv func(string) string, stdout io.Writer) error {
		return run(ctx, nil, getenv, stdout)
	})
	if got := strings.Contains(viaRun.logs.String(), warning); got != testHooksEnabled {
		t.Fatalf("run with %s set logged the skew warning: %v, want %v (built with -tags pulsetesthooks: %v):\n%s",
			envTestClockSkew, got, testHooksEnabled, testHooksEnabled, viaRun.logs.String())
	}
}
