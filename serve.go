package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"reflect"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/rs/zerolog"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/event"
	mongodrv "go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/x/mongo/driver/connstring"

	"github.com/pulse-sidecar/pulse/config"
	"github.com/pulse-sidecar/pulse/dispatcher"
	"github.com/pulse-sidecar/pulse/httpapi"
	"github.com/pulse-sidecar/pulse/internal/cli"
	"github.com/pulse-sidecar/pulse/internal/devdb"
	"github.com/pulse-sidecar/pulse/internal/sealing"
	"github.com/pulse-sidecar/pulse/internal/tracing"
	"github.com/pulse-sidecar/pulse/lease"
	"github.com/pulse-sidecar/pulse/mongo"
	"github.com/pulse-sidecar/pulse/pulsetype"
	"github.com/pulse-sidecar/pulse/reconciler"
	"github.com/pulse-sidecar/pulse/webhook"
)

// Periods of the background chores.
const (
	clockSyncInterval = 30 * time.Second
	sweepInterval     = time.Minute
	// pendingCountMaxAge is how long a count of pending deliveries (one aggregation, made when /metrics is
	// scraped) is reused.
	pendingCountMaxAge = 15 * time.Second
)

// serve runs the sidecar until ctx is done, then shuts down in order: publishes and /readyz answer 503 (the
// API stays up so clients get an answer, not a refused connection), the dispatcher stops claiming and lets
// in-flight POSTs finish and be recorded within PULSE_SHUTDOWN_TIMEOUT, the HTTP server closes, then the
// database is disconnected.
func serve(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	if err := cli.Parse(fs, args, serveUsage(), stdout); err != nil {
		return err
	}
	hooks, err := testHooks(getenv)
	if err != nil {
		return err
	}
	return serveWith(ctx, getenv, stdout, hooks)
}

// serveUsage is the text of `pulse serve --help`: the configuration variables with their defaults, read
// from config.Config's tags so that the list cannot fall behind.
func serveUsage() string {
	var b strings.Builder
	b.WriteString("Usage: pulse [serve]\n\nRuns the sidecar. It takes no flags: the configuration comes from these environment\nvariables (see the README for each one):\n\n")
	t := reflect.TypeOf(config.Config{})
	for i := range t.NumField() {
		name := t.Field(i).Tag.Get("env")
		if name == "" {
			continue
		}
		if def, ok := t.Field(i).Tag.Lookup("envDefault"); ok {
			fmt.Fprintf(&b, "  %-26s default %s\n", name, def)
		} else {
			fmt.Fprintf(&b, "  %s\n", name)
		}
	}
	return b.String()
}

// serveHooks let `pulse bench` observe a sidecar it runs in-process, and tests bend one (testhooks.go); the
// zero value changes nothing.
type serveHooks struct {
	monitor *event.CommandMonitor // counts the sidecar's database commands
	ready   func(addr string)     // called once the API listens

	clockSkew         time.Duration // shifts the local clock (PULSE_TEST_CLOCK_SKEW)
	crashAfterPublish bool          // SIGKILL after the first publish (PULSE_TEST_CRASH_AFTER_PUBLISH)
}

