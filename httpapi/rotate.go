package httpapi

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/pulse-sidecar/pulse/pulsetype"
)

// rotateBody is the body of POST /v1/endpoints/{consumerGroup}/rotate-secret; every field is optional.
type rotateBody struct {
	Secret  string          `json:"secret"`  // the new secret; generated when empty
	Overlap json.RawMessage `json:"overlap"` // a duration string; DefaultSecretOverlap when absent
}

// rotateAnswer is the 200 answer of a rotation. Secret is set only when the sidecar generated it: the one
// time it is shown. Overlap is 0 when nothing overlaps (overlap 0 asked for, or the endpoint was unsigned).
type rotateAnswer struct {
	ConsumerGroup           string     `json:"consumerGroup"`
	Secret                  string     `json:"secret,omitempty"`
	Overlap                 Duration   `json:"overlap"`
	PreviousSecretExpiresAt *Timestamp `json:"previousSecretExpiresAt,omitempty"`
	Endpoint                Endpoint   `json:"endpoint"`
}

// rotateSecret answers POST /v1/endpoints/{consumerGroup}/rotate-secret {"secret"?, "overlap"?}: 200
// rotateAnswer; 400 invalid_json, invalid_secret (also the current secret again) or invalid_overlap (not a
// duration from 0 to MaxSecretOverlap); 404 endpoint_not_found.
func (s *Server) rotateSecret(w http.ResponseWriter, r *http.Request) {
	group := pathParam(r, "consumerGroup")
	raw, ok := readBody(w, r, maxEndpointBody, "a rotation body")
	if !ok {
		return
	}
	var b rotateBody
	if err := decodeStrict(raw, &b); err != nil {
		writeError(w, http.StatusBadRequest, "invalid_json", `the body must be {"secret": "whsec_...", "overlap": "24h"}, both optional: `+err.Error())
		return
	}
	overlap := pulsetype.DefaultSecretOverlap
	if len(b.Overlap) > 0 {
		var d Duration
		if err := json.Unmarshal(b.Overlap, &d); err != nil {
			writeError(w, http.StatusBadRequest, "invalid_overlap", "overlap: "+err.Error())
			return
		}
		if overlap = time.Duration(d); overlap < 0 || overlap > pulsetype.MaxSecretOverlap {
			writeError(w, http.StatusBadRequest, "invalid_overlap", fmt.Sprintf("overlap must be between 0s and %s, got %s", pulsetype.MaxSecretOverlap, overlap))
			return
		}
	}
	secret, generated := b.Secret, b.Secret == ""
	if generated {
		secret = pulsetype.GenerateSecret()
	} else if err := pulsetype.CheckSecret(secret); err != nil {
		writeError(w, http.StatusBadRequest, "invalid_secret", err.Error())
		return
	}
	ep, err := s.store.RotateSecret(r.Context(), group, secret, overlap)
	var fe *pulsetype.FieldError
	if errors.As(err, &fe) {
		writeError(w, http.StatusBadRequest, "invalid_secret", fe.Error())
		return
	}
	if !s.endpointFound(w, r, group, err) {
		return
	}
	s.notify.EndpointChanged(group) // other replicas see it as they see a PUT: within their endpoint cache time
	if ep.PreviousSecretExpiresAt == nil {
		overlap = 0 // the endpoint was unsigned, or overlap 0 was asked for
	}
	s.audit(r, ActionSecretRotated).Str("consumer_group", group).Str("overlap", overlap.String()).Bool("generated", generated).
		Msg("endpoint secret rotated")
	answer := rotateAnswer{ConsumerGroup: group, Overlap: Duration(overlap),
		PreviousSecretExpiresAt: timestampPtr(ep.PreviousSecretExpiresAt), Endpoint: redacted(ep)}
	if generated {
		answer.Secret = secret
	}
	writeJSON(w, http.StatusOK, answer)
}
