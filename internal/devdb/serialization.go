package devdb

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// Serialization is how the proxy orders the operations on one database.
type Serialization string

const (
	// Linearized runs each write on a database alone and whole (a write to many documents is atomic,
	// which is more than MongoDB promises); reads run beside other reads, never beside a write. Every
	// database starts Linearized.
	Linearized Serialization = "linearized"
	// Interleaved runs what MongoDB lets run side by side without transactions. Reads of a database run
	// together, as Linearized. An insert, update or delete command runs one document at a time: one command upstream per
	// document, each alone on its database, other clients' operations in between. A statement that updates
	// or deletes many documents first reads the _id of the documents its filter matches, then writes each
	// one whose document still matches; an upsert, or a statement with a collation, hint or sort, runs whole.
	//
	// It is safe on FerretDB v1 because what FerretDB lacks stays supplied: a write to one document
	// (findAndModify, one statement's document) still runs alone on its database, so its read-modify-write
	// is atomic, and a read never runs beside a write. Concurrent reads are what FerretDB's handlers serve
	// anyway (SQLite in WAL mode, PostgreSQL). Reads beside reads, and other operations between the
	// documents of one write, are interleavings a MongoDB server allows, so a store that is correct on
	// MongoDB passes in both modes.
	Interleaved Serialization = "interleaved"
)

// SerializationCommand is the command a client sends through the proxy to set the serialization of the
// command's $db, as in {devdbSerialization: "interleaved", $db: "orders"}. The proxy answers it itself:
// {ok: 1, serialization: "interleaved"}, or ok 0 with code 2 (BadValue) for a value other than
// Linearized or Interleaved.
const SerializationCommand = "devdbSerialization"

// database is the proxy's state of one database.
type database struct {
	// mu is held by every operation on the database: shared by reads when interleaved, alone otherwise.
	mu          sync.RWMutex
	interleaved atomic.Bool
}

// run calls f while holding db's mutex, shared or alone. It returns errClientGone without calling f when
// gone (nil: never) reports, once the mutex is held, that the client left.
func (db *database) run(shared bool, gone func() bool, f func() ([]byte, error)) ([]byte, error) {
	if shared {
		db.mu.RLock()
		defer db.mu.RUnlock()
	} else {
		db.mu.Lock()
		defer db.mu.Unlock()
	}
	if gone != nil && gone() {
		return nil, errClientGone
	}
	return f()
}

// setSerialization answers a SerializationCommand.
func (db *database) setSerialization(m *message) ([]byte, error) {
	v, _ := m.body.Index(0).Value().StringValueOK()
	switch Serialization(v) {
	case Linearized, Interleaved:
		db.interleaved.Store(Serialization(v) == Interleaved)
		return replyMsg(m.requestID, bson.D{{Key: "serialization", Value: v}, {Key: "ok", Value: 1.0}})
	default:
		return replyMsg(m.requestID, bson.D{{Key: "ok", Value: 0.0}, {Key: "code", Value: int32(2)}, {Key: "codeName", Value: "BadValue"},
			{Key: "errmsg", Value: fmt.Sprintf("%s: %q is neither %q nor %q", SerializationCommand, v, Linearized, Interleaved)}})
	}
}

// message is a parsed OP_MSG request: its body and its document sequences (kind-1 sections).
type message struct {
	requestID int32
	body      bson.Raw
	sequences map[string][]bson.Raw
}

