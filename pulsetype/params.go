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

// Deleted is what a store's DeleteEndpoint did with the group's pending deliveries before it returned:
// Ended is how many it ended as error/endpoint_deleted (at most one page, the store's bound on the work a
// delete does before it answers), Remaining how many of the group's deliveries were still pending then: the
// rest of a backlog larger than the page, and those whose POST was in flight, all of which the repair scan
// (or the POST's worker) ends later.
type Deleted struct {
	Ended, Remaining int64
}

// ReplayParams are the arguments of a store's ReplayDeliveries: the terminal deliveries of ConsumerGroup in
// Status whose createdAt lies in [From, To).
type ReplayParams struct {
	ConsumerGroup string
	Status        Status
	From, To      time.Time
}

// ClaimHeadsParams are the arguments of a store's ClaimHeads: the ordered consumer group's topic whose lines
// are looked at, the lease owner, and how many heads the claim may lease at most (the group's free worker
// slots and rate-limit tokens). After continues a group with more lines than one claim reads (see
// HeadClaims.Next): when set, only the lines whose ordering key sorts after *After are read (*After == "":
// the lines with a key, after the line of the events without one); nil starts at the first line (the events
// without a key).
type ClaimHeadsParams struct {
	Owner                string
	ConsumerGroup, Topic string
	Limit                int
	After                *string
}

// HeadClaims is what a store's ClaimHeads leased: the head attempts of distinct lines (at most the
// params' Limit, each under the lease the claim took); the events of those heads that the claim read, by id
// (nil: no longer visible, or expired), a head whose event it did not read being absent; Wait > 0 when a
// line's head can be looked at again after that long without other news (a head inside its settle window,
// or a line that moved during the look); and Next, the ordering key to pass as ClaimHeadsParams.After in the
// next claim when the lines read reached the store's bound (nil when every line was read; "" when the
// bound was reached within the line without a key, so the next claim reads the lines with one). Settling
// holds, by event id, the heads found inside their settle window and how long until each settles (Wait
// counts them too).
type HeadClaims struct {
	Attempts []*Attempt
	Events   map[string]*Event
	Wait     time.Duration
	Next     *string
	Settling map[string]time.Duration
}

// MinWait returns the shorter of two waits as HeadClaims.Wait holds them, 0 standing for none.
func MinWait(a, b time.Duration) time.Duration {
	if a == 0 || b < a {
		return b
	}
	return a
}
