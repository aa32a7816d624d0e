// Package devdb runs a development and test database: an embedded FerretDB (SQLite or PostgreSQL
// handler) behind a linearizing proxy.
//
// Invariants: clients only ever reach FerretDB through the proxy, and the proxy runs each write on a
// database alone (reads run beside other reads only). FerretDB v1 runs a read-modify-write
// (findOneAndUpdate, a fenced updateOne) as a separate read and write, so without the proxy two
// concurrent claims can both win; with it every operation is atomic, as on MongoDB. A database set to
// Interleaved (tests only) also runs its writes a document at a time; each document's write still runs
// alone. FerretDB reads a collection by index only for the filter {_id: x}: the proxy serves filters
// anchored on _id (beside other conditions, or an $in of ids) one id at a time, so they cost what the ids
// cost, not what the collection holds (pushdown.go); the index FerretDB reads by is one the proxy adds to
// each collection's SQLite table (idindex.go): FerretDB's own _id index does not match its queries. On
// PostgreSQL FerretDB reads the table for every query, by _id too, and the proxy forwards them as they are.
package devdb

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/FerretDB/FerretDB/ferretdb"
	"go.mongodb.org/mongo-driver/v2/bson"
)

// DefaultListen is the proxy address used when Config.Listen is empty: a free port on the loopback
// interface.
const DefaultListen = "127.0.0.1:0"

const (
	// readyPoll is how long Start waits between attempts to ping the database through the proxy.
	readyPoll = 20 * time.Millisecond
	// pingTimeout bounds one such attempt.
	pingTimeout = 5 * time.Second
)

// ferretNewMu serializes ferretdb.New, which writes FerretDB's global version information
// (version.Get().Package) and so races with itself when servers start concurrently.
var ferretNewMu sync.Mutex

// Config configures Start.
type Config struct {
	// DataDir is the directory of the SQLite databases, created (with parents) if missing. It is
	// required unless PostgreSQLURL is set, and ignored when it is. A running Server holds it locked
	// (see LockFileName) and writes FerretDB's own log to DatabaseLogName in it.
	DataDir string
	// PostgreSQLURL, when set, makes FerretDB use its postgresql handler with this connection string
	// (for example "postgres://127.0.0.1:5432/ferretdb") instead of SQLite. Default: empty.
	PostgreSQLURL string
	// Listen is the host:port the proxy listens on. Default DefaultListen (a free loopback port).
	Listen string
	// Logger receives the proxy's logs and FerretDB's errors. FerretDB's warnings (one multi-line
	// record per command it refuses, such as a TTL index or endSessions) go only to the log file in
	// DataDir. Default: nil, which discards them.
	Logger *slog.Logger
}

// DatabaseLogName is the file in the data directory that receives FerretDB's warnings and errors.
const DatabaseLogName = "ferretdb.log"

// Server is a running FerretDB with the linearizing proxy in front of it. Its methods are safe for
// concurrent use.
type Server struct {
	proxy   *Proxy
	uri     string
	cancel  context.CancelFunc
	runDone chan struct{}
	lock    *dirLock
	dbLog   *os.File

	stopOnce sync.Once
	stopErr  error
}

// Start binds the proxy's address (cfg.Listen) first, then creates and locks the data directory, starts
// FerretDB on a free loopback port behind the proxy, and returns once a ping through the proxy succeeds:
// a busy address fails before anything is written. ctx bounds the start only; the server runs until
// Stop. It returns a *LockedError if another Server holds the data directory, and an error if the
// configuration is invalid, the data directory cannot be created, FerretDB or the proxy cannot start,
// or ctx ends before the database answers.
func Start(ctx context.Context, cfg Config) (*Server, error) {
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	var dir string
	if cfg.PostgreSQLURL == "" {
		if cfg.DataDir == "" {
			return nil, errors.New("devdb: DataDir is empty and PostgreSQLURL is not set")
		}
		var err error
		if dir, err = filepath.Abs(cfg.DataDir); err != nil {
			return nil, fmt.Errorf("devdb: data dir %q: %w", cfg.DataDir, err)
		}
	}
	ln, err := net.Listen("tcp", cmp.Or(cfg.Listen, DefaultListen))
	if err != nil {
		return nil, fmt.Errorf("devdb: proxy listen: %w", err)
	}
	s := &Server{cancel: func() {}, runDone: make(chan struct{})}
	close(s.runDone) // until FerretDB runs
	fail := func(err error) (*Server, error) {
		_ = ln.Close()
		return nil, errors.Join(err, s.Stop())
	}

	dbLogger := slog.New(minLevelHandler{min: slog.LevelError, next: logger.Handler()})
	fcfg := &ferretdb.Config{Listener: ferretdb.ListenerConfig{TCP: "127.0.0.1:0"}}
	if cfg.PostgreSQLURL != "" {
		fcfg.Handler, fcfg.PostgreSQLURL = "postgresql", cfg.PostgreSQLURL
	} else {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fail(fmt.Errorf("devdb: create data dir: %w", err))
		}
		if s.lock, err = lockDir(dir); err != nil {
			return fail(fmt.Errorf("devdb: %w", err))
		}
		if s.dbLog, err = os.OpenFile(filepath.Join(dir, DatabaseLogName), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644); err != nil {
			return fail(fmt.Errorf("devdb: database log: %w", err))
		}
		fileHandler := slog.NewTextHandler(s.dbLog, &slog.HandlerOptions{Level: slog.LevelWarn})
		dbLogger = slog.New(teeHandler{fileHandler, dbLogger.Handler()})
		fcfg.Handler = "sqlite"
		fcfg.SQLiteURL = (&url.URL{Scheme: "file", Path: filepath.ToSlash(dir) + "/"}).String()
	}
	fcfg.Logger = dbLogger.With("component", "ferretdb")

	ferretNewMu.Lock()
	f, err := ferretdb.New(fcfg)
	ferretNewMu.Unlock()
	if err != nil {
		return fail(fmt.Errorf("devdb: start ferretdb: %w", err))
	}
	runCtx, cancel := context.WithCancel(context.Background())
	s.cancel, s.runDone = cancel, make(chan struct{})
	go func() {
		defer close(s.runDone)
		_ = f.Run(runCtx) // always nil; it returns once runCtx is canceled and everything is closed
	}()
	upstream, err := url.Parse(f.MongoDBURI()) // FerretDB's own listener, bound by New
	if err != nil {
		return fail(fmt.Errorf("devdb: ferretdb uri: %w", err))
	}

	// On SQLite, queries by _id read an index (the one idIndexes adds), so the proxy serves filters anchored
	// on _id one id at a time; FerretDB's PostgreSQL handler reads the table for those queries too (its _id
	// index serves its updates only), so there one read of the table for all the ids costs less.
	var ids *idIndexes
	if cfg.PostgreSQLURL == "" {
		ids = newIDIndexes(dir)
	}
	s.proxy = newProxy(ln, upstream.Host, logger.With("component", "devdb-proxy"), ids != nil, ids)
	s.uri = (&url.URL{Scheme: "mongodb", Host: s.proxy.Addr().String(), Path: "/"}).String()

	if err := waitReady(ctx, s.proxy.Addr().String()); err != nil {
		return nil, errors.Join(fmt.Errorf("devdb: wait for database: %w", err), s.Stop())
	}
	return s, nil
}

