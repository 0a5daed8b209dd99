package server

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"
)

// A group reports the first goroutine that failed, and not those that
// ended the way they are told to stop.
func TestGroupReportsOnlyFailures(t *testing.T) {
	stopped := errors.New("stopped")
	g := NewGroup(stopped)
	g.Go(func() error { return http.ErrServerClosed })
	g.Go(func() error { return fmt.Errorf("serve: %w", context.Canceled) })
	g.Go(func() error { return stopped })
	g.Go(func() error { return nil })
	g.Wait()
	select {
	case err := <-g.Err():
		t.Fatalf("an orderly stop reported as %v", err)
	default:
	}
	boom := errors.New("listener broke")
	g.Go(func() error { return boom })
	g.Wait()
	if err := <-g.Err(); !errors.Is(err, boom) {
		t.Fatalf("Err gave %v, want %v", err, boom)
	}
}
