package mongo

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/pulse-sidecar/pulse/internal/testdb"
)

// Features are what the server under test can do. A conformance case that needs one the server lacks
// skips, naming it. TestConformance probes them on the server, independently of the store; TTLIndexes,
// ChangeStreams and PartialIndexes mean what the fields of the store's Capabilities of those names mean.
type Features struct {
	TTLIndexes      bool // createIndexes with expireAfterSeconds (FerretDB v1: 238 NotImplemented)
	ChangeStreams   bool // $changeStream aggregations: a replica set or a sharded cluster
	PartialIndexes  bool // indexes with a partialFilterExpression, listed back
	SparseIndexes   bool // sparse indexes, listed back (FerretDB v1 accepts the option and drops it)
	CollatedIndexes bool // indexes with a collation, listed back
	HiddenIndexes   bool // hidden indexes, listed back
	IndexPlans      bool // explain reports the index scan (IXSCAN) of a query's winning plan
	// Serializations are the orders, of the embedded database's proxy, that the race cases run in, one
	// subtest each (see testdb.Serialize); none on a real server, where they run once in its own order.
	Serializations []testdb.Serialization
}

// feature names one field of Features, as skip messages give it.
type feature string

const (
	featureTTL           feature = "TTL indexes"
	featureChangeStreams feature = "change streams"
	featurePartial       feature = "partial indexes"
	featureSparse        feature = "sparse indexes"
	featureCollation     feature = "collated indexes"
	featureHidden        feature = "hidden indexes"
	featureIndexPlans    feature = "index plans in explain"
)

// has reports whether the server has feature f.
func (fs Features) has(f feature) bool {
	switch f {
	case featureTTL:
		return fs.TTLIndexes
	case featureChangeStreams:
		return fs.ChangeStreams
	case featurePartial:
		return fs.PartialIndexes
	case featureSparse:
		return fs.SparseIndexes
	case featureCollation:
		return fs.CollatedIndexes
	case featureHidden:
		return fs.HiddenIndexes
	case featureIndexPlans:
		return fs.IndexPlans
	}
	panic(fmt.Sprintf("unknown feature %q", f))
}

// Server is the database server of one conformance case.
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

// Open gives a conformance case its server, its database in serialization s: one of
// Features.Serializations, or "" for the server's own order.
type Open func(t *testing.T, s testdb.Serialization) Server

// conformanceCase is one test of the suite. A race case runs once per Features.Serializations. A case that
// needs a feature calls env.require.
type conformanceCase struct {
	name string
	run  func(t *testing.T, e *env)
	race bool
}

// env is what a conformance case gets: its server's opener, features and serialization.
type env struct {
	open     Open
	features Features
	order    testdb.Serialization
}

// require skips t, naming f, when the server lacks feature f.
func (e *env) require(t *testing.T, f feature) {
	t.Helper()
	if !e.features.has(f) {
		t.Skipf("skipped: the server lacks %s; the case runs on a MongoDB replica set given by %s", f, testdb.EnvMongoDBURI)
	}
}

// RunConformance runs the store's conformance suite: every case of conformanceCases, each in a subtest
// named after it, on the servers open gives, which have features f.
func RunConformance(t *testing.T, open Open, f Features) {
	for _, c := range conformanceCases {
		t.Run(c.name, func(t *testing.T) {
			if !c.race || len(f.Serializations) == 0 {
				c.run(t, &env{open: open, features: f})
				return
			}
			t.Parallel()
			for _, s := range f.Serializations {
				t.Run(string(s), func(t *testing.T) { c.run(t, &env{open: open, features: f, order: s}) })
			}
		})
	}
}

// TestConformance runs the suite on the test database: the embedded FerretDB, its race cases both
// linearized and interleaved, or the server PULSE_TEST_MONGODB_URI names, with the features probed there.
func TestConformance(t *testing.T) {
	features := probeFeatures(t, openTestDB(t, ""))
	if testdb.Embedded() {
		features.Serializations = []testdb.Serialization{testdb.Linearized, testdb.Interleaved}
	}
	t.Logf("server features: %+v", features)
	RunConformance(t, openTestDB, features)
}

// openTestDB is the Open of the test database (internal/testdb).
func openTestDB(t *testing.T, s testdb.Serialization) Server {
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
		t.Cleanup(func() { _ = c.Disconnect(context.Background()) })
		return c
	}}
}

// indexFeatures are the index options that show each index feature, and the listIndexes field that
// reports them.
var indexFeatures = map[feature]struct {
	field string
	opts  bson.D
}{
	featureTTL:       {"expireAfterSeconds", bson.D{{Key: "expireAfterSeconds", Value: 0}}},
	featureSparse:    {"sparse", bson.D{{Key: "sparse", Value: true}}},
	featurePartial:   {"partialFilterExpression", bson.D{{Key: "partialFilterExpression", Value: bson.D{{Key: "x", Value: bson.D{{Key: "$exists", Value: true}}}}}}},
	featureCollation: {"collation", bson.D{{Key: "collation", Value: bson.D{{Key: "locale", Value: "fr"}}}}},
	featureHidden:    {"hidden", bson.D{{Key: "hidden", Value: true}}},
}

