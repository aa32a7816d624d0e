package devdb

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"syscall"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// MaxMessageSize is the largest wire-protocol message, in bytes, that the proxy forwards in either
// direction (48 MiB). A larger message is a protocol error that closes the client connection.
const MaxMessageSize = 48 << 20

const (
	headerSize     = 16   // bytes: messageLength, requestID, responseTo, opCode (int32 each)
	opMsg          = 2013 // OP_MSG opcode
	flagMoreToCome = 1 << 1
	dialTimeout    = 10 * time.Second
)

// Proxy is a linearizing TCP proxy for the MongoDB wire protocol. For every client connection it opens
// one upstream connection; it forwards each request and reads its one reply while holding the
// reader-writer mutex of the request's database (the $db field of an OP_MSG; "" for messages without
// one): reads (find, aggregate without $out or $merge, count, getMore, ...) share it, every other
// operation holds it alone, so a write runs alone upstream and reads run beside reads only. That restores
// the single-document atomicity MongoDB guarantees and FerretDB v1 lacks, and every operation still takes
// effect at one instant between its request and its reply; databases stay independent, so parallel
// tests on their own databases do not wait for each other. A database set to Interleaved (see
// SerializationCommand) also runs its multi-document writes a document at a time.
//
// An OP_MSG request with the moreToCome flag gets no reply and none is awaited. Exhaust replies
// (a reply with moreToCome) are not supported and close the connection. A Proxy is safe for
// concurrent use.
type Proxy struct {
	ln       net.Listener
	upstream string
	logger   *slog.Logger
	pushdown bool       // serve filters anchored on _id one id at a time (see pushdown.go)
	ids      *idIndexes // FerretDB SQLite files to give the _id index of the queries (see idindex.go); nil: none

	dbsMu sync.Mutex
	dbs   map[string]*database // database name -> its state; entries are never removed
	holds sync.Map             // *database -> *hold (hold.go)

	connsMu sync.Mutex
	conns   map[net.Conn]struct{} // open client and upstream connections
	closed  bool

	wg        sync.WaitGroup
	closeOnce sync.Once
	closeErr  error
}

// ListenProxy listens on the TCP address listen ("127.0.0.1:0" picks a free port) and forwards every
// accepted connection to the TCP address upstream. It returns once the listener is bound; connections
// are accepted in the background until Close. A nil logger discards the proxy's logs. It returns the
// listen error, if any.
func ListenProxy(listen, upstream string, logger *slog.Logger) (*Proxy, error) {
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return nil, fmt.Errorf("proxy listen: %w", err)
	}
	return NewProxy(ln, upstream, logger), nil
}

// NewProxy is ListenProxy on a listener the caller has bound; the proxy owns ln from then on.
func NewProxy(ln net.Listener, upstream string, logger *slog.Logger) *Proxy {
	return newProxy(ln, upstream, logger, false, nil)
}

// newProxy is NewProxy; with pushdown, the proxy serves filters anchored on _id one id at a time (see
// pushdown.go), which only FerretDB needs; with ids, it gives each collection a command uses the _id index
// of FerretDB's SQLite queries (see idindex.go) and closes ids when it closes.
func newProxy(ln net.Listener, upstream string, logger *slog.Logger, pushdown bool, ids *idIndexes) *Proxy {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	p := &Proxy{
		ln:       ln,
		upstream: upstream,
		logger:   logger,
		pushdown: pushdown,
		ids:      ids,
		dbs:      make(map[string]*database),
		conns:    make(map[net.Conn]struct{}),
	}
	p.wg.Add(1)
	go p.acceptLoop()
	return p
}

// Addr returns the address the proxy listens on.
func (p *Proxy) Addr() net.Addr { return p.ln.Addr() }

// Close stops accepting connections, closes every client and upstream connection and blocks until
// all of the proxy's goroutines have returned. It is safe to call more than once and returns the
// listener's close error, if any, from the first call.
func (p *Proxy) Close() error {
	p.closeOnce.Do(func() {
		p.connsMu.Lock()
		p.closed = true
		for c := range p.conns {
			_ = c.Close()
		}
		p.connsMu.Unlock()
		if err := p.ln.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
			p.closeErr = fmt.Errorf("close proxy listener: %w", err)
		}
		p.wg.Wait()
		if p.ids != nil {
			p.ids.close()
		}
	})
	return p.closeErr
}

