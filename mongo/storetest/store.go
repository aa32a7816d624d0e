package storetest

import (
	"context"
	"time"

	"github.com/pulse-sidecar/pulse/dispatcher"
	"github.com/pulse-sidecar/pulse/httpapi"
	"github.com/pulse-sidecar/pulse/pulsetype"
	"github.com/pulse-sidecar/pulse/reconciler"
)

// Store is the store under test: what its callers need of it (the dispatcher, the HTTP API and the
// reconciler, by their own interfaces), and the few calls of theirs that take a store's method rather than
// the store (fan-out without claiming, the lease keeper's renewal, one attempt's result, the sweeper, the
// metrics' reader of endpoint states).
type Store interface {
	dispatcher.Store
	httpapi.Store
	reconciler.Store
	// FanOut is FanOutClaiming that leases none.
	FanOut(ctx context.Context, events []*pulsetype.Event) ([]*pulsetype.Attempt, error)
	// Claim leases the single most overdue claimable attempt of the consumer groups groups (nil: of any),
	// or returns nil when none is due.
	Claim(ctx context.Context, owner string, groups []string) (*pulsetype.Attempt, error)
	// ClaimBatch leases up to limit claimable attempts of the consumer groups groups (nil: of any), most
	// overdue first.
	ClaimBatch(ctx context.Context, owner string, groups []string, limit int) ([]*pulsetype.Attempt, error)
	// Renew extends the given leases and returns those that were lost.
	Renew(ctx context.Context, leases []pulsetype.LeaseKey) ([]pulsetype.LeaseKey, error)
	// FinishAttempt records one leased attempt's result, or returns pulsetype.ErrLeaseLost.
	FinishAttempt(ctx context.Context, a *pulsetype.Attempt, r pulsetype.AttemptResult) error
	// Sweep removes expired documents where the server has no TTL indexes and returns how many.
	Sweep(ctx context.Context) (int64, error)
	// EndpointStates returns the state of every consumer group's endpoint (the metrics' reader of states).
	EndpointStates(ctx context.Context) (map[string]pulsetype.EndpointState, error)
	// TTLIndexes reports whether the store leaves expiry to the server's TTL indexes (then Sweep removes
	// only what they do not cover).
	TTLIndexes() bool
}

// Options configure a store under test (Harness.NewStore).
type Options struct {
	// Database and CollectionPrefix name where the store keeps its collections: <prefix>.events, .queue…
	Database, CollectionPrefix string
	// LeaseTimeout is how long a claim's lease lasts.
	LeaseTimeout time.Duration
	// Now is the store's clock; nil is the real one.
	Now func() time.Time
	// EventRetention and HistoryRetention are how long events, and deliveries with their attempts, are
	// kept; 0 keeps them forever.
	EventRetention, HistoryRetention time.Duration
}
