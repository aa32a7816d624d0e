package pulsetype

import (
	"encoding/json"
	"time"
)

// Status is the state of a delivery or of one attempt.
type Status string

// Statuses of deliveries and attempts. Success, Error and Cancelled are terminal. Cancelled is a delivery's
// only: an attempt that a cancel ends, or that never ran because of one, is an error with CodeCancelled.
const (
	StatusPending   Status = "pending"
	StatusSuccess   Status = "success"
	StatusError     Status = "error"
	StatusCancelled Status = "cancelled"
)

// Terminal reports whether a delivery in status s is over: success, error or cancelled.
func (s Status) Terminal() bool {
	return s == StatusSuccess || s == StatusError || s == StatusCancelled
}

// ErrorCode says why an attempt or a delivery failed: one of the Code constants (docs/delivery.md, "Retries").
type ErrorCode string

// Error codes written to an attempt's history.
const (
	CodeHandlerError ErrorCode = "handler_error" // the webhook answered with a failure, or could not be reached
	CodeWorkerLost   ErrorCode = "worker_lost"   // the attempt's lease expired before it completed
	CodeEventExpired ErrorCode = "event_expired" // retention removed the event before the attempt ran
	// CodeEndpointDeleted ends the pending deliveries of a deleted consumer group (and any attempt of an
	// earlier registration of a group registered again): a normal outcome, not a failure of the receiver.
	CodeEndpointDeleted ErrorCode = "endpoint_deleted"
	// CodeUnsubscribed ends the pending deliveries of a topic that a PUT removed from the consumer group.
	CodeUnsubscribed ErrorCode = "unsubscribed"
	// CodeCancelled is the error of a delivery cancelled through the API (status StatusCancelled) and of the
	// attempt that the cancel ended or kept from running.
	CodeCancelled ErrorCode = "cancelled"
	// CodeFilterError ends, without a POST, the delivery of an event whose evaluation of the consumer group's
	// filter failed (a pulsetype.FilterError: past the cost limit or the deadline, or a result that is not a
	// boolean): terminal, counted as a failure, since the group's filter, not the event, decides.
	CodeFilterError ErrorCode = "filter_error"
)

// Ended reports whether code ends a delivery whatever retries remain: the event is gone, the consumer group
// no longer wants it, or the delivery was cancelled.
func (c ErrorCode) Ended() bool {
	return c == CodeEventExpired || c == CodeEndpointDeleted || c == CodeUnsubscribed || c == CodeCancelled
}

// LeaseState is the lease state of a pending attempt, as the inspection API shows it (field lockState).
type LeaseState string

// Lease states of a pending attempt.
const (
	LeaseQueued  LeaseState = "queued"  // no lease: waiting to be claimed or for nextAttemptAt
	LeaseActive  LeaseState = "active"  // leased and the lease has not expired: a worker is running it
	LeaseExpired LeaseState = "expired" // leased but the lease expired: the worker stopped renewing
)

// Event is one published event. Data holds the JSON exactly as the application sent it (compacted), so the
// webhook body carries it byte-equal.
type Event struct {
	ID      string
	Topic   string
	Data    json.RawMessage
	Headers map[string]string
	// OrderingKey, when set (1 to MaxOrderingKey characters), puts the event in its own line of an ordered
	// consumer group: such a group delivers in order per (topic, orderingKey), and events without a key form
	// one line per topic.
	OrderingKey string
	CreatedAt   time.Time
	// TraceParent and TraceState are the W3C trace context of the publish span; each webhook attempt is a
	// child span of it. They are not part of the event's content (a re-publish may carry another).
	TraceParent string
	TraceState  string
	// ExpiresAt is when retention removes the event (createdAt + PULSE_EVENT_RETENTION); nil keeps it
	// forever. No attempt may start at or after it: such an attempt ends as event_expired.
	ExpiresAt *time.Time
}

// ExpiredAt reports whether retention has removed the event by time now.
func (e *Event) ExpiredAt(now time.Time) bool { return e.ExpiresAt != nil && !now.Before(*e.ExpiresAt) }

// MaxOrderingKey is the longest ordering key an event may carry, in characters (Unicode code points).
const MaxOrderingKey = 200

// ErrorInfo is the code and human message of a failed attempt or terminal delivery.
type ErrorInfo struct {
	Code    ErrorCode `bson:"code"`
	Message string    `bson:"message"`
}

