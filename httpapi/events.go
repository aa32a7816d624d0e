package httpapi

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"reflect"
	"regexp"
	"unicode/utf8"

	"github.com/google/uuid"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/pulse-sidecar/pulse/internal/tracing"
	"github.com/pulse-sidecar/pulse/pulsetype"
	"github.com/pulse-sidecar/pulse/webhook"
)

// MaxBatch is the most events one publish request may carry (the contract).
const MaxBatch = 1000

// eventHeaderKey is what an event header key may be: plain names, storable as document keys everywhere.
var eventHeaderKey = regexp.MustCompile(`^[A-Za-z0-9_-]{1,256}$`)

// MaxEventHeaders bounds the headers of one event.
const MaxEventHeaders = 64

// inputEvent is one event of a publish body.
type inputEvent struct {
	Topic   *string           `json:"topic"`
	Data    json.RawMessage   `json:"data"`
	ID      *string           `json:"id"`
	Headers map[string]string `json:"headers"`
	// OrderingKey is optional: 1 to pulsetype.MaxOrderingKey characters.
	OrderingKey *string `json:"orderingKey"`
}

// BadRequestError is a publish body the API rejects: Status is 400 or 413, Code the error code.
type BadRequestError struct {
	Status  int
	Code    string
	Message string
}

func (e *BadRequestError) Error() string { return e.Message }

func badRequest(code, format string, args ...any) *BadRequestError {
	return &BadRequestError{Status: http.StatusBadRequest, Code: code, Message: fmt.Sprintf(format, args...)}
}

// DecodeEvents parses a publish body: one event object or an array of 1–1000 of them. It returns the events
// (ids of the events without a client id are left empty), whether the body was an array, or a
// *BadRequestError naming the problem. It checks UTF-8 and JSON validity before decoding (the JSON scanner is
// iterative, so deep nesting cannot exhaust the stack), rejects unknown fields, a missing or malformed topic,
// a missing data, bad ids or headers, and duplicate client ids. Data is kept verbatim (compacted).
func DecodeEvents(body []byte) (events []*pulsetype.Event, isArray bool, err error) {
	body = bytes.TrimSpace(body)
	if len(body) == 0 {
		return nil, false, badRequest("invalid_json", "the body is empty: send one event object or an array of events")
	}
	if !utf8.Valid(body) {
		return nil, false, badRequest("invalid_json", "the body is not valid UTF-8")
	}
	if !json.Valid(body) {
		return nil, false, badRequest("invalid_json", "the body is not valid JSON (truncated or malformed)")
	}
	var inputs []inputEvent
	switch body[0] {
	case '{':
		var one inputEvent
		if err := strictUnmarshal(body, &one); err != nil {
			return nil, false, err
		}
		inputs = []inputEvent{one}
	case '[':
		isArray = true
		var raws []json.RawMessage
		if err := json.Unmarshal(body, &raws); err != nil {
			return nil, true, badRequest("invalid_json", "the body is not an array of event objects")
		}
		if len(raws) == 0 {
			return nil, true, badRequest("empty_batch", "the array holds no events")
		}
		if len(raws) > MaxBatch {
			return nil, true, badRequest("batch_too_large", "the array holds %d events; at most %d are allowed per request", len(raws), MaxBatch)
		}
		inputs = make([]inputEvent, len(raws))
		for i, raw := range raws {
			if len(raw) == 0 || raw[0] != '{' {
				return nil, true, badRequest("invalid_event", "events[%d] is not a JSON object", i)
			}
			if err := strictUnmarshal(raw, &inputs[i]); err != nil {
				var br *BadRequestError
				errors.As(err, &br)
				br.Message = fmt.Sprintf("events[%d]: %s", i, br.Message)
				return nil, true, br
			}
		}
	default:
		return nil, false, badRequest("invalid_json", "the body must be an event object or an array of event objects")
	}
	seen := map[string]int{}
	for i, in := range inputs {
		where := ""
		if isArray {
			where = fmt.Sprintf("events[%d].", i)
		}
		e, err := in.event(where)
		if err != nil {
			return nil, isArray, err
		}
		if e.ID != "" {
			if j, dup := seen[e.ID]; dup {
				return nil, isArray, badRequest("duplicate_id", "events[%d] and events[%d] have the same id %q", j, i, e.ID)
			}
			seen[e.ID] = i
		}
		events = append(events, e)
	}
	return events, isArray, nil
}

func strictUnmarshal(b []byte, v *inputEvent) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return badRequest("invalid_event", "%s", describeJSONError(err))
	}
	if err := exactMembers(b, reflect.TypeFor[inputEvent]()); err != nil {
		return badRequest("invalid_event", "%s", err.Error())
	}
	return nil
}

func describeJSONError(err error) string {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		if te.Field == "" {
			return "the body must be a JSON object, not " + te.Value
		}
		return fmt.Sprintf("field %q %s", te.Field, mustBe(te))
	}
	return err.Error() // "json: unknown field \"x\"" and friends
}

