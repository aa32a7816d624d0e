package webhook_test

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pulse-sidecar/pulse/pulsetype"
	"github.com/pulse-sidecar/pulse/webhook"
)

var updateGolden = flag.Bool("update", false, "rewrite testdata/envelope.golden from Envelope")

// envelopeCases are bodies whose bytes must never change: every attempt of a delivery, whichever version of
// the sidecar sends it, carries the same body (receivers deduplicate and verify signatures over it).
var envelopeCases = []pulsetype.Event{
	{ID: "plain", Topic: "payment.captured", Data: json.RawMessage(`{"amount":1.50}`)},
	{ID: "no-data", Topic: "t"},
	{ID: "html", Topic: "t", Data: json.RawMessage(`{"b":"<a href=\"x\">&amp;</a>"}`),
		Headers: map[string]string{"x": "<&>", "y": "a>b"}, OrderingKey: "<k&>"},
	{ID: "unicode", Topic: "t", Data: json.RawMessage(`{"é":"ü\u00e9","emoji":"🦫","sep":"` + "\u2028\u2029" + `"}`),
		Headers: map[string]string{"name": "Zoë 🦫", "sep": "a\u2028b\u2029c"}, OrderingKey: "clé-\u2028-🦫"},
	{ID: "escapes", Topic: "t", Data: json.RawMessage(`["\"","\\","\n","\u0000"]`),
		Headers: map[string]string{"ctl": "tab\there\nnl\u0001\u007f", "quote": `"\`}},
	{ID: "headers-sorted", Topic: "t", Data: json.RawMessage(`[]`),
		Headers: map[string]string{"b": "2", "a": "1", "B": "3", "ce-id": "x", "": "empty name"}},
	{ID: "empty-headers", Topic: "t", Data: json.RawMessage(`null`), Headers: map[string]string{}},
	{ID: "ordering-key", Topic: "t", Data: json.RawMessage(`1e2`), OrderingKey: "customer-42"},
	{ID: "numbers", Topic: "t", Data: json.RawMessage(`{"big":123456789012345678901234567890,"neg":-0.0,"exp":1E-7}`)},
}

// The webhook body is compared with the golden bodies, one a line, written by the earlier concatenating
// implementation: the encoder gives the same bytes for HTML characters, unicode, line separators, control
// characters, headers and an ordering key present or absent.
func TestEnvelopeGolden(t *testing.T) {
	t.Parallel()
	created := time.Date(2025, 3, 4, 5, 6, 7, 890_123_456, time.FixedZone("CET", 3600))
	var got bytes.Buffer
	for _, ev := range envelopeCases {
		ev.CreatedAt = created
		got.Write(webhook.Envelope(&ev))
		got.WriteByte('\n')
	}
	path := filepath.Join("testdata", "envelope.golden")
	if *updateGolden {
		if err := os.WriteFile(path, got.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	gotLines, wantLines := bytes.Split(got.Bytes(), []byte("\n")), bytes.Split(want, []byte("\n"))
	if len(gotLines) != len(wantLines) {
		t.Fatalf("%d bodies, golden file holds %d", len(gotLines)-1, len(wantLines)-1)
	}
	for i := range gotLines {
		if !bytes.Equal(gotLines[i], wantLines[i]) {
			t.Errorf("body of %q =\n%s\nwant\n%s", envelopeCases[i].ID, gotLines[i], wantLines[i])
		}
	}
}

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
			got := webhook.Envelope(&tt.event)
			if string(got) != tt.want {
				t.Fatalf("Envelope() =\n%s\nwant\n%s", got, tt.want)
			}
			if !json.Valid(got) {
				t.Fatalf("Envelope() is not valid JSON: %s", got)
			}
			for range 20 {
				if again := webhook.Envelope(&tt.event); !bytes.Equal(again, got) {
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

// The envelope's createdAt is pulsetype.FormatTime of the event's time (RFC 3339 UTC, three fraction
// digits; its cases are in pulsetype's TestTimestampsHaveThreeFractionDigits), whatever the time's zone and
// precision.
func TestEnvelopeCreatedAt(t *testing.T) {
	t.Parallel()
	paris := time.FixedZone("CET", 3600)
	for _, in := range []time.Time{
		time.Date(2025, 3, 1, 12, 0, 15, 500_000_000, time.UTC), time.Date(2025, 3, 1, 12, 0, 15, 140_000_000, time.UTC),
		time.Date(2025, 3, 1, 12, 0, 15, 0, time.UTC), time.Date(2025, 3, 1, 12, 0, 15, 133_999_999, time.UTC),
		time.Date(2025, 3, 1, 13, 0, 15, 7_000_000, paris),
	} {
		env := webhook.Envelope(&pulsetype.Event{ID: "e", Topic: "t", Data: []byte("1"), CreatedAt: in})
		if want := `"createdAt":"` + pulsetype.FormatTime(in) + `"`; !strings.Contains(string(env), want) {
			t.Errorf("Envelope() = %s, want it to hold %s", env, want)
		}
	}
}
