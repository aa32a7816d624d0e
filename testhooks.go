package main

import "github.com/pulse-sidecar/pulse/sidecar"

// testHooks returns the test hooks getenv sets (sidecar.EnvTestClockSkew, sidecar.EnvTestCrashAfterPublish,
// sidecar.EnvTestBacklogInterval) in a binary built with -tags pulsetesthooks (testHooksEnabled), for the
// tests that run the sidecar as a process (internal/testdb builds that binary), and the zero hooks in any other: a production binary
// ignores them. It returns an error naming the variable and its value when one does not parse.
func testHooks(getenv func(string) string) (sidecar.TestHooks, error) {
	if !testHooksEnabled {
		return sidecar.TestHooks{}, nil
	}
	return sidecar.ParseTestHooks(getenv)
}
