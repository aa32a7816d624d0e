package mongo

import (
	"testing"

	"github.com/pulse-sidecar/pulse/internal/testdb"
	"github.com/pulse-sidecar/pulse/mongo/storetest"
)

// env is what a case of internalCases gets: its server's opener, features and serialization, as the
// storage suite's Env gives them.
type env struct {
	open     storetest.Open
	features storetest.Features
	order    testdb.Serialization
}

// require skips t, naming f, when the server lacks feature f.
func (e *env) require(t *testing.T, f storetest.Feature) {
	t.Helper()
	(&storetest.Env{Harness: storetest.Harness{Features: e.features}}).Require(t, f)
}

// internal adapts a case that reads the store's internals to the suite's runner.
func internal(run func(t *testing.T, e *env)) func(t *testing.T, e *storetest.Env) {
	return func(t *testing.T, e *storetest.Env) { run(t, &env{open: e.Open, features: e.Features, order: e.Order}) }
}

// TestStoreInternals runs, with the storage suite's runner and on the servers and features of
// TestConformance, the cases of this store that read its internals (its documents' types, index specs,
// capabilities and the ways it splits its work): what the suite of package storetest cannot say for
// every store.
func TestStoreInternals(t *testing.T) {
	features := storetest.ProbeFeatures(t, storetest.OpenTestDB(t, ""))
	if testdb.Embedded() {
		features.Serializations = []testdb.Serialization{testdb.Linearized, testdb.Interleaved}
	}
	storetest.Run(t, storetest.Harness{Open: storetest.OpenTestDB, Features: features}, internalCases)
}

