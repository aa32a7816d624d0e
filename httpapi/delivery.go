package httpapi

import "github.com/pulse-sidecar/pulse/pulsetype"

// errorInfo is the error of a failed attempt or terminal delivery: {"code", "message"}.
type errorInfo struct {
	Code    pulsetype.ErrorCode `json:"code"`
	Message string              `json:"message"`
}

func errorInfoOf(e *pulsetype.ErrorInfo) *errorInfo {
	return optional(e, func(v pulsetype.ErrorInfo) errorInfo { return errorInfo{Code: v.Code, Message: v.Message} })
}

// delivery is a delivery as GET /v1/deliveries lists it. Its times come after the other fields.
type delivery struct {
	ID             string           `json:"id"`
	EventID        string           `json:"eventId"`
	ConsumerGroup  string           `json:"consumerGroup"`
	Topic          string           `json:"topic"`
	OrderingKey    string           `json:"orderingKey,omitempty"`
	Status         pulsetype.Status `json:"status"`
	FinalAttempt   int              `json:"finalAttempt,omitempty"`
	Error          *errorInfo       `json:"error,omitempty"`
	EventCreatedAt Timestamp        `json:"eventCreatedAt"`
	CreatedAt      Timestamp        `json:"createdAt"`
	UpdatedAt      Timestamp        `json:"updatedAt"`
	EndedAt        *Timestamp       `json:"endedAt,omitempty"`
}

func deliveryOf(d *pulsetype.Delivery) delivery {
	return delivery{ID: d.ID, EventID: d.EventID, ConsumerGroup: d.ConsumerGroup, Topic: d.Topic, OrderingKey: d.OrderingKey,
		Status: d.Status, FinalAttempt: d.FinalAttempt, Error: errorInfoOf(d.Error), EventCreatedAt: Timestamp(d.EventCreatedAt),
		CreatedAt: Timestamp(d.CreatedAt), UpdatedAt: Timestamp(d.UpdatedAt), EndedAt: timestampPtr(d.EndedAt)}
}

// deliveryBody is the answer of GET /v1/deliveries/{id}: the delivery, then "attempts" in attempt order,
// then, while it is pending, "pendingReason" (see pendingReason).
type deliveryBody struct {
	delivery
	Attempts      []attempt      `json:"attempts"`
	PendingReason *pendingReason `json:"pendingReason,omitempty"`
}

// pendingReason is why a pending delivery waits (pulsetype.PendingReason): {"code", "message", "at"
// (the time the message names, when it names one), "headDeliveryId" (for behind_head)}.
type pendingReason struct {
	Code    pulsetype.PendingCode `json:"code"`
	Message string                `json:"message"`
	At      *Timestamp            `json:"at,omitempty"`
	Head    string                `json:"headDeliveryId,omitempty"`
}

// attempt is one attempt of a delivery; lockState is set on a pending one (pulsetype.LeaseState).
type attempt struct {
	Number        int                  `json:"attempt"`
	Status        pulsetype.Status     `json:"status"`
	LeaseState    pulsetype.LeaseState `json:"lockState,omitempty"`
	HTTPStatus    int                  `json:"httpStatus,omitempty"`
	DurationMs    *int64               `json:"durationMs,omitempty"`
	Error         *errorInfo           `json:"error,omitempty"`
	ResponseBody  string               `json:"responseBody,omitempty"`
	CreatedAt     Timestamp            `json:"createdAt"`
	NextAttemptAt Timestamp            `json:"nextAttemptAt"`
	StartedAt     *Timestamp           `json:"startedAt,omitempty"`
	EndedAt       *Timestamp           `json:"endedAt,omitempty"`
}

func attemptOf(a *pulsetype.Attempt) attempt {
	return attempt{Number: a.Number, Status: a.Status, LeaseState: a.LeaseState, HTTPStatus: a.HTTPStatus, DurationMs: a.DurationMs,
		Error: errorInfoOf(a.Error), ResponseBody: a.ResponseBody, CreatedAt: Timestamp(a.CreatedAt),
		NextAttemptAt: Timestamp(a.NextAttemptAt), StartedAt: timestampPtr(a.StartedAt), EndedAt: timestampPtr(a.EndedAt)}
}
