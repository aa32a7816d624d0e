package e2e

import (
	"flag"
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/pulse-sidecar/pulse/internal/testdb"
)

// TestMain removes the test database's temporary directory when the tests end, then fails the package if
// a goroutine outlived the tests, such as a sidecar's (services, HTTP servers, database client): nothing is ignored.
// With -short (the quick subset, `go test -short ./...`) it runs none of the system tests: each starts whole
// sidecars and a database, and together they take minutes (docs/contributing.md says how long).
func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() {
		fmt.Println("e2e: the system tests are skipped with -short")
		os.Exit(0)
	}
	goleak.VerifyTestMain(testdb.Runner(m))
}
