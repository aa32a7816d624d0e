package pulsetype_test

import (
	"bytes"
	"testing"
	"time"

	"github.com/pulse-sidecar/pulse/pulsetype"
)

func TestAttemptLeaseStateAt(t *testing.T) {
	t.Parallel()
	now := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	later, earlier := now.Add(time.Second), now.Add(-time.Second)
	tests := []struct {
		name    string
		attempt pulsetype.Attempt
		want    pulsetype.LeaseState
	}{
		{"pending without lease", pulsetype.Attempt{Status: pulsetype.StatusPending}, pulsetype.LeaseQueued},
		{"pending with a live lease", pulsetype.Attempt{Status: pulsetype.StatusPending, LeasedUntil: &later}, pulsetype.LeaseActive},
		{"pending with a lease ending now", pulsetype.Attempt{Status: pulsetype.StatusPending, LeasedUntil: &now}, pulsetype.LeaseExpired},
		{"pending with an expired lease", pulsetype.Attempt{Status: pulsetype.StatusPending, LeasedUntil: &earlier}, pulsetype.LeaseExpired},
		{"success", pulsetype.Attempt{Status: pulsetype.StatusSuccess, LeasedUntil: &later}, ""},
		{"error", pulsetype.Attempt{Status: pulsetype.StatusError}, ""},
	}
	for _, tt := range tests {
		if got := tt.attempt.LeaseStateAt(now); got != tt.want {
			t.Errorf("%s: LeaseStateAt = %q, want %q", tt.name, got, tt.want)
		}
	}
}

func TestValidNames(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		valid func(string) bool
		in    string
		want  bool
	}{
		{"topic", pulsetype.ValidTopic, "payment.captured:v1", true},
		{"topic", pulsetype.ValidTopic, "-payment", false},
		{"topic", pulsetype.ValidTopic, string(bytes.Repeat([]byte("a"), 200)), true},
		{"topic", pulsetype.ValidTopic, string(bytes.Repeat([]byte("a"), 201)), false},
		{"group", pulsetype.ValidConsumerGroup, "billing_v2", true},
		{"group", pulsetype.ValidConsumerGroup, "billing:v2", false},
		{"event id", pulsetype.ValidEventID, "order-1:created", true},
		{"event id", pulsetype.ValidEventID, "", false},
		{"event id", pulsetype.ValidEventID, "a b", false},
		{"event id", pulsetype.ValidEventID, ".", false}, // dot segments: no URL path reaches them (docs/api.md)
		{"event id", pulsetype.ValidEventID, "..", false},
		{"event id", pulsetype.ValidEventID, "...", true},
		{"event id", pulsetype.ValidEventID, "a.b", true},
		{"event id", pulsetype.ValidEventID, string(bytes.Repeat([]byte("e"), 129)), false},
	}
	for _, tt := range tests {
		if got := tt.valid(tt.in); got != tt.want {
			t.Errorf("Valid %s(%.20q…) = %v, want %v", tt.name, tt.in, got, tt.want)
		}
	}
}
