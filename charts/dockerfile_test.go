package charts_test

import (
	"bufio"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// instruction is one Dockerfile instruction with its continuation lines joined.
type instruction struct {
	cmd  string // upper case: FROM, RUN, COPY, ...
	args string
}

// stage is one FROM ... section of the Dockerfile.
type stage struct {
	base, name string
	ins        []instruction
}

func (s stage) all(cmd string) []string {
	var out []string
	for _, in := range s.ins {
		if in.cmd == cmd {
			out = append(out, in.args)
		}
	}
	return out
}

// dockerStages parses ../Dockerfile into its stages (comments and parser directives dropped).
func dockerStages(t *testing.T) []stage {
	t.Helper()
	return dockerfileStages(t, "../Dockerfile")
}

// dockerfileStages parses the Dockerfile at path into its stages (comments and parser directives dropped).
func dockerfileStages(t *testing.T, path string) []stage {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var (
		stages []stage
		buf    strings.Builder
	)
	flush := func() {
		line := strings.TrimSpace(buf.String())
		buf.Reset()
		if line == "" {
			return
		}
		cmd, args, _ := strings.Cut(line, " ")
		in := instruction{cmd: strings.ToUpper(cmd), args: strings.TrimSpace(args)}
		if in.cmd == "FROM" {
			f := strings.Fields(in.args)
			f = slices.DeleteFunc(f, func(s string) bool { return strings.HasPrefix(s, "--") })
			st := stage{base: f[0]}
			if len(f) == 3 && strings.EqualFold(f[1], "AS") {
				st.name = f[2]
			}
			stages = append(stages, st)
			return
		}
		if len(stages) == 0 {
			if in.cmd != "ARG" {
				t.Fatalf("%s: %s before the first FROM", path, in.cmd)
			}
			return
		}
		stages[len(stages)-1].ins = append(stages[len(stages)-1].ins, in)
	}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(strings.TrimSpace(line), "#") {
			continue
		}
		if strings.HasSuffix(line, `\`) {
			buf.WriteString(strings.TrimSuffix(line, `\`) + " ")
			continue
		}
		buf.WriteString(line)
		flush()
	}
	flush()
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(stages) < 2 {
		t.Fatalf("%s has %d stages, want a multi-stage build", path, len(stages))
	}
	return stages
}

var rootUser = regexp.MustCompile(`^(root|0)(:.*)?$`)

// checkMinimalStage asserts a runtime stage is distroless or scratch, runs as a non-root user, and runs no
// shell commands.
func checkMinimalStage(t *testing.T, s stage) {
	t.Helper()
	if !strings.Contains(s.base, "distroless") && s.base != "scratch" {
		t.Errorf("stage %s is based on %q, want gcr.io/distroless/... or scratch", s.name, s.base)
	}
	users := s.all("USER")
	if len(users) == 0 {
		t.Errorf("stage %s has no USER", s.name)
	} else if u := users[len(users)-1]; rootUser.MatchString(u) {
		t.Errorf("stage %s runs as %q, want a non-root user", s.name, u)
	}
	if runs := s.all("RUN"); len(runs) > 0 {
		t.Errorf("stage %s runs %v, but a minimal image has no shell", s.name, runs)
	}
	for _, cmd := range []string{"ENTRYPOINT", "CMD", "HEALTHCHECK"} {
		for _, args := range s.all(cmd) {
			if i := strings.Index(args, "["); i < 0 || !strings.HasSuffix(strings.TrimSpace(args), "]") {
				t.Errorf("stage %s: %s %s is in shell form, which needs a shell", s.name, cmd, args)
			}
		}
	}
}

func TestDockerfileFinalStage(t *testing.T) {
	t.Parallel()
	stages := dockerStages(t)
	final := stages[len(stages)-1]
	checkMinimalStage(t, final)
	if !slices.ContainsFunc(final.all("EXPOSE"), func(s string) bool { return slices.Contains(strings.Fields(s), "8080") }) {
		t.Error("final stage does not EXPOSE 8080")
	}
	env := strings.Join(final.all("ENV"), " ")
	for _, want := range []string{"PULSE_LISTEN=0.0.0.0:8080", "PULSE_PROBE_LISTEN=0.0.0.0:8081", "PULSE_DATA_DIR=/data"} {
		if !strings.Contains(env, want) {
			t.Errorf("final stage ENV does not set %s", want)
		}
	}
	if ep := strings.Join(final.all("ENTRYPOINT"), " "); !strings.Contains(ep, `"/pulse"`) {
		t.Errorf("final ENTRYPOINT = %s, want /pulse", ep)
	}
	if hc := strings.Join(final.all("HEALTHCHECK"), " "); hc != "" && !strings.Contains(hc, `"/pulse", "healthcheck"`) {
		t.Errorf("final HEALTHCHECK = %s, want the binary's healthcheck subcommand", hc)
	}
	// The /data directory must belong to the non-root user, or the embedded development database cannot write.
	if !slices.ContainsFunc(final.all("COPY"), func(s string) bool {
		return strings.Contains(s, "--chown=65532") && strings.HasSuffix(s, " /data")
	}) {
		t.Error("final stage does not create /data owned by 65532")
	}
}

func TestDockerfileBuildsStaticStampedBinary(t *testing.T) {
	t.Parallel()
	stages := dockerStages(t)
	names := map[string]bool{}
	var build string
	for _, s := range stages {
		for _, run := range s.all("RUN") {
			if strings.Contains(run, "go build") && strings.Contains(run, "-o /out/pulse .") {
				build = run
			}
		}
		for _, cp := range s.all("COPY") {
			if m := regexp.MustCompile(`--from=(\S+)`).FindStringSubmatch(cp); m != nil && !names[m[1]] {
				t.Errorf("COPY --from=%s names no earlier stage", m[1])
			}
		}
		if s.name != "" {
			names[s.name] = true
		}
	}
	if build == "" {
		t.Fatal("no stage runs `go build ... -o /out/pulse .`")
	}
	for _, want := range []string{"CGO_ENABLED=0", "-trimpath", "-X main.version=${VERSION}"} {
		if !strings.Contains(build, want) {
			t.Errorf("the go build step lacks %s: %s", want, build)
		}
	}
}

func TestDockerfileReceiverStage(t *testing.T) {
	t.Parallel()
	for _, s := range dockerStages(t) {
		if s.name == "receiver" {
			checkMinimalStage(t, s)
			return
		}
	}
	t.Error("no receiver stage (docker-compose.yml builds the demo receiver with target: receiver)")
}

func TestDockerignoreKeepsSources(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("../.dockerignore")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		l := strings.TrimPrefix(strings.TrimSpace(line), "/")
		switch l {
		case "go.mod", "go.sum", "*.go", "**/*.go", "examples", "examples/", "main.go":
			t.Errorf(".dockerignore excludes %q, which the image build needs", line)
		}
	}
	if !strings.Contains(string(b), ".git") {
		t.Error(".dockerignore does not exclude .git")
	}
}

// The release images (Dockerfile.release, built by GoReleaser from its own binaries) are the Dockerfile's
// images but for where the binary comes from: each of its runtime stages has the base, user, environment,
// ports, healthcheck, entrypoint and command of the Dockerfile's stage of the same name, and the sidecar is
// its default (last) stage as it is the Dockerfile's.
func TestReleaseDockerfileMatchesTheDockerfile(t *testing.T) {
	t.Parallel()
	built, released := dockerStages(t), dockerfileStages(t, "../Dockerfile.release")
	if last := released[len(released)-1].name; last != built[len(built)-1].name {
		t.Errorf("Dockerfile.release's default stage is %q, the Dockerfile's %q", last, built[len(built)-1].name)
	}
	for _, name := range []string{"pulse", "receiver"} {
		find := func(stages []stage) *stage {
			for i := range stages {
				if stages[i].name == name {
					return &stages[i]
				}
			}
			t.Fatalf("no stage %q", name)
			return nil
		}
		b, r := find(built), find(released)
		checkMinimalStage(t, *r)
		if r.base != b.base {
			t.Errorf("stage %s: Dockerfile.release is based on %q, the Dockerfile on %q", name, r.base, b.base)
		}
		for _, cmd := range []string{"USER", "ENV", "EXPOSE", "HEALTHCHECK", "ENTRYPOINT", "CMD"} {
			if got, want := r.all(cmd), b.all(cmd); !slices.Equal(got, want) {
				t.Errorf("stage %s: Dockerfile.release has %s %q, the Dockerfile %q", name, cmd, got, want)
			}
		}
		copies := strings.Join(r.all("COPY"), "\n")
		if !strings.Contains(copies, "${TARGETPLATFORM}/"+name+" /"+name) {
			t.Errorf("stage %s copies %q, want GoReleaser's ${TARGETPLATFORM}/%s to /%s", name, copies, name, name)
		}
	}
}
