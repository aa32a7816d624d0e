package devdb

import (
	"encoding/binary"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// commandUpstream answers commands as a server would, enough for the proxy's splits: a find returns the
// documents {_id: 1}, {_id: 2} and {_id: 3}; an insert, update or delete reports one document written; an
// aggregate whose first stage is {$match: {_id: x}} returns {_id: x}.
// With pairFinds a find waits, up to 10 seconds, until another find arrives. It records every command it got, as
// extended JSON, and the most commands it ever held at once.
type commandUpstream struct {
	ln        net.Listener
	pairFinds bool

	mu          sync.Mutex
	commands    []string
	inFlight    int
	maxInFlight int
	findArrived chan struct{} // closed by the second find
	finds       int
}

func newCommandUpstream(t *testing.T, pairFinds bool) *commandUpstream {
	t.Helper()
	u := &commandUpstream{pairFinds: pairFinds, findArrived: make(chan struct{})}
	u.ln = listenUpstream(t, u.serve)
	return u
}

func (u *commandUpstream) serve(c net.Conn) {
	defer c.Close()
	for {
		req, err := ReadMessage(c)
		if err != nil {
			return
		}
		m, ok := parseMsg(req)
		if !ok {
			return
		}
		u.mu.Lock()
		u.commands = append(u.commands, m.body.String())
		u.inFlight++
		u.maxInFlight = max(u.maxInFlight, u.inFlight)
		isFind := m.name() == "find"
		if isFind {
			if u.finds++; u.finds == 2 {
				close(u.findArrived)
			}
		}
		u.mu.Unlock()
		reply := bson.D{{Key: "ok", Value: 1.0}}
		switch m.name() {
		case "find":
			if u.pairFinds {
				select {
				case <-u.findArrived:
				case <-time.After(10 * time.Second):
				}
			}
			reply = bson.D{{Key: "cursor", Value: bson.D{{Key: "id", Value: int64(0)}, {Key: "ns", Value: "x.c"},
				{Key: "firstBatch", Value: bson.A{bson.D{{Key: "_id", Value: 1}}, bson.D{{Key: "_id", Value: 2}}, bson.D{{Key: "_id", Value: 3}}}}}},
				{Key: "ok", Value: 1.0}}
		case "insert", "update", "delete":
			reply = bson.D{{Key: "n", Value: int32(1)}, {Key: "nModified", Value: int32(1)}, {Key: "ok", Value: 1.0}}
		case "aggregate": // the document of the first stage's _id matches
			stages, _ := m.body.Lookup("pipeline").Array().Values()
			id := stages[0].Document().Lookup("$match", "_id")
			reply = bson.D{{Key: "cursor", Value: bson.D{{Key: "id", Value: int64(0)}, {Key: "ns", Value: "x.c"},
				{Key: "firstBatch", Value: bson.A{bson.D{{Key: "_id", Value: id}}}}}}, {Key: "ok", Value: 1.0}}
		}
		u.mu.Lock()
		u.inFlight--
		u.mu.Unlock()
		msg, err := replyMsg(m.requestID, reply)
		if err != nil {
			panic(err)
		}
		if _, err := c.Write(msg); err != nil {
			return
		}
	}
}

// took returns the commands received so far and forgets them.
func (u *commandUpstream) took() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	out := u.commands
	u.commands = nil
	return out
}

// runCommand sends body, and a document sequence named seq when docs are given, as one OP_MSG on c and
// returns the reply's body.
func runCommand(t *testing.T, c net.Conn, body bson.D, seq string, docs ...bson.D) bson.Raw {
	t.Helper()
	raw, err := bson.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	msg := make([]byte, headerSize+4, headerSize+4+1+len(raw))
	binary.LittleEndian.PutUint32(msg[4:], 7) // requestID
	binary.LittleEndian.PutUint32(msg[12:], opMsg)
	msg = append(append(msg, 0), raw...)
	if len(docs) > 0 {
		section := append(make([]byte, 4), append([]byte(seq), 0)...)
		for _, d := range docs {
			b, err := bson.Marshal(d)
			if err != nil {
				t.Fatal(err)
			}
			section = append(section, b...)
		}
		binary.LittleEndian.PutUint32(section, uint32(len(section)))
		msg = append(append(msg, 1), section...)
	}
	binary.LittleEndian.PutUint32(msg[0:], uint32(len(msg)))
	if _, err := c.Write(msg); err != nil {
		t.Fatal(err)
	}
	reply, err := ReadMessage(c)
	if err != nil {
		t.Fatalf("read reply: %v", err)
	}
	if responseTo := binary.LittleEndian.Uint32(reply[8:12]); responseTo != 7 {
		t.Fatalf("reply responds to request %d, want 7", responseTo)
	}
	m, ok := parseMsg(reply)
	if !ok {
		t.Fatalf("reply is not an OP_MSG: %x", reply)
	}
	return m.body
}

