package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/pulse-sidecar/pulse/config"
	"github.com/pulse-sidecar/pulse/internal/testdb"
	"github.com/pulse-sidecar/pulse/internal/testwait"
	"github.com/pulse-sidecar/pulse/sidecar"
)

// `pulse serve` honours PULSE_TEST_CLOCK_SKEW only in a binary built with -tags pulsetesthooks (the one
// internal/testdb builds): run, as main calls it, logs the skew's warning exactly when the tag is set, while a
// sidecar given the hook through sidecar.TestHooks always does.
func TestTestHooksNeedTheBuildTag(t *testing.T) {
	t.Parallel()
	_, dbName := testdb.Database(t)
	env := map[string]string{"PULSE_MONGODB_URI": testdb.URI(t), "PULSE_DATABASE": dbName, "PULSE_LISTEN": "127.0.0.1:0",
		sidecar.EnvTestClockSkew: "5m", sidecar.EnvTestCrashAfterPublish: "false"}
	getenv := func(k string) string { return env[k] }
	const warning = "PULSE_TEST_CLOCK_SKEW shifts this process's clock"

	hooks, err := sidecar.ParseTestHooks(getenv)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(getenv)
	if err != nil {
		t.Fatal(err)
	}
	hookedLogs := &testdb.SyncBuffer{}
	hooked := sidecar.New(cfg, sidecar.Options{Logs: hookedLogs, TestHooks: hooks})
	if err := hooked.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	hooked.Stop()
	if !strings.Contains(hookedLogs.String(), warning) {
		t.Fatalf("a sidecar given the clock skew through sidecar.TestHooks did not log %q:\n%s", warning, hookedLogs.String())
	}

	logs := &testdb.SyncBuffer{}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- run(ctx, nil, getenv, logs) }()
	testwait.Eventually(t, time.Minute, "run's sidecar to listen", func() bool { return strings.Contains(logs.String(), `"message":"listening"`) })
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run = %v, want nil after its context ended", err)
	}
	if got := strings.Contains(logs.String(), warning); got != testHooksEnabled {
		t.Fatalf("run with %s set logged the skew warning: %v, want %v (built with -tags pulsetesthooks: %v):\n%s",
			sidecar.EnvTestClockSkew, got, testHooksEnabled, testHooksEnabled, logs.String())
	}
}
