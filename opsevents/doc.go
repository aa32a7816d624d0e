// Package opsevents publishes the sidecar's operational events (pulse.endpoint.disabled,
// pulse.endpoint.enabled, pulse.delivery.failed, pulse.backlog.high) through the sidecar's own machinery: each is an ordinary
// event stored with the store's Publish and fanned out by the dispatcher, so any consumer group can subscribe
// to it with its usual URL, secret, retries, filter and ordering (docs/operations.md).
//
// Invariants:
//   - an operational event carries names, reasons, codes, times and counts, never a secret, a header value, a
//     URL or a response body;
//   - the consumer group an event is about never receives it (pulsetype.SubjectGroupHeader, asked by
//     pulsetype.Endpoint.WantsInput), so a disabled endpoint cannot receive its own disable event;
//   - no operational event is published about the delivery of an operational event (no loop), and each
//     (topic, consumer group) publishes at most one event per interval from each replica: the others are
//     coalesced into one event at the end of the interval that carries their count (no storm).
package opsevents