func serveWith(ctx context.Context, getenv func(string) string, stdout io.Writer, hooks serveHooks) error {
	cfg, err := config.Load(getenv)
	if err != nil {
		return err
	}
	log := newLogger(cfg, stdout)
	// Bind the API's address first: a busy port stops the process before anything is started or written.
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("PULSE_LISTEN=%q: %w", cfg.Listen, err)
	}
	defer ln.Close()
	var probeLn net.Listener
	if cfg.ProbeListen != "" {
		if probeLn, err = net.Listen("tcp", cfg.ProbeListen); err != nil {
			return fmt.Errorf("PULSE_PROBE_LISTEN=%q: %w", cfg.ProbeListen, err)
		}
		defer probeLn.Close()
	}
	keys, err := sealing.New(cfg.EncryptionKeys())
	if err != nil {
		return fmt.Errorf("PULSE_ENCRYPTION_KEY: %w", err)
	}
	uri := cfg.MongoDBURI
	if uri == "" {
		db, err := devdb.Start(ctx, devdb.Config{DataDir: cfg.DataDir, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			return fmt.Errorf("PULSE_DATA_DIR=%q: start the embedded development database: %w", cfg.DataDir, err)
		}
		defer db.Stop()
		uri = db.URI()
		log.Warn().Str("data_dir", cfg.DataDir).Msg("PULSE_MONGODB_URI is empty: using the embedded development database (FerretDB on SQLite), for development only")
	}
	dbName := cfg.Database
	if dbName == "" {
		cs, err := connstring.Parse(uri)
		if err != nil {
			return fmt.Errorf("PULSE_MONGODB_URI is invalid: %w", err)
		}
		dbName = cs.Database
	}
	if dbName == "" {
		dbName = config.DefaultDatabase
	}
	// An unreachable database fails each command after PULSE_DATABASE_TIMEOUT (server selection) instead of
	// the driver's 30 s, so API requests answer 503 database_unavailable within that bound.
	clientOpts := options.Client().ApplyURI(uri).SetAppName("pulse-sidecar").SetServerSelectionTimeout(cfg.DatabaseTimeout)
	if hooks.monitor != nil {
		clientOpts.SetMonitor(hooks.monitor)
	}
	client, err := mongodrv.Connect(clientOpts)
	if err != nil {
		return fmt.Errorf("PULSE_MONGODB_URI is invalid: %w", err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = client.Disconnect(ctx)
	}()

	local := time.Now
	if hooks.clockSkew != 0 {
		local = func() time.Time { return time.Now().Add(hooks.clockSkew) }
		log.Warn().Dur("skew_ms", hooks.clockSkew).Msg("PULSE_TEST_CLOCK_SKEW shifts this process's clock (testing only)")
	}
	clock := lease.NewClock(local)
	serverTime := func(ctx context.Context) (time.Time, error) { return serverLocalTime(ctx, client) }
	startCtx, cancelStart := context.WithTimeout(ctx, 30*time.Second)
	defer cancelStart()
	if err := clock.Sync(startCtx, serverTime); err != nil {
		return fmt.Errorf("reach the database: %w", err)
	}
	store := mongo.New(client, mongo.Options{
		Database: dbName, CollectionPrefix: cfg.CollectionPrefix, LockTimeout: cfg.LockTimeout,
		EventRetention: cfg.EventRetention, HistoryRetention: cfg.HistoryRetention, Now: clock.Now, Logger: log,
		Keys: keys,
	})
	caps, err := store.EnsureSchema(startCtx)
	if err != nil {
		return err
	}
	if !caps.TTLIndexes {
		log.Info().Msg("the database has no TTL indexes: a sweeper deletes expired documents every minute instead")
	}
	if cfg.ChangeStreams == config.ChangeStreamsRequired && !caps.ChangeStreams {
		return errors.New("PULSE_CHANGE_STREAMS=required but the database is not a replica set or sharded cluster, so it has no change streams")
	}

	denies, _ := config.ParseCIDRs(cfg.DenyCIDRs)
	allows, _ := config.ParseCIDRs(cfg.AllowCIDRs)
	sender := webhook.New(webhook.Options{UserAgent: "pulse-sidecar/" + version, DenyCIDRs: denies, AllowCIDRs: allows, Logger: log, Proxy: cfg.ProxyConfig()})
	defer sender.CloseIdleConnections()
	owner := uuid.Must(uuid.NewV7()).String()
	keeper := lease.NewKeeper(store.Renew, cfg.LockTimeout, local, log)
	metrics := httpapi.NewMetrics()
	metrics.CountPendingWith(store.PendingByGroup, pendingCountMaxAge, log)
	recon := reconciler.New(store, owner, cfg.LockTimeout, metrics, log)
	tp, err := tracing.NewProvider(startCtx, cfg.OTLPEndpoint)
	if err != nil {
		return fmt.Errorf("OTEL_EXPORTER_OTLP_ENDPOINT: %w", err)
	}
	defer func() {
		flushCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = tp.Shutdown(flushCtx) // spans that do not reach the collector are dropped
	}()
	tracer := tracing.Tracer(tp)
	disp := dispatcher.New(store, sender, recon, keeper, dispatcher.Options{
		Tracer: tracer, Owner: owner, Workers: cfg.Workers, PollInterval: cfg.PollInterval, RepairInterval: cfg.LockTimeout / 2, LockTimeout: cfg.LockTimeout, ShutdownTimeout: cfg.ShutdownTimeout, Observer: metrics, Logger: log, Now: clock.Now,
	})
	var notify httpapi.Notifier = disp
	if hooks.crashAfterPublish {
		log.Warn().Msg("PULSE_TEST_CRASH_AFTER_PUBLISH: this process dies after its first publish, before fanning it out (testing only)")
		notify = crashAfterPublish{disp}
	}
	api := httpapi.New(store, notify, httpapi.Options{APITokens: cfg.APITokens(), ReadTokens: cfg.APIReadTokens(), MaxBodyBytes: cfg.MaxBodyBytes, Metrics: metrics, Logger: log, Tracer: tracer})

	var endpointsHash [32]byte
	if cfg.EndpointsFile != "" {
		if endpointsHash, err = applyEndpointsFile(startCtx, cfg.EndpointsFile, store, func(string) {}, log); err != nil {
			return err
		}
	}
	// Every stored secret must decrypt with the configured keys: stop now, naming the endpoint, rather than
	// deliver without its signature or headers.
	stale, err := store.CheckSecrets(startCtx)
	if err != nil {
		return err
	}
	switch {
	case !keys.Enabled() && cfg.MongoDBURI != "":
		log.Warn().Msg("PULSE_ENCRYPTION_KEY is not set: endpoint signing secrets and header values are stored in clear in the database")
	case stale > 0:
		log.Info().Int("endpoints", stale).Str("key_id", keys.PrimaryKeyID()).
			Msg("some endpoints hold secrets in clear or under an older key: each is re-encrypted with the first key when next registered (PUT or the endpoints file)")
	}

	bg, stopBG := context.WithCancel(context.WithoutCancel(ctx))
	defer stopBG()
	_ = keeper.Start(bg)
	defer keeper.Stop()
	_ = disp.Start(bg)
	defer disp.Stop()
	go chores(bg, log, clock, serverTime, store)
	switch {
	case cfg.ChangeStreams == config.ChangeStreamsDisabled:
	case caps.ChangeStreams:
		go store.WatchEvents(bg, cfg.PollInterval, disp.Wake, log)
	default:
		log.Info().Msg("the database has no change streams (not a replica set): polling only")
	}
	if cfg.EndpointsFile != "" {
		go watchEndpointsFile(bg, cfg.EndpointsFile, endpointsHash, store, disp.EndpointChanged, log)
	}

	srv := &http.Server{Handler: api.Handler(), ReadHeaderTimeout: 10 * time.Second, ReadTimeout: time.Minute, IdleTimeout: 2 * time.Minute}
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }()
	started := log.Info().Str("addr", ln.Addr().String())
	probeSrv := &http.Server{Handler: api.ProbeHandler(), ReadHeaderTimeout: 10 * time.Second, ReadTimeout: time.Minute, IdleTimeout: 2 * time.Minute}
	if probeLn != nil {
		go func() { serveErr <- probeSrv.Serve(probeLn) }()
		started = started.Str("probe_addr", probeLn.Addr().String())
	}
	started.Str("database", dbName).Str("owner", owner).Bool("change_streams", caps.ChangeStreams).
		Bool("encryption", keys.Enabled()).Int("api_tokens", len(cfg.APITokens())).Int("read_tokens", len(cfg.APIReadTokens())).
		Str("version", version).Msg("listening")
	if hooks.ready != nil {
		hooks.ready(ln.Addr().String())
	}

	select {
	case err := <-serveErr:
		return fmt.Errorf("serve HTTP: %w", err)
	case <-ctx.Done():
	}
	log.Info().Msg("shutting down: publishes and /readyz now answer 503, in-flight deliveries get the grace period")
	api.Drain()
	disp.Stop() // stops claiming, waits for in-flight POSTs (PULSE_SHUTDOWN_TIMEOUT) and records them
	keeper.Stop()
	shutCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(shutCtx)
	_ = probeSrv.Shutdown(shutCtx)
	log.Info().Msg("stopped")
	return nil
}

