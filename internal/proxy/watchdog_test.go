package proxy

import (
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/router"
)

func TestResponseDeadline(t *testing.T) {
	res := Resilience{ResponseFloor: 10 * time.Second, ResponseFactor: 2, ResponseTokenTime: 10 * time.Millisecond,
		ResponseTimeout: time.Minute}.withDefaults()
	tests := []struct {
		name      string
		res       Resilience
		req       *router.Request
		predicted time.Duration
		want      time.Duration
	}{
		{"max_tokens", res, &router.Request{MaxTokens: 100}, time.Second, 10*time.Second + 2*(time.Second+time.Second)},
		{"no max_tokens", res, &router.Request{}, 0, 10*time.Second + 2*DefaultResponseTokens*10*time.Millisecond},
		{"within the response timeout", res, &router.Request{MaxTokens: 100_000}, 0, time.Minute},
		{"not routed", res, nil, 0, time.Minute},
		{"off", func() Resilience { r := res; r.ResponseFloor = -1; return r }(), &router.Request{MaxTokens: 1}, 0, time.Minute},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := &Proxy{res: tt.res}
			tk := &router.Ticket{Decision: router.Decision{PredictedTTFT: tt.predicted}}
			if got := p.firstTokenDeadline(&call{req: tt.req}, tk); got != tt.want {
				t.Errorf("deadline %v, want %v", got, tt.want)
			}
		})
	}
}
