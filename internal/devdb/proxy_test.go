package devdb

import (
	"encoding/binary"
	"errors"
	"io"
	"net"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/pulse-sidecar/pulse/internal/testwait"
)

// opMsgFor builds an OP_MSG whose body is {cmd: 1, $db: db} with the given flagBits.
func opMsgFor(t *testing.T, db string, flags uint32) []byte {
	t.Helper()
	body, err := bson.Marshal(bson.D{{Key: "cmd", Value: 1}, {Key: "$db", Value: db}})
	if err != nil {
		t.Fatal(err)
	}
	msg := make([]byte, headerSize+4+1, headerSize+5+len(body))
	binary.LittleEndian.PutUint32(msg[12:], opMsg)
	binary.LittleEndian.PutUint32(msg[16:], flags)
	msg = append(msg, body...)
	binary.LittleEndian.PutUint32(msg[0:], uint32(len(msg)))
	return msg
}

// fakeUpstream accepts connections and answers every message without moreToCome with the same bytes.
// It records the databases of the messages it received and the most requests of one database it ever
// held unanswered at once.
type fakeUpstream struct {
	ln net.Listener

	mu          sync.Mutex
	received    []string
	inFlight    map[string]int
	maxInFlight int

	gate chan struct{} // requests of database "slow" get their reply once it is closed
}

func newFakeUpstream(t *testing.T) *fakeUpstream {
	t.Helper()
	u := &fakeUpstream{inFlight: map[string]int{}, gate: make(chan struct{})}
	u.ln = listenUpstream(t, u.serve)
	return u
}

// listenUpstream listens on a free loopback port, closed in cleanup, and serves each connection it accepts
// in a goroutine of its own.
func listenUpstream(t *testing.T, serve func(net.Conn)) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go serve(c)
		}
	}()
	return ln
}

func (u *fakeUpstream) serve(c net.Conn) {
	defer c.Close()
	for {
		msg, err := ReadMessage(c)
		if err != nil {
			return
		}
		db, noReply := inspect(msg)
		u.mu.Lock()
		u.received = append(u.received, db)
		u.inFlight[db]++
		u.maxInFlight = max(u.maxInFlight, u.inFlight[db])
		u.mu.Unlock()
		if db == "slow" {
			<-u.gate
		}
		for range 100 { // widen the window in which an overlapping request would be seen
			runtime.Gosched()
		}
		u.mu.Lock()
		u.inFlight[db]--
		u.mu.Unlock()
		if !noReply {
			if _, err := c.Write(msg); err != nil {
				return
			}
		}
	}
}

func newTestProxy(t *testing.T, upstream string) *Proxy {
	t.Helper()
	p, err := ListenProxy("127.0.0.1:0", upstream, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

func dialProxy(t *testing.T, p *Proxy) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", p.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	return c
}

func TestInspect(t *testing.T) {
	t.Parallel()
	if db, more := inspect(opMsgFor(t, "orders", 0)); db != "orders" || more {
		t.Errorf("inspect(OP_MSG $db orders) = %q, %v; want orders, false", db, more)
	}
	if db, more := inspect(opMsgFor(t, "x", flagMoreToCome)); db != "x" || !more {
		t.Errorf("inspect(OP_MSG moreToCome) = %q, %v; want x, true", db, more)
	}
	query := make([]byte, 40)
	binary.LittleEndian.PutUint32(query[12:], 2004) // OP_QUERY
	if db, more := inspect(query); db != "" || more {
		t.Errorf("inspect(OP_QUERY) = %q, %v; want empty, false", db, more)
	}
	truncated := opMsgFor(t, "cut", 0)[:headerSize+10]
	if db, _ := inspect(truncated); db != "" {
		t.Errorf("inspect(truncated) = %q, want empty", db)
	}
}

func TestProxyMoreToComeGetsNoReply(t *testing.T) {
	t.Parallel()
	up := newFakeUpstream(t)
	c := dialProxy(t, newTestProxy(t, up.ln.Addr().String()))

	if _, err := c.Write(opMsgFor(t, "a", flagMoreToCome)); err != nil {
		t.Fatal(err)
	}
	want := opMsgFor(t, "b", 0)
	if _, err := c.Write(want); err != nil {
		t.Fatal(err)
	}
	got, err := ReadMessage(c)
	if err != nil {
		t.Fatalf("read reply: %v", err)
	}
	if string(got) != string(want) {
		t.Fatalf("first reply is not the echo of the second request (the moreToCome one got a reply?)")
	}
	up.mu.Lock()
	defer up.mu.Unlock()
	if len(up.received) != 2 || up.received[0] != "a" || up.received[1] != "b" {
		t.Fatalf("upstream received %q, want [a b]", up.received)
	}
}

func TestProxyClosesOnOversizedMessage(t *testing.T) {
	t.Parallel()
	up := newFakeUpstream(t)
	c := dialProxy(t, newTestProxy(t, up.ln.Addr().String()))

	var prefix [4]byte // only the length: unread bytes would make the close a reset
	binary.LittleEndian.PutUint32(prefix[:], MaxMessageSize+1)
	if _, err := c.Write(prefix[:]); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Fatalf("read after oversized message: %v, want EOF (connection closed)", err)
	}
}

