// Package mongo is the one implementation of the sidecar's storage: events, subscriptions (one per consumer
// group), deliveries and history attempts in four collections named <prefix>.events, .subscriptions,
// .deliveries and .history. It also connects to the server (Connect), reads its clock (Store.ServerTime)
// and watches the events collection for new events (EventWatcher).
//
// Invariants:
//   - no multi-document transactions: replicas converge through unique indexes (consumerGroup+eventId on
//     deliveries, deliveryId+attempt on history) where a duplicate-key error means "already done";
//   - every write that completes, renews or reaps an attempt carries the attempt's fencing token in its filter
//     (fencing), so a worker whose lease was taken over cannot write its result;
//   - times in filters come from the store's clock (the database's clock, see package lease), never from a
//     replica's own wall clock alone;
//   - expiresAt is written only when a document becomes terminal; reads treat expired documents as gone;
//   - indexes are created when missing and verified at every start; an incompatible one stops the start and
//     is never dropped (docs/delivery.md, "Collections, retention and startup safety");
//   - driver errors are translated here: mongo.ErrNoDocuments never leaves this package;
//   - what the server can do (Capabilities: TTL and partial indexes, change streams, statements per update
//     command, whether filters scan) is fixed once, when EnsureSchema builds the store with it; no other call asks which server
//     it talks to.
package mongo
