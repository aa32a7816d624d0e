package bench

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// historyBatch is how many events one request of the untimed history phase publishes (an array).
const historyBatch = 100

// publisher sends the bench's events to the replicas' APIs and records how long each publish took.
type publisher struct {
	apis []string
	rcv  *receiver
	keys int // give event i the ordering key k<i mod keys>; 0: none
	// client sends the measured run's publishes (nil: http.DefaultClient).
	client *http.Client

	sent atomic.Int64 // events of the untimed phases (history) answered 202 so far

	mu  sync.Mutex
	lat []time.Duration // publish request → 202, per event of the measured run
	err error           // the first failed publish
}

// body returns the publish request of event i with id.
func (p *publisher) body(id string, i int) string {
	key := ""
	if p.keys > 0 {
		key = fmt.Sprintf(`,"orderingKey":"k%d"`, i%p.keys)
	}
	return fmt.Sprintf(`{"id":%q,"topic":"bench","data":{"i":%d}%s}`, id, i, key)
}

// one publishes event i in a request of its own through replica i mod replicas, and records the time from
// since (when the request was due) to its answer.
func (p *publisher) one(ctx context.Context, i int, since time.Time) {
	id := fmt.Sprintf("bench-%d", i)
	p.rcv.published(id, since)
	url, body := p.apis[i%len(p.apis)]+"/v1/events", p.body(id, i)
	err := send(ctx, p.client, "POST", url, body, http.StatusAccepted)
	// A 503 (database_unavailable: an election, a lost connection) is re-sent with the same id, as a client
	// should: the publish is idempotent by id (docs/api.md), so the event is stored once.
	for wait := 50 * time.Millisecond; err != nil && strings.Contains(err.Error(), " answered 503:"); wait = min(2*wait, time.Second) {
		select {
		case <-ctx.Done():
		case <-time.After(wait):
			err = send(ctx, p.client, "POST", url, body, http.StatusAccepted)
			continue
		}
		break
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if err != nil && p.err == nil {
		p.err = err
	}
	p.lat = append(p.lat, time.Since(since))
}

// closedLoop publishes events 0..n-1 with clients concurrent clients, each sending its next event when the
// previous one was answered. It blocks until every publish was answered.
func (p *publisher) closedLoop(ctx context.Context, n, clients int) {
	work := make(chan int)
	var wg sync.WaitGroup
	for range clients {
		wg.Go(func() {
			for i := range work {
				p.one(ctx, i, time.Now())
			}
		})
	}
	for i := range n {
		work <- i
	}
	close(work)
	wg.Wait()
}

// openLoop publishes events 0..n-1 at rate per second, event i due at start + i/rate whatever earlier
// publishes take (each in a goroutine of its own), so latency is measured at a fixed load and counted from
// when each publish was due. It blocks until every publish was answered or ctx ends.
func (p *publisher) openLoop(ctx context.Context, n int, rate float64) {
	start := time.Now()
	var wg sync.WaitGroup
	defer wg.Wait()
	for i := range n {
		due := start.Add(time.Duration(float64(i) / rate * float64(time.Second)))
		if d := time.Until(due); d > 0 {
			select {
			case <-ctx.Done():
				return
			case <-time.After(d):
			}
		}
		wg.Go(func() { p.one(ctx, i, due) })
	}
}

// history publishes n events with ids <prefix>-<i>, in arrays of historyBatch with clients concurrent
// clients, untimed: the history (retained, not measured) and the backlog of --pending.
func (p *publisher) history(ctx context.Context, prefix string, n, clients int) error {
	work := make(chan int)
	var wg sync.WaitGroup
	var first error
	var mu sync.Mutex
	for range clients {
		wg.Go(func() {
			for from := range work {
				var events []string
				for i := from; i < min(from+historyBatch, n); i++ {
					events = append(events, p.body(fmt.Sprintf("%s-%d", prefix, i), i))
				}
				err := request(ctx, "POST", p.apis[from/historyBatch%len(p.apis)]+"/v1/events", "["+strings.Join(events, ",")+"]", http.StatusAccepted)
				if err == nil {
					p.sent.Add(int64(len(events)))
				}
				mu.Lock()
				first = cmpErr(first, err)
				mu.Unlock()
			}
		})
	}
	for from := 0; from < n; from += historyBatch {
		work <- from
	}
	close(work)
	wg.Wait()
	return first
}

// cmpErr returns a unless it is nil, else b.
func cmpErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// latencies returns the publish latencies recorded so far.
func (p *publisher) latencies() []time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]time.Duration(nil), p.lat...)
}
