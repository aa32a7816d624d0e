//go:build pulsetesthooks

package main

// testHooksEnabled is true in a binary built with -tags pulsetesthooks: serve reads the test hooks.
const testHooksEnabled = true
