package pulsetype_test

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/pulse-sidecar/pulse/pulsetype"
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
		got.Write(ev.Envelope())
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
