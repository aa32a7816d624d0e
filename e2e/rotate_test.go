package e2e

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/pulse-sidecar/pulse/e2e/internal/harness"
	"github.com/pulse-sidecar/pulse/internal/testwait"
)

// Test secrets: whsec_ and the base64 of 24 to 27 readable bytes.
const (
	secretOld    = "whsec_dGhlLXNlY3JldC1iZWZvcmUtcm90YXRpb24="     // the-secret-before-rotation
	secretNewer  = "whsec_YS1zZWNyZXQtZ2l2ZW4tYnktdGhlLWNhbGxlcg==" // a-secret-given-by-the-caller
	secretFourth = "whsec_dGhlLWZvdXJ0aC1zZWNyZXQtb2YtdGhlLXRlc3Q=" // the-fourth-secret-of-the-test
	secretFifth  = "whsec_YW5kLWEtZmlmdGgtb25lLWZvci10aGUtcHV0"     // and-a-fifth-one-for-the-put
)

// rotateAnswer is the answer of POST /v1/endpoints/{group}/rotate-secret: the fields of a 200, or the error.
type rotateAnswer struct {
	ConsumerGroup           string          `json:"consumerGroup"`
	Secret                  string          `json:"secret"`
	Overlap                 string          `json:"overlap"`
	PreviousSecretExpiresAt *time.Time      `json:"previousSecretExpiresAt"`
	Endpoint                json.RawMessage `json:"endpoint"`
	errorAnswer
}

func rotateSecret(s *harness.Sidecar, t *testing.T, group string, body any) (int, rotateAnswer) {
	t.Helper()
	var out rotateAnswer
	code := harness.Do(t, "POST", s.URL+"/v1/endpoints/"+group+"/rotate-secret", body, &out)
	return code, out
}

// verifiesWith reports whether the Standard Webhooks Go library accepts the POST with secret; with only, it
// looks at the only-th signature of webhook-signature alone (0-based), -1 for all of them.
func verifiesWith(t *testing.T, r harness.Received, secret string, only int) bool {
	t.Helper()
	wh, err := standardwebhooks.NewWebhook(secret)
	if err != nil {
		t.Fatal(err)
	}
	h := r.Header
	if only >= 0 {
		sigs := strings.Fields(h.Get("webhook-signature"))
		if only >= len(sigs) {
			return false
		}
		h = h.Clone()
		h.Set("webhook-signature", sigs[only])
	}
	return wh.Verify(r.Body, h) == nil
}

// signatures returns the signatures of webhook-signature.
func signatures(r harness.Received) []string {
	return strings.Fields(r.Header.Get("webhook-signature"))
}

// postOf publishes one event through s and returns the POST that carried it (the next one the receiver gets).
func postOf(t *testing.T, s *harness.Sidecar, rcv *harness.Receiver) harness.Received {
	t.Helper()
	before := len(rcv.Received())
	id := s.Publish(t, "t", 1)
	var got harness.Received
	testwait.Eventually(t, 20*time.Second, "the POST of "+id, func() bool {
		for _, r := range rcv.Received()[before:] {
			if r.Header.Get("webhook-id") == id {
				got = r
				return true
			}
		}
		return false
	})
	return got
}

// wantSigners fails the test unless the POST's signatures are, in order, those of the given secrets, and each
// secret (and only those, of all) verifies it.
func wantSigners(t *testing.T, what string, r harness.Received, all []string, signers ...string) {
	t.Helper()
	if n := len(signatures(r)); n != len(signers) {
		t.Fatalf("%s: webhook-signature %q has %d signatures, want %d", what, r.Header.Get("webhook-signature"), n, len(signers))
	}
	for i, secret := range signers {
		if !verifiesWith(t, r, secret, i) {
			t.Errorf("%s: signature %d is not by the secret expected there", what, i)
		}
	}
	for _, secret := range all {
		want := slices.Contains(signers, secret)
		if got := verifiesWith(t, r, secret, -1); got != want {
			t.Errorf("%s: verifies with %s…: %v, want %v", what, secret[:12], got, want)
		}
	}
}

