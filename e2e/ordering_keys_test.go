package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pulse-sidecar/pulse/e2e/internal/harness"
	"github.com/pulse-sidecar/pulse/internal/testwait"
)

// keyedPost is one POST a keyed receiver got: the event id, its ordering key and the status answered.
type keyedPost struct {
	ID, Key string
	Status  int
}

// An ordered group delivers in order per (topic, orderingKey): the head of key A fails until every event of
// key B has arrived, so B's line cannot wait on A's; each line, and the unkeyed one, arrives in order.
func TestOrderingKeyFailingHeadBlocksOnlyItsKey(t *testing.T) {
	b := harness.Setup(t)
	s := b.Start(b.FastEnv())
	const n = 4
	var (
		mu    sync.Mutex
		posts []keyedPost
	)
	bDone := func() int { // B events received; mu held
		c := 0
		for _, p := range posts {
			if p.Key == "B" {
				c++
			}
		}
		return c
	}
	rcv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var env struct {
			ID          string `json:"id"`
			OrderingKey string `json:"orderingKey"`
		}
		_ = json.Unmarshal(body, &env)
		mu.Lock()
		defer mu.Unlock()
		status := 200
		if env.ID == "a1" && (bDone() < n || !slices.ContainsFunc(posts, func(p keyedPost) bool { return p.ID == "a1" })) {
			status = 500 // the head of A fails at least once, and until B's line is through
		}
		posts = append(posts, keyedPost{ID: env.ID, Key: env.OrderingKey, Status: status})
		w.WriteHeader(status)
	}))
	t.Cleanup(rcv.Close)
	s.RegisterEndpoint(t, "ledger", map[string]any{"url": rcv.URL, "topics": []string{"o"}, "ordered": true,
		"retryDelay": "50ms", "retryBackoffMultiplier": 1, "maxRetries": 100})
	for i := 1; i <= n; i++ {
		for _, key := range []string{"A", "B", ""} {
			ev := map[string]any{"topic": "o", "data": i, "id": fmt.Sprintf("%s%d", map[string]string{"A": "a", "B": "b", "": "u"}[key], i)}
			if key != "" {
				ev["orderingKey"] = key
			}
			if code := harness.Do(t, "POST", s.URL+"/v1/events", ev, nil); code != 202 {
				t.Fatalf("publish %v answered %d", ev, code)
			}
		}
	}
	testwait.Eventually(t, 30*time.Second, "every event delivered", func() bool {
		mu.Lock()
		defer mu.Unlock()
		ok := map[string]bool{}
		for _, p := range posts {
			if p.Status == 200 {
				ok[p.ID] = true
			}
		}
		return len(ok) == 3*n
	})
	mu.Lock()
	defer mu.Unlock()
	lines := map[string][]string{} // first POST of each event, by key
	seen := map[string]bool{}
	a1OK := -1
	for i, p := range posts {
		if p.ID == "a1" && p.Status == 200 {
			a1OK = i
		}
		if p.Key == "B" && a1OK >= 0 {
			t.Errorf("B event %s arrived after the head of A succeeded: B waited on A", p.ID)
		}
		if !seen[p.ID] {
			seen[p.ID] = true
			lines[p.Key] = append(lines[p.Key], p.ID)
		}
		if p.Key == "A" && p.ID != "a1" && a1OK < 0 {
			t.Errorf("%s was POSTed before the failing head a1 succeeded", p.ID)
		}
	}
	for key, prefix := range map[string]string{"A": "a", "B": "b", "": "u"} {
		var want []string
		for i := 1; i <= n; i++ {
			want = append(want, fmt.Sprintf("%s%d", prefix, i))
		}
		if !slices.Equal(lines[key], want) {
			t.Errorf("key %q arrived as %v, want %v", key, lines[key], want)
		}
	}
	if posts[0].ID != "a1" && !slices.ContainsFunc(posts, func(p keyedPost) bool { return p.ID == "a1" && p.Status == 500 }) {
		t.Errorf("the head of A never failed: %v", posts)
	}
}

// orderingKey must be a string of 1 to 200 characters; the rejection names the field.
func TestOrderingKeyValidation(t *testing.T) {
	b := harness.Setup(t)
	s := b.Start(b.FastEnv())
	long := string(make([]rune, 201))
	for _, tc := range []struct {
		name string
		body any
		code string
	}{
		{"too long", map[string]any{"topic": "t", "data": 1, "orderingKey": long}, "invalid_ordering_key"},
		{"empty", map[string]any{"topic": "t", "data": 1, "orderingKey": ""}, "invalid_ordering_key"},
		{"not a string", map[string]any{"topic": "t", "data": 1, "orderingKey": 7}, "invalid_event"},
		{"in an array", []any{map[string]any{"topic": "t", "data": 1}, map[string]any{"topic": "t", "data": 1, "orderingKey": long}}, "invalid_ordering_key"},
	} {
		var e struct {
			Error struct{ Code, Message string }
		}
		if code := harness.Do(t, "POST", s.URL+"/v1/events", tc.body, &e); code != 400 || e.Error.Code != tc.code || !strings.Contains(e.Error.Message, "orderingKey") {
			t.Errorf("%s: got %d %+v, want 400 %s naming orderingKey", tc.name, code, e.Error, tc.code)
		}
	}
	var ok struct{ ID string }
	key := strings.Repeat("é", 200) // 200 characters, 400 bytes
	if code := harness.Do(t, "POST", s.URL+"/v1/events", map[string]any{"topic": "t", "data": 1, "orderingKey": key}, &ok); code != 202 {
		t.Fatalf("a 200-character key answered %d", code)
	}
	var ev struct{ OrderingKey string }
	if code := harness.Do(t, "GET", s.URL+"/v1/events/"+ok.ID, nil, &ev); code != 200 || ev.OrderingKey != key {
		t.Fatalf("GET event = %d, orderingKey %q", code, ev.OrderingKey)
	}
}
