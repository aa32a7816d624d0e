package main

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// With PULSE_OUTBOUND_PROXY=env, webhooks go through HTTP_PROXY (a forward proxy on loopback here: the
// TEST-NET destination is not reachable directly), the proxy's own loopback address is not refused by a deny
// list that covers it, and a destination the guard refuses never reaches the proxy.
func TestOutboundProxy(t *testing.T) {
	b := setup(t)
	var mu sync.Mutex
	var seen []string
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Method+" "+r.URL.String()+" "+r.Header.Get("Pulse-Consumer-Group"))
		mu.Unlock()
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(proxy.Close)
	env := b.fastEnv()
	env["PULSE_OUTBOUND_PROXY"] = "env"
	env["HTTP_PROXY"] = proxy.URL
	env["PULSE_DENY_CIDRS"] = "127.0.0.0/8"
	s := b.start(env)
	s.registerEndpoint(t, "far", map[string]any{"url": "http://192.0.2.10/hook", "topics": []string{"t"}, "timeout": "5s"})
	s.registerEndpoint(t, "metadata", map[string]any{"url": "http://169.254.169.254/latest/meta-data", "topics": []string{"t"}})
	id := s.publish(t, "t", 1)
	if d := s.waitDelivery(t, id, "far", 30*time.Second); d.Status != "success" {
		t.Fatalf("delivery through the proxy = %+v, want success", d)
	}
	d := s.waitDelivery(t, id, "metadata", 30*time.Second)
	if d.Status != "error" || d.Attempts[0].Error == nil || !strings.Contains(d.Attempts[0].Error.Message, "169.254.169.254") {
		t.Fatalf("delivery to the metadata address = %+v, want error blocked", d)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 1 || seen[0] != "POST http://192.0.2.10/hook far" {
		t.Fatalf("the proxy saw %q, want one POST for http://192.0.2.10/hook of group far", seen)
	}
	if n := b.count("deliveries", bson.M{"status": "success"}); n != 1 {
		t.Fatalf("%d successful deliveries, want 1", n)
	}
}
