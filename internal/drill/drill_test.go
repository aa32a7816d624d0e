package drill_test

import (
	"context"
	"errors"
	"net/url"
	"os"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/pulse-sidecar/pulse/internal/drill"
	"github.com/pulse-sidecar/pulse/internal/testdb"
	"github.com/pulse-sidecar/pulse/internal/testwait"
)

func TestMain(m *testing.M) { os.Exit(testdb.Main(m)) }

// through starts a Proxy in front of the test database and returns it, a client connected through it (one
// connection, no retries, a short server selection) and the test's collection read directly.
func through(t *testing.T) (*drill.Proxy, *mongo.Collection, *mongo.Collection) {
	t.Helper()
	direct, dbName := testdb.Database(t)
	u, err := url.Parse(testdb.URI(t))
	if err != nil {
		t.Fatal(err)
	}
	p, err := drill.Listen(u.Host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	c, err := mongo.Connect(options.Client().SetHosts([]string{p.Addr()}).SetDirect(true).SetRetryWrites(false).SetRetryReads(false).
		SetServerSelectionTimeout(time.Second).SetMaxPoolSize(1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Disconnect(context.Background()) })
	return p, c.Database(dbName).Collection("c"), direct.Database(dbName).Collection("c")
}

// Election answers commands with an election error (NotWritablePrimary first) without reaching the database; LoseReplies
// applies a write and its client gets a network error; Close and Reset fail the command with a network
// error; HalfOpen and HangOpen never answer; Pass forwards again.
func TestModes(t *testing.T) {
	t.Parallel()
	p, c, direct := through(t)
	ctx := t.Context()
	if _, err := c.InsertOne(ctx, bson.M{"_id": "before"}); err != nil {
		t.Fatalf("insert through the proxy in Pass: %v", err)
	}

	p.Set(drill.Election)
	_, err := c.InsertOne(ctx, bson.M{"_id": "during"})
	var ce mongo.CommandError
	if !errors.As(err, &ce) || ce.Code != drill.ElectionErrors[0].Code || ce.Name != drill.ElectionErrors[0].CodeName {
		t.Fatalf("insert during the election = %v, want %s", err, drill.ElectionErrors[0].CodeName)
	}
	// The driver marks the server unknown after it; its monitor's hello is answered an election error too, so
	// the next command finds no server, as while a replica set has no primary.
	if _, err := c.InsertOne(ctx, bson.M{"_id": "during"}); err == nil {
		t.Error("a second insert during the election succeeded")
	}
	if n, _ := direct.CountDocuments(ctx, bson.M{"_id": "during"}); n != 0 {
		t.Errorf("an insert answered an election error was stored")
	}
	p.Set(drill.Pass)
	waitServer(t, c)

	p.Set(drill.LoseReplies)
	_, err = c.InsertOne(ctx, bson.M{"_id": "lost"})
	if !mongo.IsNetworkError(err) {
		t.Errorf("insert whose reply is lost = %v, want a network error", err)
	}
	if n, _ := direct.CountDocuments(ctx, bson.M{"_id": "lost"}); n != 1 {
		t.Errorf("the insert whose reply was lost is stored %d times, want 1", n)
	}

	for _, m := range []drill.Mode{drill.Close, drill.Reset} {
		p.Set(drill.Pass)
		waitServer(t, c)
		p.Set(m)
		if _, err := c.InsertOne(ctx, bson.M{"_id": m.String()}); err == nil {
			t.Errorf("insert in mode %s succeeded, want a failure", m)
		}
	}
	p.Set(drill.Pass)
	waitServer(t, c)

	p.Set(drill.HalfOpen)
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err = c.InsertOne(short, bson.M{"_id": "half-open"})
	cancel()
	if !mongo.IsTimeout(err) && !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("insert on a half-open connection = %v, want its deadline exceeded", err)
	}

	p.Set(drill.Pass)
	waitServer(t, c)
	if s := p.Stats(); s.Errors < 2 || s.LostReplies != 1 || s.Held == 0 || s.Closed < 2 {
		t.Errorf("stats %+v: want the election errors, one lost reply, a held request and two closed connections", s)
	}

	if n := p.HangOpen(); n == 0 {
		t.Fatal("HangOpen found no open connection")
	}
	short, cancel = context.WithTimeout(ctx, 300*time.Millisecond)
	_, err = c.InsertOne(short, bson.M{"_id": "hung"})
	cancel()
	if !mongo.IsTimeout(err) && !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("insert on a connection HangOpen left = %v, want its deadline exceeded", err)
	}
}

// waitServer waits until a ping through c succeeds (the driver found the server again).
func waitServer(t *testing.T, c *mongo.Collection) {
	t.Helper()
	testwait.Eventually(t, time.Minute, "the server through the proxy", func() bool {
		return c.Database().Client().Ping(t.Context(), nil) == nil
	})
}
