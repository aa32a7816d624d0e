// Package sidecar wires the Pulse sidecar's parts into one running process and shuts them down in order:
// the API (package httpapi), the dispatcher, the reconciler's sweeper, the lease keeper and clock sync, the
// change-stream and endpoints-file watchers, the metrics, the tracer and the database client (the embedded
// development database when no URI is configured). A Sidecar has the shared lifecycle of
// internal/startstop; `pulse serve` (package main), `pulse bench` (internal/bench) and the system tests
// (e2e/internal/harness) all start it the same way: New, Start, Wait or Stop.
//
// Invariants:
//
//   - Start binds the API's address before anything else, so a busy port stops it before anything is
//     started or written; a failed Start has undone what it started.
//   - Shutdown goes in this order: publishes and /readyz answer 503 (the API stays up so clients get an
//     answer); the dispatcher stops claiming and in-flight POSTs finish and are recorded within
//     PULSE_SHUTDOWN_TIMEOUT; the watchers, the sweeper and the clock sync stop, then the keeper (it renewed
//     the in-flight leases); the HTTP servers close; the tracer flushes; the database is disconnected.
package sidecar
