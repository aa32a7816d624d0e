package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/pulse-sidecar/pulse/e2e/internal/harness"
	"github.com/pulse-sidecar/pulse/internal/testwait"
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

	// Pause asks first: Cancel leaves the group active; confirming pauses it. Then resume: the page says
	// so, the group's state cell follows, and so does the API.
	page(t, ctx, 10*time.Second, "press pause and see the confirmation",
		chromedp.Click(chromedp.CSS(`button[data-action="pause"][data-group="billing"]`)), chromedp.WaitVisible(chromedp.CSS(`#confirm`)))
	if text := read[string](t, ctx, `document.getElementById("confirm-text").textContent`); !strings.HasPrefix(text, "Pause billing?") {
		t.Errorf("the confirmation reads %q, want it to ask to pause billing", text)
	}
	if ep := getEndpoint(s, t, "billing"); ep.State != "active" {
		t.Errorf("pressing pause, not yet confirmed, made the endpoint %v", ep.State)
	}
	page(t, ctx, 10*time.Second, "cancel the pause", chromedp.Click(chromedp.CSS(`#confirm-no`)), chromedp.WaitNotVisible(chromedp.CSS(`#confirm`)))
	if ep := getEndpoint(s, t, "billing"); ep.State != "active" {
		t.Errorf("a cancelled pause made the endpoint %v", ep.State)
	}
	page(t, ctx, 10*time.Second, "press pause and confirm",
		chromedp.Click(chromedp.CSS(`button[data-action="pause"][data-group="billing"]`)), chromedp.WaitVisible(chromedp.CSS(`#confirm`)),
		chromedp.Click(chromedp.CSS(`#confirm-yes`)))
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

// consoleScreenshotEnv names a file the console's screenshot is written to (PNG); unset, it goes to the
// test's temporary directory.
const consoleScreenshotEnv = "PULSE_CONSOLE_SCREENSHOT"

