package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/rs/zerolog"
	"go.mongodb.org/mongo-driver/v2/event"

	"github.com/pulse-sidecar/pulse/config"
	"github.com/pulse-sidecar/pulse/dispatcher"
	"github.com/pulse-sidecar/pulse/httpapi"
	"github.com/pulse-sidecar/pulse/internal/cli"
	"github.com/pulse-sidecar/pulse/internal/devdb"
	"github.com/pulse-sidecar/pulse/internal/sealing"
	"github.com/pulse-sidecar/pulse/internal/startstop"
	"github.com/pulse-sidecar/pulse/internal/tracing"
	"github.com/pulse-sidecar/pulse/lease"
	"github.com/pulse-sidecar/pulse/mongo"
	"github.com/pulse-sidecar/pulse/reconciler"
	"github.com/pulse-sidecar/pulse/webhook"
)

// pendingCountMaxAge is how long a count of pending deliveries (one aggregation, made when /metrics is
// scraped) is reused.
const pendingCountMaxAge = 15 * time.Second

// serve runs the sidecar until ctx is done. Its background services start in this order: the lease keeper,
// the clock sync, the retention sweeper, the change-stream and endpoints-file watchers, the dispatcher (a
// failed start stops those started, last first). Each Stop waits for its service's goroutines
// (internal/startstop). Shutdown goes in this order:
//  1. publishes and /readyz answer 503 (the API stays up so clients get an answer, not a refused connection);
//  2. the dispatcher stops claiming; in-flight POSTs finish and are recorded within PULSE_SHUTDOWN_TIMEOUT;
//  3. the watchers, the sweeper and the clock sync stop, then the keeper (it renewed the in-flight leases);
//  4. the HTTP servers close, then the database is disconnected.
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
		if dbName, err = mongo.DatabaseName(uri); err != nil {
			return fmt.Errorf("PULSE_MONGODB_URI is invalid: %w", err)
		}
	}
	dbName = cmp.Or(dbName, config.DefaultDatabase)
	// An unreachable database fails each command after PULSE_DATABASE_TIMEOUT (server selection) instead of
	// the driver's 30 s, so API requests answer 503 database_unavailable within that bound.
	client, err := mongo.Connect(uri, mongo.ConnectOptions{ServerSelectionTimeout: cfg.DatabaseTimeout, Monitor: hooks.monitor})
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
	store := mongo.New(client, mongo.Options{
		Database: dbName, CollectionPrefix: cfg.CollectionPrefix, LeaseTimeout: cfg.LeaseTimeout,
		EventRetention: cfg.EventRetention, HistoryRetention: cfg.HistoryRetention, Now: clock.Now, Logger: log,
		Keys: keys,
	})
	startCtx, cancelStart := context.WithTimeout(ctx, 30*time.Second)
	defer cancelStart()
	if err := clock.Sync(startCtx, store.ServerTime); err != nil {
		return fmt.Errorf("reach the database: %w", err)
	}
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

	denies, _ := webhook.ParseCIDRs(cfg.DenyCIDRs)
	allows, _ := webhook.ParseCIDRs(cfg.AllowCIDRs)
	sender := webhook.New(webhook.Options{UserAgent: "pulse-sidecar/" + version, DenyCIDRs: denies, AllowCIDRs: allows, Logger: log, Proxy: cfg.ProxyConfig()})
	defer sender.CloseIdleConnections()
	owner := uuid.Must(uuid.NewV7()).String()
	keeper := lease.NewKeeper(store.Renew, cfg.LeaseTimeout, local, log)
	metrics := httpapi.NewMetrics()
	metrics.CountPendingWith(store.PendingByGroup, pendingCountMaxAge, log)
	metrics.ReadStatesWith(store.EndpointStates)
	recon := reconciler.New(store, owner, cfg.LeaseTimeout, metrics, log)
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
		Tracer: tracer, Owner: owner, Workers: cfg.Workers, PollInterval: cfg.PollInterval, RepairInterval: cfg.LeaseTimeout / 2, LeaseTimeout: cfg.LeaseTimeout, ShutdownTimeout: cfg.ShutdownTimeout, Observer: metrics, Logger: log, Now: clock.Now,
	})
	var notify httpapi.Notifier = disp
	if hooks.crashAfterPublish {
		log.Warn().Msg("PULSE_TEST_CRASH_AFTER_PUBLISH: this process dies after its first publish, before fanning it out (testing only)")
		notify = crashAfterPublish{disp}
	}
	api := httpapi.New(store, notify, httpapi.Options{APITokens: cfg.APITokens(), ReadTokens: cfg.APIReadTokens(), MaxBodyBytes: cfg.MaxBodyBytes, Metrics: metrics, Logger: log, Tracer: tracer,
		CheckHost: cfg.APIChecksHost(), AllowedHosts: cfg.AllowedHosts})

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

	// Started in this order, stopped in the reverse one (see serve's comment).
	services := []startstop.Service{keeper, lease.NewClockSync(clock, store.ServerTime, lease.DefaultSyncInterval, log),
		reconciler.NewSweeper(store.Sweep, reconciler.DefaultSweepInterval, log)}
	switch {
	case cfg.ChangeStreams == config.ChangeStreamsDisabled:
	case caps.ChangeStreams:
		services = append(services, mongo.NewEventWatcher(store, cfg.PollInterval, disp.Wake, log))
	default:
		log.Info().Msg("the database has no change streams (not a replica set): polling only")
	}
	if cfg.EndpointsFile != "" {
		services = append(services, newEndpointsWatcher(cfg.EndpointsFile, endpointsHash, store, disp.EndpointChanged, log))
	}
	services = append(services, disp)
	httpSrv := newHTTPServers()
	defer httpSrv.shutdown() // after stopServices, as below
	// The services outlive ctx: the shutdown below stops them in order.
	if err := startstop.StartAll(context.WithoutCancel(ctx), services...); err != nil {
		return fmt.Errorf("start background services: %w", err)
	}
	stopServices := sync.OnceFunc(func() {
		slices.Reverse(services)
		startstop.StopAll(services...) // the dispatcher first, the keeper last
	})
	defer stopServices()

	httpSrv.serve(api.Handler(), ln)
	started := log.Info().Str("addr", ln.Addr().String())
	if probeLn != nil {
		httpSrv.serve(api.ProbeHandler(), probeLn)
		started = started.Str("probe_addr", probeLn.Addr().String())
	}
	started.Str("database", dbName).Str("owner", owner).Bool("change_streams", caps.ChangeStreams).
		Bool("encryption", keys.Enabled()).Int("api_tokens", len(cfg.APITokens())).Int("read_tokens", len(cfg.APIReadTokens())).
		Str("version", version).Msg("listening")
	if hooks.ready != nil {
		hooks.ready(ln.Addr().String())
	}

	select {
	case err := <-httpSrv.failed:
		return fmt.Errorf("serve HTTP: %w", err)
	case <-ctx.Done():
	}
	log.Info().Msg("shutting down: publishes and /readyz now answer 503, in-flight deliveries get the grace period")
	api.Drain()
	stopServices() // the dispatcher waits for in-flight POSTs (PULSE_SHUTDOWN_TIMEOUT) and records them
	httpSrv.shutdown()
	log.Info().Msg("stopped")
	return nil
}

// httpServers are the API's HTTP servers (the API and, with PULSE_PROBE_LISTEN, the probes).
type httpServers struct {
	servers []*http.Server
	serving sync.WaitGroup
	failed  chan error // the first error of a Serve that failed
}

func newHTTPServers() *httpServers { return &httpServers{failed: make(chan error, 1)} }

// serve serves h on ln in a goroutine until shutdown.
func (s *httpServers) serve(h http.Handler, ln net.Listener) {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: time.Minute, IdleTimeout: 2 * time.Minute}
	s.servers = append(s.servers, srv)
	s.serving.Go(func() {
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			select {
			case s.failed <- err:
			default: // another server failed first
			}
		}
	})
}

// shutdown closes the servers, gives open requests 5 s to finish before closing their connections, and
// blocks until every Serve returned. It is safe twice.
func (s *httpServers) shutdown() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, srv := range s.servers {
		if srv.Shutdown(ctx) != nil {
			_ = srv.Close()
		}
	}
	s.serving.Wait()
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