// URI returns the connection string of the proxy, for example "mongodb://127.0.0.1:40123/". Clients
// must use it rather than FerretDB's own address.
func (s *Server) URI() string { return s.uri }

// Stop closes the proxy and all its connections, then stops FerretDB, and blocks until both are
// closed. It is safe to call more than once; later calls return the first call's error.
func (s *Server) Stop() error {
	s.stopOnce.Do(func() {
		if s.proxy != nil {
			s.stopErr = s.proxy.Close()
		}
		s.cancel()
		<-s.runDone
		if s.dbLog != nil {
			_ = s.dbLog.Close()
		}
		s.lock.release() // last: FerretDB has closed its files
	})
	return s.stopErr
}

// waitReady pings the database through the proxy at addr until it answers ok, polling every
// readyPoll, each attempt bounded by pingTimeout. It returns the last failure once ctx ends.
func waitReady(ctx context.Context, addr string) error {
	for {
		attemptCtx, cancel := context.WithTimeout(ctx, pingTimeout)
		err := ping(attemptCtx, addr)
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last attempt: %w)", context.Cause(ctx), err)
		case <-time.After(readyPoll):
		}
	}
}

// ping sends {ping: 1, $db: "admin"} as an OP_MSG to addr and checks that the reply has ok: 1.
func ping(ctx context.Context, addr string) error {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	if deadline, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(deadline) // waitReady always sets one
	}

	body, err := bson.Marshal(bson.D{{Key: "ping", Value: 1}, {Key: "$db", Value: "admin"}})
	if err != nil {
		return err
	}
	req := make([]byte, headerSize+4+1, headerSize+4+1+len(body))
	binary.LittleEndian.PutUint32(req[4:], 1)      // requestID
	binary.LittleEndian.PutUint32(req[12:], opMsg) // opCode; responseTo, flagBits and kind stay 0
	req = append(req, body...)
	binary.LittleEndian.PutUint32(req[0:], uint32(len(req)))
	if _, err := conn.Write(req); err != nil {
		return err
	}

	reply, err := ReadMessage(conn)
	if err != nil {
		return err
	}
	if len(reply) < headerSize+4+1+5 || binary.LittleEndian.Uint32(reply[12:]) != opMsg || reply[headerSize+4] != 0 {
		return errors.New("ping: unexpected reply")
	}
	doc := bson.Raw(reply[headerSize+4+1:])
	if ok, _ := doc.Lookup("ok").AsFloat64OK(); ok != 1 {
		return fmt.Errorf("ping: reply %s", doc)
	}
	return nil
}

// minLevelHandler passes to next only the records at min level or above.
type minLevelHandler struct {
	min  slog.Level
	next slog.Handler
}

func (h minLevelHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= h.min && h.next.Enabled(ctx, l)
}

func (h minLevelHandler) Handle(ctx context.Context, r slog.Record) error {
	return h.next.Handle(ctx, r)
}

func (h minLevelHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return minLevelHandler{min: h.min, next: h.next.WithAttrs(as)}
}

func (h minLevelHandler) WithGroup(name string) slog.Handler {
	return minLevelHandler{min: h.min, next: h.next.WithGroup(name)}
}

// teeHandler hands every record to each of its handlers that is enabled for its level.
type teeHandler []slog.Handler

func (t teeHandler) Enabled(ctx context.Context, l slog.Level) bool {
	for _, h := range t {
		if h.Enabled(ctx, l) {
			return true
		}
	}
	return false
}

func (t teeHandler) Handle(ctx context.Context, r slog.Record) error {
	var errs []error
	for _, h := range t {
		if h.Enabled(ctx, r.Level) {
			errs = append(errs, h.Handle(ctx, r.Clone()))
		}
	}
	return errors.Join(errs...)
}

func (t teeHandler) WithAttrs(as []slog.Attr) slog.Handler {
	out := make(teeHandler, len(t))
	for i, h := range t {
		out[i] = h.WithAttrs(as)
	}
	return out
}

func (t teeHandler) WithGroup(name string) slog.Handler {
	out := make(teeHandler, len(t))
	for i, h := range t {
		out[i] = h.WithGroup(name)
	}
	return out
}
