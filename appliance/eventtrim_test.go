package appliance

import (
	"context"
	"errors"
	"testing"
	"time"

	"kiln/store"
	"kiln/store/storetest"
)

// The retention pass trims by count and by age on the real store, and an
// old cursor then reads as expired.
func TestEventTrimmer(t *testing.T) {
	ctx := context.Background()
	st := storetest.NewLocal(t)
	for range 20 {
		if err := st.AppendEvents(ctx, []store.Event{{Subject: "machine/m", Kind: "step"}}); err != nil {
			t.Fatal(err)
		}
	}
	now := time.Now()
	tr := &eventTrimmer{st: st, cfg: EventsConfig{MaxAge: time.Hour, MaxCount: 5}, now: func() time.Time { return now }}
	before, err := tr.trimOnce(ctx)
	if err != nil || before == 0 {
		t.Fatalf("count trim: %d, %v", before, err)
	}
	oldest, _ := st.OldestEventCursor()
	if evs, err := st.Events(oldest, 0); err != nil || len(evs) != 5 {
		t.Fatalf("kept %d events, %v; want 5", len(evs), err)
	}
	if _, err := st.Events(0, 0); !errors.Is(err, store.ErrCursorExpired) {
		t.Fatalf("cursor 0 after a trim: %v; want ErrCursorExpired", err)
	}
	if again, err := tr.trimOnce(ctx); err != nil || again != 0 {
		t.Fatalf("second pass: %d, %v; want nothing to trim", again, err)
	}
	now = now.Add(2 * time.Hour)
	if _, err := tr.trimOnce(ctx); err != nil {
		t.Fatal(err)
	}
	oldest, _ = st.OldestEventCursor()
	if evs, err := st.Events(oldest, 0); err != nil || len(evs) != 0 {
		t.Fatalf("after the age bound: %d events, %v; want 0", len(evs), err)
	}
}
