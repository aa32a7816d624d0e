package metrics

import (
	"context"
	"errors"
	"io"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
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