func (p *Proxy) acceptLoop() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				p.logger.Warn("proxy accept stopped", slog.Any("error", err))
			}
			return
		}
		if !p.track(client) {
			return
		}
		p.wg.Add(1)
		go p.serve(client)
	}
}

// track registers c so that Close closes it. It closes c and reports false if the proxy is closed.
func (p *Proxy) track(c net.Conn) bool {
	p.connsMu.Lock()
	defer p.connsMu.Unlock()
	if p.closed {
		_ = c.Close()
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.connsMu.Lock()
	delete(p.conns, c)
	p.connsMu.Unlock()
	_ = c.Close()
}

func (p *Proxy) serve(client net.Conn) {
	defer p.wg.Done()
	defer p.untrack(client)

	upstream, err := net.DialTimeout("tcp", p.upstream, dialTimeout)
	if err != nil {
		p.logger.Warn("proxy upstream dial", slog.String("upstream", p.upstream), slog.Any("error", err))
		return
	}
	if !p.track(upstream) {
		return
	}
	defer p.untrack(upstream)

	err = p.relay(client, upstream)
	if err != nil && !errors.Is(err, net.ErrClosed) {
		p.logger.Warn("proxy connection closed", slog.String("client", client.RemoteAddr().String()), slog.Any("error", err))
	}
}

// errClientGone reports a request whose client closed its connection while the request waited for its
// database's mutex.
var errClientGone = errors.New("client closed the connection while its request waited")

// relay forwards requests from client to upstream and replies back until either side fails or closes.
// It returns nil when the client closes its connection between messages, or while a request waits for its
// database: a driver that timed out closes its connection, and running its request anyway would only make
// the queue behind it longer.
func (p *Proxy) relay(client, upstream net.Conn) error {
	for {
		req, err := ReadMessage(client)
		if errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) { // a client that left: nothing to report
			return nil
		}
		if err != nil {
			return fmt.Errorf("read request: %w", err)
		}
		reply, err := p.roundTrip(upstream, req, func() bool { return peerClosed(client) })
		if errors.Is(err, errClientGone) {
			return nil
		}
		if err != nil {
			return err
		}
		if reply == nil {
			continue
		}
		if _, err := client.Write(reply); err != nil {
			return fmt.Errorf("write reply: %w", err)
		}
	}
}

// roundTrip writes req upstream and reads its reply while holding the mutex of req's database: alone, or
// as its database's Serialization allows. It answers a SerializationCommand itself, returns a nil reply
// for an OP_MSG with moreToCome, and errClientGone without sending req when gone reports, once the mutex is
// held, that the client left.
func (p *Proxy) roundTrip(upstream net.Conn, req []byte, gone func() bool) ([]byte, error) {
	name, noReply := inspect(req)
	db := p.database(name)
	m, parsed := parseMsg(req)
	if parsed {
		p.holdOf(db).wait(m.name()) // a HoldCommand (hold.go)
	}
	switch {
	case parsed && m.name() == HoldCommand:
		if noReply {
			return nil, nil
		}
		return p.holdOf(db).set(m)
	case parsed && m.name() == SerializationCommand:
		if noReply {
			return nil, nil
		}
		return db.setSerialization(m)
	case noReply:
		return db.run(false, gone, func() ([]byte, error) {
			if _, err := upstream.Write(req); err != nil {
				return nil, fmt.Errorf("write request: %w", err)
			}
			return nil, nil
		})
	case parsed && db.interleaved.Load():
		defer p.indexIDs(m)
		return runInterleaved(db, upstream, req, m, gone, p.pushdown)
	case parsed:
		defer p.indexIDs(m)
		return db.run(m.isRead(), gone, func() ([]byte, error) { return forward(upstream, req, m, p.pushdown) })
	default:
		return db.run(false, gone, func() ([]byte, error) { return exchange(upstream, req) })
	}
}

