package mongo

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/rs/zerolog"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/x/mongo/driver"
	"go.mongodb.org/mongo-driver/v2/x/mongo/driver/topology"

	"github.com/pulse-sidecar/pulse/internal/sealing"
	"github.com/pulse-sidecar/pulse/pulsetype"
)

// Options configure a Store. Zero durations mean "keep forever" for retention.
type Options struct {
	Database         string
	CollectionPrefix string
	LeaseTimeout     time.Duration // lease length of a claimed attempt
	EventRetention   time.Duration // events: expiresAt = createdAt + this; 0 = forever
	HistoryRetention time.Duration // terminal deliveries and ended attempts; 0 = forever
	// Now returns the database's current time (lease.Clock.Now); nil uses time.Now.
	Now    func() time.Time
	Logger zerolog.Logger
	// Keys, when set, encrypt endpoint secrets and header values at rest (the first key) and decrypt them
	// (any key); nil stores them in clear and reads clear ones only.
	Keys *sealing.Keyring
	// Capabilities, when set, are what the server can do, taken as given: EnsureSchema neither probes nor
	// asks. Nil: EnsureSchema detects them (DetectCapabilities).
	Capabilities *Capabilities
	// ReadConcern is the read concern level ("majority", "local", ...) the store's finds and aggregations
	// send themselves (they are sent as commands, see reads.go, which the client's read concern does not
	// reach); "" sends none: the server's default.
	ReadConcern string
	// PageSize bounds the ids one command of the store's bulk work names (ending a group's pending work, the
	// queue migration): that work runs in pages of this many documents, so no command grows with the backlog.
	// 0 means DefaultPageSize.
	PageSize int
	// FilterErrors, when set, is called with the consumer group of each delivery the fan-out ends as
	// pulsetype.CodeFilterError (its filter's evaluation failed, pulsetype.FilterError), for a metric; the
	// store logs the first of each group and filter itself.
	FilterErrors func(group string)
	// SummarizeIndexBuilds, for a database where builds take milliseconds (the embedded development
	// database), logs EnsureSchema's index builds at debug and one info line for all of them ("built 25
	// indexes in 0.4 s"); false (MongoDB, where one build can take minutes) logs each build at info, before
	// and after.
	SummarizeIndexBuilds bool
}

// DefaultPageSize is Options.PageSize when unset: 1,000 ids of at most 40 bytes make a command of about
// 50 KiB, far below MongoDB's 16 MiB limit on a command (BSON document size).
const DefaultPageSize = 1000

// Store reads and writes the sidecar's collections. It is safe for concurrent use.
type Store struct {
	client                                     *mongo.Client
	db                                         *mongo.Database
	events, subscriptions, deliveries, history *mongo.Collection
	queue, outbox                              *mongo.Collection // pending work (queueDoc) and unfinished fan-outs (outboxDoc)
	opts                                       Options
	caps                                       Capabilities
	log                                        zerolog.Logger
	publishes                                  *groupCommit                              // concurrent publishes of one event each, written together
	hello                                      func(context.Context) (helloReply, error) // nil: the server's hello (tests replace it)
	filters                                    pulsetype.FilterCache                     // the consumer groups' filters, compiled once
	filterLogged                               sync.Map                                  // group + "\x00" + filter: its first filter_error was logged
}

// New returns a Store on client. It does no I/O; call EnsureSchema before use.
func New(client *mongo.Client, opts Options) *Store {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	db := client.Database(opts.Database)
	p := opts.CollectionPrefix
	s := &Store{
		client:        client,
		db:            db,
		events:        db.Collection(p + ".events"),
		subscriptions: db.Collection(p + ".subscriptions"),
		deliveries:    db.Collection(p + ".deliveries"),
		history:       db.Collection(p + ".history"),
		queue:         db.Collection(p + ".queue"),
		outbox:        db.Collection(p + ".outbox"),
		opts:          opts,
		log:           opts.Logger.With().Str("component", "store").Logger(),
	}
	s.publishes = &groupCommit{store: s}
	return s
}

