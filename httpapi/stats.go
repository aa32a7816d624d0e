package httpapi

import (
	"net/http"
	"time"

	"github.com/pulse-sidecar/pulse/pulsetype"
)

// stats answers GET /v1/stats: {"windowMs": 3600000, "groups": [GroupStats, ...]} for every registered
// consumer group in group order, or for the one named by ?consumerGroup= (404 endpoint_not_found when it has
// no endpoint). See mongo.Store.Stats for what the figures cost.
func (s *Server) stats(w http.ResponseWriter, r *http.Request) {
	var groups []string
	if g := r.URL.Query().Get("consumerGroup"); g != "" {
		if !s.groupRegistered(w, r, g) {
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
	list, err := s.store.Stats(r.Context(), groups)
	if err != nil {
		s.internalError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"windowMs": pulsetype.StatsWindow.Milliseconds(), "groups": each(list, groupStatsOf)})
}

// groupStats is one consumer group's figures in GET /v1/stats (pulsetype.GroupStats). oldestPendingAt is
// written by encoding/json's time format (RFC 3339 with up to nine fraction digits, trailing zeros cut), not
// as a Timestamp.
type groupStats struct {
	ConsumerGroup      string     `json:"consumerGroup"`
	Pending            int64      `json:"pending"`
	OldestPendingAt    *time.Time `json:"oldestPendingAt,omitempty"`
	OldestPendingAgeMs int64      `json:"oldestPendingAgeMs"`
	Succeeded1h        int64      `json:"succeeded1h"`
	Failed1h           int64      `json:"failed1h"`
	LatencyP50Ms       *int64     `json:"latencyP50Ms"`
	LatencySample      int        `json:"latencySample"`
}

func groupStatsOf(g *pulsetype.GroupStats) groupStats {
	return groupStats{ConsumerGroup: g.ConsumerGroup, Pending: g.Pending, OldestPendingAt: g.OldestPendingAt,
		OldestPendingAgeMs: g.OldestPendingAgeMs, Succeeded1h: g.Succeeded1h, Failed1h: g.Failed1h, LatencyP50Ms: g.LatencyP50Ms,
		LatencySample: g.LatencySample}
}
