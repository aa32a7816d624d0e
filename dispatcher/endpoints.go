package dispatcher

import (
	"context"
	"errors"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/pulse-sidecar/pulse/pulsetype"
)

// endpointCacheTTL is how long an endpoint read from the database is reused; a change made through this
// process drops it at once (EndpointChanged), one made through another replica is seen within this time.
const endpointCacheTTL = time.Second

// endpointStore is the part of Store the endpoint cache reads.
type endpointStore interface {
	ListEndpoints(ctx context.Context) ([]*pulsetype.Endpoint, error)
	GetEndpoint(ctx context.Context, group string) (*pulsetype.Endpoint, error)
}

// endpointCache holds the endpoints the dispatcher read, by consumer group, and the ordered groups with
// their topics, listed again every listEvery (jittered). It is safe for concurrent use; it calls nothing
// else while holding its lock.
type endpointCache struct {
	store     endpointStore
	ttl       time.Duration
	listEvery time.Duration
	now       func() time.Time // time.Now; tests move it

	mu       sync.Mutex
	eps      map[string]cachedEndpoint
	off      map[string]bool     // groups last read paused or disabled: no claims until read active
	ordered  map[string][]string // ordered consumer groups and their topics
	listNext time.Time           // when the endpoints are listed again
}

type cachedEndpoint struct {
	ep        *pulsetype.Endpoint // nil: the group has no endpoint
	fetched   time.Time           // when the read that gave ep began
	changedAt time.Time           // when the group last changed through this process (changed)
}

func newEndpointCache(store endpointStore, listEvery time.Duration) *endpointCache {
	return &endpointCache{store: store, ttl: endpointCacheTTL, listEvery: listEvery, now: time.Now, eps: map[string]cachedEndpoint{},
		off: map[string]bool{}}
}

// get returns the consumer group's endpoint (nil when it has none), cached for ttl unless fresh is set.
func (c *endpointCache) get(ctx context.Context, group string, fresh bool) (*pulsetype.Endpoint, error) {
	c.mu.Lock()
	e, ok := c.eps[group]
	c.mu.Unlock()
	if ok && !fresh && c.now().Sub(e.fetched) < c.ttl {
		return e.ep, nil
	}
	start := c.now()
	ep, err := c.store.GetEndpoint(ctx, group)
	if errors.Is(err, pulsetype.ErrNotFound) {
		ep, err = nil, nil
	}
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.putLocked(group, ep, start)
	c.mu.Unlock()
	return ep, nil
}

// putLocked caches ep as group's endpoint read at readStart, unless the group changed through this process
// after readStart (the read may predate the change); c.mu is held.
func (c *endpointCache) putLocked(group string, ep *pulsetype.Endpoint, readStart time.Time) {
	if e, ok := c.eps[group]; ok && e.changedAt.After(readStart) {
		return
	}
	c.eps[group] = cachedEndpoint{ep: ep, fetched: readStart}
	if ep != nil && !ep.Active() {
		c.off[group] = true
	} else {
		delete(c.off, group)
	}
}

// inactive returns the groups last read paused or disabled (or so noted by stopped): the claims skip them.
func (c *endpointCache) inactive() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Collect(maps.Keys(c.off))
}

// isInactive reports whether the group was last read paused or disabled.
func (c *endpointCache) isInactive(group string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.off[group]
}

// stopped notes that the group was found paused or disabled (after a lease, or disabled here) until a read
// finds it active, and drops its entry so that the next get reads it again.
func (c *endpointCache) stopped(group string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.off[group] = true
	if e, ok := c.eps[group]; ok {
		e.fetched = time.Time{}
		c.eps[group] = e
	}
}

// disableAfter returns the group's disableAfter as cached (0: never, or unknown).
func (c *endpointCache) disableAfter(group string) time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.eps[group]; ok && e.ep != nil {
		return time.Duration(e.ep.DisableAfter)
	}
	return 0
}

// known reports whether the group has an entry, fresh or not.
func (c *endpointCache) known(group string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, ok := c.eps[group]
	return ok
}

// isOrdered reports whether the group's cached endpoint is ordered.
func (c *endpointCache) isOrdered(group string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.eps[group]
	return ok && e.ep != nil && e.ep.Ordered
}

// limit returns a consumer group's maxConcurrency as cached (the default when unknown).
func (c *endpointCache) limit(group string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.eps[group]; ok && e.ep != nil {
		return *e.ep.MaxConcurrency
	}
	return pulsetype.DefaultMaxConcurrency
}

// rateLimit returns a consumer group's rateLimit as cached (0: none, or unknown).
func (c *endpointCache) rateLimit(group string) float64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.eps[group]; ok && e.ep != nil {
		return e.ep.RateLimit
	}
	return 0
}

// groups returns the consumer groups with an entry.
func (c *endpointCache) groups() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	groups := make([]string, 0, len(c.eps))
	for group := range c.eps {
		groups = append(groups, group)
	}
	return groups
}

// changed drops the group's entry after it was registered, replaced or deleted through this process (reads
// begun earlier are not cached) and makes orderedGroups list the endpoints again.
func (c *endpointCache) changed(group string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.eps[group]
	e.fetched, e.changedAt = time.Time{}, c.now()
	c.eps[group] = e
	c.listNext = time.Time{}
}

// relist makes the next orderedGroups list the endpoints again.
func (c *endpointCache) relist() {
	c.mu.Lock()
	c.listNext = time.Time{}
	c.mu.Unlock()
}

// orderedGroups returns the ordered consumer groups and their topics. It lists every endpoint (caching
// each, so every group's limits are known before its attempts are claimed) when the last listing is older
// than listEvery, jittered, or relist or changed asked for it; when the listing fails it returns the
// groups listed before with the error.
func (c *endpointCache) orderedGroups(ctx context.Context) (map[string][]string, error) {
	c.mu.Lock()
	stale := !c.now().Before(c.listNext)
	ordered := c.ordered
	c.mu.Unlock()
	if !stale {
		return ordered, nil
	}
	start := c.now()
	eps, err := c.store.ListEndpoints(ctx)
	if err != nil {
		return ordered, err
	}
	ordered = map[string][]string{}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, ep := range eps {
		if ep.Ordered {
			ordered[ep.ConsumerGroup] = ep.Topics
		}
		c.putLocked(ep.ConsumerGroup, ep, start)
	}
	c.ordered, c.listNext = ordered, c.now().Add(pulsetype.Jittered(c.listEvery))
	return ordered, nil
}

// unsubscribed returns why attempt a may not run for endpoint ep (the group's current registration, nil
// when it has none), or nil when it may: endpoint_deleted when the group was deleted, or deleted and
// registered again (another incarnation); unsubscribed when it no longer subscribes to a's topic.
func unsubscribed(ep *pulsetype.Endpoint, a *pulsetype.Attempt) *pulsetype.ErrorInfo {
	switch {
	case ep == nil:
		return &pulsetype.ErrorInfo{Code: pulsetype.CodeEndpointDeleted, Message: "the consumer group " + a.ConsumerGroup + " was deleted"}
	case ep.Incarnation != a.Incarnation:
		return &pulsetype.ErrorInfo{Code: pulsetype.CodeEndpointDeleted,
			Message: "the consumer group " + a.ConsumerGroup + " was deleted and registered again; this delivery belongs to the earlier registration"}
	case !ep.Subscribes(a.Topic):
		return &pulsetype.ErrorInfo{Code: pulsetype.CodeUnsubscribed, Message: "the consumer group " + a.ConsumerGroup + " no longer subscribes to topic " + a.Topic}
	}
	return nil
}
