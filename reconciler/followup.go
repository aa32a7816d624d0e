package reconciler

import (
	"context"
	"fmt"
	"time"

	"github.com/pulse-sidecar/pulse/pulsetype"
)

// FollowUpStore is the storage FollowUp needs.
type FollowUpStore interface {
	CreateAttempt(ctx context.Context, ref pulsetype.DeliveryRef, n int, delay time.Duration) (bool, error)
	EndDelivery(ctx context.Context, p pulsetype.EndDeliveryParams) (bool, error)
}

// Step is what FollowUp did after an attempt ended.
type Step struct {
	Ended   bool          // the delivery became terminal (by this call or another replica's)
	Retry   bool          // attempt n+1 exists now
	Delay   time.Duration // when Retry: the delay before attempt n+1
	Created bool          // this call wrote the change (false: another replica had already done it)
	// EndStatus and EndError are the delivery's end when Ended: success, or error with the attempt's error
	// or retry_window_exceeded.
	EndStatus pulsetype.Status
	EndError  *pulsetype.ErrorInfo
}

// FollowUp moves a delivery on after its attempt a ended with res, as policy.Decide says, with one write.
// It is idempotent: called twice, or by several replicas at once, it changes the database once. The retry
// window (maxRetryDuration) is counted from a's FirstStart to now, when the successor would be created.
func FollowUp(ctx context.Context, store FollowUpStore, a *pulsetype.Attempt, res pulsetype.AttemptResult, policy pulsetype.RetryPolicy) (Step, error) {
	next := policy.Decide(a.Counted(), res, time.Since(a.FirstStart()))
	if next.Retry {
		created, err := store.CreateAttempt(ctx, pulsetype.NextRef(a, next), a.Number+1, next.Delay)
		if err != nil {
			return Step{}, fmt.Errorf("create attempt %d: %w", a.Number+1, err)
		}
		return Step{Retry: true, Delay: next.Delay, Created: created}, nil
	}
	ended, err := store.EndDelivery(ctx, pulsetype.EndDeliveryParams{DeliveryID: a.DeliveryID, Status: next.EndStatus,
		FinalAttempt: a.Number, Error: next.EndError})
	return Step{Ended: true, Created: ended, EndStatus: next.EndStatus, EndError: next.EndError}, err
}
