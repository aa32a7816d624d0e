package sidecar

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/pulse-sidecar/pulse/internal/testdb"
)

// TestMain removes the test database's temporary directory when the tests end, then fails the package if
// a goroutine of a sidecar outlived its Stop.
func TestMain(m *testing.M) { goleak.VerifyTestMain(testdb.Runner(m)) }
