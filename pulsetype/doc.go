// Package pulsetype holds the sidecar's domain: events, endpoints (consumer groups), deliveries and their
// attempts, statuses, error codes and the retry policy math. It imports nothing of this project and knows no
// wire format: the API's JSON shapes are package httpapi's, the webhook body package webhook's.
//
// Invariants (docs/delivery.md):
//   - one delivery per (consumer group, event), one attempt document per (delivery, attempt number);
//   - an attempt exists before its webhook POST starts;
//   - a delivery becomes terminal (success or error) exactly once and only then gets an expiresAt.
package pulsetype
