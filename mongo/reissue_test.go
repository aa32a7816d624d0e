package mongo

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/event"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/x/mongo/driver/connstring"
	"go.mongodb.org/mongo-driver/v2/x/mongo/driver/topology"

	"github.com/pulse-sidecar/pulse/internal/devdb"
	"github.com/pulse-sidecar/pulse/mongo/storetest"
	"github.com/pulse-sidecar/pulse/pulsetype"
)

// The store re-issues a write the driver does not retry (updateMany, deleteMany, a bulk holding them) when it
// fails for the topology's sake, and only then: a stepdown's NotWritablePrimary, a RetryableWriteError label, a
// lost reply or no server found (an election without a primary) is sent again until it succeeds, however many
// tries that takes within the context's deadline (four stepdowns: more than the three tries of a count), and
// given up at the deadline; a duplicate key or a cancelled context is not sent again.
func TestReissue(t *testing.T) {
	t.Parallel()
	stepdown := mongo.CommandError{Code: 10107, Name: "NotWritablePrimary", Message: "not primary"}
	labelled := mongo.CommandError{Code: 1, Labels: []string{"RetryableWriteError"}}
	network := mongo.CommandError{Labels: []string{"NetworkError"}, Message: "connection closed"}
	noPrimary := topology.ServerSelectionError{Wrapped: errors.New("server selection timeout")}
	duplicate := mongo.WriteException{WriteErrors: []mongo.WriteError{{Code: 11000, Message: "dup"}}}
	for _, tt := range []struct {
		name      string
		failures  []error       // what the tries answer, in order; nil after them
		deadline  time.Duration // of the context; 0: a minute
		wantCalls int           // 0: at least 2, the last answering a failure
		wantErr   error
	}{
		{"a stepdown, then success", []error{stepdown}, 0, 2, nil},
		{"a lost reply (a network error), then success", []error{network}, 0, 2, nil},
		{"a labelled error twice, then success", []error{labelled, labelled}, 0, 3, nil},
		{"no server found, then success", []error{noPrimary}, 0, 2, nil},
		{"four stepdowns, then success", []error{stepdown, stepdown, stepdown, stepdown}, 0, 5, nil},
		{"a stepdown until the deadline", slices.Repeat([]error{stepdown}, 1000), 400 * time.Millisecond, 0, stepdown},
		{"a duplicate key", []error{duplicate}, 0, 1, duplicate},
		{"cancelled", []error{context.Canceled}, 0, 1, context.Canceled},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), cmp.Or(tt.deadline, time.Minute))
			defer cancel()
			calls := 0
			err := reissue(ctx, func(context.Context) error {
				calls++
				if calls <= len(tt.failures) {
					return tt.failures[calls-1]
				}
				return nil
			})
			if tt.wantCalls > 0 && calls != tt.wantCalls || tt.wantCalls == 0 && (calls < 2 || calls >= len(tt.failures)) {
				t.Errorf("write sent %d times, want %d (0: at least 2, and given up at the deadline)", calls, tt.wantCalls)
			}
			if (err == nil) != (tt.wantErr == nil) || err != nil && err.Error() != tt.wantErr.Error() {
				t.Errorf("reissue = %v, want %v", err, tt.wantErr)
			}
		})
	}
	if !retryableWrite(stepdown) || !retryableWrite(labelled) || !retryableWrite(network) || retryableWrite(duplicate) || retryableWrite(errors.New("x")) {
		t.Error("retryableWrite classifies a stepdown, a labelled error, a network error, a duplicate key and a plain error wrongly")
	}
}

