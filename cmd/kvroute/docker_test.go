package main

import (
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
)

// TestDockerBuildCommand runs the Dockerfile's `go build` line as it is
// (its variables filled in) outside Docker, which this machine lacks, and
// checks the binary: static, and reporting the version the line injects.
func TestDockerBuildCommand(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	if runtime.GOOS != "linux" {
		t.Skip("the image is linux")
	}
	data, err := os.ReadFile("../../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	// The build RUN line, its continuations joined.
	src := strings.ReplaceAll(string(data), "\\\n", " ")
	line := regexp.MustCompile(`(?m)^RUN .*\bgo build\b.*$`).FindString(src)
	if line == "" {
		t.Fatal("no RUN ... go build line in the Dockerfile")
	}
	for _, want := range []string{"CGO_ENABLED=0", "-trimpath", "-X main.version=${VERSION}", "./cmd/kvroute"} {
		if !strings.Contains(line, want) {
			t.Errorf("the build line lacks %q: %s", want, line)
		}
	}
	for _, want := range []string{"USER 65532", `ENTRYPOINT ["/kvroute"]`, `CMD ["serve"`, "EXPOSE 8080 9464"} {
		if !strings.Contains(src, want) {
			t.Errorf("the Dockerfile lacks %q", want)
		}
	}
	// Drop the cache mounts (Docker's, not the shell's) and run the rest
	// from the module root.
	cmdline := regexp.MustCompile(`--mount=\S+`).ReplaceAllString(strings.TrimPrefix(line, "RUN "), "")
	out := filepath.Join(t.TempDir(), "kvroute")
	cmdline = strings.ReplaceAll(cmdline, "/out/kvroute", out)
	cmd := exec.Command("sh", "-c", cmdline)
	cmd.Dir = "../.."
	cmd.Env = append(os.Environ(), "TARGETOS=linux", "TARGETARCH="+runtime.GOARCH, "VERSION=v0.0.0-docker-test")
	if msg, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", cmdline, err, msg)
	}

	f, err := elf.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Error("the binary is dynamically linked: distroless/static has no libc")
		}
	}
	got, err := exec.Command(out, "--version").Output()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(string(got), "kvroute v0.0.0-docker-test ") {
		t.Errorf("--version printed %q, want the injected version", got)
	}
}
