package mongo_test

import (
	"testing"

	"github.com/rs/zerolog"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/pulse-sidecar/pulse/internal/testdb"
	pmongo "github.com/pulse-sidecar/pulse/mongo"
	"github.com/pulse-sidecar/pulse/mongo/storetest"
)

// storeUnderTest is a Store as the storage suite sees it.
type storeUnderTest struct{ *pmongo.Store }

// TTLIndexes reports the capability the store detected in EnsureSchema.
func (s storeUnderTest) TTLIndexes() bool { return s.Capabilities().TTLIndexes }

var _ storetest.Store = storeUnderTest{}

// harness returns the storage suite's harness of this store on the test database (internal/testdb): the
// embedded FerretDB, its race cases both linearized and interleaved, or the server PULSE_TEST_MONGODB_URI
// names, with the features probed there.
func harness(t *testing.T) storetest.Harness {
	features := storetest.ProbeFeatures(t, storetest.OpenTestDB(t, ""))
	if testdb.Embedded() {
		features.Serializations = []testdb.Serialization{testdb.Linearized, testdb.Interleaved}
	}
	t.Logf("server features: %+v", features)
	return storetest.Harness{Open: storetest.OpenTestDB, Features: features, DeliveryID: pmongo.DeliveryID,
		StagedTimeout: pmongo.StagedTimeout, NewStore: newStore}
}

// newStore is the suite's Harness.NewStore: a Store on client with o, its schema ensured.
func newStore(t *testing.T, client *mongo.Client, o storetest.Options) storetest.Store {
	t.Helper()
	s := pmongo.New(client, pmongo.Options{Database: o.Database, CollectionPrefix: o.CollectionPrefix, LeaseTimeout: o.LeaseTimeout,
		Now: o.Now, EventRetention: o.EventRetention, HistoryRetention: o.HistoryRetention, Logger: zerolog.Nop()})
	ctx, cancel := storetest.Context(t)
	defer cancel()
	if _, err := s.EnsureSchema(ctx); err != nil {
		t.Fatalf("EnsureSchema: %v", err)
	}
	return storeUnderTest{s}
}

// TestConformance runs the storage suite (package storetest) on this store.
func TestConformance(t *testing.T) {
	storetest.Run(t, harness(t), storetest.Cases())
}
