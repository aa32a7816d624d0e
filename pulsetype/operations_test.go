package pulsetype_test

import (
	"testing"

	"github.com/pulse-sidecar/pulse/pulsetype"
)

// An operational event about a group is wanted by the other groups of its topic, never by that group; an
// application event carrying the same header is not affected.
func TestOperationalEventNotForItsOwnGroup(t *testing.T) {
	t.Parallel()
	ev := &pulsetype.Event{Topic: pulsetype.TopicEndpointDisabled, Headers: map[string]string{pulsetype.SubjectGroupHeader: "shop"}}
	shop := &pulsetype.Endpoint{ConsumerGroup: "shop", Topics: []string{"pulse.endpoint.*"}, OffsetReset: pulsetype.OffsetEarliest}
	ops := &pulsetype.Endpoint{ConsumerGroup: "ops", Topics: []string{"pulse.endpoint.*"}, OffsetReset: pulsetype.OffsetEarliest}
	if shop.Wants(ev) || !ops.Wants(ev) {
		t.Fatalf("shop wants its own disable event: %v; ops wants it: %v; want false, true", shop.Wants(ev), ops.Wants(ev))
	}
	// An event an older sidecar stored names its group under the header's former name.
	legacy := &pulsetype.Event{Topic: pulsetype.TopicEndpointDisabled, Headers: map[string]string{"pulse-consumer-group": "shop"}}
	if shop.Wants(legacy) || !ops.Wants(legacy) {
		t.Fatalf("under the former header name, shop wants its own disable event: %v; ops wants it: %v; want false, true", shop.Wants(legacy), ops.Wants(legacy))
	}
	app := &pulsetype.Event{Topic: "orders", Headers: map[string]string{pulsetype.SubjectGroupHeader: "shop"}}
	shop.Topics = []string{"orders"}
	if !shop.Wants(app) {
		t.Fatal("an application event with the header is not wanted by the group it names")
	}
	for topic, want := range map[string]bool{"pulse.endpoint.disabled": true, "pulse.x": true, "pulse": false, "pulsex.a": false, "orders": false} {
		if got := pulsetype.Reserved(topic); got != want {
			t.Errorf("Reserved(%q) = %v, want %v", topic, got, want)
		}
	}
}
