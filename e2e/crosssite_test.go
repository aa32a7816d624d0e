package e2e

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"

	"github.com/pulse-sidecar/pulse/e2e/internal/harness"
	"github.com/pulse-sidecar/pulse/internal/testwait"
)

// attackPage is what a web page of another origin tries against the sidecar at API (its base URL): every
// request a page can send without a preflight, each tagged with ?attack=<name> so that the browser's network
// log tells them apart. Each fetch is no-cors (the answer is opaque: what counts is what the sidecar did), but
// the read, which must fail for want of CORS headers. The page's title becomes "done" when all are settled.
const attackPage = `<!doctype html><html><body>
<iframe name="sink"></iframe>
<form id="f" method="POST" target="sink"><input name="overlap" value="0s"></form>
<script>
const api = new URLSearchParams(location.search).get("api");
const u = (path, name) => api + path + "?attack=" + name;
const tries = [
  fetch(u("/v1/endpoints/billing/pause", "pause"), {method: "POST", mode: "no-cors"}),
  fetch(u("/v1/endpoints/billing/rotate-secret", "rotate"), {method: "POST", mode: "no-cors", headers: {"Content-Type": "text/plain"}, body: '{"overlap":"0s"}'}),
  fetch(u("/v1/endpoints/billing/replay", "replay"), {method: "POST", mode: "no-cors", headers: {"Content-Type": "text/plain"}, body: "{}"}),
  fetch(u("/v1/events", "publish-text"), {method: "POST", mode: "no-cors", headers: {"Content-Type": "text/plain"}, body: '{"topic":"t","data":"from a page"}'}),
  fetch(u("/v1/events", "publish-untyped"), {method: "POST", mode: "no-cors", body: new Blob(['{"topic":"t","data":"untyped"}'])}),
  fetch(u("/v1/deliveries/DELIVERY/retry", "retry"), {method: "POST", mode: "no-cors"}),
  fetch(u("/v1/endpoints/billing", "read"), {mode: "cors"}).then(r => r.text()).then(() => { window.readSucceeded = true }),
  new Promise(done => { const i = new Image(); i.onload = i.onerror = done; i.src = u("/metrics", "image") }),
  new Promise(done => { const f = document.getElementById("f"); f.action = u("/v1/endpoints/billing/rotate-secret", "form");
    document.querySelector("iframe").onload = done; f.submit() }),
];
Promise.allSettled(tries).then(() => { document.title = "done" });
</script></body></html>`