// mustBe is the text of a JSON type error without its field: "must be a string, not number".
func mustBe(te *json.UnmarshalTypeError) string {
	return fmt.Sprintf("must be %s, not %s", jsonKind(te.Type.Kind().String()), te.Value)
}

func jsonKind(k string) string {
	switch k {
	case "string":
		return "a string"
	case "map":
		return "an object of strings"
	case "int", "int64", "int32":
		return "an integer"
	default:
		return "a " + k
	}
}

func (in *inputEvent) event(where string) (*pulsetype.Event, error) {
	if in.Topic == nil {
		return nil, badRequest("invalid_topic", "%stopic is required", where)
	}
	if !pulsetype.ValidTopic(*in.Topic) {
		return nil, badRequest("invalid_topic", "%stopic %q must match ^[A-Za-z0-9][A-Za-z0-9._:-]{0,199}$", where, *in.Topic)
	}
	if pulsetype.Reserved(*in.Topic) {
		return nil, badRequest("reserved_topic", "%stopic %q: the prefix %q is reserved for the sidecar's operational events", where, *in.Topic, pulsetype.ReservedTopicPrefix)
	}
	if in.Data == nil {
		return nil, badRequest("missing_data", "%sdata is required (any JSON value, null included)", where)
	}
	var data bytes.Buffer
	if err := json.Compact(&data, in.Data); err != nil {
		return nil, badRequest("invalid_json", "%sdata is not valid JSON", where)
	}
	e := &pulsetype.Event{Topic: *in.Topic, Data: data.Bytes(), Headers: in.Headers}
	if in.ID != nil {
		if !pulsetype.ValidEventID(*in.ID) {
			return nil, badRequest("invalid_id", "%sid %q must be 1-128 characters of letters, digits, '.', '_', ':' or '-', and not . or ..", where, *in.ID)
		}
		e.ID = *in.ID
	}
	if len(in.Headers) > MaxEventHeaders {
		return nil, badRequest("invalid_headers", "%sheaders holds %d entries; at most %d", where, len(in.Headers), MaxEventHeaders)
	}
	for k := range in.Headers {
		if !eventHeaderKey.MatchString(k) {
			return nil, badRequest("invalid_headers", "%sheaders key %q must be 1-256 characters of letters, digits, '_' or '-'", where, k)
		}
	}
	if in.OrderingKey != nil {
		if n := utf8.RuneCountInString(*in.OrderingKey); n == 0 || n > pulsetype.MaxOrderingKey {
			return nil, badRequest("invalid_ordering_key", "%sorderingKey must be 1-%d characters, not %d", where, pulsetype.MaxOrderingKey, n)
		}
		if why := pulsetype.ValidCEString(*in.OrderingKey); why != "" {
			return nil, badRequest("invalid_ordering_key", "%sorderingKey: %s", where, why)
		}
		e.OrderingKey = *in.OrderingKey
	}
	// The ce-* headers, the id, the topic and the ordering key go out as CloudEvents headers to a cloudevents
	// endpoint: what could never be sent is refused now rather than failing every attempt.
	if err := webhook.CheckCEHeaders(e); err != nil {
		return nil, badRequest("invalid_headers", "%sheaders: %v", where, err)
	}
	return e, nil
}

type publishedBody struct {
	ID        string    `json:"id"`
	Topic     string    `json:"topic"`
	CreatedAt Timestamp `json:"createdAt"`
}

