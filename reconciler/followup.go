package reconciler

import (
	"context"
	"fmt"
	"time"

	"github.com/pulse-sidecar/pulse/pulsetype"
)

// FollowUpStore is the storage FollowUp needs.
type FollowUpStore interface {
	CreateAttempt(ctx context.Context, deliveryID, eventID, group, topic string, n int, delay time.Duration) (bool, error)
	EndDelivery(ctx context.Context, deliveryID string, status pulsetype.Status, finalAttempt int, e *pulsetype.ErrorInfo) (bool, error)
}

// Step is what FollowUp did after an attempt ended.
type Step struct {
	Ended   bool          // the delivery became terminal (by this call or another replica's)
	Retry   bool          // attempt n+1 exists now
	Delay   time.Duration // when Retry: the delay before attempt n+1
	Created bool          // this call wrote the change (false: another replica had already done it)
}

// FollowUp moves a delivery on after its attempt a ended with status and e (the seed's lifecycle): success
// ends the delivery; an error creates exactly the next numbered attempt while policy allows it (terminal
// reports a non-retryable answer, retryAfter a receiver's Retry-After), and otherwise ends the delivery with
// that error. It is idempotent: called twice, or by several replicas at once, it changes the database once.
func FollowUp(ctx context.Context, store FollowUpStore, a *pulsetype.Attempt, status pulsetype.Status, e *pulsetype.ErrorInfo,
	terminal bool, retryAfter time.Duration, policy pulsetype.RetryPolicy) (Step, error) {
	if status == pulsetype.StatusSuccess {
		ended, err := store.EndDelivery(ctx, a.DeliveryID, pulsetype.StatusSuccess, a.Number, nil)
		return Step{Ended: true, Created: ended}, err
	}
	code := ""
	if e != nil {
		code = e.Code
	}
	if retry, delay := policy.Next(a.Number, code, terminal, retryAfter); retry {
		created, err := store.CreateAttempt(ctx, a.DeliveryID, a.EventID, a.ConsumerGroup, a.Topic, a.Number+1, delay)
		if err != nil {
			return Step{}, fmt.Errorf("create attempt %d: %w", a.Number+1, err)
		}
		return Step{Retry: true, Delay: delay, Created: created}, nil
	}
	ended, err := store.EndDelivery(ctx, a.DeliveryID, pulsetype.StatusError, a.Number, e)
	return Step{Ended: true, Created: ended}, err
}