// collections returns the sidecar's collections by suffix (see collectionNames).
func (s *Store) collections() map[string]*mongo.Collection {
	return map[string]*mongo.Collection{"events": s.events, "subscriptions": s.subscriptions, "deliveries": s.deliveries,
		"history": s.history, "queue": s.queue, "outbox": s.outbox}
}

// Capabilities returns the capabilities EnsureSchema built the store with (the zero value before it ran).
func (s *Store) Capabilities() Capabilities { return s.caps }

// Ping checks that the database answers, for /readyz.
func (s *Store) Ping(ctx context.Context) error {
	return s.client.Ping(ctx, nil)
}

// pageSize is Options.PageSize or DefaultPageSize.
func (s *Store) pageSize() int { return cmp.Or(max(s.opts.PageSize, 0), DefaultPageSize) }

func (s *Store) now() time.Time { return s.opts.Now().UTC().Truncate(time.Millisecond) }

// expiry returns now+d, or nil when d is 0 (keep forever).
func expiry(now time.Time, d time.Duration) *time.Time {
	if d <= 0 {
		return nil
	}
	t := now.Add(d)
	return &t
}

// wrap prefixes err with op; an error that says the database is unavailable (see unavailable) also wraps
// pulsetype.ErrUnavailable.
func wrap(op string, err error) error {
	if err == nil {
		return nil
	}
	if unavailable(err) {
		return fmt.Errorf("%s: %w: %w", op, pulsetype.ErrUnavailable, err)
	}
	return fmt.Errorf("%s: %w", op, err)
}

// noServer reports whether err says the driver found no usable server within its server selection timeout
// (PULSE_DATABASE_TIMEOUT): the database is unreachable, and a command sent now would wait as long again.
func noServer(err error) bool {
	var sse topology.ServerSelectionError
	return errors.As(err, &sse)
}

// unavailableCodes are server error codes that mean "not now" rather than "not this request": MongoDB's
// HostUnreachable 6, HostNotFound 7, NetworkTimeout 89, ShutdownInProgress 91, PrimarySteppedDown 189,
// ExceededTimeLimit 262, NotWritablePrimary 10107, InterruptedAtShutdown 11600,
// InterruptedDueToReplStateChange 11602, NotPrimaryNoSecondaryOk 13435, NotPrimaryOrSecondary 13436,
// OutOfDiskSpace 14031; and InternalError 1, which the embedded database (FerretDB) answers when its storage
// fails, for example "database or disk is full".
var unavailableCodes = map[int32]bool{1: true, 6: true, 7: true, 89: true, 91: true, 189: true, 262: true, 10107: true,
	11600: true, 11602: true, 13435: true, 13436: true, 14031: true}

// unavailable reports whether err means the database cannot serve now: a network error, a timeout (server
// selection included), a deadline, an error of the driver's connections or connection pool (a connection
// that failed or was closed, a pool cleared after another operation's network error, a wait for a
// connection that timed out), a socket error (a reset, a refused connection, EOF), or a server error code
// of unavailableCodes (as a command error, a write error or a write concern error).
func unavailable(err error) bool {
	if err == nil {
		return false
	}
	if mongo.IsNetworkError(err) || mongo.IsTimeout(err) || errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	var sse topology.ServerSelectionError
	var ce topology.ConnectionError
	var wqe topology.WaitQueueTimeoutError
	var pe topology.PoolError
	var pool driver.RetryablePoolError // the driver's pool cleared error ("connection pool ... was cleared")
	var ne net.Error
	if errors.As(err, &sse) || errors.As(err, &ce) || errors.As(err, &wqe) || errors.As(err, &pe) || errors.As(err, &pool) ||
		errors.As(err, &ne) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.EPIPE) || errors.Is(err, net.ErrClosed) {
		return true
	}
	var se mongo.ServerError
	if !errors.As(err, &se) {
		return false
	}
	for code := range unavailableCodes {
		if se.HasErrorCode(int(code)) {
			return true
		}
	}
	return false
}

