package devdb

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// On the SQLite handler, a collection used through the proxy gets the index FerretDB's queries by _id read
// by: SQLite's plan of such a query searches an index instead of scanning the table. listIndexes is
// unchanged, and a dropped and recreated collection gets it again.
func TestSQLiteQueriesByIDUseAnIndex(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir := t.TempDir()
	srv, err := Start(ctx, Config{DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Stop() })
	client, err := mongo.Connect(options.Client().ApplyURI(srv.URI()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Disconnect(context.Background()) })
	coll := client.Database("ids").Collection("c")
	for round := range 2 {
		if _, err := coll.InsertMany(ctx, []any{bson.M{"_id": "a", "n": 1}, bson.M{"_id": "b", "n": 2}}); err != nil {
			t.Fatal(err)
		}
		var got bson.M
		if err := coll.FindOne(ctx, bson.M{"_id": "b"}).Decode(&got); err != nil || got["n"] != int32(2) {
			t.Fatalf("round %d: FindOne(b) = %v, %v", round, got, err)
		}
		if plan := sqlitePlan(t, filepath.Join(dir, "ids.sqlite"), "c"); !strings.Contains(plan, "USING INDEX") || !strings.Contains(plan, "__id_path") {
			t.Errorf("round %d: SQLite's plan of a query by _id is %q, want a search of the _id index", round, plan)
		}
		cur, err := coll.Indexes().List(ctx)
		var indexes []bson.M
		if err != nil || cur.All(ctx, &indexes) != nil || len(indexes) != 1 || indexes[0]["name"] != "_id_" {
			t.Errorf("round %d: listIndexes = %v, %v; want _id_ alone", round, indexes, err)
		}
		if err := coll.Drop(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// sqlitePlan returns SQLite's plan of the query FerretDB runs for {_id: x} on collection coll of the
// database file.
func sqlitePlan(t *testing.T, file, coll string) string {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+filepath.ToSlash(file)+"?_pragma=busy_timeout(10000)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var table string
	if err := db.QueryRow(fmt.Sprintf("SELECT table_name FROM %q WHERE name = ?", sqliteMetadataTable), coll).Scan(&table); err != nil {
		t.Fatalf("table of %s: %v", coll, err)
	}
	rows, err := db.Query(fmt.Sprintf(`EXPLAIN QUERY PLAN SELECT _ferretdb_sjson FROM %q WHERE _ferretdb_sjson->'$._id' = ?`, table), `"b"`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var plan []string
	for rows.Next() {
		var id, parent, notUsed int
		var detail string
		if err := rows.Scan(&id, &parent, &notUsed, &detail); err != nil {
			t.Fatal(err)
		}
		plan = append(plan, detail)
	}
	return strings.Join(plan, "; ")
}