// probeFeatures asks srv what it can do, independently of the store: an index feature by creating an
// index with its option on a scratch collection and finding the option listed back (see lacks), change
// streams by opening one, index plans by explaining a find that an index serves.
func probeFeatures(t *testing.T, srv Server) Features {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	db := srv.Client.Database(srv.Database)
	var f Features
	for name, dst := range map[feature]*bool{featureTTL: &f.TTLIndexes, featurePartial: &f.PartialIndexes,
		featureSparse: &f.SparseIndexes, featureCollation: &f.CollatedIndexes, featureHidden: &f.HiddenIndexes} {
		why := lacks(ctx, t, db, name)
		*dst = why == ""
		if why != "" {
			t.Logf("the server lacks %s: %s", name, why)
		}
	}
	if stream, err := db.Collection("feature_probe_stream").Watch(ctx, mongo.Pipeline{}); err != nil {
		t.Logf("the server lacks %s: %v", featureChangeStreams, err)
	} else {
		f.ChangeStreams = true
		_ = stream.Close(ctx)
	}
	plans := db.Collection("feature_probe_plans")
	if _, err := plans.Indexes().CreateOne(ctx, mongo.IndexModel{Keys: bson.D{{Key: "x", Value: 1}}}); err != nil {
		t.Fatalf("create an index on %s: %v", plans.Name(), err)
	}
	var explained bson.Raw
	err := db.RunCommand(ctx, bson.D{{Key: "explain", Value: bson.D{{Key: "find", Value: plans.Name()}, {Key: "filter", Value: bson.D{{Key: "x", Value: 1}}}}},
		{Key: "verbosity", Value: "queryPlanner"}}).Decode(&explained)
	if err != nil {
		t.Fatalf("explain a find on %s: %v", plans.Name(), err)
	}
	f.IndexPlans = strings.Contains(explained.Lookup("queryPlanner", "winningPlan").String(), "IXSCAN")
	return f
}

// lacks reports why the server of db lacks index feature f ("" when it has it): it creates an index with
// f's option on a scratch collection of db and checks that listIndexes reports the option (FerretDB
// answers 238 for most, and accepts sparse but drops it).
func lacks(ctx context.Context, t *testing.T, db *mongo.Database, f feature) string {
	t.Helper()
	co, ok := indexFeatures[f]
	if !ok {
		t.Fatalf("%q is not an index feature", f)
	}
	coll := "capability_probe_" + co.field
	ix := append(bson.D{{Key: "key", Value: bson.D{{Key: "x", Value: 1}}}, {Key: "name", Value: "probe"}}, co.opts...)
	defer func() { _ = db.Collection(coll).Drop(context.Background()) }()
	err := db.RunCommand(ctx, bson.D{{Key: "createIndexes", Value: coll}, {Key: "indexes", Value: bson.A{ix}}}).Err()
	if err != nil {
		return "createIndexes answers " + err.Error()
	}
	cur, err := db.Collection(coll).Indexes().List(ctx)
	if err != nil {
		t.Fatalf("list indexes of %s: %v", coll, err)
	}
	var listed []bson.M
	if err := cur.All(ctx, &listed); err != nil {
		t.Fatalf("list indexes of %s: %v", coll, err)
	}
	for _, l := range listed {
		if l["name"] == "probe" {
			if _, ok := l[co.field]; ok {
				return ""
			}
			return fmt.Sprintf("createIndexes accepts %s but listIndexes does not report it: %v", co.field, l)
		}
	}
	return "createIndexes succeeded but listIndexes has no such index"
}

