package main

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"
)

// sign builds Standard Webhooks headers the way the sidecar does.
func sign(t *testing.T, key []byte, id string, ts time.Time, body string) http.Header {
	t.Helper()
	mac := hmac.New(sha256.New, key)
	fmt.Fprintf(mac, "%s.%d.%s", id, ts.Unix(), body)
	h := http.Header{}
	h.Set("webhook-id", id)
	h.Set("webhook-timestamp", strconv.FormatInt(ts.Unix(), 10))
	h.Set("webhook-signature", "v1,bm90LXRoaXMtb25l v1,"+base64.StdEncoding.EncodeToString(mac.Sum(nil)))
	return h
}

func TestHandlerVerifiesSignatures(t *testing.T) {
	t.Parallel()
	key := []byte("demo-secret-key-0123456789abcdef")
	secret := "whsec_" + base64.StdEncoding.EncodeToString(key)
	now := time.Unix(1_800_000_000, 0)
	body := `{"id":"evt_1","topic":"demo.hello","createdAt":"2027-01-15T08:00:00Z","data":{"seq":1}}`

	cases := []struct {
		name   string
		hdr    http.Header
		body   string
		status int
	}{
		{"valid", sign(t, key, "evt_1", now, body), body, http.StatusNoContent},
		{"tampered body", sign(t, key, "evt_1", now, body), strings.Replace(body, "1}", "2}", 1), http.StatusUnauthorized},
		{"other key", sign(t, []byte("another key"), "evt_1", now, body), body, http.StatusUnauthorized},
		{"too old", sign(t, key, "evt_1", now.Add(-10*time.Minute), body), body, http.StatusUnauthorized},
		{"unsigned", http.Header{}, body, http.StatusUnauthorized},
		{"not json", sign(t, key, "evt_1", now, "nope"), "nope", http.StatusBadRequest},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h, err := newHandler(secret, slog.New(slog.NewTextHandler(io.Discard, nil)))
			if err != nil {
				t.Fatal(err)
			}
			h.now = func() time.Time { return now }
			req := httptest.NewRequest(http.MethodPost, "/hooks/pulse", strings.NewReader(tc.body))
			req.Header = tc.hdr
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != tc.status {
				t.Fatalf("status = %d, want %d (%s)", rec.Code, tc.status, rec.Body)
			}
		})
	}
}

func TestHandlerWithoutSecretAcceptsJSON(t *testing.T) {
	t.Parallel()
	h, err := newHandler("", slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/hooks/pulse", strings.NewReader(`{"id":"e","topic":"t","data":1}`)))
	if rec.Code != http.StatusNoContent {
		t.Fatalf("status = %d, want 204", rec.Code)
	}
}

func TestNewHandlerRejectsBadSecret(t *testing.T) {
	t.Parallel()
	if _, err := newHandler("whsec_not base64!", slog.New(slog.NewTextHandler(io.Discard, nil))); err == nil {
		t.Fatal("want an error for a secret that is not base64")
	}
}

func TestPublisherPostsEvents(t *testing.T) {
	t.Parallel()
	got := make(chan *http.Request, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(strings.NewReader(string(b)))
		got <- r
		w.WriteHeader(http.StatusAccepted)
	}))
	t.Cleanup(srv.Close)
	p := &publisher{url: srv.URL + "/v1/events", topic: "demo.hello", token: "tok", host: "h", http: srv.Client()}
	status, err := p.publish(t.Context(), 7)
	if err != nil || status != http.StatusAccepted {
		t.Fatalf("publish = %d, %v; want 202, nil", status, err)
	}
	r := <-got
	b, _ := io.ReadAll(r.Body)
	if r.Header.Get("Authorization") != "Bearer tok" || r.Header.Get("Content-Type") != "application/json" {
		t.Errorf("headers = %v", r.Header)
	}
	if !strings.Contains(string(b), `"topic":"demo.hello"`) || !strings.Contains(string(b), `"seq":7`) {
		t.Errorf("body = %s", b)
	}
}