// internalCases are the cases of TestStoreInternals, in the order the files of this package hold them.
var internalCases = []storetest.Case{
	// retention_test.go
	{Name: "TTLIndexesAreRequested", Run: internal(testTTLIndexesAreRequested)},
	{Name: "ExpiresAtOnlyOnTerminalDocuments", Run: internal(testExpiresAtOnlyOnTerminalDocuments)},
	// schema_test.go, schema_verify_test.go
	{Name: "CapabilitiesMatchTheServer", Run: internal(testCapabilitiesMatchTheServer)},
	{Name: "DetectCapabilities", Run: internal(testDetectCapabilities)},
	{Name: "IndexBuildsSummarized", Run: internal(testIndexBuildsSummarized)},
	{Name: "GivenCapabilitiesAreNotDetected", Run: internal(testGivenCapabilitiesAreNotDetected)},
	{Name: "UpdateCommandsHonourMaxUpdateStatements", Run: internal(testUpdateCommandsHonourMaxUpdateStatements)},
	{Name: "EnsureSchemaCreatesEveryIndexAndIsIdempotent", Run: internal(testEnsureSchemaCreatesEveryIndexAndIsIdempotent)},
	{Name: "EnsureSchemaAddsNewIndexes", Run: internal(testEnsureSchemaAddsNewIndexes)},
	{Name: "EnsureSchemaConcurrentStores", Run: internal(testEnsureSchemaConcurrentStores), Race: true},
	{Name: "EnsureSchemaRefusesIncompatibleIndex", Run: internal(testEnsureSchemaRefusesIncompatibleIndex)},
	{Name: "EnsureSchemaReportsDuplicatesBlockingUniqueIndex", Run: internal(testEnsureSchemaReportsDuplicatesBlockingUniqueIndex)},
	{Name: "EnsureSchemaRefusesIndexVariants", Run: internal(testEnsureSchemaRefusesIndexVariants)},
	{Name: "TTLFallbackComesFromTheServer", Run: internal(testTTLFallbackComesFromTheServer)},
	{Name: "EnsureSchemaRefusesUserWithoutIndexRights", Run: internal(testEnsureSchemaRefusesUserWithoutIndexRights)},
	// reissue_test.go
	{Name: "ClaimsAndRenewalsAreReissued", Run: internal(testClaimsAndRenewalsAreReissued)},
	{Name: "ReissuedWritesKeepAReopen", Run: internal(testReissuedWritesKeepAReopen)},
	// sealing_test.go
	{Name: "EndpointSecretsEncryptedAtRest", Run: internal(testEndpointSecretsEncryptedAtRest)},
	// connect_test.go
	{Name: "ServerTime", Run: internal(testServerTime)},
	// explain_test.go, shardplan_test.go
	{Name: "HotQueriesUseIndexes", Run: internal(testHotQueriesUseIndexes)},
	{Name: "ShardPlanCoversHotQueries", Run: internal(testShardPlanCoversHotQueries)},
	// hotpaths_test.go
	{Name: "HotQueriesUseAnIndex", Run: internal(testHotQueriesUseAnIndex)},
	// readlimit_test.go
	{Name: "ReadsCarryAServerSideLimit", Run: internal(testReadsCarryAServerSideLimit)},
	// stats_test.go
	{Name: "GroupStatsCountsTheLastHour", Run: internal(testGroupStatsCountsTheLastHour)},
	{Name: "ConsoleReadsWith10000Deliveries", Run: internal(testConsoleReadsWith10000Deliveries)},
	// activity_test.go
	{Name: "ActivityCountsMinutes", Run: internal(testActivityCountsMinutes)},
	{Name: "LineHeadReadsOnly", Run: internal(testLineHeadReadsOnly)},
	// lag_test.go
	{Name: "OldestPendingFollowsTheBacklog", Run: internal(testOldestPendingFollowsTheBacklog)},
	{Name: "PendingByGroupCountsOnBothPaths", Run: internal(testPendingByGroupCountsOnBothPaths)},
	{Name: "SetBacklogHighFlipsOnce", Run: internal(testSetBacklogHighFlipsOnce)},
	// filter_test.go
	{Name: "FanOutEndsAFailedFilterAsFilterError", Run: internal(testFanOutEndsAFailedFilterAsFilterError)},
	// watch_test.go
	{Name: "WatchEventsSendsChangeStreamAndReopens", Run: internal(testWatchEventsSendsChangeStreamAndReopens)},
	{Name: "WatchMatchesOnlyWhatWakesWork", Run: internal(testWatchMatchesOnlyWhatWakesWork)},
	{Name: "WatchWithoutTheChangeStreamActionWarnsOnce", Run: internal(testWatchWithoutTheChangeStreamActionWarnsOnce)},
	// queue_test.go
	{Name: "GroupCommitWritesConcurrentPublishesTogether", Run: internal(testGroupCommitWritesConcurrentPublishesTogether), Race: true},
	{Name: "RepairScanWorksFromTheQueue", Run: internal(testRepairScanWorksFromTheQueue)},
	{Name: "EnsureSchemaQueuesEarlierWork", Run: internal(testEnsureSchemaQueuesEarlierWork)},
	// arrays_test.go
	{Name: "PartlyCommittedArrayRollsForward", Run: internal(testPartlyCommittedArrayRollsForward)},
	{Name: "SinglePublishIsTwoCommands", Run: internal(testSinglePublishIsTwoCommands)},
	{Name: "SmallRoundIsOneCommandPerEventMore", Run: internal(testSmallRoundIsOneCommandPerEventMore)},
	// lines_test.go
	{Name: "ClaimHeadsCostIsPerRound", Run: internal(testClaimHeadsCostIsPerRound)},
	{Name: "ClaimHeadsKeepsANewRegistrationsHead", Run: internal(testClaimHeadsKeepsANewRegistrationsHead)},
	{Name: "ClaimHeadsEndsAnEarlierRegistrationsHeadBehindAnEndedOne", Run: internal(testClaimHeadsEndsAnEarlierRegistrationsHeadBehindAnEndedOne)},
	{Name: "ClaimHeadsReadsPastABigUnkeyedLine", Run: internal(testClaimHeadsReadsPastABigUnkeyedLine)},
	{Name: "ClaimHeadsReadsPastABigKeyedLine", Run: internal(testClaimHeadsReadsPastABigKeyedLine)},
	// paging_test.go
	{Name: "EndPendingWorksInPages", Run: internal(testEndPendingWorksInPages)},
	{Name: "QueueMigrationResumes", Run: internal(testQueueMigrationResumes)},
	{Name: "IndexesBuildWithMajorityCommitQuorum", Run: internal(testIndexesBuildWithMajorityCommitQuorum)},
	{Name: "ChangeStreamDetectionSurvivesFailedHello", Run: internal(testChangeStreamDetectionSurvivesFailedHello)},
}
