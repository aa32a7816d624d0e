package main

import (
	"bytes"
	"errors"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/pulse-sidecar/pulse/internal/cli"
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
	line := regexp.MustCompile(`(?m)^bench: deliveries=20 duplicates=0 seconds=[0-9.]+ deliveries_per_s=[0-9.]+ p50_ms=[0-9.]+ p99_ms=[0-9.]+ db_commands_per_delivery=([0-9.]+) raw_db_ops_per_s=[0-9.]+ efficiency=[0-9.]+ sidecar_cpu_us_per_delivery=([0-9]+) process_cpu_us_per_delivery=([0-9]+) peak_rss_mib=[0-9.]+ publish_p50_ms=[0-9.]+ publish_p99_ms=[0-9.]+ deliveries_per_raw_op=[0-9.]+ log_warnings=\d+ log_errors=\d+ lease_losses=\d+ docs_written_per_delivery=([0-9.]+)$`)
	m := line.FindStringSubmatch(out.String())
	if m == nil {
		t.Fatalf("no machine line with 20 deliveries and 0 duplicates in:\n%s", out.String())
	}
	if cmds, _ := strconv.ParseFloat(m[1], 64); cmds <= 0 {
		t.Errorf("db_commands_per_delivery = %s: the command monitor counted nothing", m[1])
	}
	// Each delivery inserts at least its delivery and its attempt.
	if docs, _ := strconv.ParseFloat(m[4], 64); docs < 2 {
		t.Errorf("docs_written_per_delivery = %s, want at least 2 (a delivery and an attempt inserted each)", m[4])
	}
	// The sidecars' share of the CPU is a part of the process's (internal/bench tests how it is split).
	sidecar, _ := strconv.Atoi(m[2])
	process, _ := strconv.Atoi(m[3])
	if sidecar <= 0 || sidecar > process {
		t.Errorf("sidecar_cpu_us_per_delivery = %d, process_cpu_us_per_delivery = %d: want 0 < sidecar ≤ process", sidecar, process)
	}
	if !regexp.MustCompile(`(?m)^\s+db insert pulse\.outbox\s+\d+ \(`).MatchString(out.String()) {
		t.Errorf("the table lists no commands by name and collection:\n%s", out.String())
	}
}

// --history delivers its events first and leaves them out of the figures; --rate publishes on a schedule, so
// the measured run lasts about events ÷ rate; the machine line carries the publish latencies and deliveries
// per raw update.
func TestBenchHistoryAndRate(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	env := map[string]string{"PULSE_MONGODB_URI": testdb.URI(t)}
	args := []string{"bench", "--events", "6", "--rate", "10", "--history", "150", "--groups", "2", "--concurrency", "2"}
	if err := run(t.Context(), args, func(k string) string { return env[k] }, &out); err != nil {
		t.Fatalf("bench: %v\n%s", err, out.String())
	}
	line := regexp.MustCompile(`(?m)^bench: deliveries=12 duplicates=0 seconds=([0-9.]+) .* publish_p50_ms=([0-9.]+) publish_p99_ms=([0-9.]+) deliveries_per_raw_op=([0-9.]+) `)
	m := line.FindStringSubmatch(out.String())
	if m == nil {
		t.Fatalf("no machine line with 12 measured deliveries (the 300 of the history left out) in:\n%s", out.String())
	}
	// Six publishes at 10/s are due over 0.5 s: the run cannot end sooner.
	if secs, _ := strconv.ParseFloat(m[1], 64); secs < 0.5 {
		t.Errorf("seconds = %s, want at least 0.5 (the last publish is due 0.5 s after the first)", m[1])
	}
	p50, _ := strconv.ParseFloat(m[2], 64)
	p99, _ := strconv.ParseFloat(m[3], 64)
	if p50 <= 0 || p99 < p50 {
		t.Errorf("publish_p50_ms = %s, publish_p99_ms = %s: want 0 < p50 ≤ p99", m[2], m[3])
	}
	if perOp, _ := strconv.ParseFloat(m[4], 64); perOp <= 0 {
		t.Errorf("deliveries_per_raw_op = %s, want > 0", m[4])
	}
	if !strings.Contains(out.String(), "after 150 events delivered and retained, 10 publishes/s") {
		t.Errorf("the table's heading does not name the history and the rate:\n%s", out.String())
	}
}

// --pending drains a backlog published while the groups were paused: every one of its deliveries arrives
// once after the resume, the figures are the drain's (the wait counted from the resume), and the machine line
// names the backlog. It does not run in parallel: its CPU profile (runtime/pprof, one per process) would
// overlap the other bench tests' measured runs.
func TestBenchDrainsPending(t *testing.T) {
	var out bytes.Buffer
	env := map[string]string{"PULSE_MONGODB_URI": testdb.URI(t)}
	args := []string{"bench", "--pending", "120", "--groups", "2", "--concurrency", "2"}
	if err := run(t.Context(), args, func(k string) string { return env[k] }, &out); err != nil {
		t.Fatalf("bench: %v\n%s", err, out.String())
	}
	line := regexp.MustCompile(`(?m)^bench: deliveries=240 duplicates=0 seconds=([0-9.]+) deliveries_per_s=[0-9.]+ p50_ms=([0-9.]+) p99_ms=([0-9.]+) db_commands_per_delivery=([0-9.]+) .* pending=120$`)
	m := line.FindStringSubmatch(out.String())
	if m == nil {
		t.Fatalf("no machine line with the 240 deliveries of the drain and pending=120 in:\n%s", out.String())
	}
	secs, _ := strconv.ParseFloat(m[1], 64)
	p50, _ := strconv.ParseFloat(m[2], 64)
	p99, _ := strconv.ParseFloat(m[3], 64)
	if p50 <= 0 || p99 < p50 || p99 > secs*1000+10 { // seconds is printed to 10 ms
		t.Errorf("wait p50 = %s ms, p99 = %s ms over a drain of %s s: want 0 < p50 ≤ p99 ≤ the drain", m[2], m[3], m[1])
	}
	if cmds, _ := strconv.ParseFloat(m[4], 64); cmds <= 0 {
		t.Errorf("db_commands_per_delivery = %s: the command monitor counted nothing", m[4])
	}
	if !strings.Contains(out.String(), "drain of 120 events × consumer groups 2 published while paused") {
		t.Errorf("the table's heading does not name the drain:\n%s", out.String())
	}
}

// Negative --rate, --history, --idle or --pending are usage errors, and so is --pending with --rate.
func TestBenchRejectsNegativeFlags(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	var usage *cli.UsageError
	if err := run(t.Context(), []string{"bench", "--pending", "10", "--rate", "5"}, func(string) string { return "" }, &out); !errors.As(err, &usage) {
		t.Errorf("bench --pending 10 --rate 5 = %v, want a usage error", err)
	}
	for _, flag := range []string{"--rate", "--history", "--idle", "--pending"} {
		value := "-1"
		if flag == "--idle" {
			value = "-1s"
		}
		var out bytes.Buffer
		err := run(t.Context(), []string{"bench", flag, value}, func(string) string { return "" }, &out)
		var usage *cli.UsageError
		if !errors.As(err, &usage) {
			t.Errorf("bench %s %s = %v, want a usage error", flag, value, err)
		}
	}
}
