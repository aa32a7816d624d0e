package httpapi

import (
	"context"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/rs/zerolog"
)

// Metrics holds the sidecar's Prometheus metrics. It implements dispatcher.Observer and
// reconciler.Observer. Label values are bounded: topics, consumer groups, outcomes and repair kinds, never
// event or delivery ids. It is safe for concurrent use.
type Metrics struct {
	registry   *prometheus.Registry
	published  *prometheus.CounterVec
	deliveries *prometheus.CounterVec
	duration   *prometheus.HistogramVec
	pending    *prometheus.GaugeVec
	leaseLost  prometheus.Counter
	workerLost prometheus.Counter
	reconciled *prometheus.CounterVec
}

// NewMetrics registers the metrics (and the Go and process collectors) in a registry of their own.
func NewMetrics() *Metrics {
	m := &Metrics{
		registry: prometheus.NewRegistry(),
		published: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "pulse_events_published_total",
			Help: "Events stored by this process, by topic (idempotent re-publishes excluded)."}, []string{"topic"}),
		deliveries: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "pulse_deliveries_total",
			Help: "Attempts finished by this process, by consumer group and outcome (success, retry, error = terminal)."},
			[]string{"consumer_group", "outcome"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "pulse_attempt_duration_seconds",
			Help: "Duration of webhook POSTs, by consumer group.", Buckets: prometheus.ExponentialBuckets(0.005, 2.5, 10)},
			[]string{"consumer_group"}),
		pending: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "pulse_deliveries_pending",
			Help: "Pending deliveries by consumer group, counted in the database on scrape (at most every 15 s)."},
			[]string{"consumer_group"}),
		leaseLost: prometheus.NewCounter(prometheus.CounterOpts{Name: "pulse_lease_lost_total",
			Help: "Attempts whose lease this process lost while running them (their result was not written)."}),
		workerLost: prometheus.NewCounter(prometheus.CounterOpts{Name: "pulse_worker_lost_total",
			Help: "Expired attempts this process reaped as worker_lost."}),
		reconciled: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "pulse_reconciled_total",
			Help: "Partial states this process repaired, by kind."}, []string{"kind"}),
	}
	m.registry.MustRegister(m.published, m.deliveries, m.duration, m.leaseLost, m.workerLost, m.reconciled,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// Handler serves the Prometheus text format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.registry, promhttp.HandlerOpts{})
}

// Published counts an event stored by this process.
func (m *Metrics) Published(topic string) { m.published.WithLabelValues(topic).Inc() }

// AttemptDone counts a finished attempt (outcome success, retry or error) and observes its duration.
func (m *Metrics) AttemptDone(group, outcome string, d time.Duration) {
	m.deliveries.WithLabelValues(group, outcome).Inc()
	m.duration.WithLabelValues(group).Observe(d.Seconds())
}

// LeaseLost counts an attempt whose lease was lost while it ran.
func (m *Metrics) LeaseLost(string) { m.leaseLost.Inc() }

// WorkerLost counts an attempt reaped as worker_lost.
func (m *Metrics) WorkerLost(string) { m.workerLost.Inc() }

// Reconciled counts a repaired partial state.
func (m *Metrics) Reconciled(kind string) { m.reconciled.WithLabelValues(kind).Inc() }

// pendingCollector serves pulse_deliveries_pending: it counts pending deliveries when scraped, at most once
// per maxAge (a scrape in between gets the last count), so nobody pays for the count unless it is read.
type pendingCollector struct {
	gauge  *prometheus.GaugeVec
	count  func(context.Context) (map[string]int64, error)
	maxAge time.Duration
	log    zerolog.Logger

	mu      sync.Mutex
	sampled time.Time
}

func (c *pendingCollector) Describe(ch chan<- *prometheus.Desc) { c.gauge.Describe(ch) }

func (c *pendingCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if time.Since(c.sampled) >= c.maxAge {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		counts, err := c.count(ctx)
		cancel()
		if err == nil {
			c.gauge.Reset()
			for group, n := range counts {
				c.gauge.WithLabelValues(group).Set(float64(n))
			}
			c.sampled = time.Now()
		} else {
			c.log.Warn().Err(err).Msg("counting pending deliveries for /metrics failed: serving the last count")
		}
	}
	c.gauge.Collect(ch)
}

// CountPendingWith makes /metrics serve pulse_deliveries_pending from count (pending deliveries by consumer
// group, registered groups with none included as 0), called on scrape at most once per maxAge. Call it once,
// before serving.
func (m *Metrics) CountPendingWith(count func(context.Context) (map[string]int64, error), maxAge time.Duration, log zerolog.Logger) {
	m.registry.MustRegister(&pendingCollector{gauge: m.pending, count: count, maxAge: maxAge, log: log})
}
