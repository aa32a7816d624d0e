package e2e

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"github.com/pulse-sidecar/pulse/e2e/internal/harness"
	"github.com/pulse-sidecar/pulse/internal/testdb"
	"github.com/pulse-sidecar/pulse/internal/testwait"
)

// Docs example begins (docs/api.md, "Verifying signatures in your receiver": kept there verbatim).

// verified passes a webhook POST on to next only when its signature verifies with the endpoint's secret
// ("whsec_..."); otherwise it answers 401, which the sidecar retries.
func verified(secret string, next func(w http.ResponseWriter, body []byte)) (http.Handler, error) {
	wh, err := standardwebhooks.NewWebhook(secret)
	if err != nil {
		return nil, err
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body) // the raw bytes: verify before parsing
		if err != nil || wh.Verify(body, r.Header) != nil {
			http.Error(w, "invalid signature", http.StatusUnauthorized)
			return
		}
		next(w, body)
	}), nil
}

// Docs example ends.

// readmeExample returns the code block of language lang in the section "Verifying signatures in your
// receiver" of docs/api.md (moved there from the README).
func readmeExample(t *testing.T, lang string) string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("..", "docs", "api.md")) // the test runs in e2e/
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(raw), "\n## Verifying signatures in your receiver\n")
	section, _, _ = strings.Cut(section, "\n## ")
	_, block, found := strings.Cut(section, "\n```"+lang+"\n")
	block, _, closed := strings.Cut(block, "\n```\n")
	if !ok || !found || !closed {
		t.Fatalf("docs/api.md has no %s block in its section \"Verifying signatures in your receiver\"", lang)
	}
	return block + "\n"
}

// verifyingScenario registers four consumer groups whose endpoint is url, a receiver that verifies with
// secretOld: one signing with that secret, one with another, one rotated from it to another and one rotated
// from another to it (both 1 h overlaps), publishes one event and checks that the receiver accepted it
// (the delivery succeeded) from all but the one signing with the other secret, whose first attempt got 401.
// It returns the event id.
func verifyingScenario(t *testing.T, s *harness.Sidecar, url string) string {
	t.Helper()
	register := func(group, secret string) {
		s.RegisterEndpoint(t, group, map[string]any{"url": url, "topics": []string{"t"}, "secret": secret, "retryDelay": "1h"})
	}
	register("right", secretOld)
	register("wrong", secretNewer)
	register("rotated-from", secretOld)
	register("rotated-to", secretNewer)
	for group, secret := range map[string]string{"rotated-from": secretNewer, "rotated-to": secretOld} {
		if code, _ := rotateSecret(s, t, group, map[string]any{"secret": secret, "overlap": "1h"}); code != 200 {
			t.Fatalf("rotate %s answered %d", group, code)
		}
	}
	id := s.Publish(t, "t", map[string]any{"order": 42})
	for _, group := range []string{"right", "rotated-from", "rotated-to"} {
		if d := s.WaitDelivery(t, id, group, 20*time.Second); d.Status != "success" {
			t.Errorf("delivery to %s = %+v, want success: the receiver accepted its signature", group, d)
		}
	}
	did := deliveryOf(s, t, id, "wrong")
	var d harness.DeliveryView
	testwait.Eventually(t, 20*time.Second, "the wrongly signed attempt to be recorded", func() bool {
		d = getDelivery(s, t, did)
		return len(d.Attempts) > 0 && d.Attempts[0].Status != "pending"
	})
	if d.Attempts[0].HTTPStatus != 401 {
		t.Errorf("attempt 1 to the group signing with another secret = %+v, want HTTP 401", d.Attempts[0])
	}
	return id
}

// The docs' Go example (docs/api.md), verbatim, accepts the sidecar's POSTs signed with its secret (also as the old or
// the new secret of a rotation) and refuses those signed with another, handing on the body as sent.
func TestReadmeGoVerifierAcceptsTheSidecarsPOSTs(t *testing.T) {
	own, err := os.ReadFile("signatures_test.go")
	if err != nil {
		t.Fatal(err)
	}
	_, example, _ := strings.Cut(string(own), "// Docs example begins (docs/api.md, \"Verifying signatures in your receiver\": kept there verbatim).\n\n")
	example, _, _ = strings.Cut(example, "\n// Docs example ends.")
	if !strings.Contains(readmeExample(t, "go"), example) {
		t.Fatalf("docs/api.md's Go example differs from the function verified that this test runs:\n%s", example)
	}

	b := harness.Setup(t)
	s := b.Start(b.FastEnv())
	var mu sync.Mutex
	var bodies []string
	h, err := verified(secretOld, func(w http.ResponseWriter, body []byte) {
		mu.Lock()
		bodies = append(bodies, string(body))
		mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	})
	if err != nil {
		t.Fatal(err)
	}
	rcv := httptest.NewServer(h)
	t.Cleanup(rcv.Close)
	id := verifyingScenario(t, s, rcv.URL)
	mu.Lock()
	defer mu.Unlock()
	if len(bodies) != 3 {
		t.Fatalf("the handler behind the verifier got %d bodies, want 3", len(bodies))
	}
	for _, body := range bodies {
		if !strings.HasPrefix(body, `{"id":"`+id+`","topic":"t",`) || !strings.Contains(body, `"data":{"order":42}`) {
			t.Errorf("the verified body %s is not the event as published", body)
		}
	}
}

// freePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// runExampleReceiver runs the docs' example of language lang (saved as file in dir) with command, the
// secret secretOld and a free port, and returns its URL and its output. It is killed in t.Cleanup.
func runExampleReceiver(t *testing.T, dir, lang, file string, command ...string) (string, *testdb.SyncBuffer) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, file), []byte(readmeExample(t, lang)), 0o600); err != nil {
		t.Fatal(err)
	}
	port := freePort(t)
	out := &testdb.SyncBuffer{}
	cmd := exec.Command(command[0], append(command[1:], file)...)
	cmd.Dir, cmd.Stdout, cmd.Stderr = dir, out, out
	cmd.Env = append(os.Environ(), "WEBHOOK_SECRET="+secretOld, "PORT="+strconv.Itoa(port))
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", command[0], err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-exited })
	addr := "127.0.0.1:" + strconv.Itoa(port)
	testwait.Eventually(t, 20*time.Second, "the "+lang+" receiver to listen on "+addr, func() bool {
		select {
		case <-exited:
			t.Fatalf("the %s receiver exited:\n%s", lang, out.String())
		default:
		}
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	return "http://" + addr + "/hook", out
}

// The docs' Node example, run by node with the standardwebhooks package from npm, accepts the sidecar's
// POSTs as the Go one does. Skipped when node or npm is missing or the package cannot be installed.
func TestReadmeNodeVerifierAcceptsTheSidecarsPOSTs(t *testing.T) {
	for _, tool := range []string{"node", "npm"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s is not installed: the docs' Node example is not run", tool)
		}
	}
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	install := exec.CommandContext(ctx, "npm", "install", "--prefix", dir, "--no-save", "--no-audit", "--no-fund", "--loglevel=error", "standardwebhooks@1")
	if out, err := install.CombinedOutput(); err != nil {
		t.Skipf("npm install standardwebhooks failed (no registry?): the docs' Node example is not run: %v\n%s", err, out)
	}
	b := harness.Setup(t)
	s := b.Start(b.FastEnv())
	url, out := runExampleReceiver(t, dir, "js", "receiver.js", "node")
	id := verifyingScenario(t, s, url)
	if n := strings.Count(out.String(), "delivery t "+id); n != 3 {
		t.Errorf("the Node receiver logged %d deliveries of %s, want 3:\n%s", n, id, out.String())
	}
}

// The docs' Python example accepts the sidecar's POSTs as the Go one does. It runs with the installed
// standardwebhooks module, else with the same library's Python source as the Go module
// github.com/standard-webhooks/standard-webhooks/libraries ships it (one repository holds every language's
// library; the Python registry is not reachable everywhere). Skipped without python3.
func TestReadmePythonVerifierAcceptsTheSidecarsPOSTs(t *testing.T) {
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("python3 is not installed: the docs' Python example is not run")
	}
	dir := t.TempDir()
	if err := exec.Command("python3", "-c", "import standardwebhooks.webhooks").Run(); err != nil {
		mod, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/standard-webhooks/standard-webhooks/libraries").Output()
		lib := filepath.Join(strings.TrimSpace(string(mod)), "python", "standardwebhooks")
		if _, statErr := os.Stat(filepath.Join(lib, "webhooks.py")); err != nil || statErr != nil {
			t.Skipf("neither an installed standardwebhooks module nor the Go module's copy (%v, %v): the docs' Python example is not run", err, statErr)
		}
		if err := os.CopyFS(filepath.Join(dir, "standardwebhooks"), os.DirFS(lib)); err != nil {
			t.Fatal(err)
		}
		t.Logf("python3 has no standardwebhooks module: using the library's source from %s", lib)
	}
	b := harness.Setup(t)
	s := b.Start(b.FastEnv())
	url, out := runExampleReceiver(t, dir, "python", "receiver.py", "python3", "-u")
	id := verifyingScenario(t, s, url)
	if n := strings.Count(out.String(), "delivery t "+id); n != 3 {
		t.Errorf("the Python receiver logged %d deliveries of %s, want 3:\n%s", n, id, out.String())
	}
}
