// Package dispatcher runs the sidecar's worker loop (the seed's "Recovery after a crash" order): reap one
// expired attempt, repair partial states, fan out newly published events, then claim due attempts up to the
// free capacity and POST each to its consumer group's webhook.
//
// Invariants:
//   - an attempt is leased (claimed with a fresh lock token) before its POST starts, and the lease is renewed
//     by the heartbeat every third of the lock timeout while the POST runs;
//   - the result is written through a write fenced by the lock token; a worker whose lease was lost writes
//     nothing, reports the loss and goes on working;
//   - an attempt interrupted by shutdown writes nothing: lease expiry hands it to the reaper (never success);
//   - the loop sleeps at most one poll interval; a publish to this process, a freed worker slot or a retry
//     coming due wakes it at once.
package dispatcher
