package httpapi

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/pulse-sidecar/pulse/pulsetype"
)

func (s *Server) listDeliveries(w http.ResponseWriter, r *http.Request) {
	q := pulsetype.DeliveryFilter{ConsumerGroup: r.URL.Query().Get("consumerGroup"), Topic: r.URL.Query().Get("topic"),
		Status: pulsetype.Status(r.URL.Query().Get("status")), After: r.URL.Query().Get("after"), Limit: 50}
	if q.Status != "" && q.Status != pulsetype.StatusPending && !q.Status.Terminal() {
		writeError(w, http.StatusBadRequest, "invalid_status", fmt.Sprintf("status must be pending, success, error or cancelled, got %q", q.Status))
		return
	}
	if l := r.URL.Query().Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 || n > 500 {
			writeError(w, http.StatusBadRequest, "invalid_limit", "limit must be an integer between 1 and 500")
			return
		}
		q.Limit = n
	}
	list, next, err := s.store.ListDeliveries(r.Context(), q)
	if errors.Is(err, pulsetype.ErrBadCursor) {
		writeError(w, http.StatusBadRequest, "invalid_cursor", "after must be the next cursor of a previous page")
		return
	}
	if err != nil {
		s.internalError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"deliveries": each(list, deliveryOf), "next": next})
}

func (s *Server) retryDelivery(w http.ResponseWriter, r *http.Request) {
	id := pathParam(r, "id")
	n, err := s.store.RetryDelivery(r.Context(), id)
	switch {
	case errors.Is(err, pulsetype.ErrNotSubscribed):
		writeError(w, http.StatusConflict, "not_subscribed", "the delivery's consumer group has no endpoint whose topics and filter take its event now; register one to retry it")
	case errors.Is(err, pulsetype.ErrNotTerminal):
		writeError(w, http.StatusConflict, "delivery_not_terminal", "the delivery is still pending; only a terminal delivery can be retried")
	case errors.Is(err, pulsetype.ErrAttemptInFlight):
		writeError(w, http.StatusConflict, "attempt_in_flight", "the delivery was cancelled while an attempt was in flight, and that attempt has not ended yet; retry once it has")
	case s.deliveryFound(w, r, id, err): // when not, it answered 404 or 500
		s.notify.Wake() // the attempt is due now
		s.audit(r, ActionDeliveryRetried).Str("delivery_id", id).Int("attempt", n).Msg("delivery retried")
		writeJSON(w, http.StatusAccepted, map[string]any{"id": id, "attempt": n, "status": pulsetype.StatusPending})
	}
}

type replayBody struct {
	Status pulsetype.Status `json:"status"`
	From   *time.Time       `json:"from"`
	To     *time.Time       `json:"to"`
}

func (s *Server) replay(w http.ResponseWriter, r *http.Request) {
	group := pathParam(r, "consumerGroup")
	var b replayBody
	raw, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxEndpointBody))
	if err == nil && len(raw) > 0 {
		err = json.Unmarshal(raw, &b)
	}
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid_json", "the body must be {\"status\": \"error\"|\"success\"|\"cancelled\", \"from\": RFC 3339, \"to\": RFC 3339}: "+err.Error())
		return
	}
	if b.Status == "" {
		b.Status = pulsetype.StatusError
	}
	if !b.Status.Terminal() {
		writeError(w, http.StatusBadRequest, "invalid_status", "status must be error, success or cancelled (terminal deliveries)")
		return
	}
	from, to := time.Time{}, time.Now().Add(24*time.Hour)
	if b.From != nil {
		from = *b.From
	}
	if b.To != nil {
		to = *b.To
	}
	if !from.Before(to) {
		writeError(w, http.StatusBadRequest, "invalid_window", "from must be before to")
		return
	}
	// A read that fails for another reason answers its error: the replay would wait for the same database
	// again, and an unreachable one would hold the request twice PULSE_DATABASE_TIMEOUT. An endpoint whose
	// values cannot be decrypted can still be replayed.
	if !s.groupRegistered(w, r, group) {
		return
	}
	n, err := s.store.ReplayDeliveries(r.Context(), pulsetype.ReplayParams{ConsumerGroup: group, Status: b.Status, From: from, To: to})
	if err != nil {
		s.internalError(w, r, err)
		return
	}
	if n > 0 {
		s.notify.Wake()
	}
	s.audit(r, ActionDeliveriesReplayd).Str("consumer_group", group).Str("status", string(b.Status)).
		Time("from", from).Time("to", to).Int("replayed", n).Msg("deliveries replayed")
	writeJSON(w, http.StatusOK, map[string]any{"consumerGroup": group, "replayed": n})
}
