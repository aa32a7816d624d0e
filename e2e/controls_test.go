package e2e

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/pulse-sidecar/pulse/e2e/internal/harness"
	"github.com/pulse-sidecar/pulse/internal/testwait"
)

// endpointView is the state part of an endpoint as GET /v1/endpoints/{group} shows it.
type endpointView struct {
	ConsumerGroup string     `json:"consumerGroup"`
	URL           string     `json:"url"`
	State         string     `json:"state"`
	StateReason   string     `json:"stateReason"`
	StateSince    *time.Time `json:"stateSince"`
	RateLimit     float64    `json:"rateLimit"`
	DisableAfter  string     `json:"disableAfter"`
	errorAnswer
}

// controlEndpoint POSTs .../pause or .../resume for group and returns the answer.
func controlEndpoint(s *harness.Sidecar, t *testing.T, group, action string) (int, endpointView) {
	t.Helper()
	var out endpointView
	code := harness.Do(t, "POST", s.URL+"/v1/endpoints/"+group+"/"+action, nil, &out)
	return code, out
}

// getEndpoint reads group's endpoint.
func getEndpoint(s *harness.Sidecar, t *testing.T, group string) endpointView {
	t.Helper()
	return harness.Get[endpointView](t, s.URL+"/v1/endpoints/"+group)
}

// postsTo returns the POSTs rcv got for group, in arrival order.
func postsTo(rcv *harness.Receiver, group string) []harness.Received {
	var out []harness.Received
	for _, r := range rcv.Received() {
		if r.Header.Get("Pulse-Consumer-Group") == group {
			out = append(out, r)
		}
	}
	return out
}

// A pause through replica A stops replica B at once: events published through B while the groups (one
// unordered, one ordered) are paused wait, for several lease timeouts and poll turns, as pending deliveries
// whose first attempt never started; a PUT keeps the pause; a resume through B delivers every one of them
// with attempt 1 (in order for the ordered group).
func TestPauseThroughOneReplicaStopsTheOther(t *testing.T) {
	b := harness.Setup(t)
	a, bb := b.Start(b.FastEnv()), b.Start(b.FastEnv())
	rcv := harness.NewReceiver(t, 200)
	groups := map[string]bool{"plain": false, "ordered": true}
	for g, ordered := range groups {
		a.RegisterEndpoint(t, g, map[string]any{"url": rcv.URL, "topics": []string{"t"}, "ordered": ordered})
	}
	for _, action := range []string{"pause", "resume"} {
		if code, out := controlEndpoint(a, t, "nobody", action); code != 404 || out.Error.Code != "endpoint_not_found" {
			t.Fatalf("%s of an unknown group answered %d %+v, want 404 endpoint_not_found", action, code, out.Error)
		}
	}
	if ep := getEndpoint(a, t, "plain"); ep.State != "active" || ep.StateReason != "" || ep.StateSince != nil {
		t.Fatalf("a new endpoint reads %+v, want state active without reason or since", ep)
	}
	before := time.Now().Add(-time.Second)
	for g := range groups {
		code, out := controlEndpoint(a, t, g, "pause")
		if code != 200 || out.ConsumerGroup != g || out.State != "paused" || out.StateReason != "paused" || out.StateSince == nil ||
			out.StateSince.Before(before) || out.StateSince.After(time.Now().Add(time.Second)) {
			t.Fatalf("pause %s answered %d %+v, want the endpoint paused since now", g, code, out)
		}
	}
	var raw json.RawMessage
	harness.Do(t, "GET", bb.URL+"/v1/endpoints/plain", nil, &raw)
	var since struct{ StateSince string }
	_ = json.Unmarshal(raw, &since)
	if _, err := time.Parse("2006-01-02T15:04:05.000Z", since.StateSince); err != nil {
		t.Fatalf("stateSince %q is not RFC 3339 with milliseconds: %s", since.StateSince, raw)
	}
	// A PUT keeps the state; pausing again keeps stateSince.
	a.RegisterEndpoint(t, "plain", map[string]any{"url": rcv.URL, "topics": []string{"t"}, "state": "active"})
	first := getEndpoint(a, t, "plain")
	if _, again := controlEndpoint(a, t, "plain", "pause"); first.State != "paused" || again.StateSince == nil || !again.StateSince.Equal(*first.StateSince) {
		t.Fatalf("after a PUT the endpoint reads %+v, a second pause %+v; want paused since the first pause", first, again)
	}

	var dids []string
	for i := range 4 {
		id := bb.Publish(t, "t", i)
		for g := range groups {
			dids = append(dids, deliveryOf(bb, t, id, g))
		}
	}
	// Several lease timeouts (600 ms) and poll turns (50 ms) of both replicas pass with nothing POSTed and
	// every attempt back in the queue, unstarted.
	quiet := time.Now().Add(4 * 600 * time.Millisecond)
	testwait.Eventually(t, 20*time.Second, "several lease timeouts with the groups paused", func() bool {
		if n := len(rcv.Received()); n != 0 {
			t.Fatalf("the receiver got %d POSTs while the groups were paused", n)
		}
		return time.Now().After(quiet)
	})
	testwait.Eventually(t, 30*time.Second, "every attempt queued, unstarted", func() bool {
		for _, id := range dids {
			d := getDelivery(bb, t, id)
			if d.Status != "pending" || len(d.Attempts) != 1 {
				t.Fatalf("delivery %+v while paused, want pending with its first attempt only", d)
			}
			if at := d.Attempts[0]; at.Attempt != 1 || at.LockState != "queued" || at.StartedAt != nil {
				return false // a claim in the instant before its release
			}
		}
		return true
	})
	if n := len(rcv.Received()); n != 0 {
		t.Fatalf("the receiver got %d POSTs while the groups were paused", n)
	}

	for g := range groups {
		if code, out := controlEndpoint(bb, t, g, "resume"); code != 200 || out.State != "active" || out.StateReason != "" || out.StateSince != nil {
			t.Fatalf("resume %s answered %d %+v, want active", g, code, out)
		}
	}
	testwait.Eventually(t, 20*time.Second, "every delivery after the resume", func() bool {
		for _, id := range dids {
			if d := getDelivery(bb, t, id); d.Status != "success" {
				return false
			}
		}
		return true
	})
	for _, id := range dids {
		if d := getDelivery(bb, t, id); len(d.Attempts) != 1 || d.Attempts[0].Attempt != 1 {
			t.Fatalf("delivery %+v, want success at attempt 1: a pause uses up no attempt", d)
		}
	}
	for i, r := range postsTo(rcv, "ordered") {
		var body struct{ Data int }
		_ = json.Unmarshal(r.Body, &body)
		if body.Data != i {
			t.Fatalf("the ordered group's POST %d carried event %d, want %d (in order)", i, body.Data, i)
		}
	}
	if n := len(postsTo(rcv, "plain")); n != 4 {
		t.Fatalf("the plain group got %d POSTs, want 4", n)
	}
}