// conformanceCases is the suite, in the order the files of this package hold the cases.
var conformanceCases = []conformanceCase{
	// store_test.go
	{name: "PutEndpointConcurrentNewGroupLeavesOneSubscription", run: testPutEndpointConcurrentNewGroupLeavesOneSubscription, race: true},
	{name: "PutEndpointReplaceKeepsCreatedAt", run: testPutEndpointReplaceKeepsCreatedAt},
	{name: "FanOutConcurrentCreatesOneDeliveryPerGroup", run: testFanOutConcurrentCreatesOneDeliveryPerGroup, race: true},
	{name: "FanOutStaleRepairsInterruptedFanOut", run: testFanOutStaleRepairsInterruptedFanOut},
	{name: "PublishArrayIsIdempotentAndConflictsStoreNothing", run: testPublishArrayIsIdempotentAndConflictsStoreNothing},
	{name: "ClaimIsFencedByFencingToken", run: testClaimIsFencedByFencingToken},
	{name: "ReapOneReapsExpiredLease", run: testReapOneReapsExpiredLease},
	{name: "ReapOneSparesRenewedLease", run: testReapOneSparesRenewedLease, race: true},
	{name: "CreateAttemptAndEndDeliveryAreExactlyOnce", run: testCreateAttemptAndEndDeliveryAreExactlyOnce, race: true},
	{name: "ExpiredDocumentsAreInvisibleAndSwept", run: testExpiredDocumentsAreInvisibleAndSwept},
	{name: "ConcurrentIdenticalArrayPublishes", run: testConcurrentIdenticalArrayPublishes, race: true},
	{name: "ReplayVisitsEachDeliveryOnce", run: testReplayVisitsEachDeliveryOnce},
	// batch_test.go
	{name: "ClaimAttemptsLeasesEachAttemptOnce", run: testClaimAttemptsLeasesEachAttemptOnce, race: true},
	{name: "FinishAttemptsIsFencedPerAttempt", run: testFinishAttemptsIsFencedPerAttempt},
	{name: "FanOutMarkIsClearedSeparately", run: testFanOutMarkIsClearedSeparately},
	{name: "GetEventsSkipsMissingAndExpired", run: testGetEventsSkipsMissingAndExpired},
	{name: "LargeBatchesDoNotStallTheDatabase", run: testLargeBatchesDoNotStallTheDatabase},
	// lines_test.go
	{name: "ClaimHeadIsPerOrderingKey", run: testClaimHeadIsPerOrderingKey},
	// retention_test.go, retry_retention_test.go
	{name: "TTLIndexesAreRequested", run: testTTLIndexesAreRequested},
	{name: "ExpiresAtOnlyOnTerminalDocuments", run: testExpiresAtOnlyOnTerminalDocuments},
	{name: "RetryOfExpiringDeliveryIsNotSweptAway", run: testRetryOfExpiringDeliveryIsNotSweptAway},
	{name: "RetryAfterTheHistoryExpiredIsNotFound", run: testRetryAfterTheHistoryExpiredIsNotFound},
	// schema_test.go, schema_verify_test.go
	{name: "CapabilitiesMatchTheServer", run: testCapabilitiesMatchTheServer},
	{name: "DetectCapabilities", run: testDetectCapabilities},
	{name: "GivenCapabilitiesAreNotDetected", run: testGivenCapabilitiesAreNotDetected},
	{name: "UpdateCommandsHonourMaxUpdateStatements", run: testUpdateCommandsHonourMaxUpdateStatements},
	{name: "EnsureSchemaCreatesEveryIndexAndIsIdempotent", run: testEnsureSchemaCreatesEveryIndexAndIsIdempotent},
	{name: "EnsureSchemaConcurrentStores", run: testEnsureSchemaConcurrentStores, race: true},
	{name: "EnsureSchemaRefusesIncompatibleIndex", run: testEnsureSchemaRefusesIncompatibleIndex},
	{name: "EnsureSchemaReportsDuplicatesBlockingUniqueIndex", run: testEnsureSchemaReportsDuplicatesBlockingUniqueIndex},
	{name: "EnsureSchemaRefusesIndexVariants", run: testEnsureSchemaRefusesIndexVariants},
	{name: "TTLFallbackComesFromTheServer", run: testTTLFallbackComesFromTheServer},
	{name: "EnsureSchemaRefusesUserWithoutIndexRights", run: testEnsureSchemaRefusesUserWithoutIndexRights},
	// sealing_test.go
	{name: "EndpointSecretsEncryptedAtRest", run: testEndpointSecretsEncryptedAtRest},
	// connect_test.go
	{name: "ServerTime", run: testServerTime},
	// explain_test.go, shardplan_test.go
	{name: "HotQueriesUseIndexes", run: testHotQueriesUseIndexes},
	{name: "ShardPlanCoversHotQueries", run: testShardPlanCoversHotQueries},
	// stats_test.go
	{name: "GroupStatsCountsTheLastHour", run: testGroupStatsCountsTheLastHour},
	{name: "ConsoleReadsWith10000Deliveries", run: testConsoleReadsWith10000Deliveries},
	// state_test.go
	{name: "EndpointStateAndFailingStreak", run: testEndpointStateAndFailingStreak},
	// watch_test.go
	{name: "WatchEventsSendsChangeStreamAndReopens", run: testWatchEventsSendsChangeStreamAndReopens},
	// queue_test.go
	{name: "GroupCommitWritesConcurrentPublishesTogether", run: testGroupCommitWritesConcurrentPublishesTogether, race: true},
	{name: "QueueHoldsPendingWorkOnly", run: testQueueHoldsPendingWorkOnly},
	{name: "RepairScanWorksFromTheQueue", run: testRepairScanWorksFromTheQueue},
	{name: "LeaseWithoutItsQueueCopyIsReaped", run: testLeaseWithoutItsQueueCopyIsReaped},
	{name: "StagedLeftoversDoNotHideAnInterruptedFanOut", run: testStagedLeftoversDoNotHideAnInterruptedFanOut},
	{name: "EnsureSchemaQueuesEarlierWork", run: testEnsureSchemaQueuesEarlierWork},
	{name: "FanOutClaimingInsertsLeasedAttempts", run: testFanOutClaimingInsertsLeasedAttempts, race: true},
	{name: "HeadWaitsForAFanOutRepairedDuringItsLook", run: testHeadWaitsForAFanOutRepairedDuringItsLook},
}
