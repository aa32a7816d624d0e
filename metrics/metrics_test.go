package metrics

import (
	"context"
	"errors"
	"io"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/pulse-sidecar/pulse/pulsetype"
)

// pulse_deliveries_pending is counted on scrape, reused for maxAge, kept when a count fails, and shows
// registered groups with nothing pending as 0.
func TestPendingCountedOnScrape(t *testing.T) {
	m := New()
	calls := 0
	counts := map[string]int64{"billing": 3, "audit": 0}
	m.CountPendingWith(func(context.Context) (map[string]int64, error) {
		calls++
		return counts, nil
	}, time.Hour, zerolog.Nop())
	scrape := func() string {
		rec := httptest.NewRecorder()
		m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
		b, _ := io.ReadAll(rec.Body)
		return string(b)
	}
	if calls != 0 {
		t.Fatalf("counted %d times before any scrape, want 0", calls)
	}
	body := scrape()
	for _, want := range []string{`pulse_deliveries_pending{consumer_group="billing"} 3`, `pulse_deliveries_pending{consumer_group="audit"} 0`} {
		if !strings.Contains(body, want) {
			t.Errorf("scrape lacks %s", want)
		}
	}
	counts = map[string]int64{"billing": 1}
	if body := scrape(); calls != 1 || !strings.Contains(body, `consumer_group="billing"} 3`) {
		t.Errorf("second scrape within maxAge counted again (%d calls) or changed the value", calls)
	}

	m2 := New()
	n := 0
	m2.CountPendingWith(func(context.Context) (map[string]int64, error) {
		n++
		if n > 1 {
			return nil, errors.New("database down")
		}
		return map[string]int64{"billing": 5}, nil
	}, 0, zerolog.Nop())
	for range 2 {
		rec := httptest.NewRecorder()
		m2.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
		if !strings.Contains(rec.Body.String(), `pulse_deliveries_pending{consumer_group="billing"} 5`) {
			t.Errorf("scrape %d lacks the last good count", n)
		}
	}
	if n != 2 {
		t.Errorf("count called %d times with maxAge 0, want 2", n)
	}
}

// The per-group series follow the groups of the count: a group gets its attempt series at 0 on the first
// scrape, and loses them when it leaves the count (deleted, nothing pending), so the label set stays bounded.
func TestGroupSeriesFollowRegistration(t *testing.T) {
	m := New()
	counts := map[string]int64{"billing": 0}
	m.CountPendingWith(func(context.Context) (map[string]int64, error) { return counts, nil }, 0, zerolog.Nop())
	scrape := func() string {
		rec := httptest.NewRecorder()
		m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
		return rec.Body.String()
	}
	if body := scrape(); !strings.Contains(body, `pulse_attempts_total{consumer_group="billing",outcome="error"} 0`) {
		t.Fatalf("a registered group has no attempt series at 0:\n%s", body)
	}
	m.AttemptDone("billing", "success", time.Millisecond)
	counts = map[string]int64{"audit": 0}
	body := scrape()
	if strings.Contains(body, `consumer_group="billing"`) || !strings.Contains(body, `pulse_attempts_total{consumer_group="audit",outcome="success"} 0`) {
		t.Fatalf("series did not follow the groups:\n%s", body)
	}
}

// pulse_filter_errors_total counts the deliveries ended as filter_error by group, at 0 for a registered
// group before its first.
func TestFilterErrorsCounted(t *testing.T) {
	m := New()
	m.CountPendingWith(func(context.Context) (map[string]int64, error) {
		return map[string]int64{"billing": 0, "audit": 0}, nil
	}, 0, zerolog.Nop())
	m.FilterError("billing")
	m.FilterError("billing")
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	body := rec.Body.String()
	for _, want := range []string{`pulse_filter_errors_total{consumer_group="billing"} 2`, `pulse_filter_errors_total{consumer_group="audit"} 0`} {
		if !strings.Contains(body, want) {
			t.Errorf("scrape lacks %s:\n%s", want, body)
		}
	}
}

