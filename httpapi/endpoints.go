package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/pulse-sidecar/pulse/pulsetype"
)

// maxEndpointBody bounds an endpoint registration body, in bytes.
const maxEndpointBody = 64 << 10

// Endpoint is the JSON shape of an endpoint: the body of PUT /v1/endpoints/{consumerGroup}, an entry of
// PULSE_ENDPOINTS_FILE, and what reads answer (redacted). Its times come last. createdAt, updatedAt and
// previousSecretExpiresAt are accepted in a body (a read can be sent back) and ignored by the store.
type Endpoint struct {
	ConsumerGroup          string                  `json:"consumerGroup"`
	URL                    string                  `json:"url"`
	Topics                 []string                `json:"topics"`
	Filter                 string                  `json:"filter,omitempty"`
	Delivery               pulsetype.DeliveryMode  `json:"delivery"`
	Ordered                bool                    `json:"ordered"`
	Format                 pulsetype.WebhookFormat `json:"format"`
	OffsetReset            pulsetype.OffsetReset   `json:"offsetReset"`
	MaxRetries             *Integer                `json:"maxRetries,omitempty"`
	RetryDelay             *Duration               `json:"retryDelay,omitempty"`
	RetryBackoffMultiplier *float64                `json:"retryBackoffMultiplier,omitempty"`
	MaxRetryDelay          *Duration               `json:"maxRetryDelay,omitempty"`
	Timeout                *Duration               `json:"timeout,omitempty"`
	MaxConcurrency         *Integer                `json:"maxConcurrency,omitempty"`
	Headers                map[string]string       `json:"headers,omitempty"`
	Secret                 string                  `json:"secret,omitempty"`
	InsecureSkipVerify     bool                    `json:"insecureSkipVerify,omitempty"`
	// RateLimit is in POSTs per second per replica; it, MaxRetryDuration and DisableAfter are left out when 0.
	RateLimit         float64  `json:"rateLimit,omitempty"`
	MaxRetryDuration  Duration `json:"maxRetryDuration,omitempty"`
	BacklogAlertAfter Duration `json:"backlogAlertAfter,omitempty"`
	DisableAfter      Duration `json:"disableAfter,omitempty"`
	// State, StateReason and StateSince are read-only: a PUT or the endpoints file does not change them.
	State       pulsetype.EndpointState `json:"state"`
	StateReason pulsetype.StateReason   `json:"stateReason,omitempty"`
	CreatedAt   Timestamp               `json:"createdAt"`
	UpdatedAt   Timestamp               `json:"updatedAt"`
	// PreviousSecretExpiresAt ends the overlap of a secret rotation (the previous secret is never shown).
	PreviousSecretExpiresAt *Timestamp `json:"previousSecretExpiresAt,omitempty"`
	StateSince              *Timestamp `json:"stateSince,omitempty"`
}

// EndpointOf returns e's JSON shape. It writes what it is given: pass e.Redacted() for reads and logs.
func EndpointOf(e *pulsetype.Endpoint) Endpoint {
	return Endpoint{ConsumerGroup: e.ConsumerGroup, URL: e.URL, Topics: e.Topics, Filter: e.Filter, Delivery: e.Delivery, Ordered: e.Ordered,
		Format: e.Format, OffsetReset: e.OffsetReset, MaxRetries: integerPtr(e.MaxRetries), RetryDelay: durationPtr(e.RetryDelay),
		RetryBackoffMultiplier: e.RetryBackoffMultiplier, MaxRetryDelay: durationPtr(e.MaxRetryDelay), Timeout: durationPtr(e.Timeout),
		MaxConcurrency: integerPtr(e.MaxConcurrency), Headers: e.Headers, Secret: e.Secret, InsecureSkipVerify: e.InsecureSkipVerify,
		RateLimit: e.RateLimit, MaxRetryDuration: Duration(e.MaxRetryDuration), BacklogAlertAfter: Duration(e.BacklogAlertAfter), DisableAfter: Duration(e.DisableAfter), State: e.State, StateReason: e.StateReason,
		CreatedAt: Timestamp(e.CreatedAt), UpdatedAt: Timestamp(e.UpdatedAt), PreviousSecretExpiresAt: timestampPtr(e.PreviousSecretExpiresAt),
		StateSince: timestampPtr(e.StateSince)}
}

// redacted returns e's JSON shape for a read (pulsetype.Endpoint.Redacted).
func redacted(e *pulsetype.Endpoint) Endpoint {
	r := e.Redacted()
	return EndpointOf(&r)
}

