package mongo

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	drvevent "go.mongodb.org/mongo-driver/v2/event"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/mongo/readconcern"
	"go.mongodb.org/mongo-driver/v2/mongo/readpref"
	"go.mongodb.org/mongo-driver/v2/mongo/writeconcern"
	"go.mongodb.org/mongo-driver/v2/x/mongo/driver/connstring"
)

// appName is the client name the server logs for the sidecar's connections.
const appName = "pulse-sidecar"

// ConnectOptions configure Connect.
type ConnectOptions struct {
	// ServerSelectionTimeout bounds how long each command waits for a usable server
	// (PULSE_DATABASE_TIMEOUT); 0 keeps the driver's 30 s.
	ServerSelectionTimeout time.Duration
	// Monitor, when set, sees every command the client sends (pulse bench counts them).
	Monitor *drvevent.CommandMonitor
	// OperationTimeout is the driver's client-side operation timeout (CSOT, timeoutMS): every operation whose
	// context has no deadline gets one this long, and the driver sends the server the time left as maxTimeMS,
	// so no call waits without end on a connection that never answers. 0: none (each caller's own).
	OperationTimeout time.Duration
}

// Connect returns a client of the server at uri, named pulse-sidecar in the server's logs. It does no I/O:
// the driver connects in the background, and a command finding no usable server fails after
// ServerSelectionTimeout (with pulsetype.ErrUnavailable once wrapped by the Store), so that an unreachable
// database answers API requests within that bound.
//
// The client's concerns are the sidecar's, set here whatever uri says (see CheckConcerns): every write is
// acknowledged by a majority of the voting members and journaled (writeConcern {w: "majority", j: true}),
// so that a publish answered 202, a lease or a delivery's end survives a failover (on a replica set with
// an arbiter the server's implicit default is w:1, which a failover can roll back); every read is
// readConcern "majority" (it sees only what a failover cannot roll back: a claim never decides on a
// document that may vanish) from the primary (readPreference primary: a secondary's copy lags, and a claim
// read there sees stale leases).
//
// It returns an error when uri is not a valid connection string, or CheckConcerns' error when uri asks for
// less. The caller disconnects the client.
func Connect(uri string, opts ConnectOptions) (*mongo.Client, error) {
	if err := CheckConcerns(uri); err != nil {
		return nil, err
	}
	co := options.Client().ApplyURI(uri).SetAppName(appName).
		SetWriteConcern(WriteConcern()).SetReadConcern(readconcern.Majority()).SetReadPreference(readpref.Primary())
	if opts.ServerSelectionTimeout > 0 {
		co.SetServerSelectionTimeout(opts.ServerSelectionTimeout)
	}
	if opts.Monitor != nil {
		co.SetMonitor(opts.Monitor)
	}
	if opts.OperationTimeout > 0 {
		co.SetTimeout(opts.OperationTimeout)
	}
	return mongo.Connect(co)
}

// ReadConcernLevel is the read concern of every read of the sidecar, set on the client by Connect and sent by
// the store with each find and aggregation it sends as a command (Options.ReadConcern).
const ReadConcernLevel = "majority"

// WriteConcern returns the write concern of every write of the sidecar: {w: "majority", j: true}, no
// wtimeout (the caller's context bounds the wait).
func WriteConcern() *writeconcern.WriteConcern {
	j := true
	return &writeconcern.WriteConcern{W: "majority", Journal: &j}
}

