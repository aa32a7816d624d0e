// Package drill is a fault-injecting TCP proxy for the MongoDB wire protocol, put in front of the test
// database to rehearse what a real deployment does that the embedded database never shows: an election, a
// lost reply, a half-open connection, a reset.
//
// A Proxy forwards every connection to one upstream server and behaves, at any moment, as its current Mode
// says:
//
//   - Pass forwards requests and replies.
//   - Election answers every command (hello included, as a server without a primary cannot serve the
//     driver's handshake or its monitor either) with one of the errors a replica set answers while it elects a
//     primary: NotWritablePrimary 10107, PrimarySteppedDown 189, InterruptedDueToReplStateChange 11602, in
//     turn. As MongoDB 4.4 and later do, an error to a command that carries a txnNumber (a retryable write)
//     has the RetryableWriteError label (retryable-writes specification, "Determining Retryable Errors"); the
//     others have no label.
//   - LoseReplies forwards writes (insert, update, delete, findAndModify, bulkWrite) and closes the client's
//     connection instead of sending their replies: the write applied and its client cannot know, as when a
//     primary steps down or the network breaks after the write. Other commands pass.
//   - Close closes every connection, new ones as soon as they are accepted.
//   - HalfOpen reads requests and never answers, and keeps every connection open: a peer that went away
//     with no reset (a cut that drops packets).
//   - Reset closes each connection with a TCP reset (SO_LINGER 0) when a request arrives.
//
// HangOpen leaves the connections open at that moment half-open for good (new ones are served as the mode
// says): the cut that stopped a sidecar's loop on its pooled connections while a fresh one answered pings.
//
// Run switches through a script of modes (a drill) and back to Pass. A Proxy counts what it did (Stats). It
// is safe for concurrent use.
package drill

import (
	"encoding/binary"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/pulse-sidecar/pulse/internal/devdb"
)

// Mode is how a Proxy treats the requests it receives (see the package comment).
type Mode int32

// The modes of a Proxy.
const (
	Pass Mode = iota
	Election
	LoseReplies
	Close
	HalfOpen
	Reset
)

func (m Mode) String() string {
	switch m {
	case Pass:
		return "pass"
	case Election:
		return "election"
	case LoseReplies:
		return "lose-replies"
	case Close:
		return "close"
	case HalfOpen:
		return "half-open"
	case Reset:
		return "reset"
	}
	return fmt.Sprintf("mode(%d)", int32(m))
}

// ElectionLength is the default length of an election drill: MongoDB's manual says an election "should not
// typically exceed 12 seconds" (Replica Set Elections) with the default settings.
const ElectionLength = 12 * time.Second

// ElectionError is one error a replica set answers while it has no primary.
type ElectionError struct {
	Code     int32
	CodeName string
	Message  string
}

// ElectionErrors are the errors Election answers, in turn.
var ElectionErrors = []ElectionError{
	{10107, "NotWritablePrimary", "not primary"},
	{189, "PrimarySteppedDown", "primary stepped down while waiting for replication"},
	{11602, "InterruptedDueToReplStateChange", "operation was interrupted because a client disconnected or the node's replication state changed"},
}

// Step is one part of a drill: Mode for Length.
type Step struct {
	Mode   Mode
	Length time.Duration
}

// ElectionDrill is the drill of an election of length d (ElectionLength when d is 0): the writes under way
// when it starts apply and lose their replies (the first sixth), then every command is answered an election
// error (four sixths), then connections are closed as the new primary takes over (the last sixth).
func ElectionDrill(d time.Duration) []Step {
	if d <= 0 {
		d = ElectionLength
	}
	return []Step{{LoseReplies, d / 6}, {Election, d - d/6 - d/6}, {Close, d / 6}}
}

// Stats counts what a Proxy did since it started.
type Stats struct {
	Forwarded   int64 // requests forwarded upstream
	Errors      int64 // requests answered with an election error
	LostReplies int64 // writes forwarded whose replies were dropped
	Closed      int64 // connections closed by Close or reset by Reset
	Held        int64 // requests read and never answered (HalfOpen)
}

// Proxy is the fault-injecting proxy (see the package comment).
type Proxy struct {
	ln       net.Listener
	upstream string
	mode     atomic.Int32
	next     atomic.Int64 // the next ElectionErrors index

	forwarded, errs, lost, closed, held atomic.Int64

	wg    sync.WaitGroup
	conns devdb.Conns
	stop  chan struct{}
	once  sync.Once

	mu      sync.Mutex
	clients map[net.Conn]bool // open client connections -> hung by HangOpen
}

