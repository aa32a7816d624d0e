package webhook

import (
	"net/http"
	"strings"
	"testing"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
)

// During a rotation webhook-signature holds two signatures, the new secret's first, and a Standard Webhooks
// verifier accepts the request with either secret; a previous secret equal to the current one adds nothing.
func TestSendSignsWithBothSecretsDuringARotation(t *testing.T) {
	t.Parallel()
	const previous = "whsec_c2VjcmV0LWJlZm9yZS10aGUtcm90YXRpb24="
	rc := newReceiver(t, func(http.ResponseWriter, *http.Request) {})
	client := New(Options{})
	for _, tc := range []struct {
		name     string
		previous string
		want     []string // secrets that sign, in order
	}{
		{"rotation", previous, []string{testSecret, previous}},
		{"same secret", testSecret, []string{testSecret}},
		{"no rotation", "", []string{testSecret}},
	} {
		req := newRequest(rc.URL)
		req.Secret, req.PreviousSecret = testSecret, tc.previous
		if res := client.Send(t.Context(), req); res.Outcome != OutcomeSuccess {
			t.Fatalf("%s: Send = %+v", tc.name, res)
		}
		got := rc.next(t)
		sigs := strings.Split(got.Header.Get("webhook-signature"), " ")
		if len(sigs) != len(tc.want) {
			t.Fatalf("%s: webhook-signature = %q, want %d signatures", tc.name, got.Header.Get("webhook-signature"), len(tc.want))
		}
		for i, secret := range tc.want {
			wh, err := standardwebhooks.NewWebhook(secret)
			if err != nil {
				t.Fatal(err)
			}
			if err := wh.Verify(got.Body, got.Header); err != nil {
				t.Errorf("%s: the request does not verify with secret %d: %v", tc.name, i, err)
			}
			one := got.Header.Clone()
			one.Set("webhook-signature", sigs[i])
			if err := wh.Verify(got.Body, one); err != nil {
				t.Errorf("%s: signature %d of %q is not secret %d's: %v", tc.name, i, got.Header.Get("webhook-signature"), i, err)
			}
		}
	}
}