// indexIDs gives the collection command m used the _id index of FerretDB's SQLite queries, once (see
// idindex.go), or forgets a dropped one; a failure is logged: queries by _id then read the whole table, as
// FerretDB alone does.
func (p *Proxy) indexIDs(m *message) {
	if p.ids == nil {
		return
	}
	db, coll, dropped := touches(m)
	if dropped {
		p.ids.forget(db, coll)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := p.ids.ensure(ctx, db, coll); err != nil {
		p.logger.Warn("index _id for FerretDB's queries", slog.Any("error", err))
	}
}

// database returns the state of database name, creating it on first use.
func (p *Proxy) database(name string) *database {
	p.dbsMu.Lock()
	defer p.dbsMu.Unlock()
	db, ok := p.dbs[name]
	if !ok {
		db = new(database)
		p.dbs[name] = db
	}
	return db
}

// ReadMessage reads one whole wire-protocol message, header included. It returns io.EOF if r is
// closed before the first byte and an error for a length below the header size or above
// MaxMessageSize.
func ReadMessage(r io.Reader) ([]byte, error) {
	var prefix [4]byte
	if _, err := io.ReadFull(r, prefix[:]); err != nil {
		return nil, err
	}
	n := int64(int32(binary.LittleEndian.Uint32(prefix[:])))
	if n < headerSize || n > MaxMessageSize {
		return nil, fmt.Errorf("message length %d outside [%d, %d] bytes", n, headerSize, MaxMessageSize)
	}
	msg := make([]byte, n)
	copy(msg, prefix[:])
	if _, err := io.ReadFull(r, msg[4:]); err != nil {
		return nil, fmt.Errorf("message body: %w", io.ErrUnexpectedEOF)
	}
	return msg, nil
}

// inspect returns the $db of an OP_MSG (from its kind-0 body section; "" when absent, unparsable or
// not an OP_MSG) and whether its moreToCome flag is set.
func inspect(msg []byte) (db string, moreToCome bool) {
	body, moreToCome := MessageBody(msg)
	if v, err := body.LookupErr("$db"); err == nil {
		db, _ = v.StringValueOK()
	}
	return db, moreToCome
}

// MessageBody returns the body (the kind-0 section, whose first element names the command) of a whole
// OP_MSG wire message as ReadMessage returns it, and whether the message's moreToCome flag is set (no reply
// follows). body is nil when msg is not an OP_MSG, has no body section or is malformed.
func MessageBody(msg []byte) (body bson.Raw, moreToCome bool) {
	if len(msg) < headerSize+4 || binary.LittleEndian.Uint32(msg[12:16]) != opMsg {
		return nil, false
	}
	flags := binary.LittleEndian.Uint32(msg[16:20])
	moreToCome = flags&flagMoreToCome != 0
	end := len(msg)
	if flags&1 != 0 { // checksumPresent: a CRC-32C trails the sections
		end -= 4
	}
	for i := headerSize + 4; i < end; {
		kind := msg[i]
		i++
		if i+4 > end {
			break
		}
		size := int(int32(binary.LittleEndian.Uint32(msg[i : i+4])))
		if size < 5 || i+size > end {
			break
		}
		if kind == 0 {
			return bson.Raw(msg[i : i+size]), moreToCome
		}
		i += size // a kind-1 section's size covers its identifier and documents
	}
	return nil, moreToCome
}

// CommandName returns the name of the command an OP_MSG body holds (its first element's key), or "".
func CommandName(body bson.Raw) string {
	if els, err := body.Elements(); err == nil && len(els) > 0 {
		return els[0].Key()
	}
	return ""
}

// Conns is the set of open connections of a relay (the tests' wire-protocol proxies), closed together when the
// relay closes. The zero value is ready; it is safe for concurrent use.
type Conns struct {
	mu     sync.Mutex
	open   map[net.Conn]bool
	closed bool
}

// Track adds cs to the set and reports true, or closes them and reports false once CloseAll was called.
func (s *Conns) Track(cs ...net.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		for _, c := range cs {
			_ = c.Close()
		}
		return false
	}
	if s.open == nil {
		s.open = map[net.Conn]bool{}
	}
	for _, c := range cs {
		s.open[c] = true
	}
	return true
}

// Untrack closes cs and removes them from the set.
func (s *Conns) Untrack(cs ...net.Conn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range cs {
		_ = c.Close()
		delete(s.open, c)
	}
}

// CloseAll closes every connection in the set, and every one tracked later.
func (s *Conns) CloseAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for c := range s.open {
		_ = c.Close()
	}
	s.open, s.closed = nil, true
}

// CloseOpen closes every connection in the set now and keeps the set open for the ones tracked later.
func (s *Conns) CloseOpen() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for c := range s.open {
		_ = c.Close()
	}
	clear(s.open)
}