// A claim and a renewal whose reply is lost after the server applied them (a network error: the driver never
// retries a multi-document update) are re-issued, and the re-issue is idempotent: the claim's second try
// matches none of the attempts its first leased, and the read-back by its token returns them all, their
// queue documents carrying the lease; a lost reply of that queue copy is re-issued too; the renewal's $max
// sets the same expiry again and reports no lease lost.
func testClaimsAndRenewalsAreReissued(t *testing.T, e *env) {
	b := e.setup(t)
	direct := b.store(nil, nil)
	b.putEndpoint(direct, "g", "t-history", "t-queue", "t-renew")
	proxy := startLossyProxy(t, b.srv.URI)
	s := New(b.srv.Connect(options.Client().SetHosts([]string{proxy.addr}).SetDirect(true)), b.options(nil))
	const n = 3

	for _, lose := range []string{"history", "queue"} {
		t.Run("claim, its "+lose+" update's reply lost", func(t *testing.T) {
			attempts := storetest.FanOutN(t, b.ctx, direct, n, "t-"+lose)
			sent := proxy.updates(testPrefix + "." + lose)
			proxy.loseNext(testPrefix + "." + lose)
			got, err := s.ClaimAttempts(b.ctx, "owner", attempts)
			if err != nil {
				t.Fatalf("ClaimAttempts = %v, want the claim re-issued", err)
			}
			if d := proxy.updates(testPrefix+"."+lose) - sent; d != 2 {
				t.Errorf("%s updates sent = %d, want 2 (the one whose reply was lost, and its re-issue)", lose, d)
			}
			if len(got) != n {
				t.Fatalf("ClaimAttempts leased %d of %d attempts", len(got), n)
			}
			for _, a := range got {
				if a.FencingToken == "" || a.FencingToken != got[0].FencingToken || a.LeaseOwner != "owner" {
					t.Errorf("attempt %s leased by %q under %q, want owner under one token %q", a.ID, a.LeaseOwner, a.FencingToken, got[0].FencingToken)
				}
				if h := b.historyDoc(a.ID); h.FencingToken != a.FencingToken {
					t.Errorf("history of %s holds token %q, want %q", a.ID, h.FencingToken, a.FencingToken)
				}
				if c := b.count("queue", bson.M{"_id": a.ID, fieldFencingToken: a.FencingToken}); c != 1 {
					t.Errorf("queue document of %s carries the lease %d times, want 1", a.ID, c)
				}
			}
		})
	}

	t.Run("renewal, its reply lost", func(t *testing.T) {
		claimed, err := direct.ClaimAttempts(b.ctx, "owner", storetest.FanOutN(t, b.ctx, direct, n, "t-renew"))
		if err != nil || len(claimed) != n {
			t.Fatalf("ClaimAttempts = %d attempts, %v", len(claimed), err)
		}
		keys := make([]pulsetype.LeaseKey, n)
		for i, a := range claimed {
			keys[i] = a.Key()
		}
		b.clock.Advance(time.Second)
		sent := proxy.updates(testPrefix + ".history")
		proxy.loseNext(testPrefix + ".history")
		lost, err := s.Renew(b.ctx, keys)
		if err != nil || len(lost) != 0 {
			t.Fatalf("Renew = lost %v, %v; want the renewal re-issued and no lease lost", lost, err)
		}
		if d := proxy.updates(testPrefix+".history") - sent; d != 2 {
			t.Errorf("history updates sent = %d, want 2 (the one whose reply was lost, and its re-issue)", d)
		}
		want := b.clock.Now().Add(30 * time.Second)
		for _, a := range claimed {
			if h := b.historyDoc(a.ID); h.LeasedUntil == nil || !h.LeasedUntil.Equal(want) {
				t.Errorf("lease of %s runs until %v, want %v", a.ID, h.LeasedUntil, want)
			}
		}
	})
}

// lossyProxy forwards the MongoDB wire protocol to one server and can lose the reply of the next update
// command on a collection: the update runs on the server, then the client's connection is closed before
// the reply reaches it, as when the network breaks or the primary steps down after a write applied. It
// counts the update commands it forwarded, per collection. It is safe for concurrent use.
type lossyProxy struct {
	addr string
	ln   net.Listener
	wg   sync.WaitGroup

	mu    sync.Mutex
	lose  map[string]bool // "command collection" -> lose the reply of its next such command (update or delete)
	sent  map[string]int  // collection -> update commands forwarded
	conns devdb.Conns
}