func (s *Server) publish(w http.ResponseWriter, r *http.Request) {
	if s.draining.Load() {
		writeError(w, http.StatusServiceUnavailable, "shutting_down", "the sidecar is shutting down; publish to another replica or retry")
		return
	}
	// The body is read only with its documented media type: a web page can send text/plain, a form encoding or
	// no Content-Type at all without a preflight (see browser.go). A binary-mode CloudEvent carries ce-*
	// headers, which a page cannot send without one.
	cloudEvents := isCloudEvents(r.Header)
	if ct := r.Header.Get("Content-Type"); !cloudEvents {
		if mt, _, err := mime.ParseMediaType(ct); err != nil || mt != "application/json" {
			writeError(w, http.StatusUnsupportedMediaType, "unsupported_media_type",
				"Content-Type must be application/json, "+ceStructured+" or "+ceBatch+" (or a binary-mode CloudEvent with ce-* headers), got "+cmp.Or(ct, "none"))
			return
		}
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.opts.MaxBodyBytes))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			writeError(w, http.StatusRequestEntityTooLarge, "body_too_large", fmt.Sprintf("the body exceeds %d bytes", mbe.Limit))
			return
		}
		writeError(w, http.StatusBadRequest, "unreadable_body", "the body could not be read: "+err.Error())
		return
	}
	decode := DecodeEvents
	if cloudEvents {
		decode = func(body []byte) ([]*pulsetype.Event, bool, error) { return DecodeCloudEvents(r.Header, body) }
	}
	events, isArray, err := decode(body)
	if err != nil {
		var br *BadRequestError
		errors.As(err, &br)
		writeError(w, br.Status, br.Code, br.Message)
		return
	}
	tracer := s.opts.Tracer
	if tracer == nil {
		tracer = tracing.Tracer(nil)
	}
	// The publish span is a child of the request's traceparent, if any; it is kept with the events.
	ctx, span := tracer.Start(tracing.Resume(r.Context(), r.Header.Get("traceparent"), r.Header.Get("tracestate")), "publish",
		trace.WithSpanKind(trace.SpanKindServer), trace.WithAttributes(attribute.Int("pulse.events", len(events))))
	defer span.End()
	traceparent, tracestate := tracing.Carried(ctx)
	for _, e := range events {
		if e.ID == "" {
			e.ID = uuid.Must(uuid.NewV7()).String()
		}
		e.TraceParent, e.TraceState = traceparent, tracestate
	}
	// Bounded by PublishTimeout (PULSE_DATABASE_TIMEOUT): a database that does not answer (an election, a
	// half-open connection) gets the publish a 503 within it, never a wait without end. A round already
	// under way may still store the events: a publish re-sent with the same ids is stored once.
	pctx := r.Context()
	if s.opts.PublishTimeout > 0 {
		var cancel context.CancelFunc
		pctx, cancel = context.WithTimeout(pctx, s.opts.PublishTimeout)
		defer cancel()
	}
	published, err := s.store.Publish(pctx, events)
	if err != nil {
		span.SetStatus(codes.Error, err.Error())
	}
	if errors.Is(err, pulsetype.ErrIDConflict) {
		writeError(w, http.StatusConflict, "id_conflict", "an event with this id was already published with other content")
		return
	}
	if err != nil {
		s.internalError(w, r, err)
		return
	}
	status := http.StatusOK // every event was an idempotent re-publish
	var fresh []*pulsetype.Event
	out := make([]publishedBody, len(published))
	for i, p := range published {
		out[i] = publishedBody{ID: p.Event.ID, Topic: p.Event.Topic, CreatedAt: Timestamp(p.Event.CreatedAt)}
		if !p.Existing {
			status = http.StatusAccepted
			fresh = append(fresh, p.Event)
			if s.opts.Metrics != nil {
				s.opts.Metrics.Published(p.Event.Topic)
			}
		}
	}
	if len(fresh) > 0 {
		s.notify.Published(fresh)
	}
	if isArray {
		writeJSON(w, status, out)
		return
	}
	writeJSON(w, status, out[0])
}

type eventBody struct {
	ID        string            `json:"id"`
	Topic     string            `json:"topic"`
	CreatedAt Timestamp         `json:"createdAt"`
	Data      json.RawMessage   `json:"data"`
	Headers   map[string]string `json:"headers"`
	// OrderingKey is present when the event carries one.
	OrderingKey string          `json:"orderingKey,omitempty"`
	Deliveries  []eventDelivery `json:"deliveries"`
}

type eventDelivery struct {
	ID            string           `json:"id"`
	ConsumerGroup string           `json:"consumerGroup"`
	Status        pulsetype.Status `json:"status"`
	Attempts      int              `json:"attempts"`
}

func (s *Server) getEvent(w http.ResponseWriter, r *http.Request) {
	id := pathParam(r, "id")
	ev, err := s.store.GetEvent(r.Context(), id)
	if !s.found(w, r, err, "event_not_found", fmt.Sprintf("no event %q (it may have expired)", id)) {
		return
	}
	deliveries, err := s.store.DeliveriesOfEvent(r.Context(), id)
	if err != nil {
		s.internalError(w, r, err)
		return
	}
	ids := each(deliveries, func(d *pulsetype.Delivery) string { return d.ID })
	attempts := map[string][]*pulsetype.Attempt{}
	if len(ids) > 0 {
		if attempts, err = s.store.AttemptsOf(r.Context(), ids); err != nil {
			s.internalError(w, r, err)
			return
		}
	}
	body := eventBody{ID: ev.ID, Topic: ev.Topic, CreatedAt: Timestamp(ev.CreatedAt), Data: ev.Data, Headers: ev.Headers,
		OrderingKey: ev.OrderingKey, Deliveries: []eventDelivery{}}
	if body.Headers == nil {
		body.Headers = map[string]string{}
	}
	for _, d := range deliveries {
		body.Deliveries = append(body.Deliveries, eventDelivery{ID: d.ID, ConsumerGroup: d.ConsumerGroup, Status: d.Status, Attempts: len(attempts[d.ID])})
	}
	writeJSON(w, http.StatusOK, body)
}

func (s *Server) getDelivery(w http.ResponseWriter, r *http.Request) {
	id := pathParam(r, "id")
	d, attempts, err := s.store.GetDelivery(r.Context(), id)
	if !s.deliveryFound(w, r, id, err) {
		return
	}
	body := deliveryBody{delivery: deliveryOf(d), Attempts: each(attempts, attemptOf)}
	if d.Status == pulsetype.StatusPending {
		reason, err := s.pendingReason(r.Context(), d, attempts)
		if err != nil {
			s.internalError(w, r, err)
			return
		}
		body.PendingReason = reason
	}
	writeJSON(w, http.StatusOK, body)
}
