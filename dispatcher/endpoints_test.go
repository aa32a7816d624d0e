package dispatcher

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pulse-sidecar/pulse/pulsetype"
)

// clock is a settable time source: nanoseconds since the Unix epoch.
type clock struct{ ns atomic.Int64 }

func (c *clock) Now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *clock) advance(d time.Duration) { c.ns.Add(int64(d)) }

func newTestCache(store endpointStore) (*endpointCache, *clock) {
	clk := &clock{}
	clk.ns.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	c := newEndpointCache(store, 5*time.Second)
	c.now = clk.Now
	return c, clk
}

// reads calls get for group and returns how many endpoint reads the store has served so far.
func reads(c *endpointCache, store *memStore, group string, fresh bool) int {
	_, _ = c.get(context.Background(), group, fresh)
	return store.count("GetEndpoint")
}

// An endpoint read is reused for the TTL, read again after it or when asked fresh; a group without endpoint
// is cached as nil.
func TestEndpointCacheRefreshAndExpiry(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store := newMemStore(endpoint(t, "g", []string{"t"}, func(ep *pulsetype.Endpoint) { ep.MaxConcurrency = new(3) }))
	c, clk := newTestCache(store)
	if c.known("g") || c.limit("g") != pulsetype.DefaultMaxConcurrency {
		t.Fatal("an unread group is known, or has another limit than the default")
	}
	for range 3 {
		ep, err := c.get(ctx, "g", false)
		if err != nil || ep == nil || ep.ConsumerGroup != "g" {
			t.Fatalf("get = %v, %v", ep, err)
		}
	}
	if n := store.count("GetEndpoint"); n != 1 {
		t.Fatalf("3 gets within the TTL read the database %d times, want 1", n)
	}
	if !c.known("g") || c.limit("g") != 3 {
		t.Fatalf("known %v, limit %d; want true, 3", c.known("g"), c.limit("g"))
	}
	clk.advance(endpointCacheTTL - time.Millisecond)
	if n := reads(c, store, "g", false); n != 1 {
		t.Fatalf("a get just within the TTL read the database (%d reads)", n)
	}
	clk.advance(time.Millisecond)
	if n := reads(c, store, "g", false); n != 2 {
		t.Fatalf("a get at the TTL did not read again (%d reads)", n)
	}
	if n := reads(c, store, "g", true); n != 3 {
		t.Fatalf("a fresh get did not read again (%d reads)", n)
	}
	for range 2 {
		if ep, err := c.get(ctx, "gone", false); ep != nil || err != nil {
			t.Fatalf("get of a group without endpoint = %v, %v; want nil, nil", ep, err)
		}
	}
	if n := store.count("GetEndpoint"); n != 4 {
		t.Fatalf("the missing group was read %d times, want once (cached as nil)", n-3)
	}
}

// changedStore answers GetEndpoint with ep, calling during first (once) while the read is in progress.
type changedStore struct {
	*memStore
	during func()
	once   sync.Once
}

func (s *changedStore) GetEndpoint(ctx context.Context, group string) (*pulsetype.Endpoint, error) {
	ep, err := s.memStore.GetEndpoint(ctx, group)
	s.once.Do(s.during)
	return ep, err
}

// A change made through this process drops the cached endpoint at once, and a read begun before the change
// is returned but not cached.
func TestEndpointCacheChanged(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store := &changedStore{memStore: newMemStore(endpoint(t, "g", []string{"t"}))}
	c, clk := newTestCache(store)
	store.during = func() {
		clk.advance(time.Millisecond)
		c.changed("g")
	}
	if _, err := c.get(ctx, "g", false); err != nil {
		t.Fatal(err)
	}
	if n := reads(c, store.memStore, "g", false); n != 2 {
		t.Fatalf("a read begun before the change was cached (%d reads, want 2)", n)
	}
	if n := reads(c, store.memStore, "g", false); n != 2 {
		t.Fatalf("the read after the change was not cached (%d reads, want 2)", n)
	}
	c.changed("g")
	if n := reads(c, store.memStore, "g", false); n != 3 {
		t.Fatalf("changed did not drop the cached endpoint (%d reads, want 3)", n)
	}
}

// failingList fails ListEndpoints while fail is set.
type failingList struct {
	*memStore
	fail bool
}

func (s *failingList) ListEndpoints(ctx context.Context) ([]*pulsetype.Endpoint, error) {
	if s.fail {
		s.called("ListEndpoints")
		return nil, errors.New("down")
	}
	return s.memStore.ListEndpoints(ctx)
}

// The ordered groups are listed once per listing period (jittered), again after relist or a change, and
// kept when a listing fails; the listing fills the cache.
func TestEndpointCacheOrderedGroups(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ordered := func(ep *pulsetype.Endpoint) { ep.Ordered = true }
	store := &failingList{memStore: newMemStore(endpoint(t, "o", []string{"t1", "t2"}, ordered), endpoint(t, "u", []string{"t1"}))}
	c, clk := newTestCache(store)
	groups, err := c.orderedGroups(ctx)
	if err != nil || len(groups) != 1 || len(groups["o"]) != 2 {
		t.Fatalf("orderedGroups = %v, %v; want o with 2 topics", groups, err)
	}
	if !c.isOrdered("o") || c.isOrdered("u") || !c.known("u") {
		t.Fatal("the listing did not fill the cache")
	}
	_, _ = c.orderedGroups(ctx)
	clk.advance(5*time.Second*8/10 - time.Millisecond) // below the shortest jittered period
	_, _ = c.orderedGroups(ctx)
	if n := store.count("ListEndpoints"); n != 1 {
		t.Fatalf("listed %d times within the period, want 1", n)
	}
	clk.advance(5*time.Second*4/10 + time.Millisecond) // past the longest jittered period
	_, _ = c.orderedGroups(ctx)
	if n := store.count("ListEndpoints"); n != 2 {
		t.Fatalf("listed %d times after the period, want 2", n)
	}
	c.relist()
	_, _ = c.orderedGroups(ctx)
	c.changed("u")
	_, _ = c.orderedGroups(ctx)
	if n := store.count("ListEndpoints"); n != 4 {
		t.Fatalf("relist and changed did not list again (%d listings, want 4)", n)
	}
	store.fail = true
	c.relist()
	groups, err = c.orderedGroups(ctx)
	if err == nil || len(groups["o"]) != 2 {
		t.Fatalf("a failed listing = %v, %v; want the groups listed before and the error", groups, err)
	}
}
