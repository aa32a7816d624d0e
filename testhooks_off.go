//go:build !pulsetesthooks

package main

// testHooksEnabled is false in a binary built without -tags pulsetesthooks: serve ignores the test hooks.
const testHooksEnabled = false
