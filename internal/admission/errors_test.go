package admission

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

func TestParseClass(t *testing.T) {
	tests := []struct {
		in      string
		want    Class
		wantErr bool
	}{
		{in: "", want: Standard},
		{in: "critical", want: Critical},
		{in: " Sheddable ", want: Sheddable},
		{in: "STANDARD", want: Standard},
		{in: "0", want: Critical},
		{in: "2", want: Sheddable},
		{in: "3", want: Standard, wantErr: true},
		{in: "urgent", want: Standard, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseClass(tt.in)
			if got != tt.want || (err != nil) != tt.wantErr {
				t.Errorf("ParseClass(%q) = %v, %v; want %v, err %v", tt.in, got, err, tt.want, tt.wantErr)
			}
		})
	}
	if got := Class(9).String(); got != "sheddable" {
		t.Errorf("Class(9) = %q, want sheddable", got)
	}
}

func TestRejectionWrite(t *testing.T) {
	tests := []struct {
		name           string
		err            error
		retryAfter     time.Duration
		wantCode       string
		wantRetryAfter string
	}{
		{name: "full", err: ErrQueueFull, retryAfter: 1500 * time.Millisecond, wantCode: CodeQueueFull, wantRetryAfter: "2"},
		{name: "timeout", err: ErrQueueTimeout, retryAfter: 30 * time.Second, wantCode: CodeQueueTimeout, wantRetryAfter: "30"},
		{name: "deadline", err: ErrDeadline, retryAfter: 0, wantCode: CodeDeadlineUnmeetable, wantRetryAfter: "1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var err error = &Rejection{Err: tt.err, Class: Sheddable, RetryAfter: tt.retryAfter}
			err = fmt.Errorf("route: %w", err)
			if !errors.Is(err, tt.err) {
				t.Errorf("errors.Is(%v, %v) = false", err, tt.err)
			}
			var rej *Rejection
			if !errors.As(err, &rej) {
				t.Fatal("no *Rejection in the chain")
			}
			rec := httptest.NewRecorder()
			rej.Write(rec)
			if rec.Code != http.StatusTooManyRequests {
				t.Errorf("status %d, want 429", rec.Code)
			}
			if got := rec.Header().Get("Retry-After"); got != tt.wantRetryAfter {
				t.Errorf("Retry-After %q, want %q", got, tt.wantRetryAfter)
			}
			var body struct {
				Error struct {
					Message, Type string
					Code          *string
				}
			}
			if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
				t.Fatal(err)
			}
			if body.Error.Type != "requests" || body.Error.Code == nil || *body.Error.Code != tt.wantCode || body.Error.Message == "" {
				t.Errorf("body %s, want type requests, code %s", rec.Body, tt.wantCode)
			}
		})
	}
	if _, ok := RetryAfter(errors.New("other")); ok {
		t.Error("RetryAfter found a Rejection in a plain error")
	}
}
