package main

import (
	"bytes"
	"regexp"
	"strconv"
	"testing"

	"github.com/pulse-sidecar/pulse/internal/testdb"
)

// `pulse bench` delivers every event to every group once, across replicas, takes the database from
// PULSE_MONGODB_URI, and prints the machine-readable line with the commands it counted.
func TestBenchPrintsFigures(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	env := map[string]string{"PULSE_MONGODB_URI": testdb.URI(t)}
	args := []string{"bench", "--events", "10", "--groups", "2", "--replicas", "2", "--concurrency", "2"}
	if err := run(t.Context(), args, func(k string) string { return env[k] }, &out); err != nil {
		t.Fatalf("bench: %v\n%s", err, out.String())
	}
	line := regexp.MustCompile(`(?m)^bench: deliveries=20 duplicates=0 seconds=[0-9.]+ deliveries_per_s=[0-9.]+ p50_ms=[0-9.]+ p99_ms=[0-9.]+ db_commands_per_delivery=([0-9.]+) raw_db_ops_per_s=[0-9.]+ efficiency=[0-9.]+ sidecar_cpu_us_per_delivery=[0-9]+ peak_rss_mib=[0-9.]+$`)
	m := line.FindStringSubmatch(out.String())
	if m == nil {
		t.Fatalf("no machine line with 20 deliveries and 0 duplicates in:\n%s", out.String())
	}
	if cmds, _ := strconv.ParseFloat(m[1], 64); cmds <= 0 {
		t.Errorf("db_commands_per_delivery = %s: the command monitor counted nothing", m[1])
	}
	if !regexp.MustCompile(`(?m)^\s+db insert\s+\d+ \(`).MatchString(out.String()) {
		t.Errorf("the table lists no commands by name:\n%s", out.String())
	}
}