// parseMsg parses an OP_MSG without checksum. It reports false for any other message or a malformed one.
func parseMsg(msg []byte) (*message, bool) {
	if len(msg) < headerSize+4 || binary.LittleEndian.Uint32(msg[12:16]) != opMsg || binary.LittleEndian.Uint32(msg[16:20])&1 != 0 {
		return nil, false
	}
	m := &message{requestID: int32(binary.LittleEndian.Uint32(msg[4:8])), sequences: map[string][]bson.Raw{}}
	for i := headerSize + 4; i < len(msg); {
		kind := msg[i]
		i++
		if i+4 > len(msg) {
			return nil, false
		}
		size := int(int32(binary.LittleEndian.Uint32(msg[i : i+4])))
		if size < 5 || i+size > len(msg) {
			return nil, false
		}
		section := msg[i : i+size]
		i += size
		switch kind {
		case 0:
			m.body = bson.Raw(section)
		case 1:
			id, docs, ok := parseSequence(section[4:])
			if !ok {
				return nil, false
			}
			m.sequences[id] = docs
		default:
			return nil, false
		}
	}
	if m.body == nil || m.body.Validate() != nil {
		return nil, false
	}
	return m, true
}

// parseSequence splits a kind-1 section after its size: a NUL-terminated identifier, then documents.
func parseSequence(b []byte) (string, []bson.Raw, bool) {
	n := 0
	for n < len(b) && b[n] != 0 {
		n++
	}
	if n == len(b) {
		return "", nil, false
	}
	id, b := string(b[:n]), b[n+1:]
	var docs []bson.Raw
	for len(b) > 0 {
		if len(b) < 5 {
			return "", nil, false
		}
		size := int(int32(binary.LittleEndian.Uint32(b)))
		if size < 5 || size > len(b) {
			return "", nil, false
		}
		doc := bson.Raw(b[:size])
		if doc.Validate() != nil {
			return "", nil, false
		}
		docs = append(docs, doc)
		b = b[size:]
	}
	return id, docs, true
}

// name returns the command's name: the first key of its body.
func (m *message) name() string {
	e, err := m.body.IndexErr(0)
	if err != nil {
		return ""
	}
	return e.Key()
}

// list returns the documents of field key: a document sequence or an array of the body.
func (m *message) list(key string) ([]bson.Raw, bool) {
	if docs, ok := m.sequences[key]; ok {
		return docs, true
	}
	arr, ok := m.body.Lookup(key).ArrayOK()
	if !ok {
		return nil, false
	}
	vals, err := arr.Values()
	if err != nil {
		return nil, false
	}
	docs := make([]bson.Raw, len(vals))
	for i, v := range vals {
		if docs[i], ok = v.DocumentOK(); !ok {
			return nil, false
		}
	}
	return docs, true
}

// readCommands are the commands that change nothing a client can read (aggregate only without $out or
// $merge).
var readCommands = map[string]bool{
	"find": true, "getMore": true, "aggregate": true, "count": true, "distinct": true, "explain": true,
	"listIndexes": true, "listCollections": true, "listDatabases": true, "dbStats": true, "collStats": true,
	"hello": true, "isMaster": true, "ismaster": true, "ping": true, "buildInfo": true, "buildinfo": true,
	"connectionStatus": true,
}

// isRead reports whether m only reads.
func (m *message) isRead() bool {
	name := m.name()
	if !readCommands[name] {
		return false
	}
	if name != "aggregate" {
		return true
	}
	stages, _ := m.list("pipeline")
	for _, st := range stages {
		if e, err := st.IndexErr(0); err != nil || e.Key() == "$out" || e.Key() == "$merge" {
			return false
		}
	}
	return true
}

// writeLists are the commands that Interleaved runs one document at a time, and the field of each that
// holds its documents or statements.
var writeLists = map[string]string{"insert": "documents", "update": "updates", "delete": "deletes"}

