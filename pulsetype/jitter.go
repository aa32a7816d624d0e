package pulsetype

import (
	"math/rand/v2"
	"time"
)

// Jittered returns d varied at random by up to ±Jitter (20%), uniformly in [0.8·d, 1.2·d]; d ≤ 0 is
// returned as is. Every periodic job of the sidecar (poll, reap, repair, sweep, heartbeat, endpoint
// refresh, clock sync, change-stream reopen, endpoints-file check) waits a jittered period, so that replicas
// started together, or pulled together by a database outage, drift apart and stay apart instead of hitting
// the database in the same instant. It is safe for concurrent use.
func Jittered(d time.Duration) time.Duration {
	if d <= 0 {
		return d
	}
	spread := time.Duration(float64(d) * Jitter)
	return d - spread + rand.N(2*spread+1)
}
