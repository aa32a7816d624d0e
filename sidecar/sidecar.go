package sidecar

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/mattn/go-isatty"
	"github.com/rs/zerolog"
	"go.mongodb.org/mongo-driver/v2/event"

	"github.com/pulse-sidecar/pulse/config"
	"github.com/pulse-sidecar/pulse/dispatcher"
	"github.com/pulse-sidecar/pulse/endpointsfile"
	"github.com/pulse-sidecar/pulse/httpapi"
	"github.com/pulse-sidecar/pulse/internal/devdb"
	"github.com/pulse-sidecar/pulse/internal/sealing"
	"github.com/pulse-sidecar/pulse/internal/startstop"
	"github.com/pulse-sidecar/pulse/internal/tracing"
	"github.com/pulse-sidecar/pulse/lease"
	"github.com/pulse-sidecar/pulse/metrics"
	"github.com/pulse-sidecar/pulse/mongo"
	"github.com/pulse-sidecar/pulse/opsevents"
	"github.com/pulse-sidecar/pulse/pulsetype"
	"github.com/pulse-sidecar/pulse/reconciler"
	"github.com/pulse-sidecar/pulse/webhook"
)

// PendingCountMaxAge is how long a count of pending deliveries (one aggregation, made when /metrics is
// scraped) is reused.
const PendingCountMaxAge = 15 * time.Second

// startTimeout bounds each part of Start's work against the database but the schema (PULSE_SCHEMA_TIMEOUT
// bounds that): the clock sync before the schema work, and, from the end of the schema work on, the tracing
// provider, the endpoints file and the secrets check. A schema phase longer than startTimeout (a large
// index build) therefore leaves the work after it its whole bound.
const startTimeout = 30 * time.Second

// Options are what a Sidecar takes besides its configuration; the zero value is a production sidecar
// logging nowhere.
type Options struct {
	// Version is this build's version, sent in the webhook User-Agent (pulse-sidecar/<version>) and logged
	// when the sidecar listens; empty: "dev".
	Version string
	// Logs receives the log: console lines when PULSE_LOG_FORMAT=console, or when it is unset and Logs is a
	// terminal (an *os.File), else JSON lines; nil: discarded.
	Logs io.Writer
	// Monitor, when set, sees every database command of the sidecar (`pulse bench` counts them).
	Monitor *event.CommandMonitor
	// TestHooks bend the sidecar for tests; the zero value changes nothing.
	TestHooks TestHooks
}

// Sidecar is one running Pulse sidecar. Start runs it; Stop (or the end of Start's ctx) shuts it down in
// the order of the package's invariants. It is safe for concurrent use.
type Sidecar struct {
	cfg  *config.Config
	opts Options
	log  zerolog.Logger

	mu        sync.Mutex
	started   bool
	addr      string
	probeAddr string
	stopping  chan struct{} // closed by Stop
	stopOnce  sync.Once
	done      chan struct{} // closed once the shutdown is over
	err       error         // why the sidecar stopped on its own (an HTTP server failed); set before done closes
}

var _ startstop.Service = (*Sidecar)(nil)

// New returns a sidecar for cfg (a configuration config.Load has validated); it starts nothing.
func New(cfg *config.Config, opts Options) *Sidecar {
	opts.Version = cmp.Or(opts.Version, "dev")
	if opts.Logs == nil {
		opts.Logs = io.Discard
	}
	return &Sidecar{cfg: cfg, opts: opts, log: newLogger(cfg, opts.Logs), stopping: make(chan struct{})}
}

