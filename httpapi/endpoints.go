package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/go-chi/chi/v5"

	"github.com/pulse-sidecar/pulse/pulsetype"
)

// maxEndpointBody bounds an endpoint registration body, in bytes.
const maxEndpointBody = 64 << 10

// DecodeEndpoint parses and normalizes an endpoint body for consumerGroup (unknown fields are rejected). It
// returns a *pulsetype.FieldError or a JSON error for a bad body.
func DecodeEndpoint(consumerGroup string, body []byte) (*pulsetype.Endpoint, error) {
	var ep pulsetype.Endpoint
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&ep); err != nil {
		return nil, fmt.Errorf("the body is not a valid endpoint: %s", describeJSONError(err))
	}
	if dec.More() {
		return nil, fmt.Errorf("the body holds more than one JSON value")
	}
	if ep.ConsumerGroup != "" && ep.ConsumerGroup != consumerGroup {
		return nil, &pulsetype.FieldError{Field: "consumerGroup", Message: fmt.Sprintf("%q differs from the path's %q", ep.ConsumerGroup, consumerGroup)}
	}
	ep.ConsumerGroup = consumerGroup
	ep.State, ep.StateReason, ep.StateSince = "", "", nil // read-only, like createdAt: a PUT keeps the state
	if err := ep.Normalize(); err != nil {
		return nil, err
	}
	return &ep, nil
}

func (s *Server) putEndpoint(w http.ResponseWriter, r *http.Request) {
	group := chi.URLParam(r, "consumerGroup")
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxEndpointBody))
	if err != nil {
		writeError(w, http.StatusRequestEntityTooLarge, "body_too_large", fmt.Sprintf("an endpoint body is at most %d bytes", maxEndpointBody))
		return
	}
	ep, err := DecodeEndpoint(group, body)
	if err != nil {
		var fe *pulsetype.FieldError
		if errors.As(err, &fe) {
			writeError(w, http.StatusBadRequest, "invalid_endpoint", fe.Error())
			return
		}
		writeError(w, http.StatusBadRequest, "invalid_json", err.Error())
		return
	}
	// The previous registration, for the audit log's list of changed fields; unreadable (its values were
	// encrypted with a key no longer configured) counts as new.
	prev, err := s.store.GetEndpoint(r.Context(), group)
	if err != nil && !errors.Is(err, pulsetype.ErrNotFound) && !errors.Is(err, pulsetype.ErrUndecryptable) {
		s.internalError(w, r, err)
		return
	}
	stored, created, err := s.store.PutEndpoint(r.Context(), ep)
	if err != nil {
		s.internalError(w, r, err)
		return
	}
	s.notify.EndpointChanged(group)
	status, action, msg := http.StatusOK, ActionEndpointChanged, "endpoint changed"
	if created {
		status, action, msg, prev = http.StatusCreated, ActionEndpointCreated, "endpoint created", nil
	}
	s.audit(r, action).Str("consumer_group", group).Strs("changed", ChangedFields(prev, stored)).Msg(msg)
	writeJSON(w, status, stored.Redacted())
}

func (s *Server) getEndpoint(w http.ResponseWriter, r *http.Request) {
	group := chi.URLParam(r, "consumerGroup")
	ep, err := s.store.GetEndpoint(r.Context(), group)
	if s.endpointFound(w, r, group, err) {
		writeJSON(w, http.StatusOK, ep.Redacted())
	}
}

// endpointFound reports whether err (of reading or changing group's endpoint) is nil; otherwise it answers
// 404 endpoint_not_found for pulsetype.ErrNotFound and 500 (or 503) for any other error.
func (s *Server) endpointFound(w http.ResponseWriter, r *http.Request, group string, err error) bool {
	if errors.Is(err, pulsetype.ErrNotFound) {
		writeError(w, http.StatusNotFound, "endpoint_not_found", fmt.Sprintf("consumer group %q has no endpoint", group))
		return false
	}
	if err != nil {
		s.internalError(w, r, err)
		return false
	}
	return true
}

func (s *Server) listEndpoints(w http.ResponseWriter, r *http.Request) {
	eps, err := s.store.ListEndpoints(r.Context())
	if err != nil {
		s.internalError(w, r, err)
		return
	}
	out := make([]pulsetype.Endpoint, len(eps))
	for i, ep := range eps {
		out[i] = ep.Redacted()
	}
	writeJSON(w, http.StatusOK, map[string]any{"endpoints": out})
}

func (s *Server) deleteEndpoint(w http.ResponseWriter, r *http.Request) {
	group := chi.URLParam(r, "consumerGroup")
	err := s.store.DeleteEndpoint(r.Context(), group)
	if errors.Is(err, pulsetype.ErrNotFound) {
		writeError(w, http.StatusNotFound, "endpoint_not_found", fmt.Sprintf("consumer group %q has no endpoint", group))
		return
	}
	if err != nil {
		s.internalError(w, r, err)
		return
	}
	s.notify.EndpointChanged(group)
	s.audit(r, ActionEndpointDeleted).Str("consumer_group", group).Msg("endpoint deleted")
	w.WriteHeader(http.StatusNoContent)
}
