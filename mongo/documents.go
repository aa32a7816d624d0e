package mongo

import (
	"cmp"
	"encoding/json"
	"time"

	"github.com/google/uuid"

	"github.com/pulse-sidecar/pulse/internal/sealing"
	"github.com/pulse-sidecar/pulse/pulsetype"
)

// The bson field names of these documents, and the index names in schema.go, are the stored schema: they keep
// their earlier spelling (lockOwner, lockToken, lockedAt, lockedUntil for an attempt's lease owner, fencing
// token and lease times) because existing databases and older replicas during a rolling upgrade depend on them.

// eventDoc is a document of <prefix>.events. Data is the event's JSON text, kept as a string so numbers,
// unicode escapes and key order come back byte-equal.
type eventDoc struct {
	ID      string            `bson:"_id"`
	Topic   string            `bson:"topic"`
	Data    string            `bson:"data"`
	Headers map[string]string `bson:"headers,omitempty"`
	// OrderingKey is the event's ordering key; absent without one.
	OrderingKey string    `bson:"orderingKey,omitempty"`
	CreatedAt   time.Time `bson:"createdAt"`
	// TraceParent and TraceState are the W3C trace context of the publish span.
	TraceParent string `bson:"traceparent,omitempty"`
	TraceState  string `bson:"tracestate,omitempty"`
	// Fanout is true until deliveries and first attempts exist for every subscribed consumer group.
	Fanout bool `bson:"fanout,omitempty"`
	// Staged marks events of a publish that is not yet committed; they are invisible.
	Staged bool `bson:"staged,omitempty"`
	// Batch is the id shared by the events of one array publish (absent for a single event), kept after the
	// commit: the repair rolls an array forward by it when some of its events are committed and others are
	// still staged (rollForward).
	Batch     string     `bson:"batch,omitempty"`
	ExpiresAt *time.Time `bson:"expiresAt,omitempty"`
}

func (d *eventDoc) event() *pulsetype.Event {
	return &pulsetype.Event{ID: d.ID, Topic: d.Topic, Data: json.RawMessage(d.Data), Headers: d.Headers, OrderingKey: d.OrderingKey,
		TraceParent: d.TraceParent, TraceState: d.TraceState,
		CreatedAt: d.CreatedAt, ExpiresAt: d.ExpiresAt}
}