// Start starts the sidecar and returns once its API listens (Addr): it binds the API's address (and the
// probes' with PULSE_PROBE_LISTEN) first and serves them at once with httpapi.Starting (/healthz 200,
// /readyz and the rest 503 naming what the start waits for, as in "building indexes"), starts the embedded development database when PULSE_MONGODB_URI
// is empty, connects, syncs the clock, ensures the schema, applies PULSE_ENDPOINTS_FILE, checks the stored
// secrets, then starts the background services in this order: the lease keeper, the clock sync, the
// retention sweeper, the change-stream and endpoints-file watchers, the dispatcher. ctx bounds the start
// (the clock sync at most 30 s, the schema work PULSE_SCHEMA_TIMEOUT, then the rest of its database work
// at most 30 s) and the run: when ctx ends, the sidecar shuts down as Stop does. It
// returns an error naming the variable at fault when the configuration cannot be served (a busy port, a
// bad URI or key, PULSE_CHANGE_STREAMS=required without change streams), having undone what it started;
// startstop.ErrStarted when started already.
func (s *Sidecar) Start(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.started {
		return startstop.ErrStarted
	}
	r := &running{}
	if err := s.start(ctx, r); err != nil {
		r.undo()
		return err
	}
	s.started, s.done = true, make(chan struct{})
	go s.run(ctx, r)
	return nil
}

// Addr returns the API's address (host:port) once Start returned nil, else "".
func (s *Sidecar) Addr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.addr
}

// ProbeAddr returns the probes' address (host:port) with PULSE_PROBE_LISTEN once Start returned nil, else "".
func (s *Sidecar) ProbeAddr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.probeAddr
}

// Stop shuts the sidecar down (the order of the package's invariants) and blocks until every goroutine it
// started returned and the database is disconnected. It is safe twice, concurrently, and before Start.
func (s *Sidecar) Stop() {
	s.mu.Lock() // held by a Start in progress: its outcome decides
	started := s.started
	s.mu.Unlock()
	if !started {
		return // nothing runs; a later Start starts as if Stop had not been called
	}
	s.stopOnce.Do(func() { close(s.stopping) })
	_ = s.Wait()
}

// Wait blocks until the sidecar has shut down (Stop, the end of Start's ctx, or an HTTP server that
// failed) and returns nil after a requested shutdown, or the HTTP server's error ("serve HTTP: ...").
// Before Start it returns nil at once.
func (s *Sidecar) Wait() error {
	s.mu.Lock()
	done := s.done
	s.mu.Unlock()
	if done == nil {
		return nil
	}
	<-done
	return s.err
}

// running is what a started sidecar holds until its shutdown.
type running struct {
	api      *httpapi.Server
	services []startstop.Service // in start order
	http     *httpServers
	undos    []func() // the rest of the shutdown, run last first
}

// defer1 adds f to the end of the shutdown, before what was deferred earlier (as a defer statement does).
func (r *running) defer1(f func()) { r.undos = append(r.undos, f) }

func (r *running) undo() {
	for _, f := range slices.Backward(r.undos) {
		f()
	}
	r.undos = nil
}

// run waits for the reason to stop, then shuts the sidecar down.
func (s *Sidecar) run(ctx context.Context, r *running) {
	defer close(s.done)
	var err error
	select {
	case e := <-r.http.failed:
		err = fmt.Errorf("serve HTTP: %w", e)
	case <-ctx.Done():
	case <-s.stopping:
	}
	if err == nil {
		s.log.Info().Msg("shutting down: publishes and /readyz now answer 503, in-flight deliveries get the grace period")
		r.api.Drain()
	}
	services := slices.Clone(r.services)
	slices.Reverse(services)
	startstop.StopAll(services...) // the dispatcher first (it waits for in-flight POSTs), the keeper last
	r.http.shutdown()
	if err == nil {
		s.log.Info().Msg("stopped")
	}
	r.undo()
	s.err = err
}

