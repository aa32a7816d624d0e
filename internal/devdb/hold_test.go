package devdb

import (
	"encoding/binary"
	"net"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/pulse-sidecar/pulse/internal/testwait"
)

// commandFor returns an OP_MSG whose body is {<name>: value, $db: db}.
func commandFor(t *testing.T, db, name string, value any) []byte {
	t.Helper()
	body, err := bson.Marshal(bson.D{{Key: name, Value: value}, {Key: "$db", Value: db}})
	if err != nil {
		t.Fatal(err)
	}
	msg := make([]byte, headerSize+4+1, headerSize+5+len(body))
	binary.LittleEndian.PutUint32(msg[12:], opMsg)
	msg = append(msg, body...)
	binary.LittleEndian.PutUint32(msg[0:], uint32(len(msg)))
	return msg
}

// roundTrip writes msg on c and returns the body of its reply.
func roundTripOn(t *testing.T, c net.Conn, msg []byte) bson.Raw {
	t.Helper()
	if _, err := c.Write(msg); err != nil {
		t.Fatal(err)
	}
	reply, err := ReadMessage(c)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := MessageBody(reply)
	return body
}

// A HoldCommand holds its database's commands of the name it gives, and only those, until it is released:
// the proxy answers it with the count held, the other database's commands and the same database's other
// commands pass meanwhile, and the held command reaches the upstream once released.
func TestHoldCommandHoldsOneCommandName(t *testing.T) {
	t.Parallel()
	up := newFakeUpstream(t)
	p := newTestProxy(t, up.ln.Addr().String())
	ctl, held, other := dialProxy(t, p), dialProxy(t, p), dialProxy(t, p)
	waiting := func() int32 {
		return roundTripOn(t, ctl, commandFor(t, "orders", HoldCommand, "createIndexes")).Lookup("waiting").Int32()
	}
	if n := waiting(); n != 0 {
		t.Fatalf("waiting = %d before any command, want 0", n)
	}
	if _, err := held.Write(commandFor(t, "orders", "createIndexes", "c")); err != nil {
		t.Fatal(err)
	}
	testwait.Eventually(t, time.Minute, "the createIndexes is held", func() bool { return waiting() == 1 })
	roundTripOn(t, other, commandFor(t, "orders", "find", "c"))         // another command of the database passes
	roundTripOn(t, other, commandFor(t, "other", "createIndexes", "c")) // and the same command on another database
	up.mu.Lock()
	received := len(up.received)
	up.mu.Unlock()
	if received != 2 {
		t.Fatalf("upstream received %d commands while createIndexes was held, want the 2 others", received)
	}
	if n := roundTripOn(t, ctl, commandFor(t, "orders", HoldCommand, "")).Lookup("waiting").Int32(); n != 0 {
		t.Fatalf("waiting = %d once released, want 0", n)
	}
	reply, err := ReadMessage(held) // the held command runs now
	if err != nil {
		t.Fatalf("the held createIndexes got no reply once released: %v", err)
	}
	if body, _ := MessageBody(reply); CommandName(body) != "createIndexes" {
		t.Fatalf("reply %s, want the createIndexes echoed", body)
	}
}
