package e2e

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/pulse-sidecar/pulse/internal/testdb"
)

// TestMain removes the test database's temporary directory when the tests end, then fails the package if
// a goroutine outlived the tests, such as a sidecar's (services, HTTP servers, database client): nothing is ignored.
func TestMain(m *testing.M) { goleak.VerifyTestMain(testdb.Runner(m)) }
