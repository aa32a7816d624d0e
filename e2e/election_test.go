package e2e

import (
	"context"
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

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/pulse-sidecar/pulse/e2e/internal/harness"
	"github.com/pulse-sidecar/pulse/internal/drill"
	"github.com/pulse-sidecar/pulse/internal/testwait"
)

// electionFigures are what an election drill measured (see runElection).
type electionFigures struct {
	accepted, delivered int // events answered 202 (or 200 to a re-sent id) × groups; of them delivered in success
	duplicates          int // POSTs beyond the first of one event to one group
	inversions          int // per ordering key, events of the ordered group that arrived before an earlier one
	attemptsWithoutPOST int // attempts recorded beyond the POSTs the receiver got, per delivery
	answered503, other  int // publishes answered 503 database_unavailable; answered anything else but 202/200
	slowest503          time.Duration
	notDelivered        []string
}

func (f electionFigures) String() string {
	return fmt.Sprintf("delivered %d of %d, duplicate POSTs %d, per-key inversions %d, attempts without a POST %d, "+
		"publishes answered 503 database_unavailable %d (slowest %s), other answers %d",
		f.delivered, f.accepted, f.duplicates, f.inversions, f.attemptsWithoutPOST, f.answered503, f.slowest503.Round(time.Millisecond), f.other)
}

// The election drill: under a publish load, with POSTs in flight to an unordered and an ordered group (both
// maxRetries 0, so that an attempt lost to the database counts as a lost event), the database answers
// every command with an election error for 12 s, after the writes under way lose their replies and before
// the connections are closed (drill.ElectionDrill). Every event answered 202 is then delivered once to each
// group, in order per key in the ordered group, no attempt is recorded without its POST, and every publish
// during the drill answers 503 database_unavailable within PULSE_DATABASE_TIMEOUT (and half of it, for a busy
// machine); the client re-sends those with the same id and nothing is lost.
func TestElection12s(t *testing.T) {
	runElection(t, drill.ElectionLength, "30s")
}

// The election drill of TestElection12s for 30 s: longer than the driver's default server selection timeout
// and the length of the lease, which is then 60 s (a claim is re-issued within its lease's deadline).
func TestElection30s(t *testing.T) {
	if testing.Short() {
		t.Skip("a 30 s election drill: skipped under -short")
	}
	runElection(t, 30*time.Second, "60s")
}

// electionPost is one POST the drill's receiver got.
type electionPost struct {
	group, id, key string
	seq            int
}