// startLossyProxy starts a lossyProxy in front of the first host of uri; it is closed in t.Cleanup. It
// skips t when uri names several hosts or a DNS seed list (a replica set's members would be discovered
// behind the proxy's back).
func startLossyProxy(t *testing.T, uri string) *lossyProxy {
	t.Helper()
	cs, err := connstring.Parse(uri)
	if err != nil {
		t.Fatal(err)
	}
	if len(cs.Hosts) != 1 || cs.Scheme == connstring.SchemeMongoDBSRV {
		t.Skipf("the test database %s has several hosts: a proxy in front of one cannot lose its replies", uri)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &lossyProxy{addr: ln.Addr().String(), ln: ln, lose: map[string]bool{}, sent: map[string]int{}}
	p.wg.Add(1)
	go p.accept(cs.Hosts[0])
	t.Cleanup(p.close)
	return p
}

// loseNext makes the proxy lose the reply of the next update command on coll.
func (p *lossyProxy) loseNext(coll string) { p.loseNextOf("update", coll) }

// loseNextOf makes the proxy lose the reply of the next command cmd ("update" or "delete") on coll.
func (p *lossyProxy) loseNextOf(cmd, coll string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.lose[cmd+" "+coll] = true
}

// updates returns how many update commands on coll the proxy forwarded.
func (p *lossyProxy) updates(coll string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.sent[coll]
}

func (p *lossyProxy) accept(upstream string) {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		up, err := net.DialTimeout("tcp", upstream, 10*time.Second)
		if err != nil {
			_ = c.Close()
			continue
		}
		if !p.conns.Track(c, up) {
			return
		}
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			defer p.conns.Untrack(c, up)
			p.relay(c, up)
		}()
	}
}

// relay forwards requests and replies until either side closes or a reply is lost.
func (p *lossyProxy) relay(client, upstream net.Conn) {
	for {
		req, err := devdb.ReadMessage(client)
		if err != nil {
			return
		}
		cmd, coll, moreToCome := writeOf(req)
		lost := false
		if coll != "" {
			p.mu.Lock()
			if cmd == "update" {
				p.sent[coll]++
			}
			lost, p.lose[cmd+" "+coll] = p.lose[cmd+" "+coll], false
			p.mu.Unlock()
		}
		if _, err := upstream.Write(req); err != nil || moreToCome {
			if err != nil {
				return
			}
			continue
		}
		reply, err := devdb.ReadMessage(upstream)
		if err != nil || lost { // the update ran; its reply never reaches the client
			return
		}
		if _, err := client.Write(reply); err != nil {
			return
		}
	}
}

// writeOf returns, for an OP_MSG holding an update or a delete command, the command and its collection, and
// the message's moreToCome flag.
func writeOf(msg []byte) (cmd, coll string, moreToCome bool) {
	body, moreToCome := devdb.MessageBody(msg)
	if cmd = devdb.CommandName(body); cmd == "update" || cmd == "delete" {
		coll, _ = body.Index(0).Value().StringValueOK()
	}
	return cmd, coll, moreToCome
}

func (p *lossyProxy) close() {
	_ = p.ln.Close()
	p.conns.CloseAll()
	p.wg.Wait()
}