// subscriptionDoc is a document of <prefix>.subscriptions: one per consumer group, _id = the group.
type subscriptionDoc struct {
	ID                     string                  `bson:"_id"`
	URL                    string                  `bson:"url"`
	Topics                 []string                `bson:"topics"`
	Filter                 string                  `bson:"filter,omitempty"` // a CEL expression; see pulsetype.Endpoint.Filter
	Delivery               pulsetype.DeliveryMode  `bson:"delivery"`
	Ordered                bool                    `bson:"ordered"`
	Format                 pulsetype.WebhookFormat `bson:"format,omitempty"` // empty for groups stored before formats: envelope
	OffsetReset            pulsetype.OffsetReset   `bson:"offsetReset"`
	MaxRetries             int                     `bson:"maxRetries"`
	RetryDelayMs           int64                   `bson:"retryDelayMs"`
	RetryBackoffMultiplier float64                 `bson:"retryBackoffMultiplier"`
	MaxRetryDelayMs        int64                   `bson:"maxRetryDelayMs"`
	TimeoutMs              int64                   `bson:"timeoutMs"`
	MaxConcurrency         int                     `bson:"maxConcurrency"`
	// Headers and Secret hold the endpoint's header values and signing secret in clear: written without an
	// encryption key, or before one was set. With a key they are empty and the sealed fields hold them.
	Headers map[string]string `bson:"headers,omitempty"`
	Secret  string            `bson:"secret,omitempty"`
	// SecretSealed and HeadersSealed hold the secret and each header value encrypted (AES-256-GCM, bound to
	// the consumer group, the field and the header name); see sealing.go.
	SecretSealed  *sealing.Sealed           `bson:"secretSealed,omitempty"`
	HeadersSealed map[string]sealing.Sealed `bson:"headersSealed,omitempty"`
	// PreviousSecret (in clear) or PreviousSecretSealed holds the secret a rotation replaced, which signs
	// beside the current one until PreviousSecretExpiresAt; all three are absent outside a rotation.
	PreviousSecret          string          `bson:"previousSecret,omitempty"`
	PreviousSecretSealed    *sealing.Sealed `bson:"previousSecretSealed,omitempty"`
	PreviousSecretExpiresAt *time.Time      `bson:"previousSecretExpiresAt,omitempty"`
	InsecureSkipVerify      bool            `bson:"insecureSkipVerify,omitempty"`
	RateLimit               float64         `bson:"rateLimit,omitempty"`           // POSTs per second per replica; 0: none
	DisableAfterMs          int64           `bson:"disableAfterMs,omitempty"`      // 0: never
	MaxRetryDurationMs      int64           `bson:"maxRetryDurationMs,omitempty"`  // 0: no retry window
	BacklogAlertAfterMs     int64           `bson:"backlogAlertAfterMs,omitempty"` // 0: no backlog alert
	// BacklogHigh is set while pulse.backlog.high is raised for the group (see SetBacklogHigh).
	BacklogHigh bool `bson:"backlogHigh,omitempty"`
	// State, StateReason and StateSince are absent while the endpoint is active (see state.go);
	// FailingSince is the end of the first failed attempt since the last success, kept only for endpoints
	// with a disableAfter.
	State        pulsetype.EndpointState `bson:"state,omitempty"`
	StateReason  pulsetype.StateReason   `bson:"stateReason,omitempty"`
	StateSince   *time.Time              `bson:"stateSince,omitempty"`
	FailingSince *time.Time              `bson:"failingSince,omitempty"`
	CreatedAt    time.Time               `bson:"createdAt"`
	UpdatedAt    time.Time               `bson:"updatedAt"`
	// Incarnation is set once, when the group is created; see pulsetype.Endpoint.Incarnation.
	Incarnation string `bson:"incarnation,omitempty"`
	// Backfill is set while an earliest-offset group still has to receive the events retained before it was
	// registered; the discovery lease (fenced by its token) lets one replica at a time advance its cursor.
	Backfill *backfillState `bson:"backfill,omitempty"`
	// rule is the registration as Wants reads it, its filter compiled once per document read (see wants).
	rule *pulsetype.Endpoint `bson:"-"`
}

// backfillState is the discovery cursor and lease of an earliest-offset consumer group.
type backfillState struct {
	Cursor       string     `bson:"cursor"` // last event id delivered by the backfill
	LeaseOwner   string     `bson:"lockOwner,omitempty"`
	FencingToken string     `bson:"lockToken,omitempty"`
	LeasedUntil  *time.Time `bson:"lockedUntil,omitempty"`
}

func ms(d *pulsetype.Duration) int64 { return time.Duration(*d).Milliseconds() }

func durPtr(msec int64) *pulsetype.Duration {
	d := pulsetype.Duration(time.Duration(msec) * time.Millisecond)
	return &d
}

// endpoint returns the document as an endpoint, its sealed values decrypted with keys (in memory only). It
// returns a *DecryptError when one does not decrypt.
func (d *subscriptionDoc) endpoint(keys *sealing.Keyring) (*pulsetype.Endpoint, error) {
	maxRetries, mult, conc := d.MaxRetries, d.RetryBackoffMultiplier, d.MaxConcurrency
	ep := &pulsetype.Endpoint{
		ConsumerGroup: d.ID, URL: d.URL, Topics: d.Topics, Filter: d.Filter, Delivery: d.Delivery, Ordered: d.Ordered,
		Format:      cmp.Or(d.Format, pulsetype.FormatEnvelope),
		OffsetReset: d.OffsetReset, MaxRetries: &maxRetries, RetryDelay: durPtr(d.RetryDelayMs),
		RetryBackoffMultiplier: &mult, MaxRetryDelay: durPtr(d.MaxRetryDelayMs), Timeout: durPtr(d.TimeoutMs),
		MaxConcurrency: &conc, Headers: d.Headers, Secret: d.Secret, InsecureSkipVerify: d.InsecureSkipVerify,
		PreviousSecret: d.PreviousSecret, PreviousSecretExpiresAt: d.PreviousSecretExpiresAt,
		CreatedAt: d.CreatedAt, UpdatedAt: d.UpdatedAt, Incarnation: d.Incarnation,
		RateLimit: d.RateLimit, DisableAfter: pulsetype.Duration(time.Duration(d.DisableAfterMs) * time.Millisecond),
		MaxRetryDuration:  pulsetype.Duration(time.Duration(d.MaxRetryDurationMs) * time.Millisecond),
		BacklogAlertAfter: pulsetype.Duration(time.Duration(d.BacklogAlertAfterMs) * time.Millisecond),
		State:             cmp.Or(d.State, pulsetype.EndpointActive), StateReason: d.StateReason, StateSince: d.StateSince,
	}
	if err := d.openSecrets(ep, keys); err != nil {
		return nil, err
	}
	return ep, nil
}