// pulse_oldest_pending_delivery_age_seconds is 0 for a registered group with nothing pending, the age of its
// oldest pending delivery at the scrape while it has a backlog, and 0 again once the backlog drains.
func TestOldestPendingAge(t *testing.T) {
	m := New()
	counts := map[string]int64{"billing": 0, "audit": 0}
	oldest := map[string]time.Time{}
	m.CountPendingWith(func(context.Context) (map[string]int64, error) { return counts, nil }, 0, zerolog.Nop())
	m.OldestPendingWith(func(context.Context) (map[string]time.Time, error) { return oldest, nil })
	scrape := func() string {
		rec := httptest.NewRecorder()
		m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
		return rec.Body.String()
	}
	age := func(body, group string) float64 {
		t.Helper()
		prefix := `pulse_oldest_pending_delivery_age_seconds{consumer_group="` + group + `"} `
		for _, line := range strings.Split(body, "\n") {
			if v, ok := strings.CutPrefix(line, prefix); ok {
				f, err := strconv.ParseFloat(v, 64)
				if err != nil {
					t.Fatalf("%s: %v", line, err)
				}
				return f
			}
		}
		t.Fatalf("no age series for %s:\n%s", group, body)
		return 0
	}
	body := scrape()
	if a, b := age(body, "billing"), age(body, "audit"); a != 0 || b != 0 {
		t.Fatalf("ages with nothing pending = %v, %v, want 0, 0", a, b)
	}
	counts = map[string]int64{"billing": 3, "audit": 0}
	oldest = map[string]time.Time{"billing": time.Now().Add(-90 * time.Second)}
	body = scrape()
	if a := age(body, "billing"); a < 90 || a > 3600 {
		t.Fatalf("age with a backlog created 90 s ago = %v, want at least 90", a)
	}
	if a := age(body, "audit"); a != 0 {
		t.Fatalf("age of a group without backlog = %v, want 0", a)
	}
	counts = map[string]int64{"billing": 0, "audit": 0}
	oldest = map[string]time.Time{}
	if a := age(scrape(), "billing"); a != 0 {
		t.Fatalf("age after the backlog drained = %v, want 0", a)
	}
}

// The duration histogram's buckets run from 5 ms to the longest endpoint timeout, with a bucket at the
// default timeout, so that no POST the sidecar allows lands in +Inf only.
func TestDurationBucketsCoverTimeouts(t *testing.T) {
	b := DurationBuckets
	if b[0] != 0.005 {
		t.Errorf("first bucket %v, want 0.005", b[0])
	}
	if !slices.IsSorted(b) {
		t.Errorf("buckets %v are not increasing", b)
	}
	if top := b[len(b)-1]; top < pulsetype.MaxTimeout.Seconds() {
		t.Errorf("top bucket %v s is below the longest timeout %s", top, pulsetype.MaxTimeout)
	}
	if !slices.Contains(b, pulsetype.DefaultTimeout.Seconds()) || !slices.Contains(b, 60.0) {
		t.Errorf("buckets %v lack the default timeout %s or 60 s", b, pulsetype.DefaultTimeout)
	}
}

// pulse_oldest_pending_delivery_age_seconds never serves made-up ages: each read has a deadline of its own
// (a pending count that uses its whole deadline leaves the oldest read its own), a failed oldest read
// serves no age (not one grown from the last createdAt values) and counts in
// pulse_metrics_refresh_errors_total, and a group that left the reads (deleted) loses its series.
func TestOldestPendingAgeNeverStale(t *testing.T) {
	m := New()
	m.groups.timeout = 50 * time.Millisecond
	slowCount := true
	counts := map[string]int64{"billing": 2, "gone": 1}
	m.CountPendingWith(func(ctx context.Context) (map[string]int64, error) {
		if slowCount {
			<-ctx.Done() // a count that takes its whole deadline
			return nil, ctx.Err()
		}
		return counts, nil
	}, 0, zerolog.Nop())
	var oldestErr error
	oldest := map[string]time.Time{"billing": time.Now().Add(-time.Minute), "gone": time.Now().Add(-time.Hour)}
	m.OldestPendingWith(func(ctx context.Context) (map[string]time.Time, error) {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		return oldest, oldestErr
	})
	scrape := func() string {
		rec := httptest.NewRecorder()
		m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
		return rec.Body.String()
	}
	body := scrape()
	if !strings.Contains(body, `pulse_oldest_pending_delivery_age_seconds{consumer_group="billing"}`) {
		t.Fatalf("a pending count that used its whole deadline left the oldest read none:\n%s", body)
	}
	if !strings.Contains(body, `pulse_metrics_refresh_errors_total{read="pending"} 1`) || !strings.Contains(body, `pulse_metrics_last_refresh_timestamp_seconds{read="oldest"}`) {
		t.Fatalf("the failed count and the good oldest read are not counted:\n%s", body)
	}

	slowCount = false
	oldestErr = errors.New("database down")
	body = scrape()
	if strings.Contains(body, "pulse_oldest_pending_delivery_age_seconds{") {
		t.Fatalf("a failed oldest read still serves ages:\n%s", body)
	}
	if !strings.Contains(body, `pulse_metrics_refresh_errors_total{read="oldest"} 1`) {
		t.Fatalf("the failed oldest read is not counted:\n%s", body)
	}

	oldestErr = nil
	counts = map[string]int64{"billing": 0}
	oldest = map[string]time.Time{}
	body = scrape()
	if !strings.Contains(body, `pulse_oldest_pending_delivery_age_seconds{consumer_group="billing"} 0`) {
		t.Fatalf("a drained group's age is not 0 after a good read:\n%s", body)
	}
	if strings.Contains(body, `consumer_group="gone"`) {
		t.Fatalf("a deleted group keeps its series:\n%s", body)
	}
}