// ProbeWrite upserts one small document in <prefix>.readiness to learn whether the database accepts writes
// (for /readyz: a full disk or a lost primary answers reads but not writes). It returns the wrapped error.
func (s *Store) ProbeWrite(ctx context.Context) error {
	_, err := s.db.Collection(s.opts.CollectionPrefix+".readiness").UpdateOne(ctx, bson.M{"_id": "probe"},
		bson.M{"$set": bson.M{"at": s.now()}}, options.UpdateOne().SetUpsert(true))
	return wrap("probe a write", err)
}

// findAll runs a find on coll (see find: with a server-side time limit) and decodes every matching document
// into a T, reading the cursor to its end. s gives the read concern (nil: the server's default). Errors are
// wrapped with what.
func findAll[T any](ctx context.Context, s *Store, coll *mongo.Collection, what string, filter any, opts ...options.Lister[options.FindOptions]) ([]T, error) {
	cur, err := s.find(ctx, coll, filter, opts...)
	if err != nil {
		return nil, wrap(what, err)
	}
	var out []T
	if err := cur.All(ctx, &out); err != nil {
		return nil, wrap(what, err)
	}
	return out, nil
}

// Re-issuing writes. The driver retries a write once across an election only when it is a retryable write:
// insertOne/insertMany, updateOne, deleteOne, findAndModify, and bulk writes holding none of the others;
// never updateMany or deleteMany (multi: true), nor a bulk write holding one (driver mongo/collection.go
// and mongo/bulk_write.go: RetryNone for multi). The store re-issues those itself (updateMany, deleteMany,
// bulkUpdate), each safe to repeat: their updates $set values computed before the first try, under filters
// that keep what they guard (status pending, the fencing token, an unleased attempt), so a second try applies
// only what the first did not, and a delete of what is gone deletes nothing. A second try's counts cover only
// what it changed: callers that branch on them read the documents back (FinishAttempts) or only log them.

// Re-issue is bounded by time, not by a count of tries: an election lasts up to about 12 s (MongoDB's manual,
// "Replica Set Elections"), and a write given up on before it ends may have applied (a lost reply) and stay
// unknown to its caller: a claim that applied is then reaped after its lease as worker_lost, a failed attempt
// without a POST. reissue sends the write again while it fails for the topology's sake (retryableWrite) or
// finds no server (noServer: no primary yet, or the network is cut), until the context's deadline (the
// request's, or the lease's for a claim); a context without a deadline gets reissueBound.
const (
	reissueWait    = 100 * time.Millisecond // the wait after the first retryable failure, doubled after each further one
	reissueMaxWait = time.Second            // the longest wait between two tries
	reissueBound   = 10 * time.Second       // how long a write whose context has no deadline is re-issued
)

// retryableWrite reports whether a write that failed with err may have failed for the topology's sake and
// can be re-issued: a network error, an error labelled RetryableWriteError by the server or the driver, or
// one of the codes of the retryable writes specification (HostUnreachable 6, HostNotFound 7,
// NetworkTimeout 89, ShutdownInProgress 91, PrimarySteppedDown 189, ExceededTimeLimit 262, SocketException
// 9001, NotWritablePrimary 10107, InterruptedAtShutdown 11600, InterruptedDueToReplStateChange 11602,
// NotPrimaryNoSecondaryOk 13435, NotPrimaryOrSecondary 13436).
func retryableWrite(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var pool driver.RetryablePoolError // a pool cleared by another operation's network error: nothing was sent
	if mongo.IsNetworkError(err) || errors.As(err, &pool) && pool.Retryable() {
		return true
	}
	var le interface{ HasErrorLabel(string) bool }
	if errors.As(err, &le) && le.HasErrorLabel("RetryableWriteError") {
		return true
	}
	var se mongo.ServerError
	if !errors.As(err, &se) {
		return false
	}
	for _, code := range []int{6, 7, 89, 91, 189, 262, 9001, 10107, 11600, 11602, 13435, 13436} {
		if se.HasErrorCode(code) {
			return true
		}
	}
	return false
}

