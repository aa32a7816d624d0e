package httpapi

import (
	"net/http"
	"sync/atomic"
)

// Starting is the HTTP handler of a sidecar's listeners while it starts, until Serve hands them the API:
// /healthz answers 200 {"status": "starting"} (the process is alive: a liveness probe must not kill a
// start whose index builds take long), /readyz and every other route 503 {"error": {"code": "starting",
// "message": "starting: <phase>"}} with Retry-After, the phase saying what the start waits for (as in
// "building indexes"). It is safe for concurrent use; the zero value is not ready: use NewStarting.
type Starting struct {
	phase   atomic.Pointer[string]
	handler atomic.Pointer[http.Handler] // set by Serve
}

// NewStarting returns a Starting handler in phase.
func NewStarting(phase string) *Starting {
	s := &Starting{}
	s.SetPhase(phase)
	return s
}

// SetPhase sets what /readyz says the start is doing (a short phrase, as in "building indexes").
func (s *Starting) SetPhase(phase string) { s.phase.Store(&phase) }

// Serve hands every later request to h (the API's or the probes' handler): the start is over.
func (s *Starting) Serve(h http.Handler) { s.handler.Store(&h) }

func (s *Starting) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if h := s.handler.Load(); h != nil {
		(*h).ServeHTTP(w, r)
		return
	}
	if r.URL.Path == "/healthz" && (r.Method == http.MethodGet || r.Method == http.MethodHead) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "starting"})
		return
	}
	w.Header().Set("Retry-After", retryAfterSeconds)
	writeError(w, http.StatusServiceUnavailable, "starting", "starting: "+*s.phase.Load())
}