// runInterleaved runs req, an operation on db, as Interleaved says; gone is checked once, before its first
// step. With pushdown, each command sent upstream is served by pushdown when it allows it.
func runInterleaved(db *database, upstream net.Conn, req []byte, m *message, gone func() bool, pushdown bool) ([]byte, error) {
	if m.isRead() {
		return db.run(true, gone, func() ([]byte, error) { return forward(upstream, req, m, pushdown) })
	}
	key, isWrite := writeLists[m.name()]
	stmts, ok := m.list(key)
	if !isWrite || !ok || len(stmts) == 0 || has(m.body, "autocommit") {
		return db.run(false, gone, func() ([]byte, error) { return forward(upstream, req, m, pushdown) })
	}
	w := &splitWrite{upstream: upstream, m: m, key: key}
	w.send = func(shared bool, cmd bson.D) (bson.Raw, []byte, error) {
		req, err := requestMsg(m.requestID, cmd)
		if err != nil {
			return nil, nil, fmt.Errorf("interleave %s: %w", m.name(), err)
		}
		reply, err := db.run(shared, takeGone(&gone), func() ([]byte, error) {
			sub, _ := parseMsg(req)
			return forward(upstream, req, sub, pushdown)
		})
		if err != nil {
			return nil, nil, err
		}
		body, ok := replyBody(reply)
		if !ok {
			return nil, reply, nil
		}
		return body, nil, nil
	}
	return w.run(stmts)
}

// splitWrite is an insert, update or delete command run one document at a time, and the sum of its
// steps' replies.
type splitWrite struct {
	upstream net.Conn
	m        *message
	key      string
	// send sends one command upstream (a find holding the database's mutex shared, a step alone) and
	// returns the body of its reply, or the reply as is when it is a command error (ok 0).
	send func(shared bool, cmd bson.D) (body bson.Raw, failed []byte, err error)

	n, nModified      int32
	upserted          bson.A
	writeErrors       bson.A
	writeConcernError bson.RawValue
}

// run runs every statement and returns the reply of the whole command: the sum of the steps' replies,
// or the first reply that is a command error, as the server sent it.
func (w *splitWrite) run(stmts []bson.Raw) ([]byte, error) {
	ordered := true
	if v, ok := w.m.body.Lookup("ordered").BooleanOK(); ok {
		ordered = v
	}
	for i, stmt := range stmts {
		failed, stop, err := w.statement(int32(i), stmt)
		if failed != nil || err != nil {
			return failed, err
		}
		if stop && ordered {
			break
		}
	}
	return w.reply()
}

// reply returns the reply of the whole command: the sum of the steps' replies.
func (w *splitWrite) reply() ([]byte, error) {
	reply := bson.D{{Key: "n", Value: w.n}}
	if w.m.name() == "update" {
		reply = append(reply, bson.E{Key: "nModified", Value: w.nModified})
	}
	if len(w.upserted) > 0 {
		reply = append(reply, bson.E{Key: "upserted", Value: w.upserted})
	}
	if len(w.writeErrors) > 0 {
		reply = append(reply, bson.E{Key: "writeErrors", Value: w.writeErrors})
	}
	if w.writeConcernError.Type != 0 {
		reply = append(reply, bson.E{Key: "writeConcernError", Value: w.writeConcernError})
	}
	return replyMsg(w.m.requestID, append(reply, bson.E{Key: "ok", Value: 1.0}))
}

// statement runs statement i: one step, or one per matching document (see perDocument). It returns a
// reply to send as is (a command error), or whether a write error stopped it.
func (w *splitWrite) statement(i int32, stmt bson.Raw) (failed []byte, stop bool, err error) {
	if !w.perDocument(stmt) {
		return w.step(i, stmt)
	}
	q, _ := stmt.Lookup("q").DocumentOK()
	ids, failed, err := w.matching(q)
	if failed != nil || err != nil {
		return failed, false, err
	}
	for _, id := range ids {
		one := bson.D{}
		for _, e := range elements(stmt) {
			switch e.Key() {
			case "q", "multi", "limit":
			default:
				one = append(one, bson.E{Key: e.Key(), Value: e.Value()})
			}
		}
		// _id first: FerretDB's PostgreSQL handler pushes a top-level _id down to its query.
		one = append(one, bson.E{Key: "q", Value: bson.D{{Key: "_id", Value: id}, {Key: "$and", Value: bson.A{q}}}})
		if w.m.name() == "delete" {
			one = append(one, bson.E{Key: "limit", Value: int32(1)})
		}
		raw, err := bson.Marshal(one)
		if err != nil {
			return nil, false, fmt.Errorf("interleave %s: %w", w.m.name(), err)
		}
		if failed, stop, err := w.step(i, raw); failed != nil || stop || err != nil {
			return failed, stop, err
		}
	}
	return nil, false, nil
}

