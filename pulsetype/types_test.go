package pulsetype_test

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"

	"github.com/pulse-sidecar/pulse/pulsetype"
)

func TestEventEnvelope(t *testing.T) {
	t.Parallel()
	created := time.Date(2025, 3, 4, 5, 6, 7, 890_000_000, time.FixedZone("CET", 3600))
	tests := []struct {
		name  string
		event pulsetype.Event
		want  string
	}{
		{
			name:  "data kept verbatim, no HTML escaping",
			event: pulsetype.Event{ID: "evt-1", Topic: "payment.captured", Data: json.RawMessage(`{"a":1.50,"b":"<&>"}`), CreatedAt: created},
			want:  `{"id":"evt-1","topic":"payment.captured","createdAt":"2025-03-04T04:06:07.890Z","data":{"a":1.50,"b":"<&>"},"headers":{}}`,
		},
		{
			name: "unicode escapes and key order of data survive",
			event: pulsetype.Event{ID: "evt-2", Topic: "t", Data: json.RawMessage(`{"z":"\u00e9","a":[1e2,-0.0]}`),
				CreatedAt: created},
			want: `{"id":"evt-2","topic":"t","createdAt":"2025-03-04T04:06:07.890Z","data":{"z":"\u00e9","a":[1e2,-0.0]},"headers":{}}`,
		},
		{
			name: "headers sorted, strings escaped without HTML escaping",
			event: pulsetype.Event{ID: `id"<1>`, Topic: "t", Data: json.RawMessage(`[]`),
				Headers: map[string]string{"b": "<2>", "a": "x&y", "c": "line\nbreak"}, CreatedAt: created},
			want: `{"id":"id\"<1>","topic":"t","createdAt":"2025-03-04T04:06:07.890Z","data":[],"headers":{"a":"x&y","b":"<2>","c":"line\nbreak"}}`,
		},
		{
			name:  "empty data is null",
			event: pulsetype.Event{ID: "evt-3", Topic: "t", CreatedAt: created},
			want:  `{"id":"evt-3","topic":"t","createdAt":"2025-03-04T04:06:07.890Z","data":null,"headers":{}}`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := tt.event.Envelope()
			if string(got) != tt.want {
				t.Fatalf("Envelope() =\n%s\nwant\n%s", got, tt.want)
			}
			if !json.Valid(got) {
				t.Fatalf("Envelope() is not valid JSON: %s", got)
			}
			for range 20 {
				if again := tt.event.Envelope(); !bytes.Equal(again, got) {
					t.Fatalf("Envelope() is not stable:\n%s\nthen\n%s", got, again)
				}
			}
			var decoded struct {
				ID      string            `json:"id"`
				Topic   string            `json:"topic"`
				Data    json.RawMessage   `json:"data"`
				Headers map[string]string `json:"headers"`
			}
			if err := json.Unmarshal(got, &decoded); err != nil {
				t.Fatalf("decode envelope: %v", err)
			}
			if decoded.ID != tt.event.ID || decoded.Topic != tt.event.Topic {
				t.Errorf("decoded id/topic = %q/%q, want %q/%q", decoded.ID, decoded.Topic, tt.event.ID, tt.event.Topic)
			}
			if len(tt.event.Data) > 0 && !bytes.Equal(decoded.Data, tt.event.Data) {
				t.Errorf("decoded data = %s, want the published bytes %s", decoded.Data, tt.event.Data)
			}
			for k, v := range tt.event.Headers {
				if decoded.Headers[k] != v {
					t.Errorf("decoded header %q = %q, want %q", k, decoded.Headers[k], v)
				}
			}
		})
	}
}

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
		{"event id", pulsetype.ValidEventID, string(bytes.Repeat([]byte("e"), 129)), false},
	}
	for _, tt := range tests {
		if got := tt.valid(tt.in); got != tt.want {
			t.Errorf("Valid %s(%.20q…) = %v, want %v", tt.name, tt.in, got, tt.want)
		}
	}
}
