package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/pulse-sidecar/pulse/e2e/internal/harness"
)

// browserNames are the Chromium and Chrome binaries the browser tests look for on PATH.
var browserNames = []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "headless-shell", "headless_shell", "chrome"}

// browserPath returns the first browser of browserNames on PATH, and skips the test when there is none.
func browserPath(t *testing.T) string {
	t.Helper()
	for _, name := range browserNames {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Skipf("no browser binary on PATH (looked for %s): install Debian's package chromium (.ci/run does) to run the console's browser test", strings.Join(browserNames, ", "))
	return ""
}

// browser starts a headless Chromium (path) for the test with the extra options, stopped in t.Cleanup, and
// returns its context: run actions on it with page.
func browser(t *testing.T, path string, extra ...chromedp.ExecAllocatorOption) context.Context {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(path), chromedp.NoSandbox,
		chromedp.Flag("disable-dev-shm-usage", true), chromedp.WindowSize(1400, 1000))
	opts = append(opts, extra...)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	t.Cleanup(cancelAlloc)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(cancel)
	if err := chromedp.Do(ctx); err != nil { // starts the browser, which lives as long as ctx
		t.Fatalf("start %s: %v", path, err)
	}
	return ctx
}

// page runs steps in the browser within d, failing the test with what the step was doing.
func page(t *testing.T, ctx context.Context, d time.Duration, what string, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	c, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	if err := chromedp.Do(c, steps...); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// read returns the value of a JavaScript expression evaluated in the page.
func read[T any](t *testing.T, ctx context.Context, expr string) T {
	t.Helper()
	c, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	v, err := chromedp.Run(c, chromedp.Evaluate[T](expr))
	if err != nil {
		t.Fatalf("evaluate %s: %v", expr, err)
	}
	return v
}

// until waits (polling every 100 ms, within d) for a JavaScript predicate to hold in the page.
func until(t *testing.T, ctx context.Context, d time.Duration, what, predicate string) {
	t.Helper()
	c, cancel := context.WithTimeout(ctx, d+5*time.Second)
	defer cancel()
	if _, err := chromedp.Run(c, chromedp.Poll[chromedp.Void](predicate, chromedp.WithPollingInterval(100*time.Millisecond),
		chromedp.WithPollingTimeout(d))); err != nil {
		t.Fatalf("waiting for %s (%s): %v", what, predicate, err)
	}
}

// The console in a real browser: a consumer group whose receiver answers 500 with maxRetries 0 has a failed
// delivery; the page shows the group (URL credentials redacted, state active, 1 failure in the last hour)
// and the failing delivery; its timeline shows attempt 1 (HTTP 500, handler_error); Retry makes attempt 2,
// which the timeline shows as it succeeds (the receiver now answers 200). Pause and resume
// (the page and the API agree on the state), replay and the status filter work from the page.
func TestConsoleRetriesAFailingDelivery(t *testing.T) {
	path := browserPath(t)
	b := harness.Setup(t)
	s := b.Start(b.FastEnv())
	rcv := harness.NewReceiver(t, 500, 200)
	const secret = "s3cr3tAbc123def456"
	s.RegisterEndpoint(t, "billing", map[string]any{"url": rcv.URL + "/hook?api_key=" + secret + "&region=eu",
		"topics": []string{"invoice.paid"}, "maxRetries": 0})
	d := s.WaitDelivery(t, s.Publish(t, "invoice.paid", map[string]any{"n": 1}), "billing", 30*time.Second)
	if d.Status != "error" || len(d.Attempts) != 1 {
		t.Fatalf("delivery = %s with %d attempts, want error after 1", d.Status, len(d.Attempts))
	}

	ctx := browser(t, path)
	group := `#groups tr[data-group="billing"]`
	page(t, ctx, 30*time.Second, "load the console and see the group",
		chromedp.Navigate(s.URL+"/ui/"), chromedp.WaitVisible(chromedp.CSS(group)))
	until(t, ctx, 10*time.Second, "the group's figures", `document.querySelector('`+group+` td.failed').textContent === "1"`)
	row := read[string](t, ctx, `document.querySelector('`+group+`').innerText`)
	if !strings.Contains(row, "api_key=…") || !strings.Contains(row, "region=eu") || strings.Contains(row, secret) || !strings.Contains(row, "active") {
		t.Errorf("group row %q: want the URL with api_key redacted, region kept, and state active", row)
	}
	if html := read[string](t, ctx, `document.documentElement.outerHTML`); strings.Contains(html, secret) {
		t.Errorf("the page holds the endpoint URL's secret query value")
	}

	delivery := `#deliveries tr[data-id="` + d.ID + `"]`
	page(t, ctx, 20*time.Second, "see the failing delivery and open its timeline",
		chromedp.WaitVisible(chromedp.CSS(delivery+`[data-status="error"]`)),
		chromedp.Click(chromedp.CSS(`button[data-open="`+d.ID+`"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#attempts tr[data-attempt="1"]`)))
	first := read[string](t, ctx, `document.querySelector('#attempts tr[data-attempt="1"]').innerText`)
	if !strings.Contains(first, "500") || !strings.Contains(first, "handler_error") || !strings.Contains(first, "error") {
		t.Errorf("attempt 1 row %q: want HTTP 500 and handler_error", first)
	}

	page(t, ctx, 30*time.Second, "press retry and see attempt 2",
		chromedp.Click(chromedp.CSS(`#retry`)),
		chromedp.WaitVisible(chromedp.CSS(`#attempts tr[data-attempt="2"]`)))
	until(t, ctx, 30*time.Second, "attempt 2 to succeed in the timeline",
		`document.querySelector('#attempts tr[data-attempt="2"]').dataset.status === "success"`)
	if got := len(rcv.Received()); got != 2 {
		t.Errorf("the receiver got %d POSTs, want 2", got)
	}
	second := read[string](t, ctx, `document.querySelector('#attempts tr[data-attempt="2"]').innerText`)
	if !strings.Contains(second, "200") {
		t.Errorf("attempt 2 row %q: want HTTP 200", second)
	}

	// Pause, then resume: the page says so, the group's state cell follows, and so does the API.
	page(t, ctx, 10*time.Second, "press pause", chromedp.Click(chromedp.CSS(`button[data-action="pause"][data-group="billing"]`)))
	until(t, ctx, 10*time.Second, "the pause message", `document.getElementById("message").textContent.startsWith("Paused billing")`)
	until(t, ctx, 10*time.Second, "the group shown paused", `((b) => b !== null && /^paused/.test(b.closest("tr").querySelector("td.state").textContent))(document.querySelector('button[data-group="billing"][data-action="resume"]'))`)
	if ep := getEndpoint(s, t, "billing"); ep.State != "paused" {
		t.Errorf("after pressing pause the endpoint's state is %v, want paused", ep.State)
	}
	page(t, ctx, 10*time.Second, "press resume",
		chromedp.Click(chromedp.CSS(`button[data-action="resume"][data-group="billing"]`)))
	until(t, ctx, 10*time.Second, "the resume message", `document.getElementById("message").textContent.startsWith("Resumed billing")`)
	until(t, ctx, 10*time.Second, "the group shown active", `((b) => b !== null && b.closest("tr").querySelector("td.state").textContent === "active")(document.querySelector('button[data-group="billing"][data-action="pause"]'))`)
	if ep := getEndpoint(s, t, "billing"); ep.State != "active" {
		t.Errorf("after pressing resume the endpoint's state is %v, want active", ep.State)
	}

	page(t, ctx, 10*time.Second, "replay the group's failed deliveries",
		chromedp.Click(chromedp.CSS(`button[data-action="replay"][data-group="billing"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#replay-form`)),
		chromedp.Click(chromedp.CSS(`#replay-submit`)))
	until(t, ctx, 10*time.Second, "the replay message", `document.getElementById("message").textContent.startsWith("Replay of billing: 0 deliveries")`)

	page(t, ctx, 10*time.Second, "filter on failing deliveries", chromedp.Click(chromedp.CSS(`#f-failing`)))
	until(t, ctx, 10*time.Second, "an empty failing list (the delivery succeeded)", `document.querySelector('#deliveries tbody').innerText.includes("No delivery matches")`)
	page(t, ctx, 10*time.Second, "filter on succeeded deliveries of billing",
		chromedp.SetValue(chromedp.CSS(`#f-status`), "success"), chromedp.SetValue(chromedp.CSS(`#f-group`), "billing"),
		chromedp.Click(chromedp.CSS(`#f-apply`)),
		chromedp.WaitVisible(chromedp.CSS(delivery+`[data-status="success"]`)))
}

// With PULSE_API_TOKEN the console asks for the token before it shows anything: a wrong token is refused,
// the right one shows the data; the token is kept in the tab's sessionStorage, never in the URL or the
// sidecar's logs; "Forget token" asks again.
func TestConsoleAsksForTheToken(t *testing.T) {
	path := browserPath(t)
	b := harness.Setup(t)
	const token = "tok-console-8c2e5a"
	s := b.Start(b.FastEnv(map[string]string{"PULSE_API_TOKEN": token}))
	body, _ := json.Marshal(map[string]any{"url": "http://127.0.0.1:9/hook", "topics": []string{"t"}})
	req, _ := http.NewRequest(http.MethodPut, s.URL+"/v1/endpoints/billing", bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 201 {
		t.Fatalf("PUT endpoint = %d", resp.StatusCode)
	}

	ctx := browser(t, path)
	page(t, ctx, 30*time.Second, "load the console and see the token form",
		chromedp.Navigate(s.URL+"/ui/"), chromedp.WaitVisible(chromedp.CSS(`#login`)))
	if !read[bool](t, ctx, `document.getElementById("data").hidden`) || read[int](t, ctx, `document.querySelectorAll("#groups tbody tr").length`) != 0 {
		t.Fatalf("the page shows data before a token was given")
	}

	page(t, ctx, 10*time.Second, "give a wrong token",
		chromedp.SendKeys(chromedp.CSS(`#token`), "not-the-token"), chromedp.Click(chromedp.CSS(`#login-submit`)))
	until(t, ctx, 10*time.Second, "the refusal", `document.getElementById("message").textContent.includes("refused")`)
	if !read[bool](t, ctx, `document.getElementById("data").hidden`) {
		t.Fatalf("the page shows data after a wrong token")
	}

	page(t, ctx, 20*time.Second, "give the token and see the group",
		chromedp.SendKeys(chromedp.CSS(`#token`), token), chromedp.Click(chromedp.CSS(`#login-submit`)),
		chromedp.WaitVisible(chromedp.CSS(`#groups tr[data-group="billing"]`)))
	if loc := read[string](t, ctx, `location.href`); strings.Contains(loc, token) {
		t.Errorf("the token is in the URL %q", loc)
	}
	if kept := read[string](t, ctx, `sessionStorage.getItem("pulse.apiToken") || ""`); kept != token {
		t.Errorf("sessionStorage holds %q, want the token", kept)
	}
	if read[string](t, ctx, `document.getElementById("token").value`) != "" {
		t.Errorf("the token field still holds the token")
	}

	page(t, ctx, 10*time.Second, "forget the token", chromedp.Click(chromedp.CSS(`#forget`)), chromedp.WaitVisible(chromedp.CSS(`#login`)))
	if kept := read[string](t, ctx, `sessionStorage.getItem("pulse.apiToken") || ""`); kept != "" {
		t.Errorf("after Forget token sessionStorage holds %q", kept)
	}
	if strings.Contains(s.Logs.String(), token) || strings.Contains(s.Logs.String(), "not-the-token") {
		t.Errorf("the sidecar's logs carry a token")
	}
}
