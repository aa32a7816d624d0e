package httpapi

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/pulse-sidecar/pulse/pulsetype"
)

// stats answers GET /v1/stats: {"windowMs": 3600000, "groups": [GroupStats, ...]} for every registered
// consumer group in group order, or for the one named by ?consumerGroup= (404 endpoint_not_found when it has
// no endpoint). See mongo.Store.Stats for what the figures cost.
func (s *Server) stats(w http.ResponseWriter, r *http.Request) {
	var groups []string
	if g := r.URL.Query().Get("consumerGroup"); g != "" {
		if _, err := s.store.GetEndpoint(r.Context(), g); errors.Is(err, pulsetype.ErrNotFound) {
			writeError(w, http.StatusNotFound, "endpoint_not_found", fmt.Sprintf("consumer group %q has no endpoint", g))
			return
		} else if err != nil && !errors.Is(err, pulsetype.ErrUndecryptable) {
			s.internalError(w, r, err)
			return
		}
		groups = []string{g}
	} else {
		eps, err := s.store.ListEndpoints(r.Context())
		if err != nil {
			s.internalError(w, r, err)
			return
		}
		for _, ep := range eps {
			groups = append(groups, ep.ConsumerGroup)
		}
	}
	out, err := s.store.Stats(r.Context(), groups)
	if err != nil {
		s.internalError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"windowMs": pulsetype.StatsWindow.Milliseconds(), "groups": out})
}