// perDocument reports whether stmt writes many documents and runs one step per document: an update with
// multi true or a delete with limit 0, without upsert, collation, hint or sort, in a command without let
// (the _id query could not see its variables).
func (w *splitWrite) perDocument(stmt bson.Raw) bool {
	if truthy(stmt.Lookup("upsert")) || has(w.m.body, "let") || has(stmt, "collation") || has(stmt, "hint") || has(stmt, "sort") {
		return false
	}
	if _, ok := stmt.Lookup("q").DocumentOK(); !ok {
		return false
	}
	switch w.m.name() {
	case "update":
		return truthy(stmt.Lookup("multi"))
	case "delete":
		limit, ok := stmt.Lookup("limit").AsInt64OK()
		return ok && limit == 0
	}
	return false
}

// matching returns the _id of every document of the command's collection that q matches, read with a
// find (and getMores) holding the database's mutex shared. It returns the reply of a find that failed.
func (w *splitWrite) matching(q bson.Raw) (ids []bson.RawValue, failed []byte, err error) {
	coll := w.m.body.Index(0).Value()
	db := w.m.body.Lookup("$db")
	cmd := bson.D{{Key: "find", Value: coll}, {Key: "filter", Value: q}, {Key: "projection", Value: bson.D{{Key: "_id", Value: 1}}},
		{Key: "batchSize", Value: int32(1000)}, {Key: "$db", Value: db}}
	for {
		body, failed, err := w.send(true, cmd)
		if failed != nil || err != nil {
			return nil, failed, err
		}
		batch, ok := body.Lookup("cursor", "firstBatch").ArrayOK()
		if !ok {
			batch, _ = body.Lookup("cursor", "nextBatch").ArrayOK()
		}
		for _, d := range values(batch) {
			if id, err := d.Document().LookupErr("_id"); err == nil {
				ids = append(ids, id)
			}
		}
		cursor, _ := body.Lookup("cursor", "id").AsInt64OK()
		if cursor == 0 {
			return ids, nil, nil
		}
		cmd = bson.D{{Key: "getMore", Value: cursor}, {Key: "collection", Value: coll}, {Key: "batchSize", Value: int32(1000)}, {Key: "$db", Value: db}}
	}
}

// step sends the command with stmt as its only statement (or document), holding the database's mutex
// alone, and adds its reply to w; write errors and upserts carry index i. It returns the reply of a
// command error as is, or whether the step had a write error.
func (w *splitWrite) step(i int32, stmt bson.Raw) (failed []byte, writeError bool, err error) {
	cmd := bson.D{}
	for _, e := range elements(w.m.body) {
		if k := e.Key(); k != w.key && k != "txnNumber" {
			cmd = append(cmd, bson.E{Key: k, Value: e.Value()})
		}
	}
	body, failed, err := w.send(false, append(cmd, bson.E{Key: w.key, Value: bson.A{stmt}}))
	if failed != nil || err != nil {
		return failed, false, err
	}
	n, _ := body.Lookup("n").AsInt64OK()
	modified, _ := body.Lookup("nModified").AsInt64OK()
	w.n += int32(n)
	w.nModified += int32(modified)
	if ups, ok := body.Lookup("upserted").ArrayOK(); ok {
		for _, u := range values(ups) {
			w.upserted = append(w.upserted, bson.D{{Key: "index", Value: i}, {Key: "_id", Value: u.Document().Lookup("_id")}})
		}
	}
	if wce := body.Lookup("writeConcernError"); wce.Type != 0 && w.writeConcernError.Type == 0 {
		w.writeConcernError = wce
	}
	errs, _ := body.Lookup("writeErrors").ArrayOK()
	for _, e := range values(errs) {
		reindexed := bson.D{{Key: "index", Value: i}}
		for _, f := range elements(e.Document()) {
			if f.Key() != "index" {
				reindexed = append(reindexed, bson.E{Key: f.Key(), Value: f.Value()})
			}
		}
		w.writeErrors = append(w.writeErrors, reindexed)
	}
	return nil, len(errs) > 0, nil
}

