package main

import (
	"context"
	"io"
	"strings"
	"testing"

	"github.com/pulse-sidecar/pulse/internal/harness"
	sidecarpkg "github.com/pulse-sidecar/pulse/internal/sidecar"
)

// `pulse serve` honours PULSE_TEST_CLOCK_SKEW only in a binary built with -tags pulsetesthooks (the one
// internal/testdb builds): run, as main calls it, logs the skew's warning exactly when the tag is set, while a
// sidecar given the hook through sidecar.TestHooks always does.
func TestTestHooksNeedTheBuildTag(t *testing.T) {
	b := harness.Setup(t)
	env := b.FastEnv()
	env[sidecarpkg.EnvTestClockSkew] = "5m"
	env[sidecarpkg.EnvTestCrashAfterPublish] = "false"
	const warning = "PULSE_TEST_CLOCK_SKEW shifts this process's clock"
	if hooked := b.Start(env); !strings.Contains(hooked.Logs.String(), warning) {
		t.Fatalf("a sidecar given the clock skew through serveHooks did not log %q:\n%s", warning, hooked.Logs.String())
	}
	viaRun := b.StartWith(env, func(ctx context.Context, getenv func(string) string, stdout io.Writer) error {
		return run(ctx, nil, getenv, stdout)
	})
	if got := strings.Contains(viaRun.Logs.String(), warning); got != testHooksEnabled {
		t.Fatalf("run with %s set logged the skew warning: %v, want %v (built with -tags pulsetesthooks: %v):\n%s",
			sidecarpkg.EnvTestClockSkew, got, testHooksEnabled, testHooksEnabled, viaRun.Logs.String())
	}
}