// A rotation with encryption at rest: bad bodies answer 400 naming the field, a generated secret is shown
// once; during the overlap every POST carries the new then the old signature and verifies with either
// secret; after a 1 s overlap only the new one signs; a PUT keeping the secret keeps the overlap, one
// setting another secret ends it. Neither secret is stored in clear or shown by a read.
func TestRotateSecretSignsWithBothDuringTheOverlap(t *testing.T) {
	b := harness.Setup(t)
	s := b.Start(b.FastEnv(map[string]string{"PULSE_ENCRYPTION_KEY": keyB64(5)}))
	rcv := harness.NewReceiver(t, 200)
	endpoint := func(secret string) map[string]any {
		return map[string]any{"url": rcv.URL, "topics": []string{"t"}, "secret": secret}
	}
	s.RegisterEndpoint(t, "billing", endpoint(secretOld))

	for _, tc := range []struct {
		group, body, code string
	}{
		{"billing", `{"secret": "whsec_short"}`, "invalid_secret"},
		{"billing", `{"secret": "` + secretOld + `"}`, "invalid_secret"},
		{"billing", `{"overlap": "soon"}`, "invalid_overlap"},
		{"billing", `{"overlap": "-1s"}`, "invalid_overlap"},
		{"billing", `{"overlap": "721h"}`, "invalid_overlap"},
		{"billing", `{"secrets": "x"}`, "invalid_json"},
		{"nobody", `{}`, "endpoint_not_found"},
	} {
		code, out := rotateSecret(s, t, tc.group, tc.body)
		if code/100 != 4 || out.Error.Code != tc.code {
			t.Errorf("rotate %s %s answered %d %+v, want %s", tc.group, tc.body, code, out.Error, tc.code)
		}
	}

	code, rot := rotateSecret(s, t, "billing", nil) // everything by default: a generated secret, 24 h
	generated := rot.Secret
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(generated, "whsec_"))
	if code != 200 || !strings.HasPrefix(generated, "whsec_") || err != nil || len(key) != 32 || rot.Overlap != "24h0m0s" ||
		rot.PreviousSecretExpiresAt == nil || time.Until(*rot.PreviousSecretExpiresAt) < 23*time.Hour {
		t.Fatalf("rotate answered %d %+v, want a generated 32-byte secret and a 24 h overlap", code, rot)
	}
	all := []string{secretOld, generated, secretNewer, secretFourth, secretFifth}
	var raw json.RawMessage
	harness.Do(t, "GET", s.URL+"/v1/endpoints/billing", nil, &raw)
	for _, secret := range all[:2] {
		body := strings.TrimPrefix(secret, "whsec_")
		if strings.Contains(string(raw), body[:16]) || strings.Contains(string(rot.Endpoint), body[:16]) {
			t.Errorf("a read shows a secret: %s", raw)
		}
	}
	if !strings.Contains(string(raw), `"secret":"whsec_…`+generated[len(generated)-4:]+`"`) || !strings.Contains(string(raw), `"previousSecretExpiresAt"`) {
		t.Errorf("GET endpoint = %s, want the new secret redacted and the end of the overlap", raw)
	}
	doc, err := b.Client.Database(b.DBName).Collection("pulse.subscriptions").FindOne(context.Background(), bson.M{"_id": "billing"}).Raw()
	if err != nil {
		t.Fatal(err)
	}
	for _, secret := range all[:2] {
		if strings.Contains(string(doc), strings.TrimPrefix(secret, "whsec_")[:16]) {
			t.Errorf("the subscription document holds a secret in clear")
		}
	}
	if _, err := doc.LookupErr("previousSecretSealed"); err != nil {
		t.Errorf("the subscription document has no sealed previous secret: %v", err)
	}

	wantSigners(t, "during the 24 h overlap", postOf(t, s, rcv), all, generated, secretOld)

	if code, rot = rotateSecret(s, t, "billing", map[string]any{"secret": secretNewer, "overlap": "1s"}); code != 200 || rot.Secret != "" || rot.Overlap != "1s" {
		t.Fatalf("rotate with a given secret answered %d %+v, want 200 without the secret echoed", code, rot)
	}
	ends := *rot.PreviousSecretExpiresAt
	var last harness.Received
	testwait.Eventually(t, 20*time.Second, "a POST signed by the new secret alone", func() bool {
		last = postOf(t, s, rcv)
		if len(signatures(last)) == 2 {
			wantSigners(t, "during the 1 s overlap", last, all, secretNewer, generated)
			return false
		}
		return true
	})
	wantSigners(t, "after the 1 s overlap", last, all, secretNewer)
	if ts, _ := strconv.ParseInt(last.Header.Get("webhook-timestamp"), 10, 64); time.Unix(ts+1, 0).Before(ends) {
		t.Errorf("signed by the new secret alone at %d, before the overlap ended at %s", ts, ends)
	}

	if code, _ := rotateSecret(s, t, "billing", map[string]any{"secret": secretFourth, "overlap": "1h"}); code != 200 {
		t.Fatalf("rotate answered %d", code)
	}
	moved := endpoint(secretFourth)
	moved["url"] = rcv.URL + "/moved"
	s.RegisterEndpoint(t, "billing", moved) // keeps the secret: the overlap stays
	wantSigners(t, "after a PUT keeping the secret", postOf(t, s, rcv), all, secretFourth, secretNewer)
	s.RegisterEndpoint(t, "billing", endpoint(secretFifth)) // another secret: replaced at once
	wantSigners(t, "after a PUT setting another secret", postOf(t, s, rcv), all, secretFifth)
	harness.Do(t, "GET", s.URL+"/v1/endpoints/billing", nil, &raw)
	if strings.Contains(string(raw), "previousSecretExpiresAt") {
		t.Errorf("GET endpoint after the PUT = %s, want no overlap", raw)
	}
}