// start does Start's work; what it started is undone by r.undo when it fails.
func (s *Sidecar) start(ctx context.Context, r *running) error {
	cfg, log, hooks := s.cfg, s.log, s.opts.TestHooks
	// A URI that asks for weaker concerns than the sidecar's stops the process before anything is bound,
	// logged or started: one line naming the option (mongo.CheckConcerns).
	if cfg.MongoDBURI != "" {
		if err := mongo.CheckConcerns(cfg.MongoDBURI); err != nil {
			return fmt.Errorf("PULSE_MONGODB_URI is invalid: %w", err)
		}
	}
	// Bind the API's address first: a busy port stops the process before anything is started or written.
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("PULSE_LISTEN=%q: %w", cfg.Listen, err)
	}
	r.defer1(func() { _ = ln.Close() })
	var probeLn net.Listener
	if cfg.ProbeListen != "" {
		if probeLn, err = net.Listen("tcp", cfg.ProbeListen); err != nil {
			return fmt.Errorf("PULSE_PROBE_LISTEN=%q: %w", cfg.ProbeListen, err)
		}
		r.defer1(func() { _ = probeLn.Close() })
	}
	// The listeners answer during the start: the kubelet's liveness probe sees the process alive while the
	// index builds run, and /readyz says what the start waits for.
	r.http = newHTTPServers()
	r.defer1(r.http.shutdown) // a failed start; a started sidecar's run shuts them down earlier
	apiStart := httpapi.NewStarting("connecting to the database")
	r.http.serve(apiStart, ln)
	starting := []*httpapi.Starting{apiStart}
	probeStart := httpapi.NewStarting("connecting to the database")
	if probeLn != nil {
		r.http.serve(probeStart, probeLn)
		starting = append(starting, probeStart)
	}
	phase := func(p string) {
		for _, st := range starting {
			st.SetPhase(p)
		}
	}
	started := log.Info().Str("addr", ln.Addr().String())
	if probeLn != nil {
		started = started.Str("probe_addr", probeLn.Addr().String())
	}
	started.Msg("starting: /healthz answers, /readyz answers 503 until the sidecar listens")
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
		r.defer1(func() { _ = db.Stop() })
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
	client, err := mongo.Connect(uri, mongo.ConnectOptions{ServerSelectionTimeout: cfg.DatabaseTimeout, Monitor: s.opts.Monitor,
		OperationTimeout: operationTimeout(cfg)}) // see deadlines.go
	if err != nil {
		return fmt.Errorf("PULSE_MONGODB_URI is invalid: %w", err)
	}
	r.defer1(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = client.Disconnect(ctx)
	})

	local := time.Now
	if hooks.ClockSkew != 0 {
		local = func() time.Time { return time.Now().Add(hooks.ClockSkew) }
		log.Warn().Dur("skew_ms", hooks.ClockSkew).Msg("PULSE_TEST_CLOCK_SKEW shifts this process's clock (testing only)")
	}
	clock := lease.NewClock(local)
	m := metrics.New()
	store := mongo.New(client, mongo.Options{
		Database: dbName, CollectionPrefix: cfg.CollectionPrefix, LeaseTimeout: cfg.LeaseTimeout,
		EventRetention: cfg.EventRetention, HistoryRetention: cfg.HistoryRetention, Now: clock.Now, Logger: log,
		Keys: keys, FilterErrors: m.FilterError,
		SummarizeIndexBuilds: cfg.MongoDBURI == "", // the embedded database builds in milliseconds
		// The finds and aggregations the store sends as commands (for their maxTimeMS) carry the client's read
		// concern themselves (mongo.Connect sets majority on the client).
		ReadConcern: mongo.ReadConcernLevel,
	})
	syncCtx, cancelSync := context.WithTimeout(ctx, startTimeout)
	err = clock.Sync(syncCtx, store.ServerTime)
	cancelSync()
	if err != nil {
		return fmt.Errorf("reach the database: %w", err)
	}
	// The schema work has its own bound: index builds on large collections and the one-time migrations take
	// as long as the data needs (each logs its progress; a migration stopped by the bound resumes at the
	// next start).
	phase("building indexes (the schema work, at most PULSE_SCHEMA_TIMEOUT=" + cfg.SchemaTimeout.String() + ")")
	schemaCtx, cancelSchema := context.WithTimeout(ctx, cfg.SchemaTimeout)
	caps, err := store.EnsureSchema(schemaCtx)
	cancelSchema()
	if err != nil {
		return err
	}
	// The rest of the start's database work gets its bound from now on, whatever the schema work took.
	phase("applying the endpoints file and checking the stored secrets")
	startCtx, cancelStart := context.WithTimeout(ctx, cmp.Or(hooks.StartTimeout, startTimeout))
	defer cancelStart()
	if !caps.TTLIndexes {
		log.Info().Msg("the database has no TTL indexes: a sweeper deletes expired documents every minute instead")
	}
	if cfg.ChangeStreams == config.ChangeStreamsRequired && !caps.ChangeStreams {
		return errors.New("PULSE_CHANGE_STREAMS=required but the database is not a replica set or sharded cluster, so it has no change streams")
	}

	denies, _ := webhook.ParseCIDRs(cfg.DenyCIDRs)
	allows, _ := webhook.ParseCIDRs(cfg.AllowCIDRs)
	sender := webhook.New(webhook.Options{UserAgent: "pulse-sidecar/" + s.opts.Version, DenyCIDRs: denies, AllowCIDRs: allows, Logger: log, Proxy: cfg.ProxyConfig()})
	r.defer1(sender.CloseIdleConnections)
	owner := uuid.Must(uuid.NewV7()).String()
	keeper := lease.NewKeeper(store.Renew, cfg.LeaseTimeout, local, log)
	m.CountPendingWith(store.PendingByGroup, PendingCountMaxAge, log)
	m.ReadStatesWith(store.EndpointStates)
	m.OldestPendingWith(store.OldestPending)
	ops := opsevents.New(store, opsevents.Options{Logger: log})
	r.defer1(ops.Wait) // before the database is disconnected
	obs := observer{Metrics: m, ops: ops}
	recon := reconciler.New(store, owner, cfg.LeaseTimeout, obs, log) // obs: pulse.delivery.failed of the deliveries it ends
	tp, err := tracing.NewProvider(startCtx, cfg.OTLPEndpoint)
	if err != nil {
		return fmt.Errorf("OTEL_EXPORTER_OTLP_ENDPOINT: %w", err)
	}
	r.defer1(func() {
		flushCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = tp.Shutdown(flushCtx) // spans that do not reach the collector are dropped
	})
	tracer := tracing.Tracer(tp)
	disp := dispatcher.New(store, sender, recon, keeper, dispatcher.Options{
		Tracer: tracer, Owner: owner, Workers: cfg.Workers, PollInterval: cfg.PollInterval, RepairInterval: cfg.LeaseTimeout / 2, LeaseTimeout: cfg.LeaseTimeout, ShutdownTimeout: cfg.ShutdownTimeout, Observer: obs, Logger: log, Now: clock.Now,
	})
	ops.NotifyWith(disp)
	var notify httpapi.Notifier = disp
	if hooks.CrashAfterPublish {
		log.Warn().Msg("PULSE_TEST_CRASH_AFTER_PUBLISH: this process dies after its first publish, before fanning it out (testing only)")
		notify = crashAfterPublish{disp}
	}
	r.api = httpapi.New(store, notify, httpapi.Options{APITokens: cfg.APITokens(), ReadTokens: cfg.APIReadTokens(), MaxBodyBytes: cfg.MaxBodyBytes, Metrics: m, Operations: ops, Logger: log, Tracer: tracer,
		CheckHost: cfg.APIChecksHost(), AllowedHosts: cfg.AllowedHosts,
		PublishTimeout: cfg.DatabaseTimeout, Stalled: func() error { return disp.Stalled(stallBound(cfg)) }}) // see deadlines.go

	var endpointsHash [32]byte
	if cfg.EndpointsFile != "" {
		if endpointsHash, err = endpointsfile.Apply(startCtx, cfg.EndpointsFile, store, func(string) {}, log); err != nil {
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

	// Started in this order, stopped in the reverse one (see the package's invariants).
	services := []startstop.Service{keeper, lease.NewClockSync(clock, store.ServerTime, lease.DefaultSyncInterval, log),
		reconciler.NewSweeper(store.Sweep, reconciler.DefaultSweepInterval, log),
		opsevents.NewBacklogWatcher(store, ops, cmp.Or(hooks.BacklogInterval, opsevents.DefaultBacklogInterval), clock.Now, log)}
	switch {
	case cfg.ChangeStreams == config.ChangeStreamsDisabled:
	case caps.ChangeStreams:
		w := mongo.NewEventWatcher(store, cfg.PollInterval, disp.Wake, log)
		states := make([]string, len(mongo.ChangeStreamStates))
		for i, st := range mongo.ChangeStreamStates {
			states[i] = string(st)
		}
		w.Report(func(st mongo.ChangeStreamState) { m.ChangeStream(string(st), states) })
		services = append(services, w)
	default:
		log.Info().Msg("the database has no change streams (not a replica set): polling only")
	}
	if cfg.EndpointsFile != "" {
		services = append(services, endpointsfile.NewWatcher(cfg.EndpointsFile, endpointsHash, store, disp.EndpointChanged, log))
	}
	services = append(services, disp)
	phase("starting the background services")
	// The services outlive ctx's start: the shutdown stops them in order.
	if err := startstop.StartAll(context.WithoutCancel(ctx), services...); err != nil {
		return fmt.Errorf("start background services: %w", err)
	}
	r.services = services
	apiStart.Serve(r.api.Handler())
	started = log.Info().Str("addr", ln.Addr().String())
	s.addr = ln.Addr().String()
	if probeLn != nil {
		probeStart.Serve(r.api.ProbeHandler())
		started = started.Str("probe_addr", probeLn.Addr().String())
		s.probeAddr = probeLn.Addr().String()
	}
	started.Str("database", dbName).Str("owner", owner).Bool("change_streams", caps.ChangeStreams).
		Bool("encryption", keys.Enabled()).Int("api_tokens", len(cfg.APITokens())).Int("read_tokens", len(cfg.APIReadTokens())).
		Str("version", s.opts.Version).Msg("listening")
	return nil
}

// newLogger returns the sidecar's logger on w at PULSE_LOG_LEVEL, in the format cfg.LogFormatFor chooses: w is
// a terminal when it is a file that isatty says is one (the process's stdout on a terminal).
func newLogger(cfg *config.Config, w io.Writer) zerolog.Logger {
	level, _ := zerolog.ParseLevel(cfg.LogLevel)
	f, isFile := w.(*os.File)
	if cfg.LogFormatFor(isFile && (isatty.IsTerminal(f.Fd()) || isatty.IsCygwinTerminal(f.Fd()))) == "console" {
		w = zerolog.ConsoleWriter{Out: w, TimeFormat: time.RFC3339}
	}
	return zerolog.New(w).Level(level).With().Timestamp().Logger()
}

// The storage the sidecar wires in implements what each consumer asks of it, and the metrics observe the
// dispatcher and the reconciler.
var (
	_ httpapi.Store       = (*mongo.Store)(nil)
	_ dispatcher.Store    = (*mongo.Store)(nil)
	_ reconciler.Store    = (*mongo.Store)(nil)
	_ dispatcher.Observer = (*metrics.Metrics)(nil)
	_ reconciler.Observer = (*metrics.Metrics)(nil)
	_ httpapi.Metrics     = (*metrics.Metrics)(nil)
)

// observer is the dispatcher's and the reconciler's observer: the metrics, and the operational events of the
// endpoints the dispatcher disables and of the deliveries either ends in error (dispatcher.FailureObserver,
// reconciler.FailureObserver).
type observer struct {
	*metrics.Metrics
	ops *opsevents.Emitter
}

func (o observer) EndpointDisabled(group string, reason pulsetype.StateReason) {
	o.Metrics.EndpointDisabled(group, reason)
	o.ops.EndpointDisabled(group, reason)
}

func (o observer) DeliveryFailed(a *pulsetype.Attempt, res pulsetype.AttemptResult, end *pulsetype.ErrorInfo) {
	o.ops.DeliveryFailed(a, res, end)
}