// The serialization command is answered by the proxy; Interleaved sends an update one statement and one
// document at a time (a multi statement as a find of the _ids, then one update per _id still matching),
// an insert one document at a time, and adds up their replies. Linearized sends the command whole.
func TestInterleavedSplitsWrites(t *testing.T) {
	t.Parallel()
	up := newCommandUpstream(t, false)
	c := dialProxy(t, newTestProxy(t, up.ln.Addr().String()))

	if r := runCommand(t, c, bson.D{{Key: SerializationCommand, Value: "sometimes"}, {Key: "$db", Value: "x"}}, ""); r.Lookup("code").Int32() != 2 {
		t.Errorf("unknown serialization answered %s, want code 2", r)
	}
	if r := runCommand(t, c, bson.D{{Key: SerializationCommand, Value: "interleaved"}, {Key: "$db", Value: "x"}}, ""); r.Lookup("ok").Double() != 1 {
		t.Fatalf("serialization command answered %s", r)
	}
	if got := up.took(); len(got) != 0 {
		t.Fatalf("the serialization command reached upstream: %q", got)
	}

	update := bson.D{{Key: "update", Value: "c"}, {Key: "ordered", Value: true}, {Key: "txnNumber", Value: int64(4)}, {Key: "$db", Value: "x"}}
	r := runCommand(t, c, update, "updates",
		bson.D{{Key: "q", Value: bson.D{{Key: "a", Value: 1}}}, {Key: "u", Value: bson.D{{Key: "$set", Value: bson.D{{Key: "b", Value: 1}}}}}},
		bson.D{{Key: "q", Value: bson.D{{Key: "a", Value: 2}}}, {Key: "u", Value: bson.D{{Key: "$set", Value: bson.D{{Key: "b", Value: 2}}}}}, {Key: "multi", Value: true}})
	if n, modified := r.Lookup("n").Int32(), r.Lookup("nModified").Int32(); n != 4 || modified != 4 || r.Lookup("ok").Double() != 1 {
		t.Errorf("split update answered %s, want n 4, nModified 4, ok 1", r)
	}
	got := up.took()
	want := []string{
		`{"update": "c","ordered": true,"$db": "x","updates": [{"q": {"a": {"$numberInt":"1"}},"u": {"$set": {"b": {"$numberInt":"1"}}}}]}`,
		`{"find": "c","filter": {"a": {"$numberInt":"2"}},"projection": {"_id": {"$numberInt":"1"}},"batchSize": {"$numberInt":"1000"},"$db": "x"}`,
	}
	for id := 1; id <= 3; id++ {
		want = append(want, strings.ReplaceAll(`{"update": "c","ordered": true,"$db": "x","updates": [{"u": {"$set": {"b": {"$numberInt":"2"}}},"q": {"_id": {"$numberInt":"ID"},"$and": [{"a": {"$numberInt":"2"}}]}}]}`, "ID", string(rune('0'+id))))
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("upstream got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	insert := bson.D{{Key: "insert", Value: "c"}, {Key: "documents", Value: bson.A{bson.D{{Key: "_id", Value: 1}}, bson.D{{Key: "_id", Value: 2}}}}, {Key: "$db", Value: "x"}}
	if r := runCommand(t, c, insert, ""); r.Lookup("n").Int32() != 2 {
		t.Errorf("split insert answered %s, want n 2", r)
	}
	if got := up.took(); len(got) != 2 {
		t.Errorf("an insert of 2 documents went upstream as %d commands, want 2: %q", len(got), got)
	}

	runCommand(t, c, bson.D{{Key: SerializationCommand, Value: "linearized"}, {Key: "$db", Value: "x"}}, "")
	if r := runCommand(t, c, update, "updates", bson.D{{Key: "q", Value: bson.D{}}, {Key: "u", Value: bson.D{}}, {Key: "multi", Value: true}}); r.Lookup("n").Int32() != 1 {
		t.Errorf("linearized update answered %s, want upstream's n 1", r)
	}
	if got := up.took(); len(got) != 1 || !strings.Contains(got[0], `"txnNumber"`) {
		t.Errorf("linearized update went upstream as %q, want the command whole", got)
	}
}

// Two finds on one database reach upstream together, linearized as interleaved (a command that is not a
// read waits for the other: TestProxySerializesEachDatabase).
func TestReadsRunTogether(t *testing.T) {
	t.Parallel()
	for _, s := range []Serialization{Linearized, Interleaved} {
		t.Run(string(s), func(t *testing.T) {
			up := newCommandUpstream(t, true)
			p := newTestProxy(t, up.ln.Addr().String())
			runCommand(t, dialProxy(t, p), bson.D{{Key: SerializationCommand, Value: string(s)}, {Key: "$db", Value: "x"}}, "")
			var wg sync.WaitGroup
			for range 2 {
				c := dialProxy(t, p)
				wg.Go(func() { runCommand(t, c, bson.D{{Key: "find", Value: "c"}, {Key: "$db", Value: "x"}}, "") })
			}
			wg.Wait()
			up.mu.Lock()
			defer up.mu.Unlock()
			if up.maxInFlight != 2 {
				t.Errorf("upstream held at most %d finds at once, want 2", up.maxInFlight)
			}
		})
	}
}
