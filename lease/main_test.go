package lease

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package when a goroutine of a Keeper or ClockSync outlives the tests (every one is
// stopped by its test).
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
