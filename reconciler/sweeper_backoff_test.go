package reconciler

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// Sweeps that delete nothing come twice as far apart each time, up to maxSweepBackoff intervals; one that
// deletes something, or fails, brings the wait back to the interval.
func TestSweeperBacksOffWhileNothingExpires(t *testing.T) {
	var deleted int64
	var failure error
	s := NewSweeper(func(context.Context) (int64, error) { return deleted, failure }, time.Minute, zerolog.Nop())
	for _, step := range []struct {
		deleted int64
		failure error
		want    time.Duration
	}{
		{0, nil, 2 * time.Minute}, {0, nil, 4 * time.Minute}, {0, nil, 8 * time.Minute}, {0, nil, 16 * time.Minute},
		{0, nil, 16 * time.Minute}, {5, nil, time.Minute}, {0, nil, 2 * time.Minute}, {0, errors.New("down"), time.Minute},
	} {
		deleted, failure = step.deleted, step.failure
		s.once(context.Background())
		if s.wait != step.want {
			t.Fatalf("after a sweep that deleted %d (error %v): wait %s, want %s", step.deleted, step.failure, s.wait, step.want)
		}
	}
}
