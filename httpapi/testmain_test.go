package httpapi_test

import (
	"os"
	"testing"

	"github.com/pulse-sidecar/pulse/internal/testdb"
)

// TestMain removes the test database's temporary directory when the tests end, passed or failed.
func TestMain(m *testing.M) { os.Exit(testdb.Main(m)) }