// A write that is re-issued after its reply was lost never undoes a reopen that landed between its two tries:
// the retry of a delivery fired (through the command monitor) when the first try of CancelDelivery's removal
// of the delivery's queue documents failed keeps the queue document of the reopened attempt, and the retry
// fired when the first try of FollowUps' end of a delivery failed stays pending (neither the cancel's
// deleteMany nor the follow-up's end knew the reopened attempt; both are fenced by attempt number).
func testReissuedWritesKeepAReopen(t *testing.T, e *env) {
	b := e.setup(t)
	direct := b.store(nil, nil)
	b.putEndpoint(direct, "g", "t-cancel", "t-follow")
	proxy := startLossyProxy(t, b.srv.URI)
	var (
		mu     sync.Mutex
		reopen func() // run once, when the next command the lossy proxy loses fails
	)
	monitor := &event.CommandMonitor{Failed: func(_ context.Context, ev *event.CommandFailedEvent) {
		mu.Lock()
		f := reopen
		reopen = nil
		mu.Unlock()
		if f != nil && (ev.CommandName == "delete" || ev.CommandName == "update") {
			f()
		}
	}}
	s := New(b.srv.Connect(options.Client().SetHosts([]string{proxy.addr}).SetDirect(true).SetMonitor(monitor)), b.options(nil))
	reopenOnFailure := func(deliveryID string, want int) {
		mu.Lock()
		defer mu.Unlock()
		reopen = func() {
			if n, err := direct.RetryDelivery(b.ctx, deliveryID); err != nil || n != want {
				t.Errorf("RetryDelivery between the two tries = %d, %v; want attempt %d", n, err, want)
			}
		}
	}

	t.Run("cancel", func(t *testing.T) {
		a := storetest.FanOutN(t, b.ctx, direct, 1, "t-cancel")[0]
		reopenOnFailure(a.DeliveryID, 2)
		proxy.loseNextOf("delete", testPrefix+".queue")
		if _, err := s.CancelDelivery(b.ctx, a.DeliveryID); err != nil {
			t.Fatalf("CancelDelivery = %v, want its removal from the queue re-issued", err)
		}
		if c := b.count("queue", bson.M{"deliveryId": a.DeliveryID, "attempt": 2}); c != 1 {
			t.Errorf("queue documents of the reopened attempt 2 = %d, want 1 (the cancel's re-issued deleteMany removed it)", c)
		}
		if d, _, err := direct.GetDelivery(b.ctx, a.DeliveryID); err != nil || d.Status != pulsetype.StatusPending {
			t.Errorf("delivery after the reopen = %+v, %v; want pending", d, err)
		}
	})

	t.Run("follow-up", func(t *testing.T) {
		claimed, err := direct.ClaimAttempts(b.ctx, "owner", storetest.FanOutN(t, b.ctx, direct, 1, "t-follow"))
		if err != nil || len(claimed) != 1 {
			t.Fatalf("ClaimAttempts = %d attempts, %v", len(claimed), err)
		}
		a := claimed[0]
		cs := []pulsetype.Completion{{Attempt: a, Result: pulsetype.AttemptResult{Status: pulsetype.StatusSuccess, HTTPStatus: 200, Duration: time.Millisecond},
			Next: pulsetype.NextStep{EndStatus: pulsetype.StatusSuccess}}}
		if _, err := direct.FinishAttempts(b.ctx, cs); err != nil {
			t.Fatal(err)
		}
		reopenOnFailure(a.DeliveryID, 2)
		proxy.loseNextOf("update", testPrefix+".deliveries")
		if err := s.FollowUps(b.ctx, cs); err != nil {
			t.Fatalf("FollowUps = %v, want its end re-issued", err)
		}
		d, _, err := direct.GetDelivery(b.ctx, a.DeliveryID)
		if err != nil || d.Status != pulsetype.StatusPending || d.ReopenedAttempt != 2 {
			t.Errorf("delivery after the reopen = %+v, %v; want pending with attempt 2 (the re-issued end ended it with attempt 1)", d, err)
		}
		if c := b.count("queue", bson.M{"deliveryId": a.DeliveryID, "attempt": 2}); c != 1 {
			t.Errorf("queue documents of the reopened attempt 2 = %d, want 1", c)
		}
	})
}

// poolCleared is an error like the driver's pool cleared error ("connection pool for … was cleared because
// another operation failed with: …"), whose type the driver does not export: a driver.RetryablePoolError.
type poolCleared struct{ cause error }

func (e poolCleared) Error() string {
	return "connection pool for 127.0.0.1:27017 was cleared because another operation failed with: " + e.cause.Error()
}
func (poolCleared) Retryable() bool { return true }

// Every error of the driver's connections and pool, and every socket error, says the database is unavailable
// (the API answers 503 database_unavailable, never a bare 500), and a pool cleared before the write was sent
// is re-issued; an error of the request is neither.
func TestUnavailableCoversConnectionAndPoolErrors(t *testing.T) {
	t.Parallel()
	reset := &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}
	for _, err := range []error{
		poolCleared{reset},
		fmt.Errorf("insert events: %w", poolCleared{reset}),
		topology.ConnectionError{ConnectionID: "c1", Wrapped: reset},
		topology.WaitQueueTimeoutError{Wrapped: context.DeadlineExceeded},
		topology.ErrPoolClosed,
		reset,
		fmt.Errorf("read reply: %w", io.ErrUnexpectedEOF),
		syscall.ECONNREFUSED,
	} {
		if !unavailable(err) {
			t.Errorf("unavailable(%v) = false, want true", err)
		}
		if wrapped := wrap("publish", err); !errors.Is(wrapped, pulsetype.ErrUnavailable) {
			t.Errorf("wrap(%v) does not wrap pulsetype.ErrUnavailable", err)
		}
	}
	if !retryableWrite(poolCleared{reset}) {
		t.Error("a pool cleared error is not re-issued")
	}
	for _, err := range []error{errors.New("bad filter"), mongo.WriteException{WriteErrors: []mongo.WriteError{{Code: 11000}}}, pulsetype.ErrNotFound} {
		if unavailable(err) {
			t.Errorf("unavailable(%v) = true, want false", err)
		}
	}
}
