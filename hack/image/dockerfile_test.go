package main

import (
	"encoding/json"
	"maps"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/dnsops/k8s_event/internal/image"
)

// instruction is one Dockerfile instruction, continuation lines joined.
type instruction struct {
	stage int // 0 for the first FROM's stage
	cmd   string
	args  string
}

func parseDockerfile(t *testing.T, path string) []instruction {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []instruction
	stage := -1
	var cur string
	for _, line := range strings.Split(string(b), "\n") {
		trimmed := strings.TrimSpace(line)
		if cur == "" && (trimmed == "" || strings.HasPrefix(trimmed, "#")) {
			continue
		}
		if strings.HasSuffix(trimmed, "\\") {
			cur += strings.TrimSuffix(trimmed, "\\") + " "
			continue
		}
		cur += trimmed
		cmd, args, _ := strings.Cut(cur, " ")
		cmd = strings.ToUpper(cmd)
		if cmd == "FROM" {
			stage++
		}
		out = append(out, instruction{stage: stage, cmd: cmd, args: strings.TrimSpace(args)})
		cur = ""
	}
	return out
}

// TestDockerfile checks that the Dockerfile builds the image that
// `make image` writes: the same user, workdir, entrypoint, ports, labels,
// capability and link flags, cross-built for the target platform.
func TestDockerfile(t *testing.T) {
	const version, revision, coredns = "VERSION", "REVISION", "COREDNS_VERSION"
	want := settings(version, revision, coredns)
	instrs := parseDockerfile(t, "../../Dockerfile")
	last := instrs[len(instrs)-1].stage

	get := func(stage int, cmd string) []string {
		var args []string
		for _, in := range instrs {
			if in.stage == stage && in.cmd == cmd {
				args = append(args, in.args)
			}
		}
		return args
	}
	one := func(stage int, cmd string) string {
		args := get(stage, cmd)
		if len(args) != 1 {
			t.Fatalf("stage %d has %d %s instructions, want one", stage, len(args), cmd)
		}
		return args[0]
	}
	args := map[string]string{"${VERSION}": version, "${REVISION}": revision, "${COREDNS_VERSION}": coredns}
	expand := func(s string) string {
		for k, v := range args {
			s = strings.ReplaceAll(s, k, v)
		}
		return s
	}

	if got := one(last, "USER"); got != image.User {
		t.Errorf("USER %s, want %s (numeric, as make image writes)", got, image.User)
	}
	if got := one(last, "WORKDIR"); got != "/" {
		t.Errorf("WORKDIR %s, want /", got)
	}
	var entrypoint []string
	if err := json.Unmarshal([]byte(one(last, "ENTRYPOINT")), &entrypoint); err != nil || !slices.Equal(entrypoint, []string{want.Entrypoint}) {
		t.Errorf("ENTRYPOINT %v (%v), want [%s]", entrypoint, err, want.Entrypoint)
	}
	ports := strings.Fields(one(last, "EXPOSE"))
	if !slices.Equal(slices.Sorted(slices.Values(ports)), slices.Sorted(slices.Values(want.Ports))) {
		t.Errorf("EXPOSE %v, want %v", ports, want.Ports)
	}
	labels := map[string]string{}
	for _, l := range get(last, "LABEL") {
		for _, m := range regexp.MustCompile(`([\w./-]+)="([^"]*)"`).FindAllStringSubmatch(l, -1) {
			labels[m[1]] = expand(m[2])
		}
	}
	if !maps.Equal(labels, want.Labels) {
		t.Errorf("LABEL\n%v\nwant\n%v", labels, want.Labels)
	}

	from := one(0, "FROM")
	if !strings.HasPrefix(from, "--platform=$BUILDPLATFORM ") {
		t.Errorf("FROM %s: the build stage must run on the build platform and cross-compile", from)
	}
	build := strings.Join(get(0, "RUN"), "\n")
	for _, s := range []string{"GOOS=${TARGETOS}", "GOARCH=${TARGETARCH}", "CGO_ENABLED=0", "-trimpath", "setcap cap_net_bind_service=+ep /coredns"} {
		if !strings.Contains(build, s) {
			t.Errorf("the build stage does not run %q", s)
		}
	}
	ldflags := regexp.MustCompile(`-ldflags "([^"]*)"`).FindStringSubmatch(build)
	makefile, err := os.ReadFile("../../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	makeLDFlags := regexp.MustCompile(`(?m)^LDFLAGS := (.*)$`).FindSubmatch(makefile)
	if ldflags == nil || makeLDFlags == nil {
		t.Fatalf("no -ldflags in the Dockerfile (%v) or LDFLAGS in the Makefile (%v)", ldflags, makeLDFlags)
	}
	docker := strings.NewReplacer("$(cat VERSION)", version, "${REVISION}", revision).Replace(ldflags[1])
	mk := strings.NewReplacer("$(VERSION)", version, "$(REVISION)", revision).Replace(string(makeLDFlags[1]))
	if docker != mk {
		t.Errorf("Dockerfile -ldflags %q, Makefile LDFLAGS %q", docker, mk)
	}
	if !slices.Contains(get(0, "ARG"), "TARGETOS TARGETARCH") {
		t.Error("the build stage does not declare ARG TARGETOS TARGETARCH")
	}
}

// TestDockerignore checks that build outputs, the git directory and test
// binaries stay out of the build context.
func TestDockerignore(t *testing.T) {
	b, err := os.ReadFile("../../.dockerignore")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Fields(string(b))
	for _, want := range []string{".git", "bin/", "dist/", "*.test", "*.out", "*.prof"} {
		if !slices.Contains(lines, want) {
			t.Errorf(".dockerignore does not name %s", want)
		}
	}
}
