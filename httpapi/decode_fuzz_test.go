package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"testing"

	"github.com/pulse-sidecar/pulse/pulsetype"
)

// FuzzDecodeEvents feeds arbitrary bodies to the ingest decoder: it never panics, every rejection is a
// *BadRequestError with a code and a 4xx status, and every accepted event has a valid topic, at most 1,000
// events come back, and data is valid JSON that re-compacts to itself (stored as sent). Seed corpus:
// testdata/fuzz/FuzzDecodeEvents.
func FuzzDecodeEvents(f *testing.F) {
	for _, seed := range []string{
		`{"topic":"payment.captured","data":{"paymentId":"p1"}}`,
		`[{"topic":"a","data":1},{"topic":"b","data":[1,2,{"x":null}],"id":"k-1","headers":{"h":"v"}}]`,
		`{"topic":"t","data":12345678901234567890.000001e-3}`,
		`{"topic":"t","data":"crème \u00e9 <&>"}`,
		`{"topic":"t","data":{"a":`, `[]`, `null`, `"x"`, `[[[[[[[[[[[[`, `{"topic":"bad topic","data":1}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		events, _, err := DecodeEvents(body)
		if err != nil {
			var br *BadRequestError
			if !errors.As(err, &br) || br.Code == "" || br.Message == "" || br.Status < 400 || br.Status > 499 {
				t.Fatalf("rejection is not a 4xx BadRequestError: %#v", err)
			}
			if events != nil {
				t.Fatal("events returned with an error")
			}
			return
		}
		if len(events) == 0 || len(events) > MaxBatch {
			t.Fatalf("%d events accepted", len(events))
		}
		for _, e := range events {
			if !pulsetype.ValidTopic(e.Topic) {
				t.Fatalf("invalid topic %q accepted", e.Topic)
			}
			if !json.Valid(e.Data) {
				t.Fatalf("invalid data %q accepted", e.Data)
			}
			var again bytes.Buffer
			if err := json.Compact(&again, e.Data); err != nil || !bytes.Equal(again.Bytes(), e.Data) {
				t.Fatalf("data not kept as compacted input: %q", e.Data)
			}
		}
	})
}