// endpoint returns the endpoint b describes, not normalized.
func (b *Endpoint) endpoint() *pulsetype.Endpoint {
	return &pulsetype.Endpoint{ConsumerGroup: b.ConsumerGroup, URL: b.URL, Topics: b.Topics, Filter: b.Filter, Delivery: b.Delivery, Ordered: b.Ordered,
		Format: b.Format, OffsetReset: b.OffsetReset, MaxRetries: intPtr(b.MaxRetries), RetryDelay: domainDuration(b.RetryDelay),
		RetryBackoffMultiplier: b.RetryBackoffMultiplier, MaxRetryDelay: domainDuration(b.MaxRetryDelay), Timeout: domainDuration(b.Timeout),
		MaxConcurrency: intPtr(b.MaxConcurrency), Headers: b.Headers, Secret: b.Secret, InsecureSkipVerify: b.InsecureSkipVerify,
		RateLimit: b.RateLimit, MaxRetryDuration: pulsetype.Duration(b.MaxRetryDuration), BacklogAlertAfter: pulsetype.Duration(b.BacklogAlertAfter), DisableAfter: pulsetype.Duration(b.DisableAfter), State: b.State, StateReason: b.StateReason,
		CreatedAt: time.Time(b.CreatedAt), UpdatedAt: time.Time(b.UpdatedAt), PreviousSecretExpiresAt: timePtr(b.PreviousSecretExpiresAt),
		StateSince: timePtr(b.StateSince)}
}

// badField returns a *pulsetype.FieldError for the first member of the JSON object body, in the body's
// order, whose value the type of its field in the struct t refuses (a Duration's or Timestamp's error does
// not name its field), or nil when body is not an object or each member decodes alone. Members match fields
// as encoding/json matches them (the exact name first, else ignoring case); the error names the field.
func badField(body []byte, t reflect.Type) *pulsetype.FieldError {
	dec := json.NewDecoder(bytes.NewReader(body))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil
		}
		key, _ := tok.(string)
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil
		}
		name, typ, ok := jsonField(t, key)
		if !ok {
			continue
		}
		if err := json.Unmarshal(raw, reflect.New(typ).Interface()); err != nil {
			msg := err.Error()
			if te := (*json.UnmarshalTypeError)(nil); errors.As(err, &te) {
				msg = mustBe(te)
			}
			return &pulsetype.FieldError{Field: name, Message: msg}
		}
	}
	return nil
}

// jsonField returns the JSON name and the type of the field of struct t that encoding/json decodes the
// member key into: the field named key, else the first whose name equals key ignoring case.
func jsonField(t reflect.Type, key string) (string, reflect.Type, bool) {
	foldedName, foldedType := "", reflect.Type(nil)
	for f := range t.Fields() {
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		switch {
		case name == "" || name == "-":
		case name == key:
			return name, f.Type, true
		case foldedType == nil && strings.EqualFold(name, key):
			foldedName, foldedType = name, f.Type
		}
	}
	return foldedName, foldedType, foldedType != nil
}

// errTrailingData is DecodeEndpoint's error for a body holding more than one JSON value.
var errTrailingData = errors.New("the body holds more than one JSON value")

// DecodeEndpoint decodes one endpoint object in the shape of Endpoint (the PUT body, an entry of
// PULSE_ENDPOINTS_FILE); unknown fields are errors. It returns the endpoint as sent, not normalized, or a
// *pulsetype.FieldError naming a field whose value is not a duration or time (`disableAfter: want a duration
// such as "1s", got "abc"`), or the encoding/json error (its message starts with "json: "), or an error for
// a body holding more than one JSON value.
func DecodeEndpoint(body []byte) (*pulsetype.Endpoint, error) {
	var b Endpoint
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&b); err != nil {
		var te *json.UnmarshalTypeError
		var se *json.SyntaxError
		if errors.As(err, &te) || errors.As(err, &se) {
			return nil, err // these name their field or offset already
		}
		if fe := badField(body, reflect.TypeFor[Endpoint]()); fe != nil {
			return nil, fe
		}
		return nil, err
	}
	if dec.More() {
		return nil, errTrailingData
	}
	if err := exactMembers(body, reflect.TypeFor[Endpoint]()); err != nil {
		return nil, err
	}
	return b.endpoint(), nil
}

