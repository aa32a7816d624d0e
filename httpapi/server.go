package httpapi

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"
	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/trace"

	"github.com/pulse-sidecar/pulse/docs"
	"github.com/pulse-sidecar/pulse/pulsetype"
)

// Store is the storage the API needs; package mongo implements it.
type Store interface {
	Publish(ctx context.Context, events []*pulsetype.Event) ([]pulsetype.Published, error)
	GetEvent(ctx context.Context, id string) (*pulsetype.Event, error)
	DeliveriesOfEvent(ctx context.Context, eventID string) ([]*pulsetype.Delivery, error)
	AttemptsOf(ctx context.Context, deliveryIDs []string) (map[string][]*pulsetype.Attempt, error)
	GetDelivery(ctx context.Context, id string) (*pulsetype.Delivery, []*pulsetype.Attempt, error)
	PutEndpoint(ctx context.Context, e *pulsetype.Endpoint) (*pulsetype.Endpoint, bool, error)
	GetEndpoint(ctx context.Context, group string) (*pulsetype.Endpoint, error)
	ListEndpoints(ctx context.Context) ([]*pulsetype.Endpoint, error)
	DeleteEndpoint(ctx context.Context, group string) (pulsetype.Deleted, error)
	Ping(ctx context.Context) error
	ProbeWrite(ctx context.Context) error
	ListDeliveries(ctx context.Context, f pulsetype.DeliveryFilter) ([]*pulsetype.Delivery, string, error)
	RetryDelivery(ctx context.Context, id string) (int, error)
	ReplayDeliveries(ctx context.Context, p pulsetype.ReplayParams) (int, error)
	CancelDelivery(ctx context.Context, id string) (pulsetype.CancelResult, error)
	RotateSecret(ctx context.Context, group, secret string, overlap time.Duration) (*pulsetype.Endpoint, error)
	SetEndpointState(ctx context.Context, group string, state pulsetype.EndpointState) (*pulsetype.Endpoint, error)
	Stats(ctx context.Context, groups []string) ([]*pulsetype.GroupStats, error)
	Activity(ctx context.Context, group string) (*pulsetype.GroupActivity, error)
	ActivityAll(ctx context.Context) ([]*pulsetype.GroupActivity, error)
	LineHead(ctx context.Context, line pulsetype.Line) (string, error)
}

// Notifier is told what this process stored, so its dispatcher acts at once; *dispatcher.Dispatcher
// implements it.
type Notifier interface {
	Published(events []*pulsetype.Event)
	EndpointChanged(group string)
	Wake()
}

// Operations publishes the sidecar's operational events that the API causes; opsevents.Emitter implements it.
type Operations interface {
	EndpointEnabled(group string, previous pulsetype.StateReason)
}

// Options configure the API.
type Options struct {
	// APITokens, when any, are the bearer tokens /v1 accepts ("Authorization: Bearer <token>"); several are
	// accepted at once so a token can be rotated without downtime. None: /v1 is open.
	APITokens []string
	// ReadTokens are bearer tokens that may only read: GET (and HEAD) /v1 routes; other methods answer 403.
	ReadTokens   []string
	MaxBodyBytes int64 // publish body limit in bytes
	Logger       zerolog.Logger
	// Metrics, when set, is served at GET /metrics and counts publishes.
	Metrics Metrics
	// Operations is told of each endpoint a resume re-enabled after the sidecar disabled it (it publishes
	// pulse.endpoint.enabled); nil: none.
	Operations Operations
	// Tracer makes the publish spans; nil makes none (the request's traceparent is still kept).
	Tracer trace.Tracer
	// CheckHost makes the API listener answer only requests whose Host is an IP address, localhost, a name
	// under .localhost, or one of AllowedHosts (see browser.go); set when the listener is on loopback or
	// AllowedHosts is given. The probe listener never checks it.
	CheckHost bool
	// AllowedHosts are further host names (no port) the API listener answers under CheckHost
	// (PULSE_ALLOWED_HOSTS).
	AllowedHosts []string
	// PublishTimeout bounds the database work of one POST /v1/events (PULSE_DATABASE_TIMEOUT): past it the
	// publish answers 503 database_unavailable. 0: no bound but the client's.
	PublishTimeout time.Duration
	// Stalled, when set, reports the sidecar's own work that is stuck (a dispatcher turn or a reconciliation
	// pass that has not completed within its bound), for /readyz: a database that answers a fresh ping while
	// the sidecar's connections hang is not ready. Nil: never.
	Stalled func() error
}

// Metrics is what the API needs of the sidecar's metrics (package metrics implements it): the handler it
// mounts at GET /metrics, and a count of each event stored (its topic, which must not become a label).
type Metrics interface {
	Handler() http.Handler
	Published(topic string)
}

