package main

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"sync"
)

// version, when stamped at build time with -ldflags "-X main.version=...", is the version this binary
// reports instead of the module version of its build information (a release stamps its tag without the
// leading v; the Dockerfile and .ci/packaging stamp theirs). `pulse version` prints it, and the sidecar
// sends it in its webhook User-Agent and logs it when it listens (binaryVersion().Version).
var version = ""

// buildTime, when stamped with -ldflags "-X main.buildTime=<RFC 3339 time>", is when the binary was built.
// The build information holds the commit's time, not the build's, so an unstamped binary reports none.
var buildTime = ""

// buildVersion is what `pulse version` prints: the version, the commit and its time (the vcs.* settings
// that `go build` records from a git checkout unless -buildvcs=false), the build time and the toolchain.
type buildVersion struct {
	Version    string // stamped version, else the main module's version, else "dev"
	Commit     string // vcs.revision; empty when the build recorded none
	CommitTime string // vcs.time (RFC 3339, UTC); empty when none
	Modified   bool   // vcs.modified: the checkout had uncommitted changes
	BuildTime  string // the stamped build time; empty when none
	GoVersion  string // the toolchain that built the binary, such as go1.26.0
	Platform   string // GOOS/GOARCH of the binary
}

// newBuildVersion reads bi (nil when the binary carries no build information) with the stamped version and
// build time; stamps win over what bi says.
func newBuildVersion(bi *debug.BuildInfo, stampedVersion, stampedBuildTime string) buildVersion {
	v := buildVersion{Version: stampedVersion, BuildTime: stampedBuildTime, GoVersion: runtime.Version(),
		Platform: runtime.GOOS + "/" + runtime.GOARCH}
	if bi != nil {
		if v.Version == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			v.Version = bi.Main.Version
		}
		if bi.GoVersion != "" {
			v.GoVersion = bi.GoVersion
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				v.Commit = s.Value
			case "vcs.time":
				v.CommitTime = s.Value
			case "vcs.modified":
				v.Modified = s.Value == "true"
			}
		}
	}
	if v.Version == "" {
		v.Version = "dev"
	}
	return v
}

// String returns the lines `pulse version` prints, "version: …" first; an unknown commit or build time
// says so rather than being left out.
func (v buildVersion) String() string {
	commit, commitTime, built := "unknown (built without VCS information)", "unknown", "unknown (not stamped)"
	if v.Commit != "" {
		commit = v.Commit
		if v.Modified {
			commit += " (modified)"
		}
	}
	if v.CommitTime != "" {
		commitTime = v.CommitTime
	}
	if v.BuildTime != "" {
		built = v.BuildTime
	}
	return fmt.Sprintf("version: %s\ncommit: %s\ncommit time: %s\nbuild time: %s\ngo: %s %s\n",
		v.Version, commit, commitTime, built, v.GoVersion, v.Platform)
}

// binaryVersion returns this binary's buildVersion, read once; safe for concurrent use.
var binaryVersion = sync.OnceValue(func() buildVersion {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		bi = nil
	}
	return newBuildVersion(bi, version, buildTime)
})