// decodePut decodes and normalizes the body of PUT /v1/endpoints/{consumerGroup}. It returns a
// *pulsetype.FieldError for an invalid field (also a consumerGroup other than the path's), any other error
// for a body that is not an endpoint.
func decodePut(consumerGroup string, body []byte) (*pulsetype.Endpoint, error) {
	ep, err := DecodeEndpoint(body)
	var fe *pulsetype.FieldError
	switch {
	case errors.Is(err, errTrailingData):
		return nil, err
	case errors.As(err, &fe): // a value the field's JSON type refuses: answered as any other JSON error
		return nil, fmt.Errorf("the body is not a valid endpoint: field %q: %s", fe.Field, fe.Message)
	case err != nil:
		return nil, fmt.Errorf("the body is not a valid endpoint: %s", describeJSONError(err))
	}
	if ep.ConsumerGroup != "" && ep.ConsumerGroup != consumerGroup {
		return nil, &pulsetype.FieldError{Field: "consumerGroup", Message: fmt.Sprintf("%q differs from the path's %q", ep.ConsumerGroup, consumerGroup)}
	}
	ep.ConsumerGroup = consumerGroup
	ep.State, ep.StateReason, ep.StateSince = "", "", nil // read-only, like createdAt: a PUT keeps the state
	if err := ep.Normalize(); err != nil {
		return nil, err
	}
	return ep, nil
}

func (s *Server) putEndpoint(w http.ResponseWriter, r *http.Request) {
	group := pathParam(r, "consumerGroup")
	body, ok := readBody(w, r, maxEndpointBody, "an endpoint body")
	if !ok {
		return
	}
	ep, err := decodePut(group, body)
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
	writeJSON(w, status, redacted(stored))
}

func (s *Server) getEndpoint(w http.ResponseWriter, r *http.Request) {
	group := pathParam(r, "consumerGroup")
	ep, err := s.store.GetEndpoint(r.Context(), group)
	if s.endpointFound(w, r, group, err) {
		writeJSON(w, http.StatusOK, redacted(ep))
	}
}

// endpointFound reports whether err (of reading or changing group's endpoint) is nil; otherwise it answers
// 404 endpoint_not_found for pulsetype.ErrNotFound and 500 (or 503) for any other error.
func (s *Server) endpointFound(w http.ResponseWriter, r *http.Request, group string, err error) bool {
	return s.found(w, r, err, "endpoint_not_found", fmt.Sprintf("consumer group %q has no endpoint", group))
}

// groupRegistered reports whether group has an endpoint, one whose values cannot be decrypted included;
// otherwise it answers 404 endpoint_not_found, or 500 (or 503) when the read failed. A failed read is
// answered, not passed over: the handler's next call would wait for the same database again.
func (s *Server) groupRegistered(w http.ResponseWriter, r *http.Request, group string) bool {
	_, err := s.store.GetEndpoint(r.Context(), group)
	if errors.Is(err, pulsetype.ErrUndecryptable) {
		err = nil
	}
	return s.endpointFound(w, r, group, err)
}

func (s *Server) listEndpoints(w http.ResponseWriter, r *http.Request) {
	eps, err := s.store.ListEndpoints(r.Context())
	if err != nil {
		s.internalError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"endpoints": each(eps, redacted)})
}

// deleteEndpoint answers DELETE /v1/endpoints/{consumerGroup}: 204 once the endpoint is gone and at most one
// page (1,000) of its pending deliveries ended as error/endpoint_deleted; the headers Pulse-Deliveries-Ended
// and Pulse-Deliveries-Remaining give how many it ended and how many stay pending for the repair scan (or
// their POST in flight) to end. 404 endpoint_not_found; 400 invalid_json for a body other than nothing or {}.
func (s *Server) deleteEndpoint(w http.ResponseWriter, r *http.Request) {
	group := pathParam(r, "consumerGroup")
	if !refuseBody(w, r, "DELETE /v1/endpoints/{consumerGroup}") {
		return
	}
	res, err := s.store.DeleteEndpoint(r.Context(), group)
	if !s.endpointFound(w, r, group, err) {
		return
	}
	s.notify.EndpointChanged(group)
	s.audit(r, ActionEndpointDeleted).Str("consumer_group", group).Int64("ended", res.Ended).Int64("remaining", res.Remaining).
		Msg("endpoint deleted")
	w.Header().Set("Pulse-Deliveries-Ended", strconv.FormatInt(res.Ended, 10))
	w.Header().Set("Pulse-Deliveries-Remaining", strconv.FormatInt(res.Remaining, 10))
	w.WriteHeader(http.StatusNoContent)
}
