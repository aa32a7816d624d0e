package mongo

import (
	"context"
	"errors"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	drvevent "go.mongodb.org/mongo-driver/v2/event"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
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
// database answers API requests within that bound. It returns an error when uri is not a valid connection
// string. The caller disconnects the client.
func Connect(uri string, opts ConnectOptions) (*mongo.Client, error) {
	co := options.Client().ApplyURI(uri).SetAppName(appName)
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
