// Package dispatcher runs the sidecar's worker loop (docs/delivery.md, "Recovery after a crash"): reap one
// expired attempt, repair partial states, fan out newly published events, then claim due attempts up to the
// free capacity and POST each to its consumer group's webhook.
//
// Invariants:
//   - an attempt is leased (claimed with a fresh lock token) before its POST starts, and the lease is renewed
//     by the heartbeat every third of the lock timeout until its result is recorded;
//   - the result is written through a write fenced by the attempt id and lock token; a worker whose lease was
//     lost writes nothing, reports the loss and goes on working;
//   - an attempt interrupted by shutdown writes nothing: lease expiry hands it to the reaper (never success);
//   - the loop sleeps at most one poll interval; a publish to this process, a freed worker slot or a retry
//     coming due wakes it at once.
//
// Cost (issue 8): the database is the shared bottleneck, so the loop batches what those invariants allow. Events
// published through this process are fanned out in batches and their first attempts are claimed by id with
// the event already in memory (no query for due work, no read of the payload); attempts found by polling are
// claimed several per round trip and their events read with one query; the results finished meanwhile are
// recorded by one bulk update (plus one for the deliveries they end and one for the retries they create).
// The database is polled for due work after a poll interval without local work, on a wake-up (change
// stream, retry timer, recovery work), while it may hold a backlog this process had no capacity for, and at
// least every max(poll interval, lock timeout/4) while local work keeps the loop busy.
package dispatcher
