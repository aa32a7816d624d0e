// Package dispatcher runs the sidecar's delivery work (docs/delivery.md) in pieces, each with its own state
// and lock:
//   - the loop (loop.go, ordered.go) finds and claims work: it fans out events published here, claims the
//     heads of ordered lines, the attempts its fan-out created and the due attempts found by polling, and
//     hands each to the executor; beside it, in a goroutine of its own, the reconciliation (Reap, Repair)
//     runs on its periods, which the time its queries take stretches (choreShare), so that a slow scan
//     never holds up a claim;
//   - the ready queue (ready.go) holds the attempts the fan-out created but could not lease in its insert
//     (no capacity at that moment), with their events, until claimed;
//   - the slots (slots.go) count the POSTs in flight and admit new ones by the fairness rules;
//   - the endpoint cache (endpoints.go) holds each consumer group's endpoint, the ordered groups and the
//     groups last read paused or disabled (left out of the claims);
//   - the state gate (gate.go) reads, right before each POST, whether its group is paused or disabled;
//   - the rate limits (ratelimit.go) admit a rate-limited group's attempts to a claim only with a token;
//   - the executor (executor.go) POSTs one leased attempt and decides what follows with the group's retry
//     policy (pulsetype.RetryPolicy.Decide);
//   - the completer (completer.go) records results group-commit style.
//
// Invariants:
//   - an attempt is leased (claimed with a fresh fencing token) before its POST starts, and the lease is
//     renewed by the heartbeat every third of the lease timeout until its result is recorded;
//   - the result is written through a write fenced by the attempt id and fencing token; a worker whose lease
//     was lost writes nothing, reports the loss and goes on working;
//   - an attempt interrupted by shutdown writes nothing: lease expiry hands it to the reaper (never success);
//   - the loop sleeps at most one poll interval; a publish to this process, a freed worker slot or a retry
//     coming due wakes it at once.
//
// Cost (issue 8): the database is the shared bottleneck, so the loop batches what those invariants allow. Events
// published through this process are fanned out in batches, and their first attempts are inserted already
// leased when the capacity admits them at once, else claimed by id later, with the event already in memory
// (no claim or query for due work, no read of the payload); attempts found by polling are
// claimed several per round trip and their events read with one query; the results finished meanwhile are
// recorded by one bulk update (plus one for the deliveries they end and one for the retries they create).
// The database is polled for due work after a poll interval without local work, on a wake-up (change
// stream, retry timer, reconciliation work), while it may hold a backlog this process had no capacity for,
// and at least every max(poll interval, lease timeout/4) while local work keeps the loop busy.
package dispatcher