// The console's pictures and words, in a real browser, from real deliveries: four groups take three events
// (billing answers 200, failing 500, refused points at a closed port, held is paused). Each group's chart
// draws the attempts of its last hour, all groups' from one call of GET /v1/activity (the page makes no
// per-group activity call; it equals GET /v1/endpoints/{group}/activity's answer) (3 succeeded bars' worth for
// billing, 3 failed for failing and refused, 3 pending for held); refused, whose attempts never got an HTTP
// answer, shows no latency; held says "paused" once; every time is UTC and marked. A held delivery's own
// URL, loaded fresh, opens its page, which says why it waits (paused), shows its event's payload and
// headers, and links its event's other deliveries; the link opens the other delivery's page.
func TestConsoleChartsAndLinksADelivery(t *testing.T) {
	path := browserPath(t)
	b := harness.Setup(t)
	s := b.Start(b.FastEnv())
	ok, failing := harness.NewReceiver(t, 200), harness.NewReceiver(t, 500)
	const topic = "invoice.paid"
	s.RegisterEndpoint(t, "billing", map[string]any{"url": ok.URL, "topics": []string{topic}})
	s.RegisterEndpoint(t, "failing", map[string]any{"url": failing.URL, "topics": []string{topic}, "maxRetries": 0})
	s.RegisterEndpoint(t, "refused", map[string]any{"url": "http://127.0.0.1:9/hook", "topics": []string{topic}, "maxRetries": 0})
	s.RegisterEndpoint(t, "held", map[string]any{"url": ok.URL, "topics": []string{topic}})
	if code, ep := controlEndpoint(s, t, "held", "pause"); code != 200 || ep.State != "paused" {
		t.Fatalf("pause held = %d %+v", code, ep)
	}
	const events = 3
	var ids []string
	for i := range events {
		var out struct {
			ID string `json:"id"`
		}
		if code := harness.Do(t, "POST", s.URL+"/v1/events", map[string]any{"topic": topic, "data": map[string]any{"invoice": "inv-" + strconv.Itoa(i), "amount": 120 + i},
			"headers": map[string]string{"x-tenant": "acme"}}, &out); code != 202 {
			t.Fatalf("publish = %d", code)
		}
		ids = append(ids, out.ID)
	}
	for _, id := range ids {
		s.WantSuccess(t, "billing", 30*time.Second, id)
		for _, g := range []string{"failing", "refused"} {
			if d := s.WaitDelivery(t, id, g, 30*time.Second); d.Status != "error" {
				t.Fatalf("delivery of %s to %s = %s, want error", id, g, d.Status)
			}
		}
	}
	ev := harness.Get[harness.EventView](t, s.URL+"/v1/events/"+ids[0])
	var heldID, billingID string
	for _, d := range ev.Deliveries {
		switch d.ConsumerGroup {
		case "held":
			heldID = d.ID
		case "billing":
			billingID = d.ID
		}
	}
	if heldID == "" || billingID == "" || len(ev.Deliveries) != 4 {
		t.Fatalf("event %s has deliveries %+v, want one to each of the 4 groups", ids[0], ev.Deliveries)
	}

	ctx := browser(t, path)
	page(t, ctx, 30*time.Second, "load the console and see the groups",
		chromedp.Navigate(s.URL+"/ui/"), chromedp.WaitVisible(chromedp.CSS(`#groups tr[data-group="held"]`)))
	// The chart of each group, drawn from the activity answer: the sum of its bars' counts.
	sum := func(group, class string) int {
		return read[int](t, ctx, `[...document.querySelectorAll('#groups tr[data-group="`+group+`"] svg.chart rect.`+class+`')].reduce((n, r) => n + Number(r.dataset.count), 0)`)
	}
	until(t, ctx, 20*time.Second, "the charts", `document.querySelectorAll('#groups svg.chart').length === 4`)
	// The page's network log: the charts' data came from GET /v1/activity, no call per group.
	calls := func(re string) int {
		return read[int](t, ctx, `performance.getEntriesByType("resource").filter((e) => `+re+`.test(new URL(e.name).pathname)).length`)
	}
	if all, each := calls(`/^\/v1\/activity$/`), calls(`/^\/v1\/endpoints\/[^/]+\/activity$/`); all < 1 || each != 0 {
		t.Errorf("the page called GET /v1/activity %d times and a group's activity %d times, want at least once and never", all, each)
	}
	for _, c := range []struct {
		group           string
		ok, bad, queued int
	}{{"billing", events, 0, 0}, {"failing", 0, events, 0}, {"refused", 0, events, 0}, {"held", 0, 0, events}} {
		act := harness.Get[struct {
			Buckets []struct{ Succeeded, Failed int }
			Pending int
		}](t, s.URL+"/v1/endpoints/"+c.group+"/activity")
		succeeded, failed := 0, 0
		for _, bk := range act.Buckets {
			succeeded, failed = succeeded+bk.Succeeded, failed+bk.Failed
		}
		if len(act.Buckets) != 60 || succeeded != c.ok || failed != c.bad || act.Pending != c.queued {
			t.Errorf("%s: activity of %d buckets with %d succeeded, %d failed, %d pending; want 60 with %d, %d, %d",
				c.group, len(act.Buckets), succeeded, failed, act.Pending, c.ok, c.bad, c.queued)
		}
		if got := [3]int{sum(c.group, "ok"), sum(c.group, "bad"), sum(c.group, "pend")}; got != [3]int{c.ok, c.bad, c.queued} {
			t.Errorf("%s: the chart draws %d succeeded, %d failed, %d pending; want %d, %d, %d", c.group, got[0], got[1], got[2], c.ok, c.bad, c.queued)
		}
	}
	until(t, ctx, 10*time.Second, "the figures", `document.querySelector('#groups tr[data-group="refused"] td.failed').textContent === "3"`)
	if p50 := read[string](t, ctx, `document.querySelector('#groups tr[data-group="refused"] td.p50').textContent`); p50 != "—" {
		t.Errorf("refused (every attempt refused) shows latency %q, want —", p50)
	}
	if p50 := read[string](t, ctx, `document.querySelector('#groups tr[data-group="billing"] td.p50').textContent`); !regexp.MustCompile(`^(< 1 ms|[0-9.]+ m?s)$`).MatchString(p50) {
		t.Errorf("billing shows latency %q, want a duration", p50)
	}
	if state := read[string](t, ctx, `document.querySelector('#groups tr[data-group="held"] td.state').textContent`); !regexp.MustCompile(`^paused since \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC$`).MatchString(state) {
		t.Errorf("held's state reads %q, want \"paused since <time> UTC\", paused said once", state)
	}
	if updated := read[string](t, ctx, `document.getElementById("updated").textContent`); !regexp.MustCompile(`^updated \d\d:\d\d:\d\d UTC$`).MatchString(updated) {
		t.Errorf("the header reads %q, want \"updated hh:mm:ss UTC\"", updated)
	}
	until(t, ctx, 10*time.Second, "the deliveries", `document.querySelectorAll('#deliveries tbody tr[data-id]').length === 12`)
	if bad := read[int](t, ctx, `[...document.querySelectorAll('#deliveries tbody tr[data-id] td:first-child')].filter((td) => !/^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC$/.test(td.textContent)).length`); bad != 0 {
		t.Errorf("%d created times of the deliveries table are not \"yyyy-mm-dd hh:mm:ss UTC\"", bad)
	}

	// A held delivery's own URL, loaded fresh in another page, opens it and says why it waits.
	link := s.URL + "/ui/#/deliveries/" + heldID
	page(t, ctx, 30*time.Second, "open a delivery by its URL",
		chromedp.Navigate("about:blank"), chromedp.Navigate(link), chromedp.WaitVisible(chromedp.CSS(`#timeline`)))
	until(t, ctx, 10*time.Second, "the held delivery's page", `document.getElementById("tl-id").textContent === "`+heldID+`"`)
	if code := read[string](t, ctx, `document.getElementById("tl-pending").dataset.code`); code != "paused" {
		t.Errorf("the held delivery's pending reason is %q, want paused", code)
	}
	if why := read[string](t, ctx, `document.getElementById("tl-pending").textContent`); !regexp.MustCompile(`^Pending: the endpoint is paused since \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC$`).MatchString(why) {
		t.Errorf("the held delivery says %q, want it paused since a UTC time", why)
	}
	until(t, ctx, 10*time.Second, "the event beside it", `document.getElementById("ev-data").textContent !== ""`)
	var data map[string]any
	if err := json.Unmarshal([]byte(read[string](t, ctx, `document.getElementById("ev-data").textContent`)), &data); err != nil || data["invoice"] != "inv-0" || data["amount"] != float64(120) {
		t.Errorf("the payload shown = %v (%v), want the first event's", data, err)
	}
	if h := read[string](t, ctx, `(document.querySelector('#ev-headers tr[data-header="x-tenant"] td') || {}).textContent || ""`); h != "acme" {
		t.Errorf("the event's header x-tenant shows %q, want acme", h)
	}
	if n := read[int](t, ctx, `document.querySelectorAll('#ev-deliveries tbody tr[data-delivery]').length`); n != 4 {
		t.Errorf("the event's deliveries list %d, want 4", n)
	}
	shot := os.Getenv(consoleScreenshotEnv)
	if shot == "" {
		shot = filepath.Join(t.TempDir(), "console.png")
	}
	sctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	png, err := chromedp.Run(sctx, chromedp.FullScreenshot(100)) // quality 100: PNG
	cancel()
	if err != nil {
		t.Fatalf("take a screenshot: %v", err)
	}
	if err := os.WriteFile(shot, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot of the console (%d bytes): %s", len(png), shot)

	page(t, ctx, 20*time.Second, "follow the link to the event's billing delivery",
		chromedp.Click(chromedp.CSS(`#ev-deliveries a[data-other="`+billingID+`"]`)))
	until(t, ctx, 10*time.Second, "the billing delivery's page", `document.getElementById("tl-id").textContent === "`+billingID+`" && location.hash === "#/deliveries/`+billingID+`"`)
	until(t, ctx, 10*time.Second, "its status", `document.querySelector('#tl-summary dd[data-field="status"]').textContent === "success"`)
	if !read[bool](t, ctx, `document.getElementById("tl-pending").hidden`) {
		t.Errorf("a successful delivery shows a pending reason")
	}
}

// A delivery's own URL opens its view at the top of the page, above the groups and the 50-row list, and the
// list's attempts column counts a pending delivery's attempts as its view does: a group whose receiver
// answers 500 with a retry an hour away has a pending delivery with attempt 1 failed and attempt 2 due, after
// 60 delivered events that fill the list.
func TestConsoleOpensADeliveryAtTheTopAndCountsItsAttempts(t *testing.T) {
	path := browserPath(t)
	b := harness.Setup(t)
	s := b.Start(b.FastEnv())
	ok, failing := harness.NewReceiver(t, 200), harness.NewReceiver(t, 500)
	s.RegisterEndpoint(t, "billing", map[string]any{"url": ok.URL, "topics": []string{"invoice.paid"}})
	s.RegisterEndpoint(t, "slow", map[string]any{"url": failing.URL, "topics": []string{"order.created"}, "maxRetries": 3,
		"retryDelay": "1h", "maxRetryDelay": "2h"})
	batch := make([]map[string]any, 60)
	for i := range batch {
		batch[i] = map[string]any{"topic": "invoice.paid", "data": map[string]any{"n": i}}
	}
	if code := harness.Do(t, "POST", s.URL+"/v1/events", batch, nil); code != 202 {
		t.Fatalf("publish the batch = %d", code)
	}
	testwait.Eventually(t, 60*time.Second, "60 POSTs to billing", func() bool { return len(ok.Received()) >= 60 })
	ev := s.Publish(t, "order.created", map[string]any{"order": "o-1"})
	var pendingID string
	testwait.Eventually(t, 30*time.Second, "the slow delivery to fail once and wait for attempt 2", func() bool {
		for _, d := range harness.Get[harness.EventView](t, s.URL+"/v1/events/"+ev).Deliveries {
			if d.ConsumerGroup == "slow" && d.Status == "pending" && d.Attempts == 2 {
				pendingID = d.ID
			}
		}
		return pendingID != ""
	})

	ctx := browser(t, path)
	page(t, ctx, 30*time.Second, "open the pending delivery by its URL",
		chromedp.Navigate(s.URL+"/ui/#/deliveries/"+pendingID), chromedp.WaitVisible(chromedp.CSS(`#timeline`)))
	until(t, ctx, 10*time.Second, "its view", `document.getElementById("tl-id").textContent === "`+pendingID+`"`)
	until(t, ctx, 10*time.Second, "the list of 50", `document.querySelectorAll('#deliveries tbody tr[data-id]').length === 50`)
	if n := read[int](t, ctx, `document.querySelectorAll('#attempts tbody tr[data-attempt]').length`); n != 2 {
		t.Fatalf("the delivery's view shows %d attempts, want 2", n)
	}
	// At the top: its view comes before the lists in the page and is in the window as opened.
	if !read[bool](t, ctx, `!!(document.getElementById("timeline").compareDocumentPosition(document.getElementById("deliveries")) & Node.DOCUMENT_POSITION_FOLLOWING)`) ||
		!read[bool](t, ctx, `!!(document.getElementById("timeline").compareDocumentPosition(document.getElementById("groups")) & Node.DOCUMENT_POSITION_FOLLOWING)`) {
		t.Errorf("the delivery's view comes after the groups or the deliveries list in the page")
	}
	if top := read[float64](t, ctx, `document.getElementById("timeline").getBoundingClientRect().top`); top < 0 || top > read[float64](t, ctx, `innerHeight / 2`) {
		t.Errorf("the delivery's view starts %.0f px from the window's top, want within its upper half", top)
	}
	row := `#deliveries tr[data-id="` + pendingID + `"]`
	until(t, ctx, 10*time.Second, "the pending delivery's attempts in the list", `((td) => td !== null && td.textContent === "2")(document.querySelector('`+row+` td.attempts'))`)
	if n := read[int](t, ctx, `[...document.querySelectorAll('#deliveries tbody tr[data-status="success"] td.attempts')].filter((td) => td.textContent !== "1").length`); n != 0 {
		t.Errorf("%d delivered rows do not show 1 attempt", n)
	}
}

// A long consumer group name (100 characters, one word) and a long URL wrap inside their cells instead of
// widening the page, and the URL wraps only between its parts (after a / . - ? & =), never inside one; a
// short name and URL (billing, http://127.0.0.1:9/hook) stay on one line each.
func TestConsoleWrapsLongNamesAndURLs(t *testing.T) {
	path := browserPath(t)
	b := harness.Setup(t)
	s := b.Start(b.FastEnv())
	group := "g" + strings.Repeat("0123456789", 9) + "abcdefghi"
	url := "http://127.0.0.1:9/tenants/europe-west/accounts/acme-corporation/webhooks/invoices/paid-events/receiver?region=eu&format=long-value"
	s.RegisterEndpoint(t, group, map[string]any{"url": url, "topics": []string{"invoice.paid"}})
	s.RegisterEndpoint(t, "billing", map[string]any{"url": "http://127.0.0.1:9/hook", "topics": []string{"invoice.paid"}})
	ctx := browser(t, path, chromedp.WindowSize(1100, 900))
	page(t, ctx, 30*time.Second, "load the console and see the group",
		chromedp.Navigate(s.URL+"/ui/"), chromedp.WaitVisible(chromedp.CSS(`#groups tr[data-group="`+group+`"]`)))
	if over := read[float64](t, ctx, `document.documentElement.scrollWidth - document.documentElement.clientWidth`); over > 0 {
		t.Errorf("the page is %.0f px wider than the window: a long name or URL does not wrap", over)
	}
	// A short name and URL stay on one line: wrapping anywhere must not let the table squeeze them.
	for _, sel := range []string{`#groups tr[data-group="billing"] td.group button`, `#groups tr[data-group="billing"] td.url`} {
		if n := read[int](t, ctx, `((e) => { const r = document.createRange(); r.selectNodeContents(e); return new Set([...r.getClientRects()].map((c) => Math.round(c.top))).size; })(document.querySelector('`+sel+`'))`); n != 1 {
			t.Errorf("%s takes %d lines, want 1", sel, n)
		}
	}
	cell := `document.querySelector('#groups tr[data-group="` + group + `"] td.url')`
	if text := read[string](t, ctx, cell+`.textContent`); text != url {
		t.Errorf("the URL cell reads %q, want %q", text, url)
	}
	lines := read[int](t, ctx, `new Set([...`+cell+`.childNodes].filter((n) => n.nodeType === Node.TEXT_NODE).flatMap((n) => { const r = document.createRange(); r.selectNodeContents(n); return [...r.getClientRects()].map((c) => Math.round(c.top)); })).size`)
	inside := read[int](t, ctx, `[...`+cell+`.childNodes].filter((n) => n.nodeType === Node.TEXT_NODE).filter((n) => { const r = document.createRange(); r.selectNodeContents(n); return new Set([...r.getClientRects()].map((c) => Math.round(c.top))).size > 1; }).length`)
	if lines < 2 || inside != 0 {
		t.Errorf("the URL takes %d lines and wraps inside %d of its parts; want several lines, wrapped between parts only", lines, inside)
	}
}

// An endpoint is created, edited (URL, topics, filter, retry policy, headers) and deleted from the console:
// the API's validation errors show beside the field they name and store nothing; what is saved is what the
// API then reads; delete asks first, and Cancel keeps the endpoint.
func TestConsoleCreatesEditsAndDeletesAnEndpoint(t *testing.T) {
	path := browserPath(t)
	b := harness.Setup(t)
	s := b.Start(b.FastEnv())
	ctx := browser(t, path)
	page(t, ctx, 30*time.Second, "load the console and open the new endpoint form",
		chromedp.Navigate(s.URL+"/ui/"), chromedp.WaitVisible(chromedp.CSS(`#ep-new`)),
		chromedp.Click(chromedp.CSS(`#ep-new`)), chromedp.WaitVisible(chromedp.CSS(`#endpoint-form`)))
	fill := func(what string, fields map[string]string) {
		t.Helper()
		values, _ := json.Marshal(fields)
		read[bool](t, ctx, `Object.entries(`+string(values)+`).every(([id, v]) => { document.getElementById("ep-" + id).value = v; return true; })`)
		page(t, ctx, 10*time.Second, what, chromedp.Click(chromedp.CSS(`#ep-save`)))
	}
	errorBeside := func(field, contains string) {
		t.Helper()
		until(t, ctx, 10*time.Second, "the error beside "+field, `!document.getElementById("err-`+field+`").hidden`)
		if msg := read[string](t, ctx, `document.getElementById("err-`+field+`").textContent`); !strings.Contains(msg, contains) {
			t.Errorf("the error beside %s reads %q, want it to say %q", field, msg, contains)
		}
		if n := read[int](t, ctx, `[...document.querySelectorAll('#endpoint-form .field-error')].filter((e) => !e.hidden).length`); n != 1 {
			t.Errorf("%d errors shown, want the one beside %s", n, field)
		}
	}
	// The API's own refusals, each beside its field.
	fill("save with a URL that is not one", map[string]string{"consumerGroup": "shop", "url": "not a url", "topics": "order.created"})
	errorBeside("url", "url")
	if code := harness.Do(t, "GET", s.URL+"/v1/endpoints/shop", nil, nil); code != 404 {
		t.Errorf("a refused create stored the endpoint: GET = %d", code)
	}
	fill("save with a filter that does not compile", map[string]string{"url": "http://127.0.0.1:9/hook", "filter": "event.data.amount >"})
	errorBeside("filter", "")
	fill("save with maxRetries not a number", map[string]string{"filter": "", "maxRetries": "many"})
	errorBeside("maxRetries", "maxRetries")
	fill("save with a bad retry delay", map[string]string{"maxRetries": "2", "retryDelay": "soon"})
	errorBeside("retryDelay", "")
	// Created as typed.
	fill("create the endpoint", map[string]string{"retryDelay": "2s", "maxRetryDelay": "30s", "retryBackoffMultiplier": "3",
		"filter": "event.data.amount > 100", "headers": "X-Tenant: acme"})
	until(t, ctx, 10*time.Second, "the created message", `document.getElementById("message").textContent === "Created shop."`)
	page(t, ctx, 10*time.Second, "see the group", chromedp.WaitVisible(chromedp.CSS(`#groups tr[data-group="shop"]`)))
	type stored struct {
		URL, Filter, RetryDelay, MaxRetryDelay string
		Topics                                 []string
		MaxRetries                             int
		RetryBackoffMultiplier                 float64
		Headers                                map[string]string
	}
	got := harness.Get[stored](t, s.URL+"/v1/endpoints/shop")
	if got.URL != "http://127.0.0.1:9/hook" || len(got.Topics) != 1 || got.Topics[0] != "order.created" || got.Filter != "event.data.amount > 100" ||
		got.MaxRetries != 2 || got.RetryDelay != "2s" || got.MaxRetryDelay != "30s" || got.RetryBackoffMultiplier != 3 || len(got.Headers) != 1 {
		t.Errorf("created endpoint reads %+v", got)
	}
	// Edit: the form shows the endpoint; a redacted header value sent back is refused beside the headers.
	page(t, ctx, 10*time.Second, "open the edit form",
		chromedp.Click(chromedp.CSS(`button[data-action="edit"][data-group="shop"]`)))
	until(t, ctx, 10*time.Second, "the form filled", `document.getElementById("ep-url").value === "http://127.0.0.1:9/hook" && document.getElementById("ep-consumerGroup").disabled`)
	if v := read[string](t, ctx, `document.getElementById("ep-topics").value + "|" + document.getElementById("ep-filter").value + "|" + document.getElementById("ep-maxRetries").value`); v != "order.created|event.data.amount > 100|2" {
		t.Errorf("the edit form reads %q", v)
	}
	fill("save with the redacted header value", map[string]string{"url": "http://127.0.0.1:9/v2/hook"})
	errorBeside("headers", "<redacted>")
	fill("save the edit", map[string]string{"topics": "order.created, order.paid", "filter": "", "maxRetries": "5",
		"retryDelay": "1s", "maxRetryDelay": "1m", "headers": "X-Tenant: globex\nX-Env: prod"})
	until(t, ctx, 10*time.Second, "the saved message", `document.getElementById("message").textContent === "Saved shop."`)
	got = harness.Get[stored](t, s.URL+"/v1/endpoints/shop")
	if got.URL != "http://127.0.0.1:9/v2/hook" || len(got.Topics) != 2 || got.Filter != "" || got.MaxRetries != 5 || got.RetryDelay != "1s" ||
		got.MaxRetryDelay != "1m0s" && got.MaxRetryDelay != "1m" || len(got.Headers) != 2 {
		t.Errorf("edited endpoint reads %+v", got)
	}
	// A second create of the same group is refused beside the name, not a silent replace.
	page(t, ctx, 10*time.Second, "open the new endpoint form again", chromedp.Click(chromedp.CSS(`#ep-new`)))
	fill("create shop again", map[string]string{"consumerGroup": "shop", "url": "http://127.0.0.1:9/other", "topics": "x"})
	errorBeside("consumerGroup", "registered already")
	if got := harness.Get[stored](t, s.URL+"/v1/endpoints/shop"); got.URL != "http://127.0.0.1:9/v2/hook" {
		t.Errorf("a second create replaced the endpoint: %+v", got)
	}
	// An endpoint with a secret: reads never show it, so an edit that does not type it again is refused
	// beside the secret (a PUT without it would stop signing), and one that does is saved.
	const secret = "whsec_MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY="
	s.RegisterEndpoint(t, "signed", map[string]any{"url": "http://127.0.0.1:9/signed", "topics": []string{"t"}, "secret": secret})
	page(t, ctx, 10*time.Second, "open the signed endpoint's edit form",
		chromedp.WaitVisible(chromedp.CSS(`button[data-action="edit"][data-group="signed"]`)),
		chromedp.Click(chromedp.CSS(`button[data-action="edit"][data-group="signed"]`)))
	until(t, ctx, 10*time.Second, "the form filled", `document.getElementById("ep-url").value === "http://127.0.0.1:9/signed"`)
	fill("save without the secret", map[string]string{"url": "http://127.0.0.1:9/signed/v2"})
	errorBeside("secret", "secret")
	if got := harness.Get[stored](t, s.URL+"/v1/endpoints/signed"); got.URL != "http://127.0.0.1:9/signed" {
		t.Errorf("an edit refused beside the secret changed the endpoint: %+v", got)
	}
	fill("save with the secret", map[string]string{"secret": secret})
	until(t, ctx, 10*time.Second, "the saved message", `document.getElementById("message").textContent === "Saved signed."`)
	if got := harness.Get[struct{ URL, Secret string }](t, s.URL+"/v1/endpoints/signed"); got.URL != "http://127.0.0.1:9/signed/v2" || !strings.HasSuffix(got.Secret, secret[len(secret)-4:]) {
		t.Errorf("the edited signed endpoint reads %+v, want the new URL and the secret kept", got)
	}
	if !read[bool](t, ctx, `document.getElementById("endpoint-form").hidden`) {
		t.Errorf("the form stays open after a save")
	}
	// Delete asks first; Cancel keeps it; confirming deletes it.
	page(t, ctx, 10*time.Second, "press delete and cancel",
		chromedp.Click(chromedp.CSS(`button[data-action="delete"][data-group="shop"]`)), chromedp.WaitVisible(chromedp.CSS(`#confirm`)),
		chromedp.Click(chromedp.CSS(`#confirm-no`)), chromedp.WaitNotVisible(chromedp.CSS(`#confirm`)))
	if code := harness.Do(t, "GET", s.URL+"/v1/endpoints/shop", nil, nil); code != 200 {
		t.Fatalf("a cancelled delete: GET = %d, want 200", code)
	}
	page(t, ctx, 10*time.Second, "press delete and confirm",
		chromedp.Click(chromedp.CSS(`button[data-action="delete"][data-group="shop"]`)), chromedp.WaitVisible(chromedp.CSS(`#confirm`)),
		chromedp.Click(chromedp.CSS(`#confirm-yes`)))
	until(t, ctx, 10*time.Second, "the deleted message", `document.getElementById("message").textContent === "Deleted shop."`)
	until(t, ctx, 10*time.Second, "the group gone", `document.querySelector('#groups tr[data-group="shop"]') === null`)
	if code := harness.Do(t, "GET", s.URL+"/v1/endpoints/shop", nil, nil); code != 404 {
		t.Errorf("after the confirmed delete GET = %d, want 404", code)
	}
}
