package httpapi

import (
	"errors"
	"net/http"

	"github.com/pulse-sidecar/pulse/pulsetype"
)

// pauseEndpoint answers POST /v1/endpoints/{consumerGroup}/pause: 200 with the endpoint as GET shows it
// (state paused, stateReason paused, stateSince); 404 endpoint_not_found. Pausing a paused endpoint keeps
// its stateSince. The body, if any, is ignored.
func (s *Server) pauseEndpoint(w http.ResponseWriter, r *http.Request) {
	if refuseBody(w, r, "POST /v1/endpoints/{consumerGroup}/pause") {
		s.setEndpointState(w, r, pulsetype.EndpointPaused, ActionEndpointPaused, "endpoint paused")
	}
}

// resumeEndpoint answers POST /v1/endpoints/{consumerGroup}/resume: 200 with the endpoint (state active) after
// a pause or a disable (410 Gone, disableAfter); 404 endpoint_not_found. Resuming an active endpoint
// changes nothing.
func (s *Server) resumeEndpoint(w http.ResponseWriter, r *http.Request) {
	if refuseBody(w, r, "POST /v1/endpoints/{consumerGroup}/resume") {
		s.setEndpointState(w, r, pulsetype.EndpointActive, ActionEndpointResumed, "endpoint resumed")
	}
}

func (s *Server) setEndpointState(w http.ResponseWriter, r *http.Request, state pulsetype.EndpointState, action, msg string) {
	group := pathParam(r, "consumerGroup")
	// A resume of an endpoint the sidecar disabled publishes pulse.endpoint.enabled: its state is read first.
	// A read that fails for another reason than a missing or undecryptable endpoint answers its error: the
	// state change would wait for the same database again, and an unreachable one would hold the request
	// twice PULSE_DATABASE_TIMEOUT.
	var disabled pulsetype.StateReason
	if state == pulsetype.EndpointActive && s.opts.Operations != nil {
		prev, err := s.store.GetEndpoint(r.Context(), group)
		switch {
		case err == nil:
			if prev.State == pulsetype.EndpointDisabled {
				disabled = prev.StateReason
			}
		case !errors.Is(err, pulsetype.ErrNotFound) && !errors.Is(err, pulsetype.ErrUndecryptable):
			s.internalError(w, r, err)
			return
		}
	}
	ep, err := s.store.SetEndpointState(r.Context(), group, state)
	if !s.endpointFound(w, r, group, err) {
		return
	}
	if disabled != "" && ep.Active() {
		s.opts.Operations.EndpointEnabled(group, disabled)
	}
	// This process's dispatcher stops (or resumes) at once; the others check the state after each claim.
	s.notify.EndpointChanged(group)
	s.audit(r, action).Str("consumer_group", group).Msg(msg)
	writeJSON(w, http.StatusOK, redacted(ep))
}