// deliveryDoc is a document of <prefix>.deliveries: one per (consumer group, event).
type deliveryDoc struct {
	ID            string `bson:"_id"`
	EventID       string `bson:"eventId"`
	ConsumerGroup string `bson:"consumerGroup"`
	Topic         string `bson:"topic"`
	// OrderingKey is the event's ordering key, absent without one: an ordered group's line is
	// (topic, orderingKey).
	OrderingKey    string               `bson:"orderingKey,omitempty"`
	EventCreatedAt time.Time            `bson:"eventCreatedAt"`
	Status         pulsetype.Status     `bson:"status"`
	CreatedAt      time.Time            `bson:"createdAt"`
	UpdatedAt      time.Time            `bson:"updatedAt"`
	EndedAt        *time.Time           `bson:"endedAt,omitempty"`
	ExpiresAt      *time.Time           `bson:"expiresAt,omitempty"`
	FinalAttempt   int                  `bson:"finalAttempt,omitempty"`
	Error          *pulsetype.ErrorInfo `bson:"error,omitempty"`
	// ReopenedAttempt is the attempt a retry or replay asked for; set before that attempt is inserted, so a
	// crash in between is repaired by creating it.
	ReopenedAttempt int `bson:"reopenedAttempt,omitempty"`
	// Incarnation is the registration of the consumer group the delivery was created (or reopened) for.
	Incarnation string `bson:"incarnation,omitempty"`
}

func (d *deliveryDoc) delivery() *pulsetype.Delivery {
	return &pulsetype.Delivery{
		ID: d.ID, EventID: d.EventID, ConsumerGroup: d.ConsumerGroup, Topic: d.Topic, OrderingKey: d.OrderingKey, Status: d.Status,
		EventCreatedAt: d.EventCreatedAt, CreatedAt: d.CreatedAt, UpdatedAt: d.UpdatedAt, EndedAt: d.EndedAt,
		FinalAttempt: d.FinalAttempt, Error: d.Error, ReopenedAttempt: d.ReopenedAttempt, Incarnation: d.Incarnation,
	}
}

// attemptDoc is a document of <prefix>.history: one per attempt of a delivery.
type attemptDoc struct {
	ID            string               `bson:"_id"`
	DeliveryID    string               `bson:"deliveryId"`
	EventID       string               `bson:"eventId"`
	ConsumerGroup string               `bson:"consumerGroup"`
	Topic         string               `bson:"topic"`
	Attempt       int                  `bson:"attempt"`
	Status        pulsetype.Status     `bson:"status"`
	CreatedAt     time.Time            `bson:"createdAt"`
	NextAttemptAt time.Time            `bson:"nextAttemptAt"`
	StartedAt     *time.Time           `bson:"startedAt,omitempty"`
	LeaseOwner    string               `bson:"lockOwner,omitempty"`
	FencingToken  string               `bson:"lockToken,omitempty"`
	LeasedAt      *time.Time           `bson:"lockedAt,omitempty"`
	LeasedUntil   *time.Time           `bson:"lockedUntil,omitempty"`
	HeartbeatAt   *time.Time           `bson:"heartbeatAt,omitempty"`
	EndedAt       *time.Time           `bson:"endedAt,omitempty"`
	DurationMs    *int64               `bson:"durationMs,omitempty"` // set (0 included) when a POST ran
	HTTPStatus    int                  `bson:"httpStatus,omitempty"`
	ResponseBody  string               `bson:"responseBody,omitempty"`
	Terminal      bool                 `bson:"terminal,omitempty"`
	Error         *pulsetype.ErrorInfo `bson:"error,omitempty"`
	ExpiresAt     *time.Time           `bson:"expiresAt,omitempty"`
	Incarnation   string               `bson:"incarnation,omitempty"`
	RetryAfterMs  int64                `bson:"retryAfterMs,omitempty"` // the receiver's Retry-After, in ms
	Uncounted     int                  `bson:"uncounted,omitempty"`    // see pulsetype.Attempt.Uncounted
	// FirstAttemptAt is pulsetype.Attempt.FirstAttemptAt (absent on a window's first attempt).
	FirstAttemptAt *time.Time `bson:"firstAttemptAt,omitempty"`
}