// Delivery is the durable record of one event for one consumer group.
type Delivery struct {
	ID             string
	EventID        string
	ConsumerGroup  string
	Topic          string
	OrderingKey    string
	Status         Status
	EventCreatedAt time.Time
	CreatedAt      time.Time
	UpdatedAt      time.Time
	EndedAt        *time.Time
	FinalAttempt   int
	Error          *ErrorInfo
	// ReopenedAttempt is the attempt number a manual retry or replay asked for (0 if none).
	ReopenedAttempt int
	// Incarnation is the registration of the consumer group this delivery belongs to (Endpoint.Incarnation).
	Incarnation string
}

// Line is one line of an ordered consumer group: its deliveries of one topic and one ordering key (""
// for the events without a key), POSTed one at a time, oldest event (createdAt, then id) first.
type Line struct {
	ConsumerGroup, Topic, OrderingKey string
}

// DeliveryRef identifies a delivery and what each of its attempts carries: its event, consumer group, topic
// and the registration (incarnation) of the group it was created for.
type DeliveryRef struct {
	DeliveryID, EventID, ConsumerGroup, Topic, Incarnation string
	// Uncounted is what the next attempt carries as Attempt.Uncounted.
	Uncounted int
	// FirstAttemptAt is what the next attempt carries as Attempt.FirstAttemptAt (zero: none, the attempt
	// starts the delivery's retry window).
	FirstAttemptAt time.Time
	// DueBy, when set, is the latest time the next attempt may be due: the end of the retry window
	// (FirstAttemptAt + maxRetryDuration). The store caps the attempt's nextAttemptAt at it, so that the time
	// between the decision and the write cannot carry the attempt past the window. Not stored.
	DueBy time.Time
}

// Ref returns the delivery's reference.
func (d *Delivery) Ref() DeliveryRef {
	return DeliveryRef{DeliveryID: d.ID, EventID: d.EventID, ConsumerGroup: d.ConsumerGroup, Topic: d.Topic, Incarnation: d.Incarnation}
}

// Ref returns the reference of the attempt's delivery.
func (a *Attempt) Ref() DeliveryRef {
	return DeliveryRef{DeliveryID: a.DeliveryID, EventID: a.EventID, ConsumerGroup: a.ConsumerGroup, Topic: a.Topic, Incarnation: a.Incarnation,
		Uncounted: a.Uncounted, FirstAttemptAt: a.FirstAttemptAt}
}

// Attempt is one history document: one try of a delivery. Lease fields are set while a worker holds it.
type Attempt struct {
	ID            string
	DeliveryID    string
	EventID       string
	ConsumerGroup string
	Topic         string
	Number        int
	Status        Status
	LeaseState    LeaseState
	HTTPStatus    int
	DurationMs    *int64 // the POST's duration in ms (0 for one under a millisecond); nil when no POST ran
	Error         *ErrorInfo
	ResponseBody  string
	CreatedAt     time.Time
	NextAttemptAt time.Time
	StartedAt     *time.Time
	EndedAt       *time.Time
	LeaseOwner    string
	FencingToken  string
	LeasedUntil   *time.Time
	// Terminal is true when the failure ended the delivery regardless of retries left (a terminal HTTP status).
	Terminal bool
	// Incarnation is the registration of the consumer group the attempt's delivery was created for; an
	// attempt runs only while it equals the group's current Endpoint.Incarnation.
	Incarnation string
	// RetryAfter is the receiver's Retry-After on this failed attempt (0 when none), kept so that a retry
	// the reconciler creates after a crash waits as long as the one the worker would have created.
	RetryAfter time.Duration
	// Uncounted is how many earlier attempts of its delivery do not count against maxRetries: those answered
	// 410 Gone (CodeEndpointGone), which disabled the endpoint instead of using up the delivery's retries.
	Uncounted int
	// FirstAttemptAt is when the first attempt of the delivery's retry window started (its claim), carried
	// from attempt to attempt; zero on that first attempt itself, and on attempts created before the field
	// existed or by a manual retry or replay, which start a new window. See FirstStart.
	FirstAttemptAt time.Time
}

// FirstStart returns when the attempt's retry window began: FirstAttemptAt when set, else the attempt's own
// start (StartedAt), else its creation. RetryPolicy.Decide counts maxRetryDuration from it.
func (a *Attempt) FirstStart() time.Time {
	switch {
	case !a.FirstAttemptAt.IsZero():
		return a.FirstAttemptAt
	case a.StartedAt != nil:
		return *a.StartedAt
	default:
		return a.CreatedAt
	}
}

// LeaseStateAt returns queued, active or expired for a pending attempt at time now, and "" otherwise.
func (a *Attempt) LeaseStateAt(now time.Time) LeaseState {
	switch {
	case a.Status != StatusPending:
		return ""
	case a.LeasedUntil == nil:
		return LeaseQueued
	case a.LeasedUntil.After(now):
		return LeaseActive
	default:
		return LeaseExpired
	}
}

