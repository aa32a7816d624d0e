package httpapi

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/pulse-sidecar/pulse/pulsetype"
)

// cancelDelivery answers POST /v1/deliveries/{id}/cancel: 200 {"id", "status": "cancelled", "finalAttempt",
// "attemptInFlight"} once the pending delivery is cancelled; 404 delivery_not_found; 409 delivery_terminal
// when it is (or became meanwhile) success, error or cancelled.
func (s *Server) cancelDelivery(w http.ResponseWriter, r *http.Request) {
	id := pathParam(r, "id")
	if !refuseBody(w, r, "POST /v1/deliveries/{id}/cancel") {
		return
	}
	res, err := s.store.CancelDelivery(r.Context(), id)
	if errors.Is(err, pulsetype.ErrTerminal) {
		writeError(w, http.StatusConflict, "delivery_terminal", firstLine(err)+"; only a pending delivery can be cancelled (a terminal one can be retried)")
		return
	}
	if !s.deliveryFound(w, r, id, err) {
		return
	}
	s.notify.Wake() // the next delivery of an ordered line may be due now
	s.audit(r, ActionDeliveryCancelled).Str("delivery_id", id).Int("attempt", res.FinalAttempt).
		Bool("in_flight", res.InFlight).Msg("delivery cancelled")
	writeJSON(w, http.StatusOK, map[string]any{"id": id, "status": pulsetype.StatusCancelled,
		"finalAttempt": res.FinalAttempt, "attemptInFlight": res.InFlight})
}

// deliveryFound is found for the delivery id: 404 delivery_not_found.
func (s *Server) deliveryFound(w http.ResponseWriter, r *http.Request, id string, err error) bool {
	return s.found(w, r, err, "delivery_not_found", fmt.Sprintf("no delivery %q (it may have expired)", id))
}
