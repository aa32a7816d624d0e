package pulsetype

import "time"

// EndDeliveryParams are the arguments of a store's EndDelivery: the pending delivery to end and how.
type EndDeliveryParams struct {
	DeliveryID   string
	Status       Status     // StatusSuccess, StatusError or StatusCancelled
	FinalAttempt int        // the number of the attempt that ended it
	Error        *ErrorInfo // nil on success
}

// EndPendingParams are the arguments of a store's EndPending: the consumer group whose pending deliveries
// end, the topics they are limited to (nil: every topic), the topics among those whose work stays (Keep,
// nil: none), and the error they end with.
type EndPendingParams struct {
	ConsumerGroup string
	Topics        []string
	Keep          func(topic string) bool
	Error         ErrorInfo
}

// ReplayParams are the arguments of a store's ReplayDeliveries: the terminal deliveries of ConsumerGroup in
// Status whose createdAt lies in [From, To).
type ReplayParams struct {
	ConsumerGroup string
	Status        Status
	From, To      time.Time
}
