package storetest

import (
	"fmt"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/pulse-sidecar/pulse/internal/testdb"
)

// Features are what the server under test can do, as ProbeFeatures detects them, independently of any
// store. A case that needs one the server lacks skips, naming it (Env.Require). TTLIndexes, ChangeStreams
// and PartialIndexes mean what the store capabilities of those names mean.
type Features struct {
	TTLIndexes      bool // createIndexes with expireAfterSeconds (FerretDB v1: 238 NotImplemented)
	ChangeStreams   bool // $changeStream aggregations: a replica set or a sharded cluster
	PartialIndexes  bool // indexes with a partialFilterExpression, listed back
	SparseIndexes   bool // sparse indexes, listed back (FerretDB v1 accepts the option and drops it)
	CollatedIndexes bool // indexes with a collation, listed back
	HiddenIndexes   bool // hidden indexes, listed back
	IndexPlans      bool // explain reports the index scan (IXSCAN) of a query's winning plan
	Users           bool // usersInfo answers: the server manages users and roles (FerretDB v1: CommandNotFound)
	// Serializations are the orders, of the embedded database's proxy, that the race cases run in, one
	// subtest each (see testdb.Serialize); none on a real server, where they run once in its own order.
	Serializations []testdb.Serialization
}

// Feature names one field of Features, as skip messages give it.
type Feature string

// The features a case may require.
const (
	FeatureTTL           Feature = "TTL indexes"
	FeatureChangeStreams Feature = "change streams"
	FeaturePartial       Feature = "partial indexes"
	FeatureSparse        Feature = "sparse indexes"
	FeatureCollation     Feature = "collated indexes"
	FeatureHidden        Feature = "hidden indexes"
	FeatureIndexPlans    Feature = "index plans in explain"
	FeatureUsers         Feature = "users and roles"
)

// Has reports whether the server has feature f; it panics on a name that is none of the Feature constants.
func (fs Features) Has(f Feature) bool {
	switch f {
	case FeatureTTL:
		return fs.TTLIndexes
	case FeatureChangeStreams:
		return fs.ChangeStreams
	case FeaturePartial:
		return fs.PartialIndexes
	case FeatureSparse:
		return fs.SparseIndexes
	case FeatureCollation:
		return fs.CollatedIndexes
	case FeatureHidden:
		return fs.HiddenIndexes
	case FeatureIndexPlans:
		return fs.IndexPlans
	case FeatureUsers:
		return fs.Users
	}
	panic(fmt.Sprintf("unknown feature %q", f))
}

// Server is the database server of one case.
type Server struct {
	// URI is the server's connection string.
	URI string
	// Client is connected to the server; Database names a fresh database of the case's own. Both are
	// cleaned up when the case ends.
	Client   *mongo.Client
	Database string
	// Connect returns another client on the server (another replica's connection pool) with opts, which
	// may be nil, applied after the server's URI; it is disconnected when the case ends.
	Connect func(opts *options.ClientOptions) *mongo.Client
}

// Open gives a case its server and its database in serialization s: one of Features.Serializations, or
// "" for the server's own order.
type Open func(t *testing.T, s testdb.Serialization) Server

// OpenTestDB is the Open of the test database (internal/testdb): the embedded FerretDB, or the server
// PULSE_TEST_MONGODB_URI names. Other clients it connects select a server within 30 seconds.
func OpenTestDB(t *testing.T, s testdb.Serialization) Server {
	t.Helper()
	client, dbName := testdb.Database(t)
	if s != "" {
		testdb.Serialize(t, client, dbName, s)
	}
	return Server{URI: testdb.URI(t), Client: client, Database: dbName, Connect: func(opts *options.ClientOptions) *mongo.Client {
		t.Helper()
		all := []*options.ClientOptions{options.Client().ApplyURI(testdb.URI(t)).SetServerSelectionTimeout(30 * time.Second)}
		if opts != nil {
			all = append(all, opts)
		}
		c, err := mongo.Connect(all...)
		if err != nil {
			t.Fatalf("connect: %v", err)
		}
		t.Cleanup(func() { _ = c.Disconnect(t.Context()) })
		return c
	}}
}

// Harness is what a store gives the suite: where its cases run and how to build the store under test.
type Harness struct {
	// Open gives each case its server and database.
	Open Open
	// Features are the server's, from ProbeFeatures (Serializations set by the caller).
	Features Features
	// NewStore returns a store on client with o, its schema ensured; it fails t when it cannot.
	NewStore func(t *testing.T, client *mongo.Client, o Options) Store
	// DeliveryID returns the id the store gives the delivery of eventID to consumerGroup.
	DeliveryID func(consumerGroup, eventID string) string
	// StagedTimeout is how long the store keeps a staged event (of a publish that never committed) before
	// its sweeper removes it.
	StagedTimeout time.Duration
}

// Case is one case of a suite. A race case runs once per Features.Serializations.
type Case struct {
	Name string
	Run  func(t *testing.T, e *Env)
	Race bool
}

// Env is what a case gets: the harness and the serialization it runs in.
type Env struct {
	Harness
	Order testdb.Serialization
}

// Require skips t, naming f, when the server lacks feature f.
func (e *Env) Require(t *testing.T, f Feature) {
	t.Helper()
	if !e.Features.Has(f) {
		t.Skipf("skipped: the server lacks %s; the case runs on a MongoDB replica set given by %s", f, testdb.EnvMongoDBURI)
	}
}

// Run runs cases, each in a subtest named after it, on the servers h opens. It blocks until they end.
func Run(t *testing.T, h Harness, cases []Case) {
	for _, c := range cases {
		t.Run(c.Name, func(t *testing.T) {
			if !c.Race || len(h.Features.Serializations) == 0 {
				c.Run(t, &Env{Harness: h})
				return
			}
			t.Parallel()
			for _, s := range h.Features.Serializations {
				t.Run(string(s), func(t *testing.T) { c.Run(t, &Env{Harness: h, Order: s}) })
			}
		})
	}
}

// Cases returns the storage suite, grouped by the step of the delivery lifecycle each case exercises.
func Cases() []Case {
	return concat(endpointCases, publishCases, fanOutCases, claimCases, lineCases, completeCases, reapCases, operateCases)
}

func concat(groups ...[]Case) []Case {
	var out []Case
	for _, g := range groups {
		out = append(out, g...)
	}
	return out
}