func runElection(t *testing.T, length time.Duration, lease string) {
	const (
		keys      = 4
		dbTimeout = 2 * time.Second
	)
	b := harness.Setup(t)
	proxy, uri := b.StartDrill()
	s := b.Start(b.FastEnv(map[string]string{
		"PULSE_MONGODB_URI":      uri,
		"PULSE_DATABASE_TIMEOUT": dbTimeout.String(),
		"PULSE_LOCK_TIMEOUT":     lease,
	}))

	var (
		mu    sync.Mutex
		posts []electionPost
	)
	rcv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		raw, _ := io.ReadAll(r.Body)
		var env struct {
			ID          string `json:"id"`
			OrderingKey string `json:"orderingKey"`
			Data        struct {
				Seq int `json:"seq"`
			} `json:"data"`
		}
		_ = json.Unmarshal(raw, &env)
		mu.Lock()
		posts = append(posts, electionPost{group: strings.TrimPrefix(r.URL.Path, "/"), id: env.ID, key: env.OrderingKey, seq: env.Data.Seq})
		mu.Unlock()
		time.Sleep(50 * time.Millisecond) // the receiver's work: keeps POSTs in flight when the drill starts
		w.WriteHeader(200)
	}))
	t.Cleanup(rcv.Close)
	groups := []string{"u", "o"}
	s.RegisterEndpoint(t, "u", map[string]any{"url": rcv.URL + "/u", "topics": []string{"t"}, "maxRetries": 0})
	s.RegisterEndpoint(t, "o", map[string]any{"url": rcv.URL + "/o", "topics": []string{"t"}, "maxRetries": 0, "ordered": true})
	postCount := func() int { mu.Lock(); defer mu.Unlock(); return len(posts) }

	// One publisher per ordering key, each publishing its events one after the other and re-sending one
	// answered 503 with the same id (as a client does), so that a key's events are stored in seq order.
	type answer struct {
		code    int
		errCode string
		took    time.Duration
	}
	var (
		amu      sync.Mutex
		answers  []answer
		accepted []string
	)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for k := range keys {
		wg.Go(func() {
			for seq := 0; ; seq++ {
				id := fmt.Sprintf("k%d-%04d", k, seq)
				for {
					select {
					case <-stop:
						return
					default:
					}
					a, err := timedRequest("POST", s.URL+"/v1/events", map[string]any{"id": id, "topic": "t", "orderingKey": fmt.Sprintf("k%d", k), "data": map[string]any{"seq": seq}})
					if err != nil {
						t.Errorf("publish %s: %v", id, err)
						return
					}
					amu.Lock()
					answers = append(answers, answer{a.code, a.errCode, a.took})
					if a.code == 202 || a.code == 200 {
						accepted = append(accepted, id)
					}
					amu.Unlock()
					if a.code == 202 || a.code == 200 {
						break
					}
					time.Sleep(100 * time.Millisecond) // the client's pause before it re-sends
				}
			}
		})
	}
	acceptedCount := func() int { amu.Lock(); defer amu.Unlock(); return len(accepted) }

	testwait.Eventually(t, 60*time.Second, "20 POSTs before the drill", func() bool { return postCount() >= 20 })
	amu.Lock()
	before := len(answers)
	amu.Unlock()
	began := proxy.Run(drill.ElectionDrill(length))
	amu.Lock()
	during := slices.Clone(answers[before:])
	amu.Unlock()
	t.Logf("drill of %s began %s; proxy %+v", length, began[0].Format(time.RFC3339Nano), proxy.Stats())
	after := acceptedCount()
	testwait.Eventually(t, 60*time.Second, "20 more events accepted after the drill", func() bool { return acceptedCount() >= after+20 })
	close(stop)
	wg.Wait()

	// Every accepted event's deliveries end (a lost claim only after its lease and the reaper).
	ctx := context.Background()
	deliveries := b.Client.Database(b.DBName).Collection("pulse.deliveries")
	want := int64(len(accepted) * len(groups))
	testwait.Eventually(t, 4*time.Minute, "every delivery to end", func() bool {
		n, err := deliveries.CountDocuments(ctx, bson.M{"status": bson.M{"$ne": "pending"}})
		return err == nil && n >= want
	})

	var f electionFigures
	f.accepted = int(want)
	for _, a := range during {
		switch {
		case a.code == 202 || a.code == 200:
		case a.code == 503 && a.errCode == "database_unavailable":
			f.answered503++
			f.slowest503 = max(f.slowest503, a.took)
		default:
			f.other++
			t.Errorf("a publish during the drill answered %d %q in %s", a.code, a.errCode, a.took)
		}
	}
	postsOf := map[string]int{} // group/id -> POSTs
	mu.Lock()
	got := slices.Clone(posts)
	mu.Unlock()
	for _, p := range got {
		postsOf[p.group+"/"+p.id]++
	}
	for _, n := range postsOf {
		f.duplicates += max(n-1, 0)
	}
	last := map[string]int{} // ordering key -> highest seq arrived at the ordered group
	seen := map[string]bool{}
	for _, p := range got {
		if p.group != "o" || seen[p.id] {
			continue
		}
		seen[p.id] = true
		if hi, ok := last[p.key]; ok && p.seq < hi {
			f.inversions++
		}
		last[p.key] = max(last[p.key], p.seq)
	}
	cur, err := deliveries.Find(ctx, bson.M{})
	if err != nil {
		t.Fatal(err)
	}
	var docs []struct {
		ID            string `bson:"_id"`
		EventID       string `bson:"eventId"`
		ConsumerGroup string `bson:"consumerGroup"`
		Status        string `bson:"status"`
		Error         *struct {
			Code    string `bson:"code"`
			Message string `bson:"message"`
		} `bson:"error"`
	}
	if err := cur.All(ctx, &docs); err != nil {
		t.Fatal(err)
	}
	history := b.Client.Database(b.DBName).Collection("pulse.history")
	for _, d := range docs {
		if d.Status == "success" {
			f.delivered++
		} else {
			why := ""
			if d.Error != nil {
				why = d.Error.Code + ": " + d.Error.Message
			}
			f.notDelivered = append(f.notDelivered, fmt.Sprintf("%s to %s %s (%s)", d.EventID, d.ConsumerGroup, d.Status, why))
		}
		n, err := history.CountDocuments(ctx, bson.M{"deliveryId": d.ID})
		if err != nil {
			t.Fatal(err)
		}
		f.attemptsWithoutPOST += max(int(n)-postsOf[d.ConsumerGroup+"/"+d.EventID], 0)
	}
	t.Logf("election drill of %s: %s", length, f)
	if f.delivered != f.accepted {
		t.Errorf("%d of %d deliveries of accepted events did not succeed: %s", f.accepted-f.delivered, f.accepted, strings.Join(f.notDelivered[:min(len(f.notDelivered), 10)], "; "))
	}
	if f.duplicates != 0 || f.inversions != 0 || f.attemptsWithoutPOST != 0 {
		t.Errorf("the drill left %d duplicate POSTs, %d per-key inversions, %d attempts without a POST; want none", f.duplicates, f.inversions, f.attemptsWithoutPOST)
	}
	if f.answered503 == 0 {
		t.Errorf("no publish answered 503 during the drill: it did not reach the database")
	}
	if f.slowest503 > dbTimeout+dbTimeout/2 {
		t.Errorf("the slowest publish answered 503 in %s during the drill, over PULSE_DATABASE_TIMEOUT %s and half of it", f.slowest503, dbTimeout)
	}
}
