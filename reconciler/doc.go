// Package reconciler holds the sidecar's reconciliation (docs/delivery.md, "Recovery after a crash"): Reap
// records attempts whose lease expired as worker_lost, and Repair mends every partial state a crash can
// leave between two writes:
//   - a delivery whose first attempt does not exist → create attempt 1 (attempt reopenedAttempt of a
//     delivery reopened by a retry or replay);
//   - a successful attempt whose delivery is still pending → finish the delivery;
//   - an errored attempt without its successor → create exactly the next numbered attempt, or end the
//     delivery when no retry remains;
//   - an event whose fan-out was interrupted (still marked) → fan it out again.
//
// Pending deliveries are found through the store's queue of pending work (Store.QueuedDeliveries), so a
// repair pass costs what the backlog holds, not what the history retains. Every repair is idempotent and
// safe to race: attempts are inserted under the unique index deliveryId +
// attempt (a duplicate-key error means another replica repaired it), and deliveries end through an update
// filtered on status pending (one replica's update wins, the others match nothing).
//
// The Sweeper runs the retention sweep (expired documents where the database has no TTL indexes, staged
// events of crashed publishers) as a service with Start and Stop.
package reconciler