// AttemptResult is what a finished attempt records: its outcome and the evidence.
type AttemptResult struct {
	Status       Status // StatusSuccess or StatusError
	HTTPStatus   int    // 0 when there was no response
	Duration     time.Duration
	ResponseBody string     // at most 4 KiB
	Error        *ErrorInfo // nil on success
	// Terminal makes the delivery end now even if retries remain (a terminal HTTP status, at-most-once).
	Terminal bool
	// RetryAfter is the receiver's Retry-After; it raises the next delay, never lowers it.
	RetryAfter time.Duration
}

// Published is the outcome of publishing one event.
type Published struct {
	Event *Event
	// Existing is true when an event with this client-chosen id and the same content was already stored (an
	// idempotent re-publish): nothing new was written for it.
	Existing bool
}

// DeliveryFilter selects a page of deliveries, newest first; empty fields match everything.
type DeliveryFilter struct {
	ConsumerGroup, Topic string
	Status               Status
	After                string // the next cursor of the previous page
	Limit                int    // 1–500
}

// CancelResult is what cancelling a delivery did.
type CancelResult struct {
	// FinalAttempt is the attempt that records the cancel: the waiting attempt it ended, or the attempt
	// number it took so that nothing can create that attempt any more (shown with code cancelled, never sent).
	FinalAttempt int
	// InFlight is true when an attempt was leased at the time: its POST may finish and its result is
	// recorded, but the delivery stays cancelled and no attempt follows it.
	InFlight bool
}

// LeaseKey names one held attempt lease: the attempt's id and the fencing token it was claimed with. One
// claim round trip leases several attempts under one fresh token, so every fenced write filters on both.
type LeaseKey struct {
	AttemptID string
	Token     string
}

// Key returns the attempt's lease key (its id and fencing token).
func (a *Attempt) Key() LeaseKey { return LeaseKey{AttemptID: a.ID, Token: a.FencingToken} }

// QueuedPage is one page of the repair scan's read of the store's queue of pending work (see
// reconciler.Store.QueuedDeliveries): the pending deliveries found, each one's queued attempts by number (the
// latest last), the delivery id to read on after ("" once the queue's end is reached), and the corrections
// the read found due, which it does not make (RepairQueue makes them).
type QueuedPage struct {
	Deliveries []*Delivery
	Attempts   map[string][]*Attempt
	Next       string
	Repairs    QueueRepairs
}

// QueueRepairs are the corrections of a store's queue that one read of it found due: what the queue holds
// for nothing, and copies of leases that differ from the leases of their pending attempts. They are the
// store's own data, handed back to it unchanged.
type QueueRepairs struct {
	// Unqueue are the ids of queue entries to remove: of ended deliveries whose attempts are not pending, of
	// deliveries that do not exist, of ended attempts with a later one, and of attempts never inserted.
	Unqueue []string
	// Attempts are attempts found otherwise than their queue entries say (leased, unleased or ended), as the
	// history holds them: their queue entries are corrected to match.
	Attempts []*Attempt
}

// Empty reports whether there is nothing to correct.
func (r QueueRepairs) Empty() bool { return len(r.Unqueue) == 0 && len(r.Attempts) == 0 }

// NextStep is what follows an ended attempt, by the lifecycle of docs/delivery.md: either attempt Number+1 is created,
// due after Delay, or the delivery ends with EndStatus and EndError.
type NextStep struct {
	Retry bool
	Delay time.Duration
	// Uncounted is set when the ended attempt does not count against maxRetries (CodeEndpointGone): attempt
	// Number+1 carries Attempt.Uncounted+1.
	Uncounted bool
	// Window is the retry window the successor must be due within, counted from the delivery's first
	// attempt (RetryPolicy.MaxDuration); 0: none.
	Window    time.Duration
	EndStatus Status     // when !Retry: StatusSuccess, StatusError, or StatusCancelled (an attempt ended by a cancel)
	EndError  *ErrorInfo // when !Retry and EndStatus is StatusError or StatusCancelled
}

// Completion is a leased attempt's result together with what follows it.
type Completion struct {
	Attempt *Attempt // as leased: ID and FencingToken fence the write
	Result  AttemptResult
	Next    NextStep
}

// CodeOrEmpty returns e's code, or "" for a nil e (no error).
func (e *ErrorInfo) CodeOrEmpty() ErrorCode {
	if e == nil {
		return ""
	}
	return e.Code
}
