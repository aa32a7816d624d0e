package e2e

import (
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/pulse-sidecar/pulse/e2e/internal/harness"
)

// Idempotent re-publish compares JSON values, not their spelling: other key order, whitespace, escapes or
// number spelling answer 200 with the stored event; other values answer 409.
func TestIdempotentPublishComparesJSONValues(t *testing.T) {
	b := harness.Setup(t)
	s := b.Start(b.FastEnv())
	var first map[string]any
	if code := harness.Do(t, "POST", s.URL+"/v1/events", `{"id":"order-7","topic":"t","data":{"a":1,"b":[1,2],"c":"é"}}`, &first); code != 202 {
		t.Fatalf("first publish = %d", code)
	}
	for _, same := range []string{
		`{"id":"order-7","topic":"t","data":{"c":"é","b":[1,2],"a":1}}`,
		`{"id":"order-7","topic":"t","data": { "b" : [ 1 , 2 ] , "a" : 1 , "c" : "\u00e9" } }`,
		`{"id":"order-7","topic":"t","data":{"a":1.0,"b":[1e0,2],"c":"é"}}`,
	} {
		var again map[string]any
		if code := harness.Do(t, "POST", s.URL+"/v1/events", same, &again); code != 200 || again["createdAt"] != first["createdAt"] {
			t.Errorf("re-publish %s = %d %v, want 200 with the stored event", same, code, again)
		}
	}
	for _, other := range []string{
		`{"id":"order-7","topic":"t","data":{"a":1,"b":[2,1],"c":"é"}}`,
		`{"id":"order-7","topic":"t","data":{"a":1,"b":[1,2],"c":"e"}}`,
		`{"id":"order-7","topic":"t","data":{"a":1,"b":[1,2]}}`,
	} {
		var e errorView
		if code := harness.Do(t, "POST", s.URL+"/v1/events", other, &e); code != 409 || e.Error.Code != "id_conflict" {
			t.Errorf("publish %s = %d %+v, want 409 id_conflict", other, code, e)
		}
	}
	if n := b.Count("events", bson.M{}); n != 1 {
		t.Fatalf("%d events stored, want 1", n)
	}
}