// Listen starts a Proxy on a free port of the loopback interface in front of the TCP address upstream, in
// mode Pass. Close stops it.
func Listen(upstream string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("drill listen: %w", err)
	}
	p := &Proxy{ln: ln, upstream: upstream, stop: make(chan struct{}), clients: map[net.Conn]bool{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr returns the host:port the proxy listens on.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Mode returns the current mode.
func (p *Proxy) Mode() Mode { return Mode(p.mode.Load()) }

// Set switches to mode m from now on. Leaving HalfOpen lets the held connections go: they are closed, as a
// peer that comes back resets the connections it no longer knows.
func (p *Proxy) Set(m Mode) {
	if old := Mode(p.mode.Swap(int32(m))); old == HalfOpen && m != HalfOpen {
		p.conns.CloseOpen()
	}
}

// HangOpen makes every client connection open now stop answering, whatever the mode, until the proxy
// closes: each reads on and never answers, as a connection left half-open by a cut without a reset does.
// Connections accepted later are served as the mode says. It returns how many connections it hung.
func (p *Proxy) HangOpen() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.clients {
		p.clients[c] = true
	}
	return len(p.clients)
}

func (p *Proxy) hung(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.clients[c]
}

// Run runs the drill steps, one after the other, then switches back to Pass; it blocks until then or until
// the proxy closes. It returns when each step began (the drill's start is the first).
func (p *Proxy) Run(steps []Step) []time.Time {
	began := make([]time.Time, 0, len(steps))
	for _, s := range steps {
		began = append(began, time.Now())
		p.Set(s.Mode)
		t := time.NewTimer(s.Length)
		select {
		case <-t.C:
		case <-p.stop:
			t.Stop()
			return began
		}
	}
	p.Set(Pass)
	return began
}

// Stats returns the counts so far.
func (p *Proxy) Stats() Stats {
	return Stats{Forwarded: p.forwarded.Load(), Errors: p.errs.Load(), LostReplies: p.lost.Load(), Closed: p.closed.Load(), Held: p.held.Load()}
}

// Close stops accepting, closes every connection and waits for the proxy's goroutines. It is safe twice.
func (p *Proxy) Close() error {
	var err error
	p.once.Do(func() {
		close(p.stop)
		err = p.ln.Close()
		p.conns.CloseAll()
		p.wg.Wait()
	})
	return err
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		if p.Mode() == Close {
			p.closed.Add(1)
			_ = c.Close()
			continue
		}
		if !p.conns.Track(c) {
			return
		}
		p.mu.Lock()
		p.clients[c] = false
		p.mu.Unlock()
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			defer func() {
				p.mu.Lock()
				delete(p.clients, c)
				p.mu.Unlock()
			}()
			defer p.conns.Untrack(c)
			p.serve(c)
		}()
	}
}

// serve relays one client connection; its upstream connection is dialled on the first request forwarded.
func (p *Proxy) serve(client net.Conn) {
	var up net.Conn
	defer func() {
		if up != nil {
			p.conns.Untrack(up)
		}
	}()
	for {
		req, err := devdb.ReadMessage(client)
		if err != nil {
			return
		}
		body, moreToCome := devdb.MessageBody(req)
		if p.hung(client) {
			p.held.Add(1)
			continue // read on, never answer
		}
		switch p.Mode() {
		case Close:
			p.closed.Add(1)
			return
		case Reset:
			p.closed.Add(1)
			if tc, ok := client.(*net.TCPConn); ok {
				_ = tc.SetLinger(0) // the close sends RST, not FIN
			}
			return
		case HalfOpen:
			p.held.Add(1)
			continue // read on, never answer
		case Election:
			p.errs.Add(1)
			if body == nil { // not an OP_MSG (a legacy OP_QUERY handshake): no command reply to give, the connection fails
				return
			}
			if moreToCome {
				continue
			}
			if _, err := client.Write(errorReply(req, body, p.electionError())); err != nil {
				return
			}
			continue
		}
		if up == nil {
			if up, err = net.DialTimeout("tcp", p.upstream, 10*time.Second); err != nil {
				return
			}
			if !p.conns.Track(up) {
				up = nil
				return
			}
		}
		lose := p.Mode() == LoseReplies && writes[devdb.CommandName(body)]
		p.forwarded.Add(1)
		if _, err := up.Write(req); err != nil {
			return
		}
		if moreToCome {
			continue
		}
		reply, err := devdb.ReadMessage(up)
		if err != nil {
			return
		}
		if lose {
			p.lost.Add(1)
			return // the write applied; its reply never reaches the client
		}
		if _, err := client.Write(reply); err != nil {
			return
		}
	}
}

func (p *Proxy) electionError() ElectionError {
	n := p.next.Add(1) - 1
	return ElectionErrors[n%int64(len(ElectionErrors))]
}

// writes are the commands LoseReplies applies without answering.
var writes = map[string]bool{"insert": true, "update": true, "delete": true, "findAndModify": true, "bulkWrite": true}

// errorReply returns an OP_MSG reply to req (whose body is body) holding e as a command error:
// {ok: 0, errmsg, code, codeName}, with errorLabels [RetryableWriteError] when body carries a txnNumber.
func errorReply(req []byte, body bson.Raw, e ElectionError) []byte {
	doc := bson.D{{Key: "ok", Value: 0.0}, {Key: "errmsg", Value: e.Message}, {Key: "code", Value: e.Code}, {Key: "codeName", Value: e.CodeName}}
	if body != nil {
		if _, err := body.LookupErr("txnNumber"); err == nil {
			doc = append(doc, bson.E{Key: "errorLabels", Value: bson.A{"RetryableWriteError"}})
		}
	}
	raw, err := bson.Marshal(doc)
	if err != nil {
		panic(err) // a fixed document always marshals
	}
	const header = 16
	msg := make([]byte, header+4+1+len(raw))
	binary.LittleEndian.PutUint32(msg[0:], uint32(len(msg)))
	binary.LittleEndian.PutUint32(msg[4:], 0)                                    // requestID
	binary.LittleEndian.PutUint32(msg[8:], binary.LittleEndian.Uint32(req[4:8])) // responseTo
	binary.LittleEndian.PutUint32(msg[12:], 2013)                                // OP_MSG
	binary.LittleEndian.PutUint32(msg[16:], 0)                                   // flagBits
	msg[20] = 0                                                                  // section kind 0: the body
	copy(msg[21:], raw)
	return msg
}
