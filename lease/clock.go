package lease

import (
	"context"
	"sync"
	"time"
)

// Clock estimates the database server's current time as the local clock plus a measured offset. It is safe
// for concurrent use.
type Clock struct {
	local  func() time.Time
	mu     sync.RWMutex
	offset time.Duration
	rtt    time.Duration // round trip of the sample behind offset
	synced bool
}

// maxTrustedRTT is the round trip under which a new offset sample always replaces the previous one (its
// error is at most half of it).
const maxTrustedRTT = 200 * time.Millisecond

// NewClock returns a Clock over local (nil = time.Now) with a zero offset until Sync runs.
func NewClock(local func() time.Time) *Clock {
	if local == nil {
		local = time.Now
	}
	return &Clock{local: local}
}

// Now returns the estimated database time.
func (c *Clock) Now() time.Time {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.local().Add(c.offset)
}

// Offset returns the last measured offset (database time − local time).
func (c *Clock) Offset() time.Duration {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.offset
}

// Sync measures the offset with serverTime (which asks the database for its time, e.g. hello.localTime),
// assuming the server read its clock halfway through the round trip. It keeps the best of three samples (the
// shortest round trip) and returns the error of serverTime when every sample failed.
func (c *Clock) Sync(ctx context.Context, serverTime func(context.Context) (time.Time, error)) error {
	var best time.Duration = -1
	var offset time.Duration
	var lastErr error
	for range 3 {
		t0 := c.local()
		st, err := serverTime(ctx)
		t1 := c.local()
		if err != nil {
			lastErr = err
			continue
		}
		rtt := t1.Sub(t0)
		if best < 0 || rtt < best {
			best = rtt
			offset = st.Sub(t0.Add(rtt / 2))
		}
	}
	if best < 0 {
		return lastErr
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	// A slow round trip bounds the offset's error by half of it: keep a measurement taken in better times
	// unless this one is tight enough, so an overloaded database cannot shift a replica's lease clock.
	if !c.synced || best <= c.rtt || best < maxTrustedRTT {
		c.offset, c.rtt, c.synced = offset, best, true
	}
	return nil
}
