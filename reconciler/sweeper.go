package reconciler

import (
	"cmp"
	"context"
	"math/rand/v2"
	"time"

	"github.com/rs/zerolog"

	"github.com/pulse-sidecar/pulse/internal/startstop"
	"github.com/pulse-sidecar/pulse/pulsetype"
)

// DefaultSweepInterval is the period of the retention sweep.
const DefaultSweepInterval = time.Minute

// SweepFunc deletes expired documents and returns how many it deleted; *mongo.Store's Sweep implements it.
type SweepFunc func(ctx context.Context) (int64, error)

// Sweeper runs the retention sweep every interval (jittered) until stopped: the path by which expired
// documents leave a database without TTL indexes, and staged events of a crashed publisher leave any
// database. A failed sweep is logged and tried again the next interval.
type Sweeper struct {
	sweep    SweepFunc
	interval time.Duration
	log      zerolog.Logger
	run      startstop.Base
}

// NewSweeper returns a Sweeper over sweep; interval 0 means DefaultSweepInterval.
func NewSweeper(sweep SweepFunc, interval time.Duration, log zerolog.Logger) *Sweeper {
	return &Sweeper{sweep: sweep, interval: cmp.Or(interval, DefaultSweepInterval), log: log.With().Str("component", "sweeper").Logger()}
}

// Start runs the sweeps in a goroutine and returns at once; it returns startstop.ErrStarted when the
// Sweeper runs already. The first sweep comes at a random point of the first interval, so that replicas
// started together sweep apart.
func (s *Sweeper) Start(ctx context.Context) error {
	next := func() time.Duration { return pulsetype.Jittered(s.interval) }
	return s.run.StartGo(ctx, func(ctx context.Context) { startstop.Every(ctx, rand.N(s.interval), next, s.once) })
}

// Stop ends the sweeps and blocks until their goroutine returned (a sweep under way is cancelled). It is
// safe twice and before Start.
func (s *Sweeper) Stop() { s.run.Stop() }

func (s *Sweeper) once(ctx context.Context) {
	n, err := s.sweep(ctx)
	switch {
	case err != nil && ctx.Err() == nil:
		s.log.Warn().Err(err).Msg("retention sweep failed")
	case n > 0:
		s.log.Debug().Int64("deleted", n).Msg("retention sweep")
	}
}
