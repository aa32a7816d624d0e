package pulsetype

import "errors"

// Sentinel errors returned by the storage implementation; callers branch on them with errors.Is.
var (
	// ErrNotFound: the event, delivery or endpoint does not exist (or has expired).
	ErrNotFound = errors.New("not found")
	// ErrIDConflict: an event with the same client-chosen id exists with other content.
	ErrIDConflict = errors.New("event id already used with other content")
	// ErrLeaseLost: the lease is no longer this worker's. Returned by a fenced write that matched nothing
	// because another worker took the attempt over (its fencing token changed) or the attempt is no longer
	// pending; also the cancellation cause of work whose lease was not renewed in time (lease.Keeper).
	ErrLeaseLost = errors.New("lease lost")
	// ErrNotTerminal: a retry was asked for a delivery that is still pending.
	ErrNotTerminal = errors.New("delivery is not terminal")
	// ErrTerminal: a cancel was asked for a delivery that is already terminal (success, error or cancelled).
	ErrTerminal = errors.New("delivery is terminal")
	// ErrAttemptInFlight: a retry was asked for a cancelled delivery whose attempt is still leased (its POST
	// was in flight when it was cancelled); it can be retried once that attempt's result is recorded.
	ErrAttemptInFlight = errors.New("an attempt of the delivery is still in flight")
	// ErrNotSubscribed: a retry was asked for a delivery whose consumer group has no endpoint now, or whose
	// current topics or filter no longer take the delivery's event (Endpoint.Selects).
	ErrNotSubscribed = errors.New("the consumer group has no endpoint subscribed to the delivery's topic")
	// ErrUnavailable: the database cannot be reached, timed out, or refuses writes (disk full, no primary,
	// shutting down). It wraps the driver's error; the API answers 503 database_unavailable.
	ErrUnavailable = errors.New("database unavailable")
)

// ErrBadCursor: a list cursor that the sidecar did not issue.
var ErrBadCursor = errors.New("invalid cursor")

// ErrUndecryptable is matched (errors.Is) by the error of reading an endpoint whose secret or a header value
// is stored encrypted and does not decrypt with the configured keys; the error's message names the endpoint.
var ErrUndecryptable = errors.New("endpoint value cannot be decrypted")