// chores keeps the lease clock in step with the database and sweeps expired documents.
func chores(ctx context.Context, log zerolog.Logger, clock *lease.Clock, serverTime func(context.Context) (time.Time, error), store *mongo.Store) {
	// Both periods are jittered (lease.Jitter); the first sweep comes at a random point of its period, so
	// replicas started together sweep apart.
	syncT := time.NewTimer(pulsetype.Jittered(clockSyncInterval))
	sweepT := time.NewTimer(rand.N(sweepInterval))
	defer syncT.Stop()
	defer sweepT.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-syncT.C:
			syncT.Reset(pulsetype.Jittered(clockSyncInterval))
			if err := clock.Sync(ctx, serverTime); err != nil && ctx.Err() == nil {
				log.Warn().Err(err).Msg("clock sync with the database failed")
			}
		case <-sweepT.C:
			sweepT.Reset(pulsetype.Jittered(sweepInterval))
			if n, err := store.Sweep(ctx); err != nil && ctx.Err() == nil {
				log.Warn().Err(err).Msg("retention sweep failed")
			} else if n > 0 {
				log.Debug().Int64("deleted", n).Msg("retention sweep")
			}
		}
	}
}

// serverLocalTime asks the server for its clock (hello.localTime, which MongoDB and FerretDB both return).
func serverLocalTime(ctx context.Context, client *mongodrv.Client) (time.Time, error) {
	var hello struct {
		LocalTime time.Time `bson:"localTime"`
	}
	if err := client.Database("admin").RunCommand(ctx, bson.D{{Key: "hello", Value: 1}}).Decode(&hello); err != nil {
		return time.Time{}, err
	}
	if hello.LocalTime.IsZero() {
		return time.Time{}, errors.New("hello returned no localTime")
	}
	return hello.LocalTime, nil
}

func newLogger(cfg *config.Config, stdout io.Writer) zerolog.Logger {
	level, _ := zerolog.ParseLevel(cfg.LogLevel)
	var w io.Writer = stdout
	if cfg.LogFormat == "console" {
		w = zerolog.ConsoleWriter{Out: stdout, TimeFormat: time.RFC3339}
	}
	return zerolog.New(w).Level(level).With().Timestamp().Logger()
}

var _ httpapi.Store = (*mongo.Store)(nil)
var _ dispatcher.Store = (*mongo.Store)(nil)
var _ reconciler.Store = (*mongo.Store)(nil)