func (d *attemptDoc) attempt() *pulsetype.Attempt {
	return &pulsetype.Attempt{
		ID: d.ID, DeliveryID: d.DeliveryID, EventID: d.EventID, ConsumerGroup: d.ConsumerGroup, Topic: d.Topic,
		Number: d.Attempt, Status: d.Status, HTTPStatus: d.HTTPStatus, DurationMs: d.DurationMs, Error: d.Error,
		ResponseBody: d.ResponseBody, CreatedAt: d.CreatedAt, NextAttemptAt: d.NextAttemptAt,
		StartedAt: d.StartedAt, EndedAt: d.EndedAt, LeaseOwner: d.LeaseOwner, FencingToken: d.FencingToken,
		LeasedUntil: d.LeasedUntil, Terminal: d.Terminal, Incarnation: d.Incarnation,
		RetryAfter: time.Duration(d.RetryAfterMs) * time.Millisecond, Uncounted: d.Uncounted, FirstAttemptAt: timeOrZero(d.FirstAttemptAt),
	}
}

// timeOrZero returns *t, or the zero time for nil.
func timeOrZero(t *time.Time) time.Time {
	if t == nil {
		return time.Time{}
	}
	return *t
}

// zeroOrNil returns &t, or nil for the zero time (so that the field is left out of the document).
func zeroOrNil(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

// queueDoc is a document of <prefix>.queue, the index of pending work: one per attempt that is (or may
// still be) pending, with the attempt's _id, from before the attempt is created in <prefix>.history until
// its next step is recorded (the delivery's end or the next attempt's own queue document). The history
// attempt stays the authority (its status, lease and fencing token); the queue only says where to look, so
// that claims, the reaper, the repair scan and ordered lines read pending work and never the retained
// history. The lease fields are hints, written after a claim and corrected when found stale.
type queueDoc struct {
	ID             string    `bson:"_id"` // the attempt's id
	DeliveryID     string    `bson:"deliveryId"`
	EventID        string    `bson:"eventId"`
	ConsumerGroup  string    `bson:"consumerGroup"`
	Topic          string    `bson:"topic"`
	OrderingKey    string    `bson:"orderingKey,omitempty"`
	EventCreatedAt time.Time `bson:"eventCreatedAt"`
	Attempt        int       `bson:"attempt"`
	Uncounted      int       `bson:"uncounted,omitempty"` // see pulsetype.Attempt.Uncounted
	// FirstAttemptAt copies the attempt's (pulsetype.Attempt.FirstAttemptAt), so that a claim carries it.
	FirstAttemptAt *time.Time `bson:"firstAttemptAt,omitempty"`
	Incarnation    string     `bson:"incarnation,omitempty"`
	CreatedAt      time.Time  `bson:"createdAt"`
	NextAttemptAt  time.Time  `bson:"nextAttemptAt"`
	// LeasedUntil and FencingToken copy the attempt's lease when it was claimed (absent: claimable, as far as the
	// queue knows); Ended is set once the attempt is known to have ended while its delivery's next step is
	// not recorded yet. Claims skip both; the reaper and the repair scan check the attempt itself.
	LeasedUntil  *time.Time `bson:"lockedUntil,omitempty"`
	FencingToken string     `bson:"lockToken,omitempty"`
	Ended        bool       `bson:"ended,omitempty"`
}

// queued returns the queue document of attempt a of the delivery d describes (eventCreatedAt and
// orderingKey place it in its line).
func queued(a *attemptDoc, orderingKey string, eventCreatedAt time.Time) *queueDoc {
	return &queueDoc{ID: a.ID, DeliveryID: a.DeliveryID, EventID: a.EventID, ConsumerGroup: a.ConsumerGroup, Topic: a.Topic,
		OrderingKey: orderingKey, EventCreatedAt: eventCreatedAt, Attempt: a.Attempt, Uncounted: a.Uncounted, Incarnation: a.Incarnation,
		CreatedAt: a.CreatedAt, NextAttemptAt: a.NextAttemptAt, FirstAttemptAt: a.FirstAttemptAt}
}

// outboxDoc is a document of <prefix>.outbox: an event published and not yet fanned out, from before its
// document is committed until its fanout mark is cleared. It indexes the events' fanout marks, which stay
// the authority, so that the repair of interrupted fan-outs and the head-of-line check of ordered consumer
// groups read unfinished fan-outs only. CreatedAt is taken before the event's own createdAt is stamped, so it
// is never later than it (within the error of the store's clock).
type outboxDoc struct {
	ID          string    `bson:"_id"` // the event's id
	Topic       string    `bson:"topic"`
	OrderingKey string    `bson:"orderingKey,omitempty"`
	CreatedAt   time.Time `bson:"createdAt"`
	// DeferredUntil is set by the fan-out repair on the document of an event still staged or missing: it
	// looks again after this time (see Store.FanOutStale).
	DeferredUntil *time.Time `bson:"deferredUntil,omitempty"`
}

// wants reports whether the subscription's group receives the event in holds (pulsetype.Endpoint.WantsInput,
// from the fields that rule reads: the group, topics, filter, offsetReset and createdAt): decide's answer,
// with a filter whose evaluation failed taken as false. Not safe for concurrent use.
func (d *subscriptionDoc) wants(in *pulsetype.EventInput, filters *pulsetype.FilterCache) bool {
	ok, err := d.decide(in, filters)
	return ok && err == nil
}

// decide is pulsetype.Endpoint.Decide for the subscription's group: whether it receives the event in holds,
// or a *pulsetype.FilterError when its filter's evaluation failed. The filter is compiled at the document's
// first call, through filters (the store's cache; nil: none), so that neither a fan-out of many events nor
// the next fan-out compiles it again; a stored filter that no longer compiles wants nothing. Not safe for
// concurrent use.
func (d *subscriptionDoc) decide(in *pulsetype.EventInput, filters *pulsetype.FilterCache) (bool, error) {
	if d.rule == nil {
		d.rule = &pulsetype.Endpoint{ConsumerGroup: d.ID, Topics: d.Topics, Filter: d.Filter, OffsetReset: d.OffsetReset, CreatedAt: d.CreatedAt}
		_ = d.rule.CompileFilterWith(filters) // on error Decide compiles again and wants nothing
	}
	return d.rule.Decide(in)
}

func newAttemptDoc(ref pulsetype.DeliveryRef, n int, now, nextAt time.Time) *attemptDoc {
	if !ref.DueBy.IsZero() && nextAt.After(ref.DueBy) {
		nextAt = ref.DueBy // within the retry window, whatever the write took since the decision
	}
	return &attemptDoc{
		ID: uuid.Must(uuid.NewV7()).String(), DeliveryID: ref.DeliveryID, EventID: ref.EventID, ConsumerGroup: ref.ConsumerGroup,
		Topic: ref.Topic, Incarnation: ref.Incarnation, Attempt: n, Status: pulsetype.StatusPending, CreatedAt: now, NextAttemptAt: nextAt,
		Uncounted: ref.Uncounted, FirstAttemptAt: zeroOrNil(ref.FirstAttemptAt),
	}
}