func TestProxySerializesEachDatabase(t *testing.T) {
	t.Parallel()
	up := newFakeUpstream(t)
	p := newTestProxy(t, up.ln.Addr().String())

	var wg sync.WaitGroup
	for i := range 8 {
		c := dialProxy(t, p)
		wg.Go(func() {
			for range 20 {
				msg := opMsgFor(t, "same", uint32(0))
				if _, err := c.Write(msg); err != nil {
					t.Errorf("conn %d write: %v", i, err)
					return
				}
				if _, err := ReadMessage(c); err != nil {
					t.Errorf("conn %d read: %v", i, err)
					return
				}
			}
		})
	}
	wg.Wait()
	up.mu.Lock()
	defer up.mu.Unlock()
	if up.maxInFlight != 1 {
		t.Fatalf("upstream saw %d requests of one database at once, want 1", up.maxInFlight)
	}
	if len(up.received) != 160 {
		t.Fatalf("upstream received %d requests, want 160", len(up.received))
	}
}

func TestProxyDatabasesAreIndependent(t *testing.T) {
	t.Parallel()
	up := newFakeUpstream(t)
	p := newTestProxy(t, up.ln.Addr().String())
	slow, fast := dialProxy(t, p), dialProxy(t, p)

	if _, err := slow.Write(opMsgFor(t, "slow", 0)); err != nil {
		t.Fatal(err)
	}
	testwait.Eventually(t, 10*time.Second, "the slow request to reach upstream", func() bool {
		up.mu.Lock()
		defer up.mu.Unlock()
		return slices.Contains(up.received, "slow")
	})
	// The mutex of "slow" is held until the gate opens; "fast" must not wait for it.
	if _, err := fast.Write(opMsgFor(t, "fast", 0)); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadMessage(fast); err != nil {
		t.Fatalf("fast database blocked behind slow one: %v", err)
	}
	close(up.gate)
	if _, err := ReadMessage(slow); err != nil {
		t.Fatalf("slow reply: %v", err)
	}
}

func TestProxyCloseClosesConnections(t *testing.T) {
	t.Parallel()
	up := newFakeUpstream(t)
	p := newTestProxy(t, up.ln.Addr().String())
	c := dialProxy(t, p)
	if _, err := c.Write(opMsgFor(t, "a", 0)); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadMessage(c); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := p.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := c.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Fatalf("read after Close: %v, want EOF", err)
	}
}

// A request whose client closed its connection while the request waited for its database's mutex is
// dropped, not run: drivers close a connection whose command timed out, and running those commands anyway
// makes the queue behind them grow.
func TestProxyDropsRequestsOfClientsThatLeft(t *testing.T) {
	t.Parallel()
	up := newFakeUpstream(t)
	p := newTestProxy(t, up.ln.Addr().String())
	holder := dialProxy(t, p)
	if _, err := holder.Write(opMsgFor(t, "slow", 0)); err != nil { // holds the mutex of "slow" until the gate opens
		t.Fatal(err)
	}
	received := func() int {
		up.mu.Lock()
		defer up.mu.Unlock()
		return len(up.received)
	}
	testwait.Eventually(t, 10*time.Second, "the first request to reach upstream", func() bool { return received() == 1 })

	leaver := dialProxy(t, p)
	if _, err := leaver.Write(opMsgFor(t, "slow", 0)); err != nil {
		t.Fatal(err)
	}
	conns := func() int {
		p.connsMu.Lock()
		defer p.connsMu.Unlock()
		return len(p.conns)
	}
	testwait.Eventually(t, 10*time.Second, "the second client's connections to be tracked", func() bool { return conns() == 4 })
	_ = leaver.Close()
	close(up.gate)
	if _, err := ReadMessage(holder); err != nil {
		t.Fatalf("first reply: %v", err)
	}
	testwait.Eventually(t, 10*time.Second, "the proxy to drop the second client's connection", func() bool { return conns() == 2 })
	if n := received(); n != 1 {
		t.Fatalf("upstream received %d requests, want 1: the request of the client that left was run", n)
	}
}