// Server is the HTTP API. Its handler is safe for concurrent use.
type Server struct {
	store    Store
	notify   Notifier
	opts     Options
	log      zerolog.Logger
	auditLog zerolog.Logger
	draining atomic.Bool
}

// retryAfterSeconds is the Retry-After of a 503 database_unavailable answer.
const retryAfterSeconds = "2"

// New returns the API server.
func New(store Store, notify Notifier, opts Options) *Server {
	return &Server{store: store, notify: notify, opts: opts, log: opts.Logger.With().Str("component", "httpapi").Logger(),
		auditLog: opts.Logger.With().Str("component", "audit").Logger()}
}

// Drain makes publishes answer 503 from now on (shutdown has begun); reads keep working.
func (s *Server) Drain() { s.draining.Store(true) }

// Handler returns the routes of the API listener (PULSE_LISTEN): /v1 (with its OpenAPI document at
// /v1/openapi.yaml), the operator console at /ui/ (see ui.go), and the probe routes too, so a sidecar
// without a probe listener is probed where it always was. Every route follows the browser rules of
// browser.go: no request a web page of another origin makes is served.
func (s *Server) Handler() http.Handler { return s.browserGuard(s.routes()) }

// routes returns the router of Handler, before the browser guard.
func (s *Server) routes() chi.Router {
	r := s.probeRouter()
	r.Mount("/ui", consoleHandler())
	r.Route("/v1", func(r chi.Router) {
		r.Use(s.auth)
		r.Post("/events", s.publish)
		r = r.With(requireJSON)
		r.Get("/events/{id}", s.getEvent)
		r.Get("/deliveries", s.listDeliveries)
		r.Get("/deliveries/{id}", s.getDelivery)
		r.Post("/deliveries/{id}/retry", s.retryDelivery)
		r.Post("/deliveries/{id}/cancel", s.cancelDelivery)
		r.Post("/endpoints/{consumerGroup}/replay", s.replay)
		r.Post("/endpoints/{consumerGroup}/rotate-secret", s.rotateSecret)
		r.Post("/endpoints/{consumerGroup}/pause", s.pauseEndpoint)
		r.Post("/endpoints/{consumerGroup}/resume", s.resumeEndpoint)
		r.Get("/stats", s.stats)
		r.Get("/activity", s.activityAll)
		r.Get("/endpoints/{consumerGroup}/activity", s.activity)
		r.Get("/endpoints", s.listEndpoints)
		r.Put("/endpoints/{consumerGroup}", s.putEndpoint)
		r.Get("/endpoints/{consumerGroup}", s.getEndpoint)
		r.Delete("/endpoints/{consumerGroup}", s.deleteEndpoint)
		r.Get("/openapi.yaml", serveOpenAPI)
	})
	return r
}

// serveOpenAPI answers the OpenAPI document of this API (docs/openapi.yaml, embedded at build time).
func serveOpenAPI(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/yaml")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	_, _ = w.Write(docs.OpenAPI)
}

// ProbeHandler returns the routes of the probe listener (PULSE_PROBE_LISTEN): /healthz, /readyz and /metrics
// only, all without a token. Nothing there changes or reveals events, deliveries or endpoints.
func (s *Server) ProbeHandler() http.Handler { return s.probeRouter() }

func (s *Server) probeRouter() chi.Router {
	r := chi.NewRouter()
	r.Use(middleware.Recoverer, middleware.GetHead)
	r.NotFound(func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "not_found", "no route "+r.Method+" "+r.URL.Path)
	})
	r.MethodNotAllowed(methodNotAllowed(r))
	r.Get("/healthz", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	r.Get("/readyz", s.readyz)
	if s.opts.Metrics != nil {
		r.Method(http.MethodGet, "/metrics", s.opts.Metrics.Handler())
	}
	return r
}

// readyz answers 200 when the database answers a ping and accepts a write within 2 s each, the sidecar's
// own work is not stuck (Options.Stalled; 503 stalled) and the sidecar is not shutting down; 503 otherwise.
func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	if err := s.store.Ping(ctx); err != nil {
		s.unavailable(w, "the database does not answer: "+firstLine(err))
		return
	}
	ctx, cancel = context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	if err := s.store.ProbeWrite(ctx); err != nil {
		s.unavailable(w, "the database refuses writes: "+firstLine(err))
		return
	}
	if s.opts.Stalled != nil {
		if err := s.opts.Stalled(); err != nil {
			writeError(w, http.StatusServiceUnavailable, "stalled", "the sidecar's work is stuck: "+firstLine(err))
			return
		}
	}
	if s.draining.Load() {
		writeError(w, http.StatusServiceUnavailable, "shutting_down", "the sidecar is shutting down")
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
}

