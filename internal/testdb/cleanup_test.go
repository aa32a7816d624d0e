package testdb_test

import (
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/pulse-sidecar/pulse/internal/testdb"
)

// envHelper makes TestHelperUsesDatabase run: "pass" or "fail" says how it ends.
const envHelper = "TESTDB_CLEANUP_HELPER"

// A test process leaves no pulse-testdb-* directory behind, whether its tests pass or fail: it runs this
// test binary as a child with its own TMPDIR and a helper test that starts the database, and looks at that
// TMPDIR once the child has exited.
func TestProcessLeavesNoDirectory(t *testing.T) {
	t.Parallel()
	bin := testdb.Binary(t) // the child reuses it instead of building its own
	for _, mode := range []string{"pass", "fail"} {
		tmp := t.TempDir()
		cmd := exec.Command(os.Args[0], "-test.run=^TestHelperUsesDatabase$", "-test.count=1", "-test.v")
		cmd.Env = append(withoutEnv(os.Environ(), testdb.EnvMongoDBURI, "TMPDIR"),
			envHelper+"="+mode, "TMPDIR="+tmp, testdb.EnvBinary+"="+bin)
		out, err := cmd.CombinedOutput()
		var ee *exec.ExitError
		switch {
		case mode == "pass" && err != nil, mode == "fail" && !errors.As(err, &ee):
			t.Fatalf("%s: child test process: %v\n%s", mode, err, out)
		case !strings.Contains(string(out), "database started in pulse-testdb-"):
			t.Fatalf("%s: the child started no database in its TMPDIR:\n%s", mode, out)
		}
		entries, err := os.ReadDir(tmp)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			if strings.HasPrefix(e.Name(), "pulse-testdb-") {
				t.Errorf("%s: the child test process left %s behind", mode, e.Name())
			}
		}
	}
}

// TestHelperUsesDatabase is run by TestProcessLeavesNoDirectory in a child process only.
func TestHelperUsesDatabase(t *testing.T) {
	mode := os.Getenv(envHelper)
	if mode == "" {
		t.Skip("run by TestProcessLeavesNoDirectory in a child process")
	}
	testdb.Database(t)
	entries, _ := os.ReadDir(os.TempDir())
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), "pulse-testdb-") {
			t.Logf("database started in %s", e.Name())
		}
	}
	if mode == "fail" {
		t.Fatal("failing on purpose: the directory must be removed all the same")
	}
}

func withoutEnv(env []string, names ...string) []string {
	var out []string
	for _, kv := range env {
		name, _, _ := strings.Cut(kv, "=")
		keep := true
		for _, n := range names {
			keep = keep && name != n
		}
		if keep {
			out = append(out, kv)
		}
	}
	return out
}
