package testdb_test

import (
	"context"
	"regexp"
	"slices"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/pulse-sidecar/pulse/internal/testdb"
)

// validDatabaseName is the rule of FerretDB v1, stricter than MongoDB's.
var validDatabaseName = regexp.MustCompile(`^[a-zA-Z0-9_-]{1,63}$`)

func TestDatabaseIsFreshAndDroppedInCleanup(t *testing.T) {
	t.Parallel()
	var name string
	t.Run("Uses/A Long Name With Spaces & Symbols That Goes On And On And On", func(t *testing.T) {
		client, dbName := testdb.Database(t)
		name = dbName
		if !validDatabaseName.MatchString(dbName) {
			t.Fatalf("database name %q is not valid on FerretDB", dbName)
		}
		n, err := client.Database(dbName).Collection("c").CountDocuments(t.Context(), bson.D{})
		if err != nil || n != 0 {
			t.Fatalf("fresh database: %d documents, %v; want 0, nil", n, err)
		}
		if _, err := client.Database(dbName).Collection("c").InsertOne(t.Context(), bson.D{{Key: "x", Value: 1}}); err != nil {
			t.Fatalf("InsertOne: %v", err)
		}
	})

	client, _ := testdb.Database(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	names, err := client.ListDatabaseNames(ctx, bson.D{})
	if err != nil {
		t.Fatalf("ListDatabaseNames: %v", err)
	}
	if slices.Contains(names, name) {
		t.Fatalf("database %s still exists after its test ended", name)
	}
}

func TestURIIsStable(t *testing.T) {
	t.Parallel()
	if a, b := testdb.URI(t), testdb.URI(t); a != b || a == "" {
		t.Fatalf("URI() = %q then %q, want the same non-empty URI", a, b)
	}
}
