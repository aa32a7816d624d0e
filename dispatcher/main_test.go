package dispatcher

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests if a goroutine outlives them: every piece's Stop waits for the
// goroutines it started.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
