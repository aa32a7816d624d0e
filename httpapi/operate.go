package httpapi

import (
	"cmp"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/pulse-sidecar/pulse/pulsetype"
)

// listDeliveries answers GET /v1/deliveries?consumerGroup&topic&status&limit&after. A parameter whose
// percent-encoding is broken (after=%%zz) is refused rather than dropped, as url.Values would drop it: a
// dropped cursor would answer the first page again, a dropped filter more than asked for. A broken after is
// invalid_cursor, status invalid_status, limit invalid_limit, any other invalid_query.
func (s *Server) listDeliveries(w http.ResponseWriter, r *http.Request) {
	query, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		name := brokenParameter(r.URL.RawQuery)
		code := map[string]string{"after": "invalid_cursor", "status": "invalid_status", "limit": "invalid_limit"}[name]
		writeError(w, http.StatusBadRequest, cmp.Or(code, "invalid_query"),
			fmt.Sprintf("the query parameter %q is not valid percent-encoding: %s", name, err))
		return
	}
	q := pulsetype.DeliveryFilter{ConsumerGroup: query.Get("consumerGroup"), Topic: query.Get("topic"),
		Status: pulsetype.Status(query.Get("status")), After: query.Get("after"), Limit: 50}
	if q.Status != "" && q.Status != pulsetype.StatusPending && !q.Status.Terminal() {
		writeError(w, http.StatusBadRequest, "invalid_status", fmt.Sprintf("status must be pending, success, error or cancelled, got %q", q.Status))
		return
	}
	if l := query.Get("limit"); l != "" {
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

// brokenParameter returns the name of the first parameter of the raw query whose name or value does not
// unescape, or that holds a semicolon, which url.ParseQuery refuses (its raw name when the name itself is
// broken).
func brokenParameter(raw string) string {
	for pair := range strings.SplitSeq(raw, "&") {
		name, value, _ := strings.Cut(pair, "=")
		key, errName := url.QueryUnescape(name)
		if _, errValue := url.QueryUnescape(value); errName != nil || errValue != nil || strings.Contains(pair, ";") {
			return cmp.Or(key, name)
		}
	}
	return ""
}

func (s *Server) retryDelivery(w http.ResponseWriter, r *http.Request) {
	id := pathParam(r, "id")
	if !refuseBody(w, r, "POST /v1/deliveries/{id}/retry") {
		return
	}
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
	raw, ok := readBody(w, r, maxEndpointBody, "a replay body")
	if !ok {
		return
	}
	var b replayBody
	if err := decodeStrict(raw, &b); err != nil {
		writeError(w, http.StatusBadRequest, "invalid_json", "the body must be {\"status\": \"error\"|\"success\"|\"cancelled\", \"from\": RFC 3339, \"to\": RFC 3339}, each optional: "+err.Error())
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
