package devdb

import (
	"fmt"
	"net"
	"strings"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// FerretDB v1 reads a collection through its storage's index only for a filter that is exactly {_id: x}
// (x a string or ObjectID); any other filter, {_id: x, status: "pending"} and {_id: {$in: [...]}}
// included, reads every document of the collection and tests each. The proxy serves a filter anchored on
// _id (a top-level _id that is a string or {$in: [strings]}, beside any other conditions) one id at a time:
// per id an aggregate whose first stage, {$match: {_id: id}}, FerretDB reads by index and whose second
// applies the whole filter, and, for a write, the write of that one document with {_id: id} alone. It runs
// under the database's mutex as the command would (a write's check and write hold it alone, so no other
// operation comes between them), and answers as the command would have.
//
// Served: find without sort, skip, hint or collation (projection of fields included or excluded); update
// and delete statements without upsert, collation, hint or sort; findAndModify of one id without upsert, and
// the insert-only upsert findAndModify of one id (see pushdownInsertOnly). Any other command, or a filter
// with more than maxAnchoredIDs ids, goes upstream as it is.

// maxAnchoredIDs bounds the ids of a filter the proxy serves one at a time: beyond it, reading the
// collection once is as cheap.
const maxAnchoredIDs = 512

// maxServedBatch bounds the bytes of the documents a served find answers in its one batch (a reply is
// at most 48 MiB and a document 16 MiB); a larger answer goes upstream as the find.
const maxServedBatch = 8 << 20

// anchoredIDs returns the ids a filter is anchored on: its top-level _id when that is a string, or
// {$in: [strings]} or {$eq: string}. It reports false for any other filter, and for {_id: "x"} alone, which
// FerretDB reads by index itself.
func anchoredIDs(filter bson.Raw) ([]bson.RawValue, bool) {
	elems, err := filter.Elements()
	if err != nil {
		return nil, false
	}
	var ids []bson.RawValue
	anchored := false
	for _, e := range elems {
		if e.Key() != "_id" {
			continue
		}
		v := e.Value()
		switch v.Type {
		case bson.TypeString:
			ids, anchored = []bson.RawValue{v}, true
		case bson.TypeEmbeddedDocument:
			ops, err := v.Document().Elements()
			if err != nil || len(ops) != 1 {
				return nil, false
			}
			op := ops[0]
			switch {
			case op.Key() == "$eq" && op.Value().Type == bson.TypeString:
				ids, anchored = []bson.RawValue{op.Value()}, true
			case op.Key() == "$in" && op.Value().Type == bson.TypeArray:
				vals, err := op.Value().Array().Values()
				if err != nil || len(vals) > maxAnchoredIDs {
					return nil, false
				}
				for _, id := range vals {
					if id.Type != bson.TypeString {
						return nil, false
					}
				}
				ids, anchored = distinctValues(vals), true
			default:
				return nil, false
			}
		default:
			return nil, false
		}
	}
	if !anchored || len(elems) == 1 && ids != nil && len(ids) == 1 && elems[0].Value().Type == bson.TypeString {
		return nil, false
	}
	return ids, true
}

// distinctValues returns vs without repeated strings, in first-seen order.
func distinctValues(vs []bson.RawValue) []bson.RawValue {
	seen := make(map[string]bool, len(vs))
	out := vs[:0:0]
	for _, v := range vs {
		if s := v.StringValue(); !seen[s] {
			seen[s] = true
			out = append(out, v)
		}
	}
	return out
}

// pushdown serves req (parsed as m) one id at a time when its filter is anchored on _id (see above). It
// reports false, having sent nothing, when it does not serve the command: then the caller sends it
// upstream. The caller holds the database's mutex: shared for a find, alone otherwise.
func pushdown(upstream net.Conn, m *message) (reply []byte, served bool, err error) {
	switch m.name() {
	case "find":
		return pushdownFind(upstream, m)
	case "update", "delete":
		return pushdownWrite(upstream, m)
	case "findAndModify", "findandmodify":
		return pushdownFindAndModify(upstream, m)
	}
	return nil, false, nil
}

// onlyFields reports whether every field of d is one of allowed (or a generic one every command may carry:
// $db, lsid, $clusterTime, comment, maxTimeMS, apiVersion, apiStrict, apiDeprecationErrors, $readPreference,
// readConcern, writeConcern).
func onlyFields(d bson.Raw, allowed ...string) bool {
	for _, e := range elements(d) {
		switch k := e.Key(); k {
		case "$db", "lsid", "$clusterTime", "comment", "maxTimeMS", "apiVersion", "apiStrict", "apiDeprecationErrors",
			"$readPreference", "readConcern", "writeConcern":
		default:
			ok := false
			for _, a := range allowed {
				ok = ok || k == a
			}
			if !ok {
				return false
			}
		}
	}
	return true
}

// simpleProjection reports whether p only includes or excludes fields (values 0, 1, true or false).
func simpleProjection(p bson.Raw) bool {
	for _, e := range elements(p) {
		if e.Value().Type != bson.TypeBoolean && e.Value().Type != bson.TypeInt32 && e.Value().Type != bson.TypeInt64 &&
			e.Value().Type != bson.TypeDouble {
			return false
		}
	}
	return true
}

// matchOne returns the document with _id id that filter matches, projected when projection is set, or nil:
// one aggregate that FerretDB reads by index. failed is the reply of an aggregate that failed.
func matchOne(upstream net.Conn, m *message, coll bson.RawValue, id bson.RawValue, filter bson.Raw, projection bson.Raw) (doc bson.Raw, failed []byte, err error) {
	pipeline := bson.A{bson.D{{Key: "$match", Value: bson.D{{Key: "_id", Value: id}}}}, bson.D{{Key: "$match", Value: filter}}}
	if projection != nil {
		pipeline = append(pipeline, bson.D{{Key: "$project", Value: projection}})
	}
	body, failed, err := call(upstream, m, bson.D{{Key: "aggregate", Value: coll}, {Key: "pipeline", Value: pipeline},
		{Key: "cursor", Value: bson.D{}}, {Key: "$db", Value: m.body.Lookup("$db")}})
	if failed != nil || err != nil {
		return nil, failed, err
	}
	batch, _ := body.Lookup("cursor", "firstBatch").ArrayOK()
	for _, d := range values(batch) {
		if doc, ok := d.DocumentOK(); ok {
			return doc, nil, nil
		}
	}
	return nil, nil, nil
}

// call sends cmd upstream as a request of m's and returns the body of its reply, or the reply as is when it
// is a command error (ok 0).
func call(upstream net.Conn, m *message, cmd bson.D) (body bson.Raw, failed []byte, err error) {
	req, err := requestMsg(m.requestID, cmd)
	if err != nil {
		return nil, nil, fmt.Errorf("pushdown %s: %w", m.name(), err)
	}
	reply, err := exchange(upstream, req)
	if err != nil {
		return nil, nil, err
	}
	body, ok := replyBody(reply)
	if !ok {
		return nil, reply, nil
	}
	return body, nil, nil
}

// pushdownFind serves a find anchored on _id: the matching documents, in the order of the filter's ids, in
// one batch.
func pushdownFind(upstream net.Conn, m *message) ([]byte, bool, error) {
	filter, ok := m.body.Lookup("filter").DocumentOK()
	if !ok || !onlyFields(m.body, "find", "filter", "projection", "limit", "batchSize", "singleBatch") {
		return nil, false, nil
	}
	ids, ok := anchoredIDs(filter)
	if !ok {
		return nil, false, nil
	}
	var projection bson.Raw
	if p, ok := m.body.Lookup("projection").DocumentOK(); ok {
		if !simpleProjection(p) {
			return nil, false, nil
		}
		if len(elements(p)) > 0 {
			projection = p
		}
	}
	limit, _ := m.body.Lookup("limit").AsInt64OK()
	if limit < 0 {
		limit = -limit
	}
	coll := m.body.Index(0).Value()
	docs := bson.A{}
	size := 0
	for _, id := range ids {
		doc, failed, err := matchOne(upstream, m, coll, id, filter, projection)
		if failed != nil || err != nil {
			return failed, true, err
		}
		if doc == nil {
			continue
		}
		if size += len(doc); size > maxServedBatch {
			return nil, false, nil // more than one batch: the find itself returns a cursor
		}
		docs = append(docs, doc)
		if limit > 0 && int64(len(docs)) == limit {
			break
		}
	}
	db, _ := m.body.Lookup("$db").StringValueOK()
	name, _ := coll.StringValueOK()
	reply, err := replyMsg(m.requestID, bson.D{{Key: "cursor", Value: bson.D{{Key: "firstBatch", Value: docs}, {Key: "id", Value: int64(0)},
		{Key: "ns", Value: db + "." + name}}}, {Key: "ok", Value: 1.0}})
	return reply, true, err
}

// pushdownWrite serves an update or delete whose every statement is anchored on _id: for each statement and
// each of its ids whose document the statement's filter matches, the statement with {_id: id} alone (one
// document for an update without multi or a delete with limit 1). The match is checked by one aggregate per
// id, except for a filter that is {_id: {$in: [...]}} alone, whose writes by {_id: id} are sent without
// one (an id without a document adds nothing). The reply adds up the steps' replies.
func pushdownWrite(upstream net.Conn, m *message) ([]byte, bool, error) {
	key := writeLists[m.name()]
	stmts, ok := m.list(key)
	if !ok || len(stmts) == 0 || !onlyFields(m.body, m.name(), key, "ordered", "bypassDocumentValidation") {
		return nil, false, nil
	}
	anchors := make([][]bson.RawValue, len(stmts))
	for i, stmt := range stmts {
		q, ok := stmt.Lookup("q").DocumentOK()
		if !ok || truthy(stmt.Lookup("upsert")) || has(stmt, "collation") || has(stmt, "hint") || has(stmt, "sort") {
			return nil, false, nil
		}
		if anchors[i], ok = anchoredIDs(q); !ok {
			return nil, false, nil
		}
	}
	w := &splitWrite{upstream: upstream, m: m, key: key}
	w.send = func(_ bool, cmd bson.D) (bson.Raw, []byte, error) { return call(upstream, m, cmd) }
	ordered := true
	if v, ok := m.body.Lookup("ordered").BooleanOK(); ok {
		ordered = v
	}
	coll := m.body.Index(0).Value()
	for i, stmt := range stmts {
		q := stmt.Lookup("q").Document()
		many := m.name() == "update" && truthy(stmt.Lookup("multi"))
		if m.name() == "delete" {
			limit, _ := stmt.Lookup("limit").AsInt64OK()
			many = limit == 0
		}
		// A filter that is its _id alone needs no check: the write by {_id: id} matches exactly the
		// documents the check would find (for a statement of one document, only with one id).
		check := len(elements(q)) > 1 || !many && len(anchors[i]) > 1
		stop := false
		for _, id := range anchors[i] {
			if check {
				doc, failed, err := matchOne(upstream, m, coll, id, q, bson.Raw(bsonDoc(bson.D{{Key: "_id", Value: 1}})))
				if failed != nil || err != nil {
					return failed, true, err
				}
				if doc == nil {
					continue
				}
			}
			one, err := bson.Marshal(withID(stmt, id, m.name()))
			if err != nil {
				return nil, true, fmt.Errorf("pushdown %s: %w", m.name(), err)
			}
			failed, stopped, err := w.step(int32(i), one)
			if failed != nil || err != nil {
				return failed, true, err
			}
			if stopped {
				stop = true
				break
			}
			if !many {
				break
			}
		}
		if stop && ordered {
			break
		}
	}
	reply, err := w.reply()
	return reply, true, err
}

// withID returns statement stmt of a command named name (update or delete) with its filter replaced by
// {_id: id} and limited to that one document.
func withID(stmt bson.Raw, id bson.RawValue, name string) bson.D {
	one := bson.D{{Key: "q", Value: bson.D{{Key: "_id", Value: id}}}}
	for _, e := range elements(stmt) {
		switch e.Key() {
		case "q", "multi", "limit":
		default:
			one = append(one, bson.E{Key: e.Key(), Value: e.Value()})
		}
	}
	if name == "delete" {
		one = append(one, bson.E{Key: "limit", Value: int32(1)})
	}
	return one
}

// bsonDoc marshals d; d must be marshalable.
func bsonDoc(d bson.D) []byte {
	b, err := bson.Marshal(d)
	if err != nil {
		panic(err)
	}
	return b
}

// pushdownFindAndModify serves a findAndModify of one _id (anchored on a string, or an $in of one): when the
// filter matches that document, the command with {_id: id} as its query; otherwise the answer of a
// findAndModify that matched nothing.
func pushdownFindAndModify(upstream net.Conn, m *message) ([]byte, bool, error) {
	q, ok := m.body.Lookup("query").DocumentOK()
	if !ok || has(m.body, "collation") || has(m.body, "hint") || has(m.body, "let") {
		return nil, false, nil
	}
	if truthy(m.body.Lookup("upsert")) {
		return pushdownInsertOnly(upstream, m, q)
	}
	ids, ok := anchoredIDs(q)
	if !ok || len(ids) != 1 {
		return nil, false, nil
	}
	doc, failed, err := matchOne(upstream, m, m.body.Index(0).Value(), ids[0], q, bson.Raw(bsonDoc(bson.D{{Key: "_id", Value: 1}})))
	if failed != nil || err != nil {
		return failed, true, err
	}
	if doc == nil {
		last := bson.D{{Key: "n", Value: int32(0)}}
		if !truthy(m.body.Lookup("remove")) {
			last = append(last, bson.E{Key: "updatedExisting", Value: false})
		}
		reply, err := replyMsg(m.requestID, bson.D{{Key: "lastErrorObject", Value: last}, {Key: "value", Value: nil}, {Key: "ok", Value: 1.0}})
		return reply, true, err
	}
	return findAndModifyByID(upstream, m, ids[0], "sort")
}

// pushdownInsertOnly serves an upsert findAndModify whose query is {_id: id} (a string) beside conditions
// {field: {$exists: false}} only, with an update of operators: the shape of an insert whose fields the
// update sets and stamps ($setOnInsert, $currentDate), refused as a duplicate key when the id is taken by a
// document the query does not match. Upstream, FerretDB would read every document of the collection for it.
// Per id, one aggregate finds the document with that id; when there is none, or the whole query matches it,
// the command goes upstream with {_id: id} as its query (the $exists conditions add no field to an inserted
// document, as on MongoDB); otherwise the answer is the duplicate key error MongoDB gives (code 11000),
// with nothing written.
func pushdownInsertOnly(upstream net.Conn, m *message, q bson.Raw) ([]byte, bool, error) {
	if !onlyFields(m.body, "findAndModify", "findandmodify", "query", "update", "upsert", "new", "fields", "bypassDocumentValidation", "txnNumber") {
		return nil, false, nil
	}
	if u, ok := m.body.Lookup("update").DocumentOK(); !ok || !operatorsOnly(u) {
		return nil, false, nil
	}
	var id bson.RawValue
	for _, e := range elements(q) {
		v := e.Value()
		switch {
		case e.Key() == "_id" && v.Type == bson.TypeString:
			id = v
		case e.Key() != "_id" && isExistsFalse(v):
		default:
			return nil, false, nil
		}
	}
	if id.Type != bson.TypeString {
		return nil, false, nil
	}
	coll := m.body.Index(0).Value()
	idOnly := bson.Raw(bsonDoc(bson.D{{Key: "_id", Value: 1}}))
	doc, failed, err := matchOne(upstream, m, coll, id, bson.Raw(bsonDoc(bson.D{})), idOnly)
	if failed != nil || err != nil {
		return failed, true, err
	}
	if doc != nil {
		doc, failed, err = matchOne(upstream, m, coll, id, q, idOnly)
		if failed != nil || err != nil {
			return failed, true, err
		}
		if doc == nil { // the id is taken by a document the query does not match: the insert fails
			db, _ := m.body.Lookup("$db").StringValueOK()
			name, _ := coll.StringValueOK()
			reply, err := replyMsg(m.requestID, bson.D{{Key: "ok", Value: 0.0},
				{Key: "errmsg", Value: "E11000 duplicate key error collection: " + db + "." + name},
				{Key: "code", Value: int32(11000)}, {Key: "codeName", Value: "DuplicateKey"}})
			return reply, true, err
		}
	}
	return findAndModifyByID(upstream, m, id, "")
}

// findAndModifyByID sends m's findAndModify upstream with {_id: id} as its query, without its txnNumber
// (and without the field drop, unless ""), and returns the reply.
func findAndModifyByID(upstream net.Conn, m *message, id bson.RawValue, drop string) ([]byte, bool, error) {
	cmd := bson.D{}
	for _, e := range elements(m.body) {
		switch k := e.Key(); {
		case k == "query":
			cmd = append(cmd, bson.E{Key: "query", Value: bson.D{{Key: "_id", Value: id}}})
		case k == "txnNumber", drop != "" && k == drop:
		default:
			cmd = append(cmd, bson.E{Key: k, Value: e.Value()})
		}
	}
	req, err := requestMsg(m.requestID, cmd)
	if err != nil {
		return nil, true, fmt.Errorf("pushdown findAndModify: %w", err)
	}
	reply, err := exchange(upstream, req)
	return reply, true, err
}

// operatorsOnly reports whether every field of an update document is an update operator ($set, ...).
func operatorsOnly(u bson.Raw) bool {
	es := elements(u)
	for _, e := range es {
		if !strings.HasPrefix(e.Key(), "$") {
			return false
		}
	}
	return len(es) > 0
}

// isExistsFalse reports whether v is the condition {$exists: false}.
func isExistsFalse(v bson.RawValue) bool {
	d, ok := v.DocumentOK()
	if !ok {
		return false
	}
	es := elements(d)
	return len(es) == 1 && es[0].Key() == "$exists" && !truthy(es[0].Value())
}
