package httpapi_test

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/rs/zerolog"

	"github.com/pulse-sidecar/pulse/httpapi"
)

// /readyz fails while the sidecar's own work is stuck (Options.Stalled), although the database answers a
// fresh ping and accepts a write: 503 stalled, naming the work; once the work completes it answers 200.
func TestReadyzFailsWhileTheSidecarsWorkIsStuck(t *testing.T) {
	t.Parallel()
	var stuck atomic.Pointer[error]
	stalled := func() error {
		if e := stuck.Load(); e != nil {
			return *e
		}
		return nil
	}
	srv := httptest.NewServer(httpapi.New(answerStore{}, nopNotifier{}, httpapi.Options{Logger: zerolog.Nop(), Stalled: stalled}).ProbeHandler())
	t.Cleanup(srv.Close)
	readyz := func() (int, string, string) {
		t.Helper()
		resp, err := http.Get(srv.URL + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var body struct {
			Error struct{ Code, Message string } `json:"error"`
		}
		_ = json.NewDecoder(resp.Body).Decode(&body)
		return resp.StatusCode, body.Error.Code, body.Error.Message
	}
	if code, _, _ := readyz(); code != 200 {
		t.Fatalf("/readyz = %d with nothing stuck, want 200", code)
	}
	err := errors.New("the reconciliation pass (reaper, repair scan) has run for 2m0s without completing (bound 1m30s)")
	stuck.Store(&err)
	if code, errCode, msg := readyz(); code != 503 || errCode != "stalled" || !strings.Contains(msg, "reconciliation pass") {
		t.Errorf("/readyz while the work is stuck = %d %q %q, want 503 stalled naming the work", code, errCode, msg)
	}
	stuck.Store(nil)
	if code, _, _ := readyz(); code != 200 {
		t.Errorf("/readyz once the work completed = %d, want 200", code)
	}
}
