package lifecycle

import (
	"context"
	"testing"
	"time"
)

// TestAfterStop: a write context that records an outcome outlives the
// controller's context by stopGrace, and no longer (a node stopping without
// quorum must not wait the store's ApplyTimeout per job).
func TestAfterStop(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	wctx, done := afterStop(ctx)
	defer done()
	cancel()
	stopped := time.Now()
	select {
	case <-wctx.Done():
		t.Fatal("cancelled at once; want stopGrace of grace")
	case <-time.After(stopGrace / 2):
	}
	select {
	case <-wctx.Done():
		if d := time.Since(stopped); d < stopGrace || d > stopGrace+time.Second {
			t.Fatalf("cancelled %v after the stop, want about %v", d, stopGrace)
		}
	case <-time.After(stopGrace + 2*time.Second):
		t.Fatal("never cancelled after the stop")
	}

	// While ctx runs, the write context stays alive.
	ctx2, cancel2 := context.WithCancel(context.Background())
	defer cancel2()
	w2, done2 := afterStop(ctx2)
	select {
	case <-w2.Done():
		t.Fatal("cancelled while its parent runs")
	case <-time.After(50 * time.Millisecond):
	}
	done2()
	if w2.Err() == nil {
		t.Fatal("the returned cancel did not cancel")
	}
}
