// Package mongo is the one implementation of the sidecar's storage: events, subscriptions (one per consumer
// group), deliveries and history attempts in four collections named <prefix>.events, .subscriptions,
// .deliveries and .history, which keep everything for their retention, and two small ones that index the
// pending work among them, <prefix>.queue (the attempts of pending deliveries, queueDoc) and <prefix>.outbox
// (the events whose fan-out is unfinished, outboxDoc). It also connects to the server (Connect), reads its
// clock (Store.ServerTime) and watches the events collection for new events (EventWatcher).
//
// Invariants:
//   - no multi-document transactions: replicas converge through unique indexes (consumerGroup+eventId on
//     deliveries, deliveryId+attempt on history) where a duplicate-key error means "already done";
//   - every write that completes, renews or reaps an attempt carries the attempt's fencing token in its filter
//     (fencing), so a worker whose lease was taken over cannot write its result;
//   - times in filters come from the store's clock (the database's clock, see package lease), never from a
//     replica's own wall clock alone;
//   - the polls (claims, the reaper, the repair scan, the fan-out repair, the heads of ordered lines) read
//     the queue and the outbox, never the retained history, and write and read the other collections by
//     _id (or by the fields of their unique indexes), so what a poll costs grows with the pending work, not
//     with the retention: a server that evaluates other filters by reading the whole collection (FerretDB)
//     stays fast however much it retains;
//   - the queue and the outbox are indexes, the other collections the authority (an attempt's status,
//     lease and fencing token are in its history document; a fanout mark in its event): a pending attempt
//     is queued before it is inserted and a delivery's attempts leave the queue only after its next step is
//     recorded, so every pending delivery and attempt is queued; an event is in the outbox before it is
//     committed with its mark, and leaves it after the mark is cleared. What the queue says of a lease is a
//     copy, corrected when found stale; a document of the queue or the outbox that stands for nothing (its
//     writer died, or its work ended) is removed by the poll that finds it;
//   - expiresAt is written only when a document becomes terminal; reads treat expired documents as gone;
//   - indexes are created when missing and verified at every start; an incompatible one stops the start and
//     is never dropped (docs/delivery.md, "Collections, retention and startup safety");
//   - driver errors are translated here: mongo.ErrNoDocuments never leaves this package;
//   - what the server can do (Capabilities: TTL and partial indexes, change streams, statements per update
//     command, whether filters scan, $group's $first) is fixed once, when EnsureSchema builds the store with it; no other call asks which server
//     it talks to.
package mongo