// A web page of another origin cannot operate the sidecar through the developer's browser: its requests reach
// the sidecar (the browser's network log shows each answered) and each is refused, so the endpoint is neither
// paused nor given a new secret, nothing is replayed, retried or published, and the page reads nothing. The
// page is served as http://evil.example (a cross-site name the browser resolves to 127.0.0.1) and from another
// port of 127.0.0.1 (same-site). A page whose name resolves to the sidecar's own address (DNS rebinding) is
// same-origin in the browser's eyes and is refused by its Host. The console keeps working from its own origin.
func TestBrowserPagesCannotOperateTheSidecar(t *testing.T) {
	path := browserPath(t)
	b := harness.Setup(t)
	s := b.Start(b.FastEnv())
	rcv := harness.NewReceiver(t, 200)
	s.RegisterEndpoint(t, "billing", map[string]any{"url": rcv.URL, "topics": []string{"t"},
		"secret": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"})
	d := s.WaitDelivery(t, s.Publish(t, "t", map[string]any{"n": 1}), "billing", 30*time.Second)
	before := rawGet(t, s.URL+"/v1/endpoints/billing")
	api, err := url.Parse(s.URL)
	if err != nil {
		t.Fatal(err)
	}

	attacker := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		io.WriteString(w, strings.ReplaceAll(attackPage, "DELIVERY", d.ID))
	}))
	t.Cleanup(attacker.Close)
	attackerPort := attacker.Listener.Addr().(*net.TCPAddr).Port

	ctx := browser(t, path, chromedp.Flag("host-resolver-rules", "MAP evil.example 127.0.0.1"))
	// The browser's network log: which attack each request was, and the sidecar's status for it (the extra-info
	// event comes for answers the page may not see too, CORS and ORB refusals, and in either order).
	var mu sync.Mutex
	sent := map[network.RequestID]string{} // -> "<origin> <attack>"
	status := map[network.RequestID]int64{}
	origin := ""
	if err := chromedp.Listen(ctx, func(ev any) {
		mu.Lock()
		defer mu.Unlock()
		switch e := ev.(type) {
		case *network.EventRequestWillBeSent:
			if q, err := url.Parse(e.Request.URL); err == nil && strings.HasPrefix(e.Request.URL, s.URL) && q.Query().Get("attack") != "" {
				sent[e.RequestID] = origin + " " + q.Query().Get("attack")
			}
		case *network.EventResponseReceivedExtraInfo:
			status[e.RequestID] = e.StatusCode
		}
	}); err != nil {
		t.Fatal(err)
	}
	answered := func() map[string]int64 {
		mu.Lock()
		defer mu.Unlock()
		m := map[string]int64{}
		for id, a := range sent {
			if st, ok := status[id]; ok {
				m[a] = st
			}
		}
		return m
	}
	attacks := []string{"pause", "rotate", "replay", "publish-text", "publish-untyped", "retry", "read", "image", "form"}
	for _, from := range []string{fmt.Sprintf("http://evil.example:%d", attackerPort), fmt.Sprintf("http://127.0.0.1:%d", attackerPort)} {
		mu.Lock()
		origin = from
		mu.Unlock()
		page(t, ctx, 30*time.Second, "open the attacking page at "+from,
			chromedp.Navigate(from+"/?api="+url.QueryEscape(s.URL)))
		until(t, ctx, 20*time.Second, "every attack of "+from+" to settle", `document.title === "done"`)
		if read[bool](t, ctx, `window.readSucceeded === true`) {
			t.Errorf("a page at %s read an endpoint", from)
		}
		testwait.Eventually(t, 10*time.Second, "the browser to log the sidecar's answer to every attack of "+from, func() bool {
			got := answered()
			for _, a := range attacks {
				if _, ok := got[from+" "+a]; !ok {
					return false
				}
			}
			return true
		})
		got := answered()
		for _, a := range attacks {
			if st := got[from+" "+a]; st != http.StatusForbidden {
				t.Errorf("attack %s from %s: the sidecar answered %d, want 403", a, from, st)
			}
		}
	}

	// DNS rebinding: the page's own name now resolves to the sidecar, so its calls are same-origin.
	rebound := fmt.Sprintf("http://evil.example:%s", api.Port())
	page(t, ctx, 30*time.Second, "open the sidecar under a rebound name", chromedp.Navigate(rebound+"/ui/"))
	if text := read[string](t, ctx, `document.body.innerText`); !strings.Contains(text, "host_not_allowed") {
		t.Errorf("the console under %s showed %q, want the host_not_allowed refusal", rebound, text)
	}
	for _, call := range []string{
		`fetch("/v1/endpoints/billing/pause", {method: "POST"}).then(r => r.status)`,
		`fetch("/v1/endpoints").then(r => r.status)`,
		`fetch("/metrics").then(r => r.status)`,
	} {
		if status, err := chromedp.Run(ctx, chromedp.Evaluate[int](call, chromedp.EvalAwaitPromise)); err != nil || status != http.StatusForbidden {
			t.Errorf("under %s, %s = %d, %v; want 403", rebound, call, status, err)
		}
	}

	if after := rawGet(t, s.URL+"/v1/endpoints/billing"); after != before {
		t.Errorf("the endpoint changed under the attacks:\nbefore %s\nafter  %s", before, after)
	}
	if list := rawGet(t, s.URL+"/v1/deliveries"); strings.Count(list, `"consumerGroup":"billing"`) != 1 {
		t.Errorf("deliveries after the attacks: %s; want the one delivery published by the test", list)
	}
	if got := len(rcv.Received()); got != 1 {
		t.Errorf("the receiver got %d POSTs, want 1 (nothing replayed, retried or published)", got)
	}

	// The console's own origin is served as before.
	page(t, ctx, 30*time.Second, "open the console from its own origin",
		chromedp.Navigate(s.URL+"/ui/"), chromedp.WaitVisible(chromedp.CSS(`#groups tr[data-group="billing"]`)))
	for _, call := range []string{
		`fetch("/v1/endpoints/billing/pause", {method: "POST"}).then(r => r.status)`,
		`fetch("/v1/endpoints/billing/resume", {method: "POST"}).then(r => r.status)`,
	} {
		if status, err := chromedp.Run(ctx, chromedp.Evaluate[int](call, chromedp.EvalAwaitPromise)); err != nil || status != http.StatusOK {
			t.Errorf("from the console's origin, %s = %d, %v; want 200", call, status, err)
		}
	}
}

// rawGet returns the body of a GET that must answer 200.
func rawGet(t *testing.T, u string) string {
	t.Helper()
	resp, err := http.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s = %d %s", u, resp.StatusCode, body)
	}
	return string(body)
}