// A 410 Gone answer to a POST by either replica disables the endpoint (seen through the other replica), is
// recorded (HTTP 410, endpoint_gone) without ending the delivery or counting against maxRetries (0 here),
// counts in pulse_endpoint_disabled_total and logs a warning; nothing is POSTed until a resume through the
// other replica, which delivers the waiting attempt 2.
func TestGoneDisablesTheEndpointUntilResumed(t *testing.T) {
	b := harness.Setup(t)
	a, bb := b.Start(b.FastEnv()), b.Start(b.FastEnv())
	rcv := harness.NewReceiver(t, 410, 200)
	a.RegisterEndpoint(t, "shop", map[string]any{"url": rcv.URL, "topics": []string{"t"}, "maxRetries": 0})
	did := deliveryOf(a, t, a.Publish(t, "t", 1), "shop")
	var ep endpointView
	testwait.Eventually(t, 20*time.Second, "the endpoint disabled, seen through the other replica", func() bool {
		ep = getEndpoint(bb, t, "shop")
		return ep.State == "disabled"
	})
	if ep.StateReason != "gone" || ep.StateSince == nil {
		t.Fatalf("endpoint %+v, want disabled for reason gone with its since", ep)
	}
	quiet := time.Now().Add(4 * 600 * time.Millisecond)
	var d harness.DeliveryView
	testwait.Eventually(t, 20*time.Second, "several lease timeouts with the endpoint disabled", func() bool {
		if n := len(rcv.Received()); n != 1 {
			t.Fatalf("the receiver got %d POSTs, want the one answered 410", n)
		}
		d = getDelivery(bb, t, did)
		return time.Now().After(quiet) && len(d.Attempts) == 2 && d.Attempts[1].LockState == "queued"
	})
	first := d.Attempts[0]
	if d.Status != "pending" || first.HTTPStatus != 410 || first.Status != "error" || first.Error == nil || first.Error.Code != "endpoint_gone" ||
		d.Attempts[1].Attempt != 2 || d.Attempts[1].Status != "pending" || d.Attempts[1].StartedAt != nil {
		t.Fatalf("delivery %+v, want pending: attempt 1 error HTTP 410 endpoint_gone, attempt 2 waiting unstarted", d)
	}
	disabled := scrape(t, a) + scrape(t, bb)
	if !strings.Contains(disabled, `pulse_endpoint_disabled_total{consumer_group="shop",reason="gone"} 1`) ||
		!strings.Contains(disabled, `pulse_endpoint_state{consumer_group="shop",state="disabled"} 1`) {
		t.Errorf("/metrics of the replicas lack the disable:\n%s", grepLines(disabled, "pulse_endpoint"))
	}
	if logs := a.Logs.String() + bb.Logs.String(); !strings.Contains(logs, `"level":"warn"`) || !strings.Contains(logs, "endpoint disabled") {
		t.Errorf("no warning names the disabled endpoint")
	}

	if code, out := controlEndpoint(bb, t, "shop", "resume"); code != 200 || out.State != "active" {
		t.Fatalf("resume answered %d %+v, want active", code, out)
	}
	d = bb.WaitDelivery(t, d.EventID, "shop", 20*time.Second)
	if d.Status != "success" || len(d.Attempts) != 2 || len(rcv.Received()) != 2 {
		t.Fatalf("delivery %+v after %d POSTs, want success at attempt 2 after 2 POSTs", d, len(rcv.Received()))
	}
}

