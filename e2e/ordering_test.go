package e2e

import (
	"bytes"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pulse-sidecar/pulse/e2e/internal/harness"
	"github.com/pulse-sidecar/pulse/internal/testwait"
)

// published is what a publish answered for one event.
type published struct {
	ID        string    `json:"id"`
	CreatedAt time.Time `json:"createdAt"`
}

// orderOf returns the ids of the events a receiver got, first POST of each, in arrival order.
func orderOf(r *harness.Receiver) []string {
	var out []string
	seen := map[string]bool{}
	for _, g := range r.Received() {
		if id := g.Header.Get("Idempotency-Key"); !seen[id] {
			seen[id] = true
			out = append(out, id)
		}
	}
	return out
}

// inversions counts the pairs of arrival order that contradict (createdAt, id) order.
func inversions(t *testing.T, arrival []string, events map[string]time.Time) int {
	t.Helper()
	n := 0
	for i := range arrival {
		for j := i + 1; j < len(arrival); j++ {
			a, b := arrival[i], arrival[j]
			ta, tb := events[a], events[b]
			if ta.IsZero() || tb.IsZero() {
				t.Fatalf("no createdAt known for %s or %s", a, b)
			}
			if tb.Before(ta) || tb.Equal(ta) && b < a {
				n++
			}
		}
	}
	return n
}

// createdAtOf reads an event's createdAt through the API.
func createdAtOf(s *harness.Sidecar, t *testing.T, id string) time.Time {
	t.Helper()
	return harness.Get[struct {
		CreatedAt time.Time `json:"createdAt"`
	}](t, s.URL+"/v1/events/"+id).CreatedAt
}

// A publisher SIGKILLed after its event E1 is durable but before it fanned it out: E2, published later
// through another replica, reaches the ordered group only after E1 (whose delivery the repair creates a
// lease timeout later).
func TestOrderHoldsWhenThePublisherDiesBeforeFanOut(t *testing.T) {
	b := harness.Setup(t)
	s := b.Start(b.FastEnv(harness.ShortLease))
	rcv := harness.NewReceiver(t, 200)
	s.RegisterEndpoint(t, "ledger", map[string]any{"url": rcv.URL, "topics": []string{"o"}, "ordered": true})
	crashEnv := b.FastEnv(harness.ShortLease)
	crashEnv["PULSE_TEST_CRASH_AFTER_PUBLISH"] = "true"
	doomed := b.StartProcess(crashEnv)
	var e1 published
	if code := harness.Do(t, "POST", doomed.URL+"/v1/events", map[string]any{"topic": "o", "data": 1}, &e1); code != 202 {
		t.Fatalf("publish through the doomed replica answered %d", code)
	}
	select {
	case <-doomed.Done:
	case <-time.After(20 * time.Second):
		t.Fatal("the doomed replica did not die")
	}
	e2 := s.Publish(t, "o", 2)
	s.WantSuccess(t, "ledger", 30*time.Second, e1.ID, e2)
	if got := strings.Join(orderOf(rcv), ","); got != e1.ID+","+e2 {
		t.Fatalf("the ordered group got %s, want E1 (%s) before E2 (%s)", got, e1.ID, e2)
	}
}

// An ordered group registered with offsetReset earliest while 60 events are retained and live events keep
// arriving through two replicas: it receives every event once, in (createdAt, id) order, none live before
// an older retained one.
func TestOrderHoldsWhileABackfillRacesLivePublishes(t *testing.T) {
	b := harness.Setup(t)
	env := b.FastEnv()
	// FastEnv's long leases also keep the recovery periods slow: with 600 ms leases the repair scans of two
	// replicas saturated the serialized test database and an ordered group (one POST at a time) crawled.
	s1, s2 := b.Start(env), b.Start(env)
	const retained = 60
	created := map[string]time.Time{}
	var mu sync.Mutex
	for range 3 {
		batch := make([]map[string]any, retained/3)
		for i := range batch {
			batch[i] = map[string]any{"topic": "bf.t", "data": i}
		}
		var out []published
		if code := harness.Do(t, "POST", s1.URL+"/v1/events", batch, &out); code != 202 {
			t.Fatalf("publish answered %d", code)
		}
		for _, p := range out {
			created[p.ID] = p.CreatedAt
		}
	}
	stop, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond): // the publishing client's own pace
			}
			via := []*harness.Sidecar{s1, s2}[i%2]
			var p published
			if harness.Do(t, "POST", via.URL+"/v1/events", map[string]any{"topic": "bf.t", "data": i}, &p) == 202 {
				mu.Lock()
				created[p.ID] = p.CreatedAt
				mu.Unlock()
			}
		}
	}()
	rcv := harness.NewReceiver(t, 200)
	s1.RegisterEndpoint(t, "audit", map[string]any{"url": rcv.URL, "topics": []string{"bf.t"}, "ordered": true, "offsetReset": "earliest"})
	testwait.Eventually(t, 3*time.Minute, "20 live events after the registration", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(created) >= retained+20
	})
	close(stop)
	<-stopped
	mu.Lock()
	total := len(created)
	mu.Unlock()
	testwait.Eventually(t, 240*time.Second, "every event to reach the ordered group", func() bool { return len(orderOf(rcv)) == total })
	arrival := orderOf(rcv)
	mu.Lock()
	defer mu.Unlock()
	if n := inversions(t, arrival, created); n != 0 {
		t.Fatalf("%d of %d events arrived out of (createdAt, id) order", n, len(arrival))
	}
	t.Logf("%d events (%d retained, %d live) arrived in order", len(arrival), retained, len(arrival)-retained)
}

