// Package metrics holds the sidecar's Prometheus metrics: the observer of the dispatcher and the
// reconciler, and the publish counter and handler the HTTP API mounts at GET /metrics.
package metrics

import (
	"cmp"
	"context"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/rs/zerolog"

	"github.com/pulse-sidecar/pulse/pulsetype"
)

// Attempt outcomes counted by pulse_attempts_total: success, retry (failed, another attempt follows) and
// error (failed, the delivery is terminal).
var attemptOutcomes = []string{"success", "retry", "error"}

// Metrics holds the sidecar's Prometheus metrics. It implements dispatcher.Observer, reconciler.Observer
// and httpapi.Metrics. Every label set is bounded: consumer groups (bounded by registration), attempt
// outcomes and repair kinds; never topics (clients choose them freely), event or delivery ids. It is safe
// for concurrent use.
type Metrics struct {
	registry   *prometheus.Registry
	published  prometheus.Counter
	attempts   *prometheus.CounterVec
	duration   *prometheus.HistogramVec
	pending    *prometheus.GaugeVec
	oldest     *prometheus.GaugeVec
	leaseLost  prometheus.Counter
	workerLost prometheus.Counter
	reconciled *prometheus.CounterVec
	disabled   *prometheus.CounterVec
	filterErrs *prometheus.CounterVec
	state      *prometheus.GaugeVec
	readErrors *prometheus.CounterVec
	readAt     *prometheus.GaugeVec
	stream     *prometheus.GaugeVec
	groups     *groupCollector
}

// Reads of the database /metrics makes on scrape, the values of the read label of
// pulse_metrics_refresh_errors_total and pulse_metrics_last_refresh_timestamp_seconds.
const (
	ReadPending = "pending" // pulse_deliveries_pending (CountPendingWith)
	ReadStates  = "states"  // pulse_endpoint_state (ReadStatesWith)
	ReadOldest  = "oldest"  // pulse_oldest_pending_delivery_age_seconds (OldestPendingWith)
)

// ReadTimeout bounds each of the reads a scrape makes (ReadPending, ReadStates, ReadOldest) on its own, so
// that a slow one never leaves the others without time.
const ReadTimeout = 5 * time.Second

// endpointStates are the values of pulse_endpoint_state's state label.
var endpointStates = []pulsetype.EndpointState{pulsetype.EndpointActive, pulsetype.EndpointPaused, pulsetype.EndpointDisabled}

// DurationBuckets are the upper bounds, in seconds, of pulse_attempt_duration_seconds: values a dashboard
// reads, from 5 ms to one hour, the longest endpoint timeout (pulsetype's bound of timeout), so that no POST
// falls only in +Inf.
var DurationBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 900, 1800, 3600}

