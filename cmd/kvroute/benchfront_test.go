package main

import (
	"io"
	"slices"
	"testing"
	"time"
)

func TestParseBenchFrontFlags(t *testing.T) {
	for _, tt := range []struct {
		name    string
		args    []string
		streams []int
		fronts  []string
		wantErr bool
	}{
		{name: "defaults", streams: []int{100, 500, 2000}},
		{name: "chosen", args: []string{"--streams", "10, 20", "--fronts", "direct,nginx"}, streams: []int{10, 20}, fronts: []string{"direct", "nginx"}},
		{name: "bad streams", args: []string{"--streams", "10,x"}, wantErr: true},
		{name: "no streams", args: []string{"--streams", "0"}, wantErr: true},
		{name: "no events", args: []string{"--events", "0"}, wantErr: true},
		{name: "no duration", args: []string{"--duration", "0s"}, wantErr: true},
		{name: "extra argument", args: []string{"now"}, wantErr: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg, role, _, _, err := parseBenchFrontFlags(tt.args, io.Discard)
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tt.wantErr)
			}
			if err != nil {
				return
			}
			if role != "" || !slices.Equal(cfg.Concurrency, tt.streams) || !slices.Equal(cfg.Fronts, tt.fronts) {
				t.Errorf("role %q, streams %v, fronts %v; want none, %v, %v", role, cfg.Concurrency, cfg.Fronts, tt.streams, tt.fronts)
			}
			if cfg.Events != 50 || cfg.EventRate != 10000 || cfg.Duration != 5*time.Second || cfg.FrontCPU != 1 || cfg.LoadCPU != 0 {
				t.Errorf("defaults: %+v", cfg)
			}
		})
	}
}
