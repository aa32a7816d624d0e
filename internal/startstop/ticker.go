package startstop

import (
	"context"
	"time"

	"github.com/pulse-sidecar/pulse/pulsetype"
)

// StartTicking is the periodic service's StartGo: it runs tick in a goroutine of b, first after first and
// then after each period() varied by pulsetype.Jittered (±20%), so that replicas started together drift
// apart; first ≤ 0 means a jittered period() too. period is read again after each tick, so a service may
// back off. It returns at once, ErrStarted while a previous run has not been stopped; b.Stop ends the
// ticks (a tick under way finishes first, see Every).
func (b *Base) StartTicking(ctx context.Context, first time.Duration, period func() time.Duration, tick func(ctx context.Context)) error {
	next := func() time.Duration { return pulsetype.Jittered(period()) }
	if first <= 0 {
		first = next()
	}
	return b.StartGo(ctx, func(ctx context.Context) { Every(ctx, first, next, tick) })
}
