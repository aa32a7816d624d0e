package main

import (
	"bytes"
	"regexp"
	"testing"

	"github.com/pulse-sidecar/pulse/internal/testdb"
)

// `pulse bench` delivers every event to every group once and prints the machine-readable line.
func TestBenchPrintsFigures(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	if err := run(t.Context(), []string{"bench", "--events", "10", "--groups", "2", "--publishers", "2", "--mongodb-uri", testdb.URI(t)}, nil, &out); err != nil {
		t.Fatalf("bench: %v\n%s", err, out.String())
	}
	line := regexp.MustCompile(`(?m)^bench: deliveries=20 duplicates=0 seconds=[0-9.]+ deliveries_per_s=[0-9.]+ p50_ms=[0-9.]+ p99_ms=[0-9.]+ db_commands_per_delivery=[0-9.]+ raw_db_ops_per_s=[0-9.]+ efficiency=[0-9.]+ sidecar_cpu_us_per_delivery=[0-9]+ peak_rss_mib=[0-9.]+$`)
	if !line.MatchString(out.String()) {
		t.Fatalf("no machine line with 20 deliveries and 0 duplicates in:\n%s", out.String())
	}
}
