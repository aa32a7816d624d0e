package harness

import (
	"context"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/pulse-sidecar/pulse/internal/devdb"
)

// SlowDB is a TCP proxy for the MongoDB wire protocol in front of the test database that holds writes back,
// as a database with a deep write queue does: each write (insert, update, delete, findAndModify, bulkWrite) is
// forwarded a fixed delay after it arrived, and never before a write that arrived earlier; reads pass at
// once. Every write waits alike, heartbeats and results as much as bulk work, and a driver that gives up on
// one closes its connection but the write still runs (as a queued write does on a server). It is safe for
// concurrent use.
type SlowDB struct {
	// URI is the connection string of the proxy: the test database's URI with the proxy's host.
	URI string
	// dbName is the test's database, where RoundTrip writes.
	dbName string

	delay  atomic.Int64 // ns each write is held after it arrived
	writes atomic.Int64 // writes forwarded

	order sync.Mutex // held while a write waits its turn: writes are forwarded in the order they arrived
	last  time.Time  // when the latest write was forwarded
	ln    net.Listener
	wg    sync.WaitGroup
	conns devdb.Conns
}

// StartSlowDB starts a SlowDB in front of b.URI holding each write for delay; it is closed in t.Cleanup.
// Point a sidecar at it with FastEnv(map[string]string{"PULSE_MONGODB_URI": db.URI}).
func (b *Bundle) StartSlowDB(delay time.Duration) *SlowDB {
	b.T.Helper()
	u, err := url.Parse(b.URI)
	if err != nil {
		b.T.Fatalf("slowdb: parse %s: %v", b.URI, err)
	}
	upstream := u.Host
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.T.Fatal(err)
	}
	u.Host = ln.Addr().String()
	db := &SlowDB{URI: u.String(), dbName: b.DBName, ln: ln}
	db.delay.Store(int64(delay))
	db.wg.Add(1)
	go db.accept(b.T, upstream)
	b.T.Cleanup(db.close)
	return db
}

// Hold sets how long each write arriving from now on is held.
func (db *SlowDB) Hold(delay time.Duration) { db.delay.Store(int64(delay)) }

// RoundTrip returns the longest round trip of n upserts (n ≥ 1) of one document of the collection
// slowdb.roundtrip in the test's database, sent one after the other through the proxy by a client of its
// own (connected, and given one write, before the first is timed), each held as Hold says: the pace of a
// write on this machine now, under whatever else runs on it, for a test that scales its timings from it.
// It fails t when a write fails.
func (db *SlowDB) RoundTrip(t *testing.T, n int) time.Duration {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	client, err := mongo.Connect(options.Client().ApplyURI(db.URI))
	if err != nil {
		t.Fatalf("slowdb: connect: %v", err)
	}
	defer func() { _ = client.Disconnect(context.Background()) }()
	coll := client.Database(db.dbName).Collection("slowdb.roundtrip")
	write := func(i int) time.Duration {
		start := time.Now()
		_, err := coll.UpdateOne(ctx, bson.M{"_id": "rtt"}, bson.M{"$set": bson.M{"i": i}}, options.UpdateOne().SetUpsert(true))
		if err != nil {
			t.Fatalf("slowdb: write %d: %v", i, err)
		}
		return time.Since(start)
	}
	write(0) // the connection's setup is not a write's round trip
	var most time.Duration
	for i := 1; i <= max(n, 1); i++ {
		most = max(most, write(i))
	}
	return most
}

// Writes returns how many writes were forwarded so far.
func (db *SlowDB) Writes() int64 { return db.writes.Load() }

func (db *SlowDB) accept(t *testing.T, upstream string) {
	defer db.wg.Done()
	for {
		c, err := db.ln.Accept()
		if err != nil {
			return
		}
		up, err := net.DialTimeout("tcp", upstream, 10*time.Second)
		if err != nil {
			t.Logf("slowdb: dial %s: %v", upstream, err)
			_ = c.Close()
			continue
		}
		if !db.conns.Track(c, up) {
			return
		}
		db.wg.Add(1)
		go func() {
			defer db.wg.Done()
			defer db.conns.Untrack(c, up)
			db.relay(c, up)
		}()
	}
}

func (db *SlowDB) close() {
	_ = db.ln.Close()
	db.conns.CloseAll()
	db.wg.Wait()
}

// relay forwards requests and their replies until either side closes; a write is held until its delay has
// passed since it arrived and every write that arrived before it was forwarded.
func (db *SlowDB) relay(client, upstream net.Conn) {
	for {
		req, err := devdb.ReadMessage(client)
		if err != nil {
			return
		}
		write, moreToCome := classify(req)
		if write {
			due := time.Now().Add(time.Duration(db.delay.Load()))
			db.order.Lock()
			due = later(due, db.last)
			time.Sleep(time.Until(due)) // the write's wait in the slow database's queue
			db.last = due
			db.order.Unlock()
			db.writes.Add(1)
		}
		if err := db.exchange(client, upstream, req, moreToCome); err != nil {
			return
		}
	}
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func (db *SlowDB) exchange(client, upstream net.Conn, req []byte, moreToCome bool) error {
	if _, err := upstream.Write(req); err != nil {
		return err
	}
	if moreToCome {
		return nil
	}
	reply, err := devdb.ReadMessage(upstream)
	if err != nil {
		return err
	}
	_, err = client.Write(reply)
	return err
}

// writeCommands are the commands SlowDB holds back.
var writeCommands = map[string]bool{"insert": true, "update": true, "delete": true, "findAndModify": true, "bulkWrite": true}

// classify returns, for an OP_MSG, whether it is a write (its body's first key names a write command) and
// its moreToCome flag.
func classify(msg []byte) (write, moreToCome bool) {
	body, moreToCome := devdb.MessageBody(msg)
	return writeCommands[devdb.CommandName(body)], moreToCome
}