// reissuable reports whether a write that failed with err is sent again: a retryableWrite error, or no
// server found within the server selection timeout (noServer), as while a replica set elects a primary.
func reissuable(err error) bool {
	return retryableWrite(err) || (err != nil && noServer(err) && !errors.Is(err, context.Canceled))
}

// reissue runs write, and runs it again after a pause (see pause) while it fails with a reissuable error.
// It returns the last error.
func reissue(ctx context.Context, write func(context.Context) error) error {
	p := newPauses(ctx)
	for {
		err := write(ctx)
		if !reissuable(err) || !p.pause(ctx) {
			return err
		}
	}
}

// pauses are the waits between the tries of a re-issued command: reissueWait, doubling up to reissueMaxWait,
// while the wait ends before the context's deadline (reissueBound after the first try when it has none).
type pauses struct {
	deadline time.Time
	wait     time.Duration
}

func newPauses(ctx context.Context) *pauses {
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(reissueBound)
	}
	return &pauses{deadline: deadline, wait: reissueWait}
}

// pause waits before the next try and reports true, or reports false at once when the wait would not end
// before the deadline, and false when ctx ends during the wait.
func (p *pauses) pause(ctx context.Context) bool {
	if time.Until(p.deadline) <= p.wait {
		return false
	}
	t := time.NewTimer(p.wait)
	defer t.Stop()
	p.wait = min(2*p.wait, reissueMaxWait)
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// reread is findAll, sent again (see reissue) while the database does not answer: for the read-backs that
// tell a caller what its re-issued writes did.
func reread[T any](ctx context.Context, s *Store, coll *mongo.Collection, what string, filter any, opts ...options.Lister[options.FindOptions]) ([]T, error) {
	var out []T
	err := reissue(ctx, func(ctx context.Context) (err error) {
		out, err = findAll[T](ctx, s, coll, what, filter, opts...)
		return err
	})
	return out, err
}

// insertNew is coll.InsertMany, unordered, of documents whose keys make a repeat a duplicate: re-issued
// while the database does not answer, and a duplicate (an earlier try, or another writer, inserted it) is
// success. For the queue's documents and the deliveries, whose duplicates are always the same work.
func (s *Store) insertNew(ctx context.Context, coll *mongo.Collection, docs []any) error {
	return reissue(ctx, func(ctx context.Context) error {
		_, err := coll.InsertMany(ctx, docs, options.InsertMany().SetOrdered(false))
		if onlyDuplicates(err) {
			return nil
		}
		return err
	})
}

// insertAttempts inserts attempt documents (each with a new _id) into the history with one unordered
// insertMany, re-issued while the database does not answer, and returns for each whether it is in the history
// as this call inserted it; false: a duplicate of another writer's attempt (the same delivery and number, on
// the unique index). Before a re-issue it reads back, by _id, which documents an unanswered try inserted: those
// count as inserted, and only the others are sent again, so that a lost reply never makes this call's own
// attempt look like another writer's.
func (s *Store) insertAttempts(ctx context.Context, docs []any) ([]bool, error) {
	inserted := make([]bool, len(docs))
	rest := make([]int, len(docs)) // indexes of docs not known to be in the history
	for i := range rest {
		rest[i] = i
	}
	p := newPauses(ctx)
	for {
		batch := make([]any, len(rest))
		for j, i := range rest {
			batch[j] = docs[i]
		}
		_, err := s.history.InsertMany(ctx, batch, options.InsertMany().SetOrdered(false))
		if err == nil || onlyDuplicates(err) {
			for j, i := range rest {
				inserted[i] = !failedAt(err, j)
			}
			return inserted, nil
		}
		if !reissuable(err) || !p.pause(ctx) {
			return nil, err
		}
		ids := make([]string, len(rest))
		for j, i := range rest {
			ids[j] = docs[i].(*attemptDoc).ID
		}
		found, rerr := reread[attemptDoc](ctx, s, s.history, "read back inserted attempts", bson.M{"_id": bson.M{"$in": ids}},
			options.Find().SetProjection(bson.M{"_id": 1}))
		if rerr != nil {
			return nil, errors.Join(err, rerr)
		}
		there := make(map[string]bool, len(found))
		for _, d := range found {
			there[d.ID] = true
		}
		kept := rest[:0]
		for _, i := range rest {
			if there[docs[i].(*attemptDoc).ID] {
				inserted[i] = true
			} else {
				kept = append(kept, i)
			}
		}
		if rest = kept; len(rest) == 0 {
			return inserted, nil
		}
	}
}

// updateMany is coll.UpdateMany, re-issued on a retryable error (see reissue); update must be safe to repeat.
func (s *Store) updateMany(ctx context.Context, coll *mongo.Collection, filter, update any) (*mongo.UpdateResult, error) {
	var res *mongo.UpdateResult
	err := reissue(ctx, func(ctx context.Context) (err error) {
		res, err = coll.UpdateMany(ctx, filter, update)
		return err
	})
	return res, err
}

// deleteMany is coll.DeleteMany, re-issued on a retryable error (see reissue).
func (s *Store) deleteMany(ctx context.Context, coll *mongo.Collection, filter any) (*mongo.DeleteResult, error) {
	var res *mongo.DeleteResult
	err := reissue(ctx, func(ctx context.Context) (err error) {
		res, err = coll.DeleteMany(ctx, filter)
		return err
	})
	return res, err
}

// bulkUpdate runs update models as unordered bulk writes of at most Capabilities.MaxUpdateStatements
// statements each (all in one when it is 0), each re-issued on a retryable error (see reissue; the models must
// be safe to repeat), and returns how many documents their filters matched in total.
func (s *Store) bulkUpdate(ctx context.Context, coll *mongo.Collection, models []mongo.WriteModel) (matched int64, err error) {
	size := s.caps.MaxUpdateStatements
	if size <= 0 {
		size = max(len(models), 1)
	}
	for chunk := range slices.Chunk(models, size) {
		var res *mongo.BulkWriteResult
		err := reissue(ctx, func(ctx context.Context) (err error) {
			res, err = coll.BulkWrite(ctx, chunk, options.BulkWrite().SetOrdered(false))
			return err
		})
		if err != nil {
			return matched, err
		}
		matched += res.MatchedCount
	}
	return matched, nil
}

// onlyDuplicates reports whether err is a bulk write error made only of duplicate-key errors ("already
// done").
func onlyDuplicates(err error) bool {
	var bwe mongo.BulkWriteException
	if !errors.As(err, &bwe) || bwe.WriteConcernError != nil || len(bwe.WriteErrors) == 0 {
		return false
	}
	for _, we := range bwe.WriteErrors {
		if we.Code != 11000 && we.Code != 11001 && we.Code != 12582 {
			return false
		}
	}
	return true
}

// failedAt reports whether the insertMany that returned err failed to insert its document at index i.
func failedAt(err error, i int) bool {
	var bwe mongo.BulkWriteException
	if !errors.As(err, &bwe) {
		return false
	}
	return slices.ContainsFunc(bwe.WriteErrors, func(we mongo.BulkWriteError) bool { return we.Index == i })
}

// idsOf returns id(x) for each x of xs, in order: the ids a query by {_id: {$in: …}} names.
func idsOf[T any](xs []T, id func(T) string) []string {
	out := make([]string, len(xs))
	for i, x := range xs {
		out[i] = id(x)
	}
	return out
}
