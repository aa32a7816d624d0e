package reconciler

import (
	"cmp"
	"context"
	"math/rand/v2"
	"time"

	"github.com/rs/zerolog"

	"github.com/pulse-sidecar/pulse/internal/startstop"
)

// DefaultSweepInterval is the period of the retention sweep.
const DefaultSweepInterval = time.Minute

// SweepFunc deletes expired documents and returns how many it deleted; *mongo.Store's Sweep implements it.
type SweepFunc func(ctx context.Context) (int64, error)

// maxSweepBackoff bounds how many intervals apart sweeps that delete nothing come.
const maxSweepBackoff = 16

// Sweeper runs the retention sweep every interval (jittered) until stopped: the path by which expired
// documents leave a database without TTL indexes, and staged events of a crashed publisher leave any
// database. A failed sweep is logged and tried again the next interval. A sweep that deleted nothing
// doubles the wait before the next one, up to maxSweepBackoff intervals, and one that deleted something
// brings it back to the interval: on a database that evaluates the sweep's filter by reading every
// document (FerretDB), an idle sidecar whose documents are far from expiring reads them seldom. Reads treat
// expired documents as gone whenever they are swept.
type Sweeper struct {
	sweep    SweepFunc
	interval time.Duration
	wait     time.Duration // until the next sweep (jittered); only the sweeping goroutine uses it
	log      zerolog.Logger
	run      startstop.Base
}

// NewSweeper returns a Sweeper over sweep; interval 0 means DefaultSweepInterval.
func NewSweeper(sweep SweepFunc, interval time.Duration, log zerolog.Logger) *Sweeper {
	interval = cmp.Or(interval, DefaultSweepInterval)
	return &Sweeper{sweep: sweep, interval: interval, wait: interval, log: log.With().Str("component", "sweeper").Logger()}
}

// Start runs the sweeps in a goroutine and returns at once; it returns startstop.ErrStarted when the
// Sweeper runs already. The first sweep comes at a random point of the first interval, so that replicas
// started together sweep apart.
func (s *Sweeper) Start(ctx context.Context) error {
	return s.run.StartTicking(ctx, rand.N(s.interval), func() time.Duration { return s.wait }, s.once)
}

// Stop ends the sweeps and blocks until their goroutine returned (a sweep under way is cancelled). It is
// safe twice and before Start.
func (s *Sweeper) Stop() { s.run.Stop() }

func (s *Sweeper) once(ctx context.Context) {
	n, err := s.sweep(ctx)
	if err == nil && n == 0 {
		s.wait = min(2*s.wait, maxSweepBackoff*s.interval)
	} else {
		s.wait = s.interval
	}
	switch {
	case err != nil && ctx.Err() == nil:
		s.log.Warn().Err(err).Msg("retention sweep failed")
	case n > 0:
		s.log.Debug().Int64("deleted", n).Msg("retention sweep")
	}
}
