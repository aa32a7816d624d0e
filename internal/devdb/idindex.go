package devdb

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"time"

	_ "modernc.org/sqlite" // the SQLite driver FerretDB's sqlite handler uses, for its own files
)

// FerretDB v1's SQLite handler stores a collection as a table of one JSON column, _ferretdb_sjson, and
// indexes _id as the expression _ferretdb_sjson->"_id"; but its queries by _id (a find or aggregate whose
// filter is {_id: x}, every update and delete of a document) filter on _ferretdb_sjson->'$._id', an
// expression SQLite does not match with that index, so each of them reads the whole table. idIndexes adds,
// to each table the proxy sees used, an index on the expression the queries use, in the database file
// itself: FerretDB's metadata does not list it (listIndexes and the collection's indexes are unchanged), and
// it only makes those reads find their document through an index.

// sqliteMetadataTable is the table of a FerretDB SQLite database that maps collections to tables.
const sqliteMetadataTable = "_ferretdb_collections"

// idIndexes adds the _id index of the queries to the tables of FerretDB's SQLite databases in one data
// directory. It is safe for concurrent use.
type idIndexes struct {
	dir string

	mu   sync.Mutex
	dbs  map[string]*sql.DB         // open database files, by database name
	done map[string]map[string]bool // collections whose table has the index, by database name
}

func newIDIndexes(dir string) *idIndexes {
	return &idIndexes{dir: dir, dbs: map[string]*sql.DB{}, done: map[string]map[string]bool{}}
}

// ensure adds the index to the table of collection coll of database db, once; a collection that does not
// exist yet is looked at again next time. It blocks while it creates the index (as long as SQLite takes to
// index the table) and returns the database's error.
func (x *idIndexes) ensure(ctx context.Context, db, coll string) error {
	if db == "" || coll == "" {
		return nil
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.done[db][coll] {
		return nil
	}
	file := filepath.Join(x.dir, db+".sqlite")
	conn, ok := x.dbs[db]
	if !ok {
		if _, err := os.Stat(file); errors.Is(err, os.ErrNotExist) {
			return nil // no collection of it exists yet
		}
		u := &url.URL{Scheme: "file", Path: filepath.ToSlash(file), RawQuery: "_pragma=busy_timeout(10000)"}
		var err error
		if conn, err = sql.Open("sqlite", u.String()); err != nil {
			return fmt.Errorf("devdb: open %s: %w", file, err)
		}
		conn.SetMaxOpenConns(1)
		conn.SetConnMaxIdleTime(time.Minute)
		x.dbs[db] = conn
	}
	var table string
	err := conn.QueryRowContext(ctx, fmt.Sprintf("SELECT table_name FROM %q WHERE name = ?", sqliteMetadataTable), coll).Scan(&table)
	if errors.Is(err, sql.ErrNoRows) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("devdb: find the table of %s.%s: %w", db, coll, err)
	}
	if _, err := conn.ExecContext(ctx, fmt.Sprintf(`CREATE INDEX IF NOT EXISTS %q ON %q (_ferretdb_sjson->'$._id')`, table+"__id_path", table)); err != nil {
		return fmt.Errorf("devdb: index the _id of %s.%s: %w", db, coll, err)
	}
	if x.done[db] == nil {
		x.done[db] = map[string]bool{}
	}
	x.done[db][coll] = true
	return nil
}

// forget makes ensure look at collection coll of database db again (it was dropped, or renamed); coll ""
// forgets the whole database (dropped: its file is gone) and closes its file.
func (x *idIndexes) forget(db, coll string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if coll != "" {
		delete(x.done[db], coll)
		return
	}
	delete(x.done, db)
	if conn, ok := x.dbs[db]; ok {
		_ = conn.Close()
		delete(x.dbs, db)
	}
}

// close closes the database files.
func (x *idIndexes) close() {
	x.mu.Lock()
	defer x.mu.Unlock()
	for db, conn := range x.dbs {
		_ = conn.Close()
		delete(x.dbs, db)
	}
	x.done = map[string]map[string]bool{}
}

// touches returns the database and collection a command m uses, and whether it drops them: a collection
// command (its first value names the collection), "" for others; dropDatabase drops the database.
func touches(m *message) (db, coll string, dropped bool) {
	db, _ = m.body.Lookup("$db").StringValueOK()
	switch name := m.name(); name {
	case "dropDatabase":
		return db, "", true
	case "drop", "renameCollection":
		coll, _ = m.body.Index(0).Value().StringValueOK()
		return db, coll, true
	case "insert", "update", "delete", "findAndModify", "findandmodify", "find", "aggregate", "count", "distinct",
		"create", "createIndexes":
		coll, _ = m.body.Index(0).Value().StringValueOK()
		return db, coll, false
	}
	return db, "", false
}
