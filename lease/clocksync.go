package lease

import (
	"cmp"
	"context"
	"time"

	"github.com/rs/zerolog"

	"github.com/pulse-sidecar/pulse/internal/startstop"
)

// DefaultSyncInterval is how often a ClockSync measures the database's clock again.
const DefaultSyncInterval = 30 * time.Second

// ServerTimeFunc returns the database server's current time (hello.localTime); *mongo.Store's ServerTime
// implements it.
type ServerTimeFunc func(ctx context.Context) (time.Time, error)

// ClockSync keeps a Clock in step with the database: it calls Clock.Sync every interval (jittered) until
// stopped. A failed sync is logged and the previous offset kept.
type ClockSync struct {
	clock      *Clock
	serverTime ServerTimeFunc
	interval   time.Duration
	log        zerolog.Logger
	run        startstop.Base
}

// NewClockSync returns a ClockSync of clock over serverTime; interval 0 means DefaultSyncInterval.
func NewClockSync(clock *Clock, serverTime ServerTimeFunc, interval time.Duration, log zerolog.Logger) *ClockSync {
	return &ClockSync{clock: clock, serverTime: serverTime, interval: cmp.Or(interval, DefaultSyncInterval),
		log: log.With().Str("component", "clock").Logger()}
}

// Start runs the periodic sync in a goroutine and returns at once (the first sync is the caller's, before
// Start); it returns startstop.ErrStarted when the ClockSync runs already.
func (s *ClockSync) Start(ctx context.Context) error {
	return s.run.StartTicking(ctx, 0, func() time.Duration { return s.interval }, s.sync)
}

// Stop ends the periodic sync and blocks until its goroutine returned. It is safe twice and before Start.
func (s *ClockSync) Stop() { s.run.Stop() }

func (s *ClockSync) sync(ctx context.Context) {
	if err := s.clock.Sync(ctx, s.serverTime); err != nil && ctx.Err() == nil {
		s.log.Warn().Err(err).Msg("clock sync with the database failed")
	}
}
