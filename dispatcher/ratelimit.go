package dispatcher

import (
	"math"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// rateBurst is the burst of every endpoint's rate limiter: POSTs to a rate-limited endpoint start at least
// 1/rateLimit apart, so no second holds more than rateLimit of them (plus one at its edge).
const rateBurst = 1

// rateLimits holds a token bucket (golang.org/x/time/rate) per rate-limited consumer group of this process:
// each POST to the group takes a token, rateLimit tokens come per second. Tokens are checked when the loop
// admits attempts to a claim and taken when it launches them, so no attempt waits for a token while it
// holds a lease or a worker slot: a group without a token is left out of the claims until its next token,
// when wake is called. It is safe for concurrent use; rate (a group's rateLimit, 0 for none) is called
// without the lock held.
type rateLimits struct {
	rate func(group string) float64
	wake func() // the loop looks for work again
	now  func() time.Time

	mu     sync.Mutex
	lims   map[string]*rate.Limiter
	wakeAt time.Time // when the pending wake fires; zero: none pending
}

func newRateLimits(rateOf func(string) float64, wake func()) *rateLimits {
	return &rateLimits{rate: rateOf, wake: wake, now: time.Now, lims: map[string]*rate.Limiter{}}
}

// limiterLocked returns group's limiter at rate per second, made or set to that rate; nil when r is 0
// (no limit). r.mu is held.
func (r *rateLimits) limiterLocked(group string, perSecond float64, now time.Time) *rate.Limiter {
	lim := r.lims[group]
	if perSecond <= 0 {
		delete(r.lims, group)
		return nil
	}
	if lim == nil {
		lim = rate.NewLimiter(rate.Limit(perSecond), rateBurst)
		r.lims[group] = lim
	} else if lim.Limit() != rate.Limit(perSecond) {
		lim.SetLimitAt(now, rate.Limit(perSecond))
	}
	return lim
}

// allows reports whether group may start one more POST now with taken already admitted to the claim being
// built; when it may not, the loop is woken at the group's next token.
func (r *rateLimits) allows(group string, taken int) bool {
	return r.available(group) > taken
}

// available returns how many POSTs of group may start now: math.MaxInt without a rate limit. At 0 it
// schedules a wake-up for the group's next token.
func (r *rateLimits) available(group string) int {
	perSecond := r.rate(group)
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.now()
	lim := r.limiterLocked(group, perSecond, now)
	if lim == nil {
		return math.MaxInt
	}
	tokens := lim.TokensAt(now)
	if tokens >= 1 {
		return int(tokens)
	}
	r.wakeLocked(now.Add(time.Duration((1 - tokens) / perSecond * float64(time.Second))))
	return 0
}

// take takes a token for one POST of group and reports whether there was one (always true without a rate
// limit).
func (r *rateLimits) take(group string) bool {
	perSecond := r.rate(group)
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.now()
	lim := r.limiterLocked(group, perSecond, now)
	return lim == nil || lim.AllowN(now, 1)
}

// holds takes a token of group's rate limiter and reports whether it did: false without a rate limit (also
// for a group whose endpoint the cache has not read yet, whose rate reads 0) and without a token. A job
// admitted with a token it holds keeps it; any other job asks take again when it is launched, after the
// loop has read the group's endpoint (launchAll), so that a limit not yet known at admission applies from
// the group's first POST.
func (r *rateLimits) holds(group string) bool {
	perSecond := r.rate(group)
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.now()
	lim := r.limiterLocked(group, perSecond, now)
	return lim != nil && lim.AllowN(now, 1)
}

// wakeLocked makes wake run at at, unless a wake-up no later than at is pending. r.mu is held.
func (r *rateLimits) wakeLocked(at time.Time) {
	now := r.now()
	if !r.wakeAt.IsZero() && !r.wakeAt.After(at) && r.wakeAt.After(now) {
		return
	}
	r.wakeAt = at
	time.AfterFunc(at.Sub(now), func() {
		r.mu.Lock()
		if r.wakeAt.Equal(at) {
			r.wakeAt = time.Time{}
		}
		r.mu.Unlock()
		r.wake()
	})
}

// limited returns the groups among groups that have a rate limit.
func (r *rateLimits) limited(groups []string) []string {
	var out []string
	for _, g := range groups {
		if r.rate(g) > 0 {
			out = append(out, g)
		}
	}
	return out
}
