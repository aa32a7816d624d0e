package mongo

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/rs/zerolog"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// Options configure a Store. Zero durations mean "keep forever" for retention.
type Options struct {
	Database         string
	CollectionPrefix string
	LockTimeout      time.Duration // lease length of a claimed attempt
	EventRetention   time.Duration // events: expiresAt = createdAt + this; 0 = forever
	HistoryRetention time.Duration // terminal deliveries and ended attempts; 0 = forever
	// Now returns the database's current time (lease.Clock.Now); nil uses time.Now.
	Now    func() time.Time
	Logger zerolog.Logger
}

// Store reads and writes the sidecar's collections. It is safe for concurrent use.
type Store struct {
	client                                     *mongo.Client
	db                                         *mongo.Database
	events, subscriptions, deliveries, history *mongo.Collection
	opts                                       Options
	caps                                       Capabilities
	log                                        zerolog.Logger
}

// Capabilities are what the server supports, detected by EnsureSchema.
type Capabilities struct {
	TTL           bool // TTL indexes (FerretDB answers 238 NotImplemented)
	ChangeStreams bool // replica set or sharded cluster
}

// New returns a Store on client. It does no I/O; call EnsureSchema before use.
func New(client *mongo.Client, opts Options) *Store {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	db := client.Database(opts.Database)
	p := opts.CollectionPrefix
	return &Store{
		client:        client,
		db:            db,
		events:        db.Collection(p + ".events"),
		subscriptions: db.Collection(p + ".subscriptions"),
		deliveries:    db.Collection(p + ".deliveries"),
		history:       db.Collection(p + ".history"),
		opts:          opts,
		log:           opts.Logger.With().Str("component", "store").Logger(),
	}
}

// Capabilities returns what EnsureSchema detected.
func (s *Store) Capabilities() Capabilities { return s.caps }

// Ping checks that the database answers, for /readyz.
func (s *Store) Ping(ctx context.Context) error {
	return s.client.Ping(ctx, nil)
}

func (s *Store) now() time.Time { return s.opts.Now().UTC().Truncate(time.Millisecond) }

// expiry returns now+d, or nil when d is 0 (keep forever).
func expiry(now time.Time, d time.Duration) *time.Time {
	if d <= 0 {
		return nil
	}
	t := now.Add(d)
	return &t
}

// isNotImplemented reports whether err is the server's code 238 NotImplemented (FerretDB's answer for TTL
// indexes, partial indexes and change streams).
func isNotImplemented(err error) bool {
	var ce mongo.CommandError
	if errors.As(err, &ce) && ce.Code == 238 {
		return true
	}
	var we mongo.WriteException
	if errors.As(err, &we) && we.WriteConcernError != nil && we.WriteConcernError.Code == 238 {
		return true
	}
	return false
}

func wrap(op string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%s: %w", op, err)
}

// findAll runs a find on coll and decodes every matching document into a T, reading the cursor to its end.
// Errors are wrapped with what.
func findAll[T any](ctx context.Context, coll *mongo.Collection, what string, filter any, opts ...options.Lister[options.FindOptions]) ([]T, error) {
	cur, err := coll.Find(ctx, filter, opts...)
	if err != nil {
		return nil, wrap(what, err)
	}
	var out []T
	if err := cur.All(ctx, &out); err != nil {
		return nil, wrap(what, err)
	}
	return out, nil
}