// New registers the metrics (and the Go and process collectors) in a registry of their own.
func New() *Metrics {
	m := &Metrics{
		registry: prometheus.NewRegistry(),
		published: prometheus.NewCounter(prometheus.CounterOpts{Name: "pulse_events_published_total",
			Help: "Events stored by this process (idempotent re-publishes excluded)."}),
		attempts: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "pulse_attempts_total",
			Help: "Webhook attempts finished by this process, by consumer group and outcome (success; retry: failed, another attempt follows; error: failed, the delivery is terminal)."},
			[]string{"consumer_group", "outcome"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "pulse_attempt_duration_seconds",
			Help: "Duration of webhook POSTs, by consumer group.", Buckets: DurationBuckets},
			[]string{"consumer_group"}),
		pending: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "pulse_deliveries_pending",
			Help: "Pending deliveries by consumer group, counted in the database on scrape (at most every 15 s)."},
			[]string{"consumer_group"}),
		oldest: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "pulse_oldest_pending_delivery_age_seconds",
			Help: "Age of each consumer group's oldest pending delivery (since it was created), in seconds; 0 when none is pending. Its createdAt is read from the database with the pending count, one indexed key per group; the age is taken at the scrape. Absent while the last read failed (pulse_metrics_refresh_errors_total{read=\"oldest\"})."},
			[]string{"consumer_group"}),
		leaseLost: prometheus.NewCounter(prometheus.CounterOpts{Name: "pulse_lease_lost_total",
			Help: "Attempts whose lease this process lost while running them (their result was not written)."}),
		workerLost: prometheus.NewCounter(prometheus.CounterOpts{Name: "pulse_worker_lost_total",
			Help: "Expired attempts this process reaped as worker_lost."}),
		reconciled: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "pulse_reconciled_total",
			Help: "Partial states this process repaired, by kind."}, []string{"kind"}),
		disabled: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "pulse_endpoint_disabled_total",
			Help: "Endpoints this process disabled, by consumer group and reason (gone: 410 Gone; failing: disableAfter)."},
			[]string{"consumer_group", "reason"}),
		filterErrs: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "pulse_filter_errors_total",
			Help: "Deliveries the fan-out of this process ended as filter_error, by consumer group: the group's filter failed for the event (past its cost limit or deadline, or a result that is not a boolean; docs/filters.md)."},
			[]string{"consumer_group"}),
		state: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "pulse_endpoint_state",
			Help: "1 for each endpoint's current state (active, paused, disabled), 0 for the others; read from the database on scrape with the pending count."},
			[]string{"consumer_group", "state"}),
		readErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "pulse_metrics_refresh_errors_total",
			Help: "Reads of the database for /metrics that failed, by read (pending, states, oldest); a failed pending or states read serves the last values, a failed oldest read serves no age."},
			[]string{"read"}),
		readAt: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "pulse_metrics_last_refresh_timestamp_seconds",
			Help: "Unix time, in seconds, of the last successful read of the database for /metrics, by read (pending, states, oldest)."},
			[]string{"read"}),
		stream: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "pulse_change_stream_state",
			Help: "1 for the current state of this process's change stream on the events collection (open; failed: reopened after PULSE_POLL_INTERVAL; unauthorized: the database user lacks the changeStream action, retried every minute), 0 for the others; all 0 when no stream runs (PULSE_CHANGE_STREAMS=disabled, or no replica set). Not open: the dispatcher polls every PULSE_POLL_INTERVAL only."},
			[]string{"state"}),
	}
	m.groups = &groupCollector{m: m}
	m.registry.MustRegister(m.published, m.groups, m.leaseLost, m.workerLost, m.reconciled, m.disabled, m.stream,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// Handler serves the Prometheus text format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.registry, promhttp.HandlerOpts{})
}

// ChangeStream sets pulse_change_stream_state: 1 for state, 0 for each of states (every value of the label).
func (m *Metrics) ChangeStream(state string, states []string) {
	for _, s := range states {
		v := 0.0
		if s == state {
			v = 1
		}
		m.stream.WithLabelValues(s).Set(v)
	}
}

// Published counts an event stored by this process. The topic is not a label: clients choose topics
// freely, so a label would make one series per topic.
func (m *Metrics) Published(string) { m.published.Inc() }

// AttemptDone counts a finished attempt (outcome success, retry or error) and observes its duration.
func (m *Metrics) AttemptDone(group, outcome string, d time.Duration) {
	m.attempts.WithLabelValues(group, outcome).Inc()
	m.duration.WithLabelValues(group).Observe(d.Seconds())
}

// LeaseLost counts an attempt whose lease was lost while it ran.
func (m *Metrics) LeaseLost(string) { m.leaseLost.Inc() }

// WorkerLost counts an attempt reaped as worker_lost.
func (m *Metrics) WorkerLost(string) { m.workerLost.Inc() }

// EndpointDisabled counts an endpoint this process disabled (reason gone or failing).
func (m *Metrics) EndpointDisabled(group string, reason pulsetype.StateReason) {
	m.disabled.WithLabelValues(group, string(reason)).Inc()
}

// FilterError counts a delivery the fan-out ended as filter_error (mongo.Options.FilterErrors).
func (m *Metrics) FilterError(group string) { m.filterErrs.WithLabelValues(group).Inc() }