// startBehindPauseProxy starts a sidecar with env whose database connections go through a pauseProxy.
func startBehindPauseProxy(b *harness.Bundle, env map[string]string) (*harness.Sidecar, *pauseProxy) {
	b.T.Helper()
	host := strings.TrimSuffix(strings.TrimPrefix(b.URI, "mongodb://"), "/")
	host, _, _ = strings.Cut(host, "/")
	proxy := newPauseProxy(b.T, host)
	behind := map[string]string{}
	for k, v := range env {
		behind[k] = v
	}
	behind["PULSE_MONGODB_URI"] = "mongodb://" + proxy.ln.Addr().String() + "/"
	return b.Start(behind), proxy
}

// pauseProxy forwards TCP connections to upstream; while paused it holds every byte its clients send, or,
// paused with a marker, only the first write holding the marker and what follows it on that connection (so
// that the driver's other connections, new ones included, are not held: a pool that needed a new
// connection while everything was held never sent the marked write).
type pauseProxy struct {
	ln       net.Listener
	upstream string
	mu       sync.Mutex
	gate     chan struct{} // closed while open; a fresh channel while paused
	marker   []byte        // a write holding these bytes signals held when it is stopped by the pause
	held     chan struct{}
}

func newPauseProxy(t *testing.T, upstream string) *pauseProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &pauseProxy{ln: ln, upstream: upstream, gate: make(chan struct{}), held: make(chan struct{}, 1)}
	close(p.gate)
	t.Cleanup(func() { ln.Close(); p.resume() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go p.serve(c)
		}
	}()
	return p
}

func (p *pauseProxy) serve(c net.Conn) {
	defer c.Close()
	u, err := net.Dial("tcp", p.upstream)
	if err != nil {
		return
	}
	defer u.Close()
	go func() { _, _ = io.Copy(c, u); c.Close() }()
	_, _ = io.Copy(gatedWriter{p, u}, c)
}

type gatedWriter struct {
	p *pauseProxy
	w io.Writer
}

func (g gatedWriter) Write(b []byte) (int, error) {
	g.p.mu.Lock()
	gate, marker := g.p.gate, g.p.marker
	g.p.mu.Unlock()
	select {
	case <-gate:
	default:
		if len(marker) > 0 {
			if !bytes.Contains(b, marker) {
				break // paused for one write: the others pass
			}
			g.p.held <- struct{}{}
		}
		<-gate
	}
	return g.w.Write(b)
}

func (p *pauseProxy) pause(marker string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.marker = []byte(marker)
	select {
	case <-p.gate:
		p.gate = make(chan struct{})
	default:
	}
}

func (p *pauseProxy) resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.gate:
	default:
		close(p.gate)
	}
}

// A publish whose insert stalls on its way to the database (E1), while a later publish through another
// replica (E2) is stored and delivered: the ordered group's arrival order is the (createdAt, id) order the
// API reports, because createdAt is stamped when the write reaches the database.
func TestOrderHoldsWhenAnInsertStalls(t *testing.T) {
	b := harness.Setup(t)
	stalled, proxy := startBehindPauseProxy(b, b.FastEnv())
	s := b.Start(b.FastEnv())
	rcv := harness.NewReceiver(t, 200)
	s.RegisterEndpoint(t, "ledger", map[string]any{"url": rcv.URL, "topics": []string{"o"}, "ordered": true})

	proxy.pause("stalled-insert-e1")
	e1 := make(chan published, 1)
	go func() {
		var p published
		harness.Do(t, "POST", stalled.URL+"/v1/events", map[string]any{"topic": "o", "data": "stalled-insert-e1"}, &p)
		e1 <- p
	}()
	select { // E1's write is on its way to the database, held by the proxy
	case <-proxy.held:
	case <-time.After(20 * time.Second):
		t.Fatal("E1's write never reached the proxy")
	}
	e2 := s.Publish(t, "o", 2)
	testwait.Eventually(t, 20*time.Second, "E2 to be delivered while E1's insert stalls", func() bool { return len(orderOf(rcv)) == 1 })
	proxy.resume()
	first := <-e1
	if first.ID == "" {
		t.Fatal("the stalled publish failed")
	}
	testwait.Eventually(t, 30*time.Second, "E1 to be delivered", func() bool { return len(orderOf(rcv)) == 2 })
	created := map[string]time.Time{first.ID: createdAtOf(s, t, first.ID), e2: createdAtOf(s, t, e2)}
	if n := inversions(t, orderOf(rcv), created); n != 0 {
		t.Fatalf("arrival %v contradicts createdAt %v", orderOf(rcv), created)
	}
}