// ownerOf returns the lease owner id a sidecar logged when it started listening (the log line may reach the
// buffer a moment after start returned).
func ownerOf(t *testing.T, s *harness.Sidecar) string {
	t.Helper()
	owner := ""
	testwait.Eventually(t, 30*time.Second, "the sidecar to log its owner", func() bool {
		sc := bufio.NewScanner(strings.NewReader(s.Logs.String()))
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			var line struct{ Message, Owner string }
			if json.Unmarshal(sc.Bytes(), &line) == nil && line.Message == "listening" && line.Owner != "" {
				owner = line.Owner
			}
		}
		return owner != ""
	})
	return owner
}

// endpointCacheTime is how long a replica may keep using an endpoint it read before another replica changed
// it (docs/operating.md, "Rotating an endpoint's secret").
const endpointCacheTime = time.Second

// A rotation made through replica A reaches replica B as a PUT does: B, which cached the endpoint with the
// old secret by POSTing with it, signs with both secrets at the latest for events published one endpoint
// cache time after the rotation answered.
func TestRotationReachesAnotherReplica(t *testing.T) {
	b := harness.Setup(t)
	a, bb := b.Start(b.FastEnv()), b.Start(b.FastEnv())
	owner := ownerOf(t, bb)
	rcv := harness.NewReceiver(t, 200)
	a.RegisterEndpoint(t, "billing", map[string]any{"url": rcv.URL, "topics": []string{"t"}, "secret": secretOld})
	all := []string{secretOld, secretNewer}
	// postedByB publishes through B until B itself POSTs an event (A may claim one first) and returns that
	// POST and when its publish began.
	postedByB := func() (harness.Received, time.Time) {
		t.Helper()
		var r harness.Received
		var began time.Time
		testwait.Eventually(t, 20*time.Second, "a POST made by replica B", func() bool {
			began = time.Now()
			r = postOf(t, bb, rcv)
			var at struct{ LockOwner string }
			err := b.Client.Database(b.DBName).Collection("pulse.history").FindOne(context.Background(),
				bson.M{"eventId": r.Header.Get("webhook-id"), "attempt": 1}).Decode(&at)
			return err == nil && at.LockOwner == owner
		})
		return r, began
	}
	before, _ := postedByB()
	wantSigners(t, "replica B before the rotation", before, all, secretOld)

	if code, _ := rotateSecret(a, t, "billing", map[string]any{"secret": secretNewer, "overlap": "1h"}); code != 200 {
		t.Fatalf("rotate through replica A answered %d", code)
	}
	rotated := time.Now()
	testwait.Eventually(t, 20*time.Second, "replica B to sign with both secrets", func() bool {
		r, began := postedByB()
		if len(signatures(r)) == 2 {
			wantSigners(t, "replica B after the rotation", r, all, secretNewer, secretOld)
			return true
		}
		if began.After(rotated.Add(endpointCacheTime)) {
			t.Fatalf("replica B signed an event published %s after the rotation with the old secret alone", began.Sub(rotated))
		}
		return false
	})
}
