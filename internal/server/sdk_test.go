//go:build unix

package server

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/auth"
	"github.com/kvroute/kvroute/internal/testfleet"
)

// sdkDir holds the pinned Anthropic TypeScript SDK (package.json and its
// lock) and the script TestMessagesWithAnthropicSDK runs with it.
const sdkDir = "testdata/anthropic-sdk"

// sdkInstallTimeout bounds npm ci: a cold install fetches a few packages.
const sdkInstallTimeout = 5 * time.Minute

// anthropicSDK returns node and a directory with the pinned SDK installed
// and the check script beside it. The SDK is installed by npm ci from the
// lock, from the registry npm is configured with, once per lock into the
// user's cache (kvroute/npm/anthropic-sdk-<lock digest>), never into the
// repository. Without node or npm, or when the install fails, the test
// skips, except under CI=true, where it fails.
func anthropicSDK(t *testing.T) (node, dir string) {
	t.Helper()
	ci := os.Getenv("CI") == "true"
	unavailable := func(format string, args ...any) {
		t.Helper()
		if ci {
			t.Fatalf(format, args...)
		}
		t.Skipf(format, args...)
	}
	node, err := exec.LookPath("node")
	if err != nil {
		unavailable("no node on PATH: the Anthropic SDK check needs node and npm")
	}
	npm, err := exec.LookPath("npm")
	if err != nil {
		unavailable("no npm on PATH: the Anthropic SDK check needs node and npm")
	}
	manifest, err := os.ReadFile(filepath.Join(sdkDir, "package.json"))
	if err != nil {
		t.Fatal(err)
	}
	lock, err := os.ReadFile(filepath.Join(sdkDir, "package-lock.json"))
	if err != nil {
		t.Fatal(err)
	}
	script, err := os.ReadFile(filepath.Join(sdkDir, "check.mjs"))
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(append(manifest, lock...))
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = t.TempDir()
	}
	dir = filepath.Join(cache, "kvroute", "npm", "anthropic-sdk-"+hex.EncodeToString(sum[:6]))
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "@anthropic-ai", "sdk", "package.json")); err != nil {
		// Installed beside, then renamed into place: a test binary running
		// at the same time sees the SDK whole or not at all.
		if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
			t.Fatal(err)
		}
		tmp, err := os.MkdirTemp(filepath.Dir(dir), "install-")
		if err != nil {
			t.Fatal(err)
		}
		defer os.RemoveAll(tmp)
		for name, data := range map[string][]byte{"package.json": manifest, "package-lock.json": lock} {
			if err := os.WriteFile(filepath.Join(tmp, name), data, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), sdkInstallTimeout)
		defer cancel()
		cmd := exec.CommandContext(ctx, npm, "ci", "--no-audit", "--no-fund", "--ignore-scripts", "--loglevel=error")
		cmd.Dir = tmp
		if out, err := cmd.CombinedOutput(); err != nil {
			unavailable("npm ci of the Anthropic SDK failed: %v\n%s", err, out)
		}
		if err := os.Rename(tmp, dir); err != nil && !exists(dir) {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "check.mjs"), script, 0o644); err != nil {
		t.Fatal(err)
	}
	return node, dir
}

func exists(path string) bool { _, err := os.Stat(path); return err == nil }

// sdkUsage is the SDK's Usage.
type sdkUsage struct {
	InputTokens          int `json:"input_tokens"`
	CacheReadInputTokens int `json:"cache_read_input_tokens"`
	OutputTokens         int `json:"output_tokens"`
}

// TestMessagesWithAnthropicSDK runs the official Anthropic TypeScript SDK
// (testdata/anthropic-sdk, version pinned) against kvroute serve on
// emulator processes, its key in x-api-key as the SDK sends it: a message,
// a streamed message continuing the conversation (client.messages.stream,
// its events and final message), and the error of an unknown model, each
// checked as the SDK parsed it: text, stop_reason, usage, error class.
func TestMessagesWithAnthropicSDK(t *testing.T) {
	if testing.Short() {
		t.Skip("installs an npm package and starts emulator processes")
	}
	node, dir := anthropicSDK(t)
	emus := testfleet.Start(t, 2, "--seed", "4", "--time-scale", "0.05")
	s := startRouter(t, emus, func(c *Config) {
		c.Router.Seed = 1
		c.Proxy.Security.APIKeys = []auth.APIKey{{Key: "sdk-key", Name: "sdk"}}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "check.mjs")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "KVROUTE_URL="+s.URL, "KVROUTE_KEY=sdk-key", "KVROUTE_MODEL="+model)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("node check.mjs: %v\n%s", err, stderr.String())
	}
	var got struct {
		Created struct {
			ID, Type, Role, Text string
			StopReason           string   `json:"stop_reason"`
			Usage                sdkUsage `json:"usage"`
		} `json:"created"`
		Streamed struct {
			Events     []string `json:"events"`
			Text       string   `json:"text"`
			FinalText  string   `json:"final_text"`
			StopReason string   `json:"stop_reason"`
			Usage      sdkUsage `json:"usage"`
		} `json:"streamed"`
		Error struct {
			Thrown   bool   `json:"thrown"`
			Status   int    `json:"status"`
			NotFound bool   `json:"not_found"`
			Type     string `json:"type"`
		} `json:"error"`
	}
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("the script printed %q: %v", out, err)
	}
	t.Logf("SDK saw: %s", out)
	c := got.Created
	if c.ID == "" || c.Type != "message" || c.Role != "assistant" || c.Text == "" || !stopReason(c.StopReason) ||
		c.Usage.InputTokens < 400 || c.Usage.OutputTokens < 1 {
		t.Errorf("messages.create: %+v", c)
	}
	st := got.Streamed
	if ev := strings.Join(st.Events, " "); !strings.HasPrefix(ev, "message_start content_block_start content_block_delta") ||
		!strings.HasSuffix(ev, "content_block_stop message_delta message_stop") {
		t.Errorf("messages.stream events: %s", ev)
	}
	if st.Text == "" || st.Text != st.FinalText || !stopReason(st.StopReason) || st.Usage.OutputTokens < 1 {
		t.Errorf("messages.stream: %+v", st)
	}
	if st.Usage.CacheReadInputTokens < c.Usage.InputTokens*3/4 {
		t.Errorf("the second turn read %d tokens from the cache, the first had %d: want the first turn cached where it went",
			st.Usage.CacheReadInputTokens, c.Usage.InputTokens)
	}
	if e := got.Error; !e.Thrown || e.Status != 404 || !e.NotFound || e.Type != "not_found_error" {
		t.Errorf("unknown model: %+v, want a NotFoundError (404, not_found_error)", e)
	}
}

// stopReason reports whether r is a stop reason the emulator gives.
func stopReason(r string) bool { return r == "end_turn" || r == "max_tokens" }