// Reconciled counts a repaired partial state.
func (m *Metrics) Reconciled(kind string) { m.reconciled.WithLabelValues(kind).Inc() }

// groupCollector serves the per-group series: pulse_attempts_total, pulse_attempt_duration_seconds,
// pulse_filter_errors_total and pulse_deliveries_pending. When a count is set (CountPendingWith), a scrape counts pending deliveries at
// most once per maxAge (a scrape in between gets the last count), so nobody pays for the count unless it is
// read; the groups of that count (every registered group, and any group with deliveries still pending) get
// their attempt series at 0 before their first attempt, and the series of groups that left it are removed,
// so the label set follows registration.
type groupCollector struct {
	m      *Metrics
	count  func(context.Context) (map[string]int64, error)
	states func(context.Context) (map[string]pulsetype.EndpointState, error)
	maxAge time.Duration
	log    zerolog.Logger
	// timeout bounds each read (ReadTimeout when zero).
	timeout time.Duration

	// oldestOf reads each group's oldest pending createdAt (OldestPendingWith); oldestAt is the answer of the
	// last read, nil when that read failed (no age is served then: an age from older createdAt values would
	// keep growing for a group that drained or left).
	oldestOf func(context.Context) (map[string]time.Time, error)

	mu       sync.Mutex
	sampled  time.Time
	known    map[string]bool
	oldestAt map[string]time.Time
}

func (c *groupCollector) Describe(ch chan<- *prometheus.Desc) {
	c.m.attempts.Describe(ch)
	c.m.duration.Describe(ch)
	c.m.pending.Describe(ch)
	c.m.oldest.Describe(ch)
	c.m.state.Describe(ch)
	c.m.filterErrs.Describe(ch)
	c.m.readErrors.Describe(ch)
	c.m.readAt.Describe(ch)
}

func (c *groupCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.count != nil && time.Since(c.sampled) >= c.maxAge {
		if c.read(ReadPending, c.refreshCount) {
			c.sampled = time.Now()
		}
		if c.states != nil {
			c.read(ReadStates, c.refreshStates)
		}
		if c.oldestOf != nil {
			c.read(ReadOldest, c.refreshOldest)
		}
	}
	c.setAges(time.Now())
	c.m.attempts.Collect(ch)
	c.m.duration.Collect(ch)
	c.m.pending.Collect(ch)
	c.m.oldest.Collect(ch)
	c.m.state.Collect(ch)
	c.m.filterErrs.Collect(ch)
	c.m.readErrors.Collect(ch) // after the reads of this scrape, so that it counts them
	c.m.readAt.Collect(ch)
}

// read runs one read of the database (refresh) bounded by ReadTimeout of its own and counts its outcome:
// pulse_metrics_last_refresh_timestamp_seconds{read} on success, pulse_metrics_refresh_errors_total{read}
// and a warning on failure. It reports whether the read succeeded.
func (c *groupCollector) read(name string, refresh func(context.Context) error) bool {
	ctx, cancel := context.WithTimeout(context.Background(), cmp.Or(c.timeout, ReadTimeout))
	defer cancel()
	errs := c.m.readErrors.WithLabelValues(name) // served at 0 from the first read, so increase() has a start
	if err := refresh(ctx); err != nil {
		errs.Inc()
		c.log.Warn().Err(err).Str("read", name).Msg("reading the database for /metrics failed")
		return false
	}
	c.m.readAt.WithLabelValues(name).SetToCurrentTime()
	return true
}

// refreshCount counts the pending deliveries; a failed count keeps the last one.
func (c *groupCollector) refreshCount(ctx context.Context) error {
	counts, err := c.count(ctx)
	if err != nil {
		return err
	}
	c.refresh(counts)
	return nil
}

