// Package lease holds what the sidecar's leases rest on: the clock they trust (Clock, kept in step with the
// database by ClockSync) and the heartbeat that renews them (Keeper).
//
// Invariants (docs/delivery.md, "Leases, heartbeats and fencing"):
//   - the database is authoritative: a lease is held only while the database says so, and every renewal and
//     completion write is fenced by the lease's token;
//   - lease times follow the database's clock (Clock measures its offset from the server's localTime), so a
//     replica whose wall clock runs minutes behind neither steals live leases nor hides due work;
//   - the local clock only bounds how long a renewal is trusted: a lease not renewed successfully within one
//     lease timeout is treated as lost locally, and its work is cancelled, even if the database is unreachable.
package lease