// grepLines returns the lines of s that contain sub.
func grepLines(s, sub string) string {
	var out []string
	for _, line := range strings.Split(s, "\n") {
		if strings.Contains(line, sub) {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}

// An endpoint with disableAfter 1s whose every attempt fails is disabled (reason failing) once its failures
// have lasted 1 s, not before; its delivery stays pending with no further POST until a resume.
func TestDisableAfterAFailingStreak(t *testing.T) {
	b := harness.Setup(t)
	a, bb := b.Start(b.FastEnv()), b.Start(b.FastEnv())
	rcv := harness.NewReceiver(t, 500)
	a.RegisterEndpoint(t, "flaky", map[string]any{"url": rcv.URL, "topics": []string{"t"}, "disableAfter": "1s",
		"retryDelay": "100ms", "maxRetryDelay": "200ms", "maxRetries": 100})
	if ep := getEndpoint(bb, t, "flaky"); ep.DisableAfter != "1s" {
		t.Fatalf("disableAfter reads %q, want 1s", ep.DisableAfter)
	}
	did := deliveryOf(a, t, bb.Publish(t, "t", 1), "flaky")
	var ep endpointView
	testwait.Eventually(t, 20*time.Second, "the endpoint disabled by its failing streak", func() bool {
		ep = getEndpoint(a, t, "flaky")
		return ep.State == "disabled"
	})
	posts := rcv.Received()
	if ep.StateReason != "failing" || ep.StateSince == nil || ep.StateSince.Sub(posts[0].At) < time.Second-50*time.Millisecond {
		t.Fatalf("endpoint %+v after the first failure at %s, want disabled for failing at least 1 s later", ep, posts[0].At)
	}
	quiet := time.Now().Add(4 * 600 * time.Millisecond)
	testwait.Eventually(t, 20*time.Second, "several lease timeouts with the endpoint disabled", func() bool { return time.Now().After(quiet) })
	if n := len(rcv.Received()); n > len(posts)+1 {
		t.Fatalf("%d POSTs after the disable, want at most the one in flight", n-len(posts))
	}
	if d := getDelivery(a, t, did); d.Status != "pending" {
		t.Fatalf("delivery %+v, want pending while disabled", d)
	}
	if code, out := controlEndpoint(bb, t, "flaky", "resume"); code != 200 || out.State != "active" {
		t.Fatalf("resume answered %d %+v", code, out)
	}
	n := len(rcv.Received())
	testwait.Eventually(t, 20*time.Second, "a POST after the resume", func() bool { return len(rcv.Received()) > n })
}

// An endpoint with rateLimit 5 receives 40 events at no more than 2×5 (+ the burst of 1, + one for the
// receiver's view of the starts) POSTs in any 2-second window and over at least 6.6 s, while an endpoint without a limit on the same sidecar gets its events at once.
func TestRateLimitSpacesThePOSTs(t *testing.T) {
	b := harness.Setup(t)
	s := b.Start(b.FastEnv())
	limited, free := harness.NewReceiver(t, 200), harness.NewReceiver(t, 200)
	s.RegisterEndpoint(t, "limited", map[string]any{"url": limited.URL, "topics": []string{"slow"}, "rateLimit": 5})
	s.RegisterEndpoint(t, "free", map[string]any{"url": free.URL, "topics": []string{"fast"}})
	if ep := getEndpoint(s, t, "limited"); ep.RateLimit != 5 {
		t.Fatalf("rateLimit reads %v, want 5", ep.RateLimit)
	}
	if code := harness.Do(t, "PUT", s.URL+"/v1/endpoints/bad", map[string]any{"url": free.URL, "topics": []string{"t"}, "rateLimit": -1}, nil); code != 400 {
		t.Fatalf("rateLimit -1 answered %d, want 400", code)
	}
	const n, perSecond, burst = 40, 5, 1
	publishAll := func(topic string, count int) { // one request, so that publishing takes no time of its own
		batch := make([]map[string]any, count)
		for i := range batch {
			batch[i] = map[string]any{"topic": topic, "data": i}
		}
		if code := harness.Do(t, "POST", s.URL+"/v1/events", batch, nil); code != 202 {
			t.Fatalf("publish of %d %s events answered %d", count, topic, code)
		}
	}
	publishAll("slow", n)
	publishAll("fast", 10)
	start, limitedAtStart := time.Now(), len(limited.Received())
	// The unlimited group does not wait behind the limited one's tokens: its 10 events arrive while the
	// limited group has made at most half of the POSTs it had left when they were published (20 POSTs at 5/s
	// take 4 s). Counted from that baseline, not from the first publish, so a slow machine's publishes do not
	// count against it.
	limitedThen := 0
	testwait.Eventually(t, 30*time.Second, "the unlimited group's 10 events", func() bool {
		if len(free.Received()) < 10 {
			return false
		}
		limitedThen = len(limited.Received())
		return true
	})
	if left := n - limitedAtStart; limitedThen-limitedAtStart > left/2 {
		t.Errorf("the unlimited group's events arrived %s after publishing, when the limited one had made %d of the %d POSTs it had left: want them long before",
			time.Since(start).Round(time.Millisecond), limitedThen-limitedAtStart, left)
	}
	testwait.Eventually(t, 30*time.Second, "the 40 rate-limited events", func() bool { return len(limited.Received()) == n })
	// The bucket spaces the POSTs' starts (TestRateLimitsAdmitByToken checks its arithmetic); the receiver sees
	// their arrivals, each late by however long a busy machine took to run the POST's goroutine, and a stall
	// of the machine lets the POSTs started during it arrive together. So a 2 s window may hold what the
	// bucket allows in it (2×5 + the burst) and the POSTs of a further second (a stall of up to 1 s; under
	// four CPU burners one POST more than the bucket's share was seen): an endpoint without its limit would
	// get all 40 within one window.
	got := limited.Received()
	const window, stall = 2 * time.Second, time.Second
	allowed := int(window.Seconds())*perSecond + burst + int(stall.Seconds())*perSecond
	most := 0
	for i := range got {
		in := 0
		for _, r := range got[i:] {
			if r.At.Sub(got[i].At) < window {
				in++
			}
		}
		most = max(most, in)
	}
	span := got[n-1].At.Sub(got[0].At)
	t.Logf("rateLimit %d: %d POSTs in %s (%.2f/s), at most %d in any %s window", perSecond, n, span, float64(n-1)/span.Seconds(), most, window)
	if most > allowed {
		t.Fatalf("%d POSTs within %s, want at most %d", most, window, allowed)
	}
	// 40 POSTs with a burst of 1 take at least 38 token intervals (7.6 s), less the first one's delay.
	if least := time.Duration(n-1-burst) * time.Second / perSecond; span < least-time.Second {
		t.Fatalf("%d POSTs arrived over %s, want at least %s at %d/s", n, span, least-time.Second, perSecond)
	}
}