// auth enforces the bearer tokens on /v1, each compared in constant time: any of APITokens allows every
// route, any of ReadTokens allows GET and HEAD only (403 otherwise). The request's context then names the
// token that matched (see principal), for the audit log.
func (s *Server) auth(next http.Handler) http.Handler {
	if len(s.opts.APITokens) == 0 && len(s.opts.ReadTokens) == 0 {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		scheme, token, _ := strings.Cut(r.Header.Get("Authorization"), " ")
		// The scheme is case-insensitive (RFC 9110 §11.1).
		var who string
		if strings.EqualFold(scheme, "Bearer") {
			got := []byte(strings.TrimSpace(token))
			who = matchToken(got, s.opts.APITokens, "PULSE_API_TOKEN")
			if read := matchToken(got, s.opts.ReadTokens, "PULSE_API_READ_TOKEN"); read != "" {
				if r.Method != http.MethodGet && r.Method != http.MethodHead {
					writeError(w, http.StatusForbidden, "read_only_token", "this token is read-only (PULSE_API_READ_TOKEN): it may only GET; "+r.Method+" needs a PULSE_API_TOKEN")
					return
				}
				who = read
			}
		}
		if who == "" {
			w.Header().Set("WWW-Authenticate", `Bearer realm="pulse"`)
			writeError(w, http.StatusUnauthorized, "unauthorized", "this route needs the header Authorization: Bearer <PULSE_API_TOKEN>")
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), principalKey{}, who)))
	})
}

// matchToken returns "<variable>#<n>" (1-based) for the token of tokens equal to got, or "". Every token is
// compared, in constant time, whichever matches.
func matchToken(got []byte, tokens []string, variable string) string {
	match := -1
	for i, t := range tokens {
		if subtle.ConstantTimeCompare(got, []byte(t)) == 1 {
			match = i
		}
	}
	if match < 0 {
		return ""
	}
	return variable + "#" + strconv.Itoa(match+1)
}

type principalKey struct{}

// principal names who made the request, never with a secret: the matching token's variable and position
// ("PULSE_API_TOKEN#2"), or "anonymous" when /v1 has no token.
func principal(r *http.Request) string {
	if who, ok := r.Context().Value(principalKey{}).(string); ok {
		return who
	}
	return "anonymous"
}

type errorBody struct {
	Error struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

func writeError(w http.ResponseWriter, status int, code, msg string) {
	var b errorBody
	b.Error.Code, b.Error.Message = code, msg
	writeJSON(w, status, b)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	writeJSONTo(w, v)
}

// writeJSONTo writes v as one line of JSON, without HTML escaping.
func writeJSONTo(w io.Writer, v any) {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
}

// found reports whether err (of a store call on one resource) is nil; otherwise it answers 404 code with
// message for pulsetype.ErrNotFound, and internalError for any other error.
func (s *Server) found(w http.ResponseWriter, r *http.Request, err error, code, message string) bool {
	if errors.Is(err, pulsetype.ErrNotFound) {
		writeError(w, http.StatusNotFound, code, message)
		return false
	}
	if err != nil {
		s.internalError(w, r, err)
		return false
	}
	return true
}

// internalError answers a store error the handler has no other answer for: 503 database_unavailable with
// Retry-After when the store says the database is unavailable (pulsetype.ErrUnavailable: unreachable for
// PULSE_DATABASE_TIMEOUT, timed out, or refusing writes), logged at warn; 500 internal_error otherwise,
// logged at error. Neither leaks more than the error's first line. A client that left gets no answer.
func (s *Server) internalError(w http.ResponseWriter, r *http.Request, err error) {
	if r.Context().Err() != nil {
		return // the client left
	}
	if errors.Is(err, pulsetype.ErrUnavailable) {
		s.log.Warn().Err(err).Str("method", r.Method).Str("path", r.URL.Path).Msg("database unavailable: answered 503")
		msg := "the database is unavailable, retry later"
		if r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/events") {
			msg += " (a publish retried with the same event id is stored once)"
		}
		s.unavailable(w, msg+": "+firstLine(err))
		return
	}
	s.log.Error().Err(err).Str("method", r.Method).Str("path", r.URL.Path).Msg("request failed")
	writeError(w, http.StatusInternalServerError, "internal_error", "the request could not be completed: "+firstLine(err))
}

// unavailable answers 503 database_unavailable with Retry-After.
func (s *Server) unavailable(w http.ResponseWriter, msg string) {
	w.Header().Set("Retry-After", retryAfterSeconds)
	writeError(w, http.StatusServiceUnavailable, "database_unavailable", msg)
}

// firstLine returns the first line of err's message.
func firstLine(err error) string {
	msg, _, _ := strings.Cut(err.Error(), "\n")
	return msg
}