// takeGone returns *gone and sets it to nil: a client that left is checked before the first step of a
// write only (a write begun is finished).
func takeGone(gone *func() bool) func() bool {
	g := *gone
	*gone = nil
	return g
}

// forward sends req (parsed as m; nil when it is not an OP_MSG the proxy parses) upstream and returns its
// reply; with pushdown set, a command anchored on _id is served one id at a time (see pushdown). The caller
// holds the database's mutex: shared for a read, alone otherwise.
func forward(upstream net.Conn, req []byte, m *message, pushdownOn bool) ([]byte, error) {
	if pushdownOn && m != nil {
		if reply, served, err := pushdown(upstream, m); served || err != nil {
			return reply, err
		}
	}
	return exchange(upstream, req)
}

// exchange writes req upstream and reads its one reply; the caller holds the database's mutex.
func exchange(upstream net.Conn, req []byte) ([]byte, error) {
	if _, err := upstream.Write(req); err != nil {
		return nil, fmt.Errorf("write request: %w", err)
	}
	reply, err := ReadMessage(upstream)
	if err != nil {
		return nil, fmt.Errorf("read reply: %w", err)
	}
	if _, moreToCome := inspect(reply); moreToCome {
		return nil, errors.New("exhaust reply (moreToCome) is not supported")
	}
	return reply, nil
}

// replyBody returns the body of an OP_MSG reply with ok 1, and false for any other reply.
func replyBody(reply []byte) (bson.Raw, bool) {
	m, ok := parseMsg(reply)
	if !ok {
		return nil, false
	}
	if v, ok := m.body.Lookup("ok").AsFloat64OK(); !ok || v != 1 {
		return nil, false
	}
	return m.body, true
}

// requestMsg encodes body as an OP_MSG request with one kind-0 section.
func requestMsg(requestID int32, body bson.D) ([]byte, error) { return encodeMsg(requestID, 0, body) }

// replyMsg encodes body as an OP_MSG reply to request responseTo.
func replyMsg(responseTo int32, body bson.D) ([]byte, error) { return encodeMsg(0, responseTo, body) }

func encodeMsg(requestID, responseTo int32, body bson.D) ([]byte, error) {
	raw, err := bson.Marshal(body)
	if err != nil {
		return nil, err
	}
	msg := make([]byte, headerSize+4+1, headerSize+5+len(raw))
	binary.LittleEndian.PutUint32(msg[4:], uint32(requestID))
	binary.LittleEndian.PutUint32(msg[8:], uint32(responseTo))
	binary.LittleEndian.PutUint32(msg[12:], opMsg)
	msg = append(msg, raw...)
	binary.LittleEndian.PutUint32(msg[0:], uint32(len(msg)))
	return msg, nil
}

// has reports whether document d has field key.
func has(d bson.Raw, key string) bool {
	_, err := d.LookupErr(key)
	return err == nil
}

// truthy reports whether v is true, or a number other than 0 (the servers accept both for flags).
func truthy(v bson.RawValue) bool {
	if b, ok := v.BooleanOK(); ok {
		return b
	}
	n, ok := v.AsFloat64OK()
	return ok && n != 0
}

// elements returns the elements of d, none when d is malformed (parseMsg validates what it returns).
func elements(d bson.Raw) []bson.RawElement {
	es, _ := d.Elements()
	return es
}

// values returns the values of a, none when a is absent or malformed.
func values(a bson.RawArray) []bson.RawValue {
	if len(a) == 0 {
		return nil
	}
	vs, _ := a.Values()
	return vs
}
