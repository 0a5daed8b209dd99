package main

import (
	"flag"
	"io"
	"testing"

	"github.com/kvroute/kvroute/internal/kvevents"
)

func TestKVEventsFlags(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		want    bool // a follower is configured
		wantErr bool
	}{
		{name: "off by default", args: nil},
		{name: "a port for the fleet", args: []string{"--kv-events-port", "5557", "--kv-events-replay-port", "5558"}, want: true},
		{name: "one backend", args: []string{"--kv-events", "gpu0=tcp://10.0.0.5:5557,tcp://10.0.0.5:5558"}, want: true},
		{name: "listening", args: []string{"--kv-events-listen", "tcp://*:5557"}, want: true},
		{name: "a bad endpoint", args: []string{"--kv-events", "gpu0=http://h:1"}, wantErr: true},
		{name: "a port out of range", args: []string{"--kv-events-port", "70000"}, wantErr: true},
		{name: "no tokenize time", args: []string{"--kv-events-port", "5557", "--kv-events-tokenize-timeout", "0s"}, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fs := flag.NewFlagSet("t", flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			var c kvEventsConfig
			c.register(fs)
			if err := fs.Parse(tt.args); err != nil {
				t.Fatal(err)
			}
			fc, err := c.config(nil)
			if (err != nil) != tt.wantErr || (err == nil && (fc != nil) != tt.want) {
				t.Fatalf("config = %+v, %v; want configured %v, error %v", fc, err, tt.want, tt.wantErr)
			}
		})
	}
}

func TestOffsetPort(t *testing.T) {
	for _, tt := range []struct {
		in   string
		i    int
		want string
	}{
		{"tcp://*:5557", 0, "tcp://*:5557"},
		{"tcp://*:5557", 2, "tcp://*:5559"},
		{"tcp://127.0.0.1:0", 3, "tcp://127.0.0.1:0"},
		{"", 1, ""},
	} {
		if got := offsetPort(tt.in, tt.i); got != tt.want {
			t.Errorf("offsetPort(%q, %d) = %q, want %q", tt.in, tt.i, got, tt.want)
		}
	}
}

func TestEmulateKVEventsFlags(t *testing.T) {
	cfg, err := parseEmulateFlags([]string{"--kv-events-endpoint", "tcp://127.0.0.1:0", "--kv-events-topic", "kv", "--kv-events-format", "array"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if ev := cfg.server.KVEvents; ev == nil || ev.Endpoint != "tcp://127.0.0.1:0" || ev.Topic != "kv" || ev.Format != kvevents.FormatArray {
		t.Fatalf("KVEvents = %+v", cfg.server.KVEvents)
	}
	if _, err := parseEmulateFlags([]string{"--kv-events-endpoint", "tcp://127.0.0.1:0", "--kv-events-format", "json"}, io.Discard); err == nil {
		t.Fatal("an unknown --kv-events-format was accepted")
	}
	if cfg, err := parseEmulateFlags(nil, io.Discard); err != nil || cfg.server.KVEvents != nil {
		t.Fatalf("without --kv-events-endpoint: %+v, %v; want no events", cfg.server.KVEvents, err)
	}
}
