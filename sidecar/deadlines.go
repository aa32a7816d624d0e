package sidecar

import (
	"time"

	"github.com/pulse-sidecar/pulse/config"
)

// minOperationTimeout is the shortest operation timeout operationTimeout gives: the longest single command
// of the sidecar's own work (a page of 1,000 ids of a repair or a sweep on a slow server) stays below it.
const minOperationTimeout = 30 * time.Second

// operationTimeout is the deadline of every database call that has none of its own (the driver's client-side
// operation timeout, mongo.ConnectOptions.OperationTimeout): the lease timeout (PULSE_LOCK_TIMEOUT), at least
// minOperationTimeout. Work that a lease bounds (claims, fan-outs) and a publish (PULSE_DATABASE_TIMEOUT) set
// shorter ones; the schema work sets its own (PULSE_SCHEMA_TIMEOUT). A call on a connection that never answers
// (a cut without a reset) then fails within it, the driver drops the connection, and the work goes on with a
// new one.
func operationTimeout(cfg *config.Config) time.Duration {
	return max(cfg.LeaseTimeout, minOperationTimeout)
}

// stallBound is how long a turn of the dispatcher or a reconciliation pass may run before /readyz says the
// sidecar is stalled: three operation timeouts and a poll interval, far above what a turn of several calls,
// each bounded by operationTimeout, takes on a slow database.
func stallBound(cfg *config.Config) time.Duration {
	return 3*operationTimeout(cfg) + cfg.PollInterval
}
