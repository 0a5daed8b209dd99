package fleet

import (
	"testing"
	"time"
)

func TestResultOf(t *testing.T) {
	tests := []struct {
		name     string
		status   int
		complete bool
		want     Result
		wantOK   bool
	}{
		{name: "no status", status: 0, complete: true},
		{name: "overloaded", status: 429, want: Result{Kind: ResultOverloaded}, wantOK: true},
		{name: "bad gateway", status: 502, want: Result{Kind: ResultGatewayError}, wantOK: true},
		{name: "unavailable", status: 503, want: Result{Kind: ResultGatewayError}, wantOK: true},
		{name: "gateway timeout", status: 504, want: Result{Kind: ResultGatewayError}, wantOK: true},
		{name: "server error", status: 500, complete: true, want: Result{Kind: ResultServerError}, wantOK: true},
		{name: "success", status: 200, complete: true,
			want: Result{Kind: ResultSuccess, TTFT: time.Second, Predicted: 2 * time.Second}, wantOK: true},
		{name: "cut short", status: 200},
		{name: "client error", status: 400, complete: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := ResultOf(tt.status, tt.complete, time.Second, 2*time.Second)
			if got != tt.want || ok != tt.wantOK {
				t.Errorf("ResultOf(%d, %v) = %+v, %v; want %+v, %v", tt.status, tt.complete, got, ok, tt.want, tt.wantOK)
			}
		})
	}
}