// CheckConcerns returns an error naming the first option of the connection string uri that asks for less
// than the sidecar's concerns (see Connect) and why that would lose or double work; nil when uri leaves
// them alone or asks for what the sidecar sets anyway (w=majority, journal=true,
// readPreference=primary, readConcernLevel=majority). Refused, from the driver's URI options
// (MongoDB manual, "Connection String Options"):
//   - w other than majority (w=0, w=1, w=2, a tag): fewer members than a majority acknowledge, and a
//     failover rolls the write back;
//   - journal=false, and j (not a URI option of the Go driver, which ignores it silently);
//   - readPreference other than primary (secondary, secondaryPreferred, primaryPreferred, nearest):
//     claims and fan-outs would read stale leases and queues;
//   - readPreferenceTags and maxStalenessSeconds, which only choose among secondaries;
//   - readConcernLevel other than majority (local, available, linearizable, snapshot).
//
// It returns the driver's parse error when uri is not a valid connection string.
func CheckConcerns(uri string) error {
	cs, err := connstring.Parse(uri)
	if err != nil {
		return err
	}
	const remove = "remove it from the URI: the sidecar writes with w=majority and journal=true, reads with readConcernLevel=majority from the primary"
	switch {
	case cs.WNumberSet:
		return fmt.Errorf("URI option w=%d: a write acknowledged by fewer than a majority of the members can be rolled back by a failover (a published event lost, a lease given twice); %s", cs.WNumber, remove)
	case cs.WString != "" && cs.WString != "majority":
		return fmt.Errorf("URI option w=%s: a tagged write concern need not reach a majority, and a failover can roll back what it acknowledged; %s", cs.WString, remove)
	case cs.JSet && !cs.J:
		return fmt.Errorf("URI option journal=false: an acknowledged write not yet in the journal is lost if the members holding it restart; %s", remove)
	}
	for key, values := range cs.UnknownOptions {
		if key == "j" {
			return fmt.Errorf("URI option j=%s: not an option of the Go driver's connection string (which ignores it); %s", strings.Join(values, ","), remove)
		}
	}
	if mode := cs.ReadPreference; mode != "" && !strings.EqualFold(mode, "primary") {
		return fmt.Errorf("URI option readPreference=%s: a secondary's copy lags the primary, so claims and fan-outs would read stale leases and queues (a second lease, a duplicate POST); %s", mode, remove)
	}
	for _, set := range cs.ReadPreferenceTagSets { // tags and staleness only choose among secondaries
		tags := make([]string, 0, len(set))
		for k, v := range set {
			tags = append(tags, k+":"+v)
		}
		slices.Sort(tags)
		return fmt.Errorf("URI option readPreferenceTags=%s: tags choose secondaries to read from, and a secondary's copy lags the primary (stale leases); %s", strings.Join(tags, ","), remove)
	}
	if cs.MaxStalenessSet {
		return fmt.Errorf("URI option maxStalenessSeconds=%d: a staleness bound chooses secondaries to read from, and a secondary's copy lags the primary (stale leases); %s", int(cs.MaxStaleness.Seconds()), remove)
	}
	if level := cs.ReadConcernLevel; level != "" && level != "majority" {
		return fmt.Errorf("URI option readConcernLevel=%s: the sidecar reads with readConcernLevel=majority (what a failover cannot roll back); %s", level, remove)
	}
	return nil
}

// DatabaseName returns the database named in uri's path, "" when it names none, or an error when uri is
// not a valid connection string.
func DatabaseName(uri string) (string, error) {
	cs, err := connstring.Parse(uri)
	if err != nil {
		return "", err
	}
	return cs.Database, nil
}

// ServerTime returns the server's clock, hello.localTime (MongoDB and FerretDB both return it), in
// milliseconds as the server keeps it; lease.Clock measures its offset from the local clock with it. It
// returns the wrapped command error (pulsetype.ErrUnavailable when the server cannot be reached), or an
// error when the answer holds no localTime.
func (s *Store) ServerTime(ctx context.Context) (time.Time, error) {
	var hello struct {
		LocalTime time.Time `bson:"localTime"`
	}
	if err := s.client.Database("admin").RunCommand(ctx, bson.D{{Key: "hello", Value: 1}}).Decode(&hello); err != nil {
		return time.Time{}, wrap("read the server's time", err)
	}
	if hello.LocalTime.IsZero() {
		return time.Time{}, errors.New("read the server's time: hello returned no localTime")
	}
	return hello.LocalTime, nil
}