// refreshOldest reads the oldest pending deliveries; a failed read forgets the last ones, so that no age is
// served until a read succeeds.
func (c *groupCollector) refreshOldest(ctx context.Context) error {
	oldest, err := c.oldestOf(ctx)
	if err != nil {
		c.oldestAt = nil
		return err
	}
	if oldest == nil {
		oldest = map[string]time.Time{}
	}
	c.oldestAt = oldest
	return nil
}

// setAges sets pulse_oldest_pending_delivery_age_seconds at now: each group of the count (registered, or
// with work pending) and each group with an oldest pending delivery gets now minus its createdAt (never
// below 0), the others 0. When the last read of the oldest failed (oldestAt nil) it serves no series.
func (c *groupCollector) setAges(now time.Time) {
	if c.oldestOf == nil {
		return
	}
	c.m.oldest.Reset()
	if c.oldestAt == nil {
		return
	}
	for group := range c.known {
		c.m.oldest.WithLabelValues(group).Set(0)
	}
	for group, at := range c.oldestAt {
		c.m.oldest.WithLabelValues(group).Set(max(0, now.Sub(at).Seconds()))
	}
}

// refreshStates sets pulse_endpoint_state from the states read now; a failed read keeps the last ones.
func (c *groupCollector) refreshStates(ctx context.Context) error {
	states, err := c.states(ctx)
	if err != nil {
		return err
	}
	c.m.state.Reset()
	for group, cur := range states {
		for _, st := range endpointStates {
			v := 0.0
			if st == cur {
				v = 1
			}
			c.m.state.WithLabelValues(group, string(st)).Set(v)
		}
	}
	return nil
}

// refresh sets the pending gauge from counts and makes the per-group series follow its groups.
func (c *groupCollector) refresh(counts map[string]int64) {
	c.m.pending.Reset()
	for group := range c.known {
		if _, ok := counts[group]; !ok {
			c.m.attempts.DeletePartialMatch(prometheus.Labels{"consumer_group": group})
			c.m.duration.DeleteLabelValues(group)
			c.m.filterErrs.DeleteLabelValues(group)
		}
	}
	c.known = make(map[string]bool, len(counts))
	for group, n := range counts {
		c.known[group] = true
		c.m.pending.WithLabelValues(group).Set(float64(n))
		for _, o := range attemptOutcomes {
			c.m.attempts.WithLabelValues(group, o)
		}
		c.m.duration.WithLabelValues(group)
		c.m.filterErrs.WithLabelValues(group)
	}
}

// ReadStatesWith makes /metrics serve pulse_endpoint_state from states (each registered consumer group's
// endpoint state), read with the pending count. Call it once, before serving.
func (m *Metrics) ReadStatesWith(states func(context.Context) (map[string]pulsetype.EndpointState, error)) {
	m.groups.mu.Lock()
	defer m.groups.mu.Unlock()
	m.groups.states = states
}

// OldestPendingWith makes /metrics serve pulse_oldest_pending_delivery_age_seconds from oldest (the createdAt
// of each consumer group's oldest pending delivery; a group with none absent), read with the pending count
// (at most once per the maxAge of CountPendingWith), the age taken at each scrape. oldest must be bounded in
// cost whatever the backlog (mongo.Store.OldestPending reads one index key per group). Call it once, before
// serving.
func (m *Metrics) OldestPendingWith(oldest func(context.Context) (map[string]time.Time, error)) {
	m.groups.mu.Lock()
	defer m.groups.mu.Unlock()
	m.groups.oldestOf = oldest
}

// CountPendingWith makes /metrics serve pulse_deliveries_pending from count (pending deliveries by consumer
// group, registered groups with none included as 0), called on scrape at most once per maxAge, and give the
// groups of that count their pulse_attempts_total and pulse_attempt_duration_seconds series at 0. Call it
// once, before serving.
func (m *Metrics) CountPendingWith(count func(context.Context) (map[string]int64, error), maxAge time.Duration, log zerolog.Logger) {
	m.groups.mu.Lock()
	defer m.groups.mu.Unlock()
	m.groups.count, m.groups.maxAge, m.groups.log = count, maxAge, log
}
