package main

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

func TestVersion(t *testing.T) {
	defer func(v string) { version = v }(version)
	for _, args := range [][]string{{"version"}, {"--version"}, {"-version"}} {
		for _, set := range []string{"", "v1.2.3"} {
			version = set
			var stdout, stderr bytes.Buffer
			if code := run(args, &stdout, &stderr); code != 0 {
				t.Fatalf("%q: exit %d, stderr %q", args, code, stderr.String())
			}
			want := `^kvroute devel .*go1\.\S+ \w+/\w+\n$`
			if set != "" {
				want = `^kvroute v1\.2\.3 .*go1\.\S+ \w+/\w+\n$`
			}
			if !regexp.MustCompile(want).MatchString(stdout.String()) {
				t.Errorf("%q with version %q printed %q, want it to match %s", args, set, stdout.String(), want)
			}
		}
	}
	var stdout, stderr bytes.Buffer
	if code := run([]string{"version", "extra"}, &stdout, &stderr); code != 2 {
		t.Errorf("version extra: exit %d, want 2", code)
	}
}

func TestLogFormat(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "kvroute.yaml")
	if err := os.WriteFile(file, []byte("log_format: json\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	backend := []string{"--backend", "http://127.0.0.1:9001"}
	tests := []struct {
		name    string
		args    []string
		env     string // KVROUTE_LOG_FORMAT; "" leaves it unset
		want    logFormat
		wantErr string
	}{
		{name: "default", want: logText},
		{name: "flag", args: []string{"--log-format", "json"}, want: logJSON},
		{name: "environment", env: "json", want: logJSON},
		{name: "config key", args: []string{"--config", file}, want: logJSON},
		{name: "flag over environment", args: []string{"--log-format", "text"}, env: "json", want: logText},
		{name: "unknown", args: []string{"--log-format", "xml"}, wantErr: `"xml" is neither text nor json`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.env != "" {
				t.Setenv("KVROUTE_LOG_FORMAT", tt.env)
			}
			cfg, err := parseServeFlags(append(tt.args, backend...), io.Discard)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if cfg.logFormat != tt.want {
				t.Errorf("serve log format %q, want %q", cfg.logFormat, tt.want)
			}
		})
	}

	ec, err := parseEmulateFlags([]string{"--log-format", "json"}, io.Discard)
	if err != nil || ec.logFormat != logJSON {
		t.Errorf("emulate --log-format json: %q, %v", ec.logFormat, err)
	}
	if ec, _ := parseEmulateFlags(nil, io.Discard); ec.logFormat != logText {
		t.Errorf("emulate's default log format is %q, want text", ec.logFormat)
	}

	var out bytes.Buffer
	newLogger(&out, logJSON, slog.LevelInfo).Info("kvroute serving", "backends", 2)
	var rec map[string]any
	if err := json.Unmarshal(out.Bytes(), &rec); err != nil || rec["msg"] != "kvroute serving" || rec["backends"] != 2.0 {
		t.Errorf("json log line %q: %v", out.String(), err)
	}
	out.Reset()
	newLogger(&out, logText, slog.LevelInfo).Info("kvroute serving", "backends", 2)
	if !strings.Contains(out.String(), `msg="kvroute serving" backends=2`) {
		t.Errorf("text log line %q", out.String())
	}
}
