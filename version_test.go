package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
)

// newBuildVersion reads the commit, its time and the modified flag from the build information, prefers
// the stamped version and build time, and says what it does not know.
func TestBuildVersionFromBuildInfo(t *testing.T) {
	t.Parallel()
	bi := &debug.BuildInfo{GoVersion: "go1.26.1", Main: debug.Module{Path: "github.com/pulse-sidecar/pulse",
		Version: "v0.0.0-20261201120000-0123456789ab+dirty"}, Settings: []debug.BuildSetting{
		{Key: "vcs", Value: "git"}, {Key: "vcs.revision", Value: "0123456789abcdef0123456789abcdef01234567"},
		{Key: "vcs.time", Value: "2026-12-01T12:00:00Z"}, {Key: "vcs.modified", Value: "true"},
	}}
	platform := runtime.GOOS + "/" + runtime.GOARCH
	for _, c := range []struct {
		name                    string
		bi                      *debug.BuildInfo
		stampVersion, stampTime string
		want                    string
	}{
		{"from git", bi, "", "", "version: v0.0.0-20261201120000-0123456789ab+dirty\n" +
			"commit: 0123456789abcdef0123456789abcdef01234567 (modified)\ncommit time: 2026-12-01T12:00:00Z\n" +
			"build time: unknown (not stamped)\ngo: go1.26.1 " + platform + "\n"},
		{"a release", bi, "1.2.0", "2026-12-02T08:00:00Z", "version: 1.2.0\n" +
			"commit: 0123456789abcdef0123456789abcdef01234567 (modified)\ncommit time: 2026-12-01T12:00:00Z\n" +
			"build time: 2026-12-02T08:00:00Z\ngo: go1.26.1 " + platform + "\n"},
		{"without VCS", &debug.BuildInfo{GoVersion: "go1.26.1", Main: debug.Module{Version: "(devel)"}}, "", "",
			"version: dev\ncommit: unknown (built without VCS information)\ncommit time: unknown\n" +
				"build time: unknown (not stamped)\ngo: go1.26.1 " + platform + "\n"},
		{"no build information", nil, "", "", "version: dev\ncommit: unknown (built without VCS information)\n" +
			"commit time: unknown\nbuild time: unknown (not stamped)\ngo: " + runtime.Version() + " " + platform + "\n"},
	} {
		if got := newBuildVersion(c.bi, c.stampVersion, c.stampTime).String(); got != c.want {
			t.Errorf("%s: got\n%s\nwant\n%s", c.name, got, c.want)
		}
	}
}

// A real `go build -buildvcs=true` of this checkout prints its commit. Go does not find the repository from
// a linked git worktree (its .git is a file: golang/go#58218), so there the test builds a clone of HEAD.
func TestVersionShowsTheCommitOfAGitBuild(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("-short: builds the binary")
	}
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("git is not installed")
	}
	head, err := exec.Command("git", "rev-parse", "HEAD").Output()
	if err != nil {
		t.Skipf("not a git checkout (git rev-parse HEAD: %v)", err)
	}
	dir := "."
	if fi, err := os.Stat(".git"); err != nil || !fi.IsDir() {
		dir = filepath.Join(t.TempDir(), "clone")
		if out, err := exec.Command("git", "clone", "--quiet", "--no-checkout", ".", dir).CombinedOutput(); err != nil {
			t.Fatalf("git clone: %v\n%s", err, out)
		}
		if out, err := exec.Command("git", "-C", dir, "checkout", "--quiet", strings.TrimSpace(string(head))).CombinedOutput(); err != nil {
			t.Fatalf("git checkout: %v\n%s", err, out)
		}
		t.Logf("this checkout is a linked worktree: building a clone of HEAD in %s", dir)
	}
	bin := filepath.Join(t.TempDir(), "pulse")
	build := exec.Command("go", "build", "-buildvcs=true", "-trimpath", "-o", bin, ".")
	build.Dir = dir
	build.Env = append(os.Environ(), "GOWORK=off", "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build -buildvcs=true: %v\n%s", err, out)
	}
	out, err := exec.Command(bin, "version").Output()
	if err != nil {
		t.Fatalf("pulse version: %v", err)
	}
	if want := "\ncommit: " + strings.TrimSpace(string(head)); !strings.Contains(string(out), want) {
		t.Errorf("pulse version of a git build printed\n%s\nwant a line %q", out, want[1:])
	}
	if strings.HasPrefix(string(out), "version: dev\n") {
		t.Errorf("pulse version of a git build printed the version dev:\n%s", out)
	}
}
