package store_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"kiln/store"
	"kiln/store/storetest"
)

// Trimming deletes the old events on every replica alike, an older cursor
// is *CursorExpiredError naming the oldest cursor served, and that cursor
// reads the rest of the feed.
func TestTrimEvents(t *testing.T) {
	t.Run("raft", func(t *testing.T) {
		c := storetest.NewCluster(t, 3)
		var all []*store.Store
		for _, n := range c.Nodes {
			all = append(all, n.Store)
		}
		testTrimEvents(t, c.Nodes[c.Leader()].Store, all)
	})
	t.Run("local", func(t *testing.T) { st := storetest.NewLocal(t); testTrimEvents(t, st, []*store.Store{st}) })
}

func testTrimEvents(t *testing.T, st *store.Store, replicas []*store.Store) {
	ctx := context.Background()
	for i := 0; i < 10; i++ {
		if err := st.AppendEvents(ctx, []store.Event{{Subject: "machine/m", Kind: "step"}, {Subject: "machine/m", Kind: "step"}}); err != nil {
			t.Fatal(err)
		}
	}
	all, err := st.Events(0, 0)
	if err != nil || len(all) < 20 {
		t.Fatalf("events: %d, %v", len(all), err)
	}
	// Keep 5 events: the count bound falls inside a two-event command, so 6 stay.
	before, err := st.EventTrimPoint(time.Now(), 0, 5)
	if err != nil || before == 0 {
		t.Fatalf("trim point: %d, %v", before, err)
	}
	if err := st.TrimEvents(ctx, before, store.W{Actor: "test"}); err != nil {
		t.Fatal(err)
	}
	oldest, err := st.OldestEventCursor()
	if err != nil || oldest != before-1 {
		t.Fatalf("oldest cursor %d, %v; want %d", oldest, err, before-1)
	}
	_, err = st.Events(0, 0)
	var ce *store.CursorExpiredError
	if !errors.As(err, &ce) || !errors.Is(err, store.ErrCursorExpired) || ce.Oldest != oldest {
		t.Fatalf("events after 0 once trimmed: %v; want *CursorExpiredError oldest %d", err, oldest)
	}
	for i, r := range replicas {
		deadline := time.Now().Add(5 * time.Second)
		for {
			_, err0 := r.Events(0, 0)
			rest, err := r.Events(oldest, 0)
			if err == nil && len(rest) == 6 && errors.Is(err0, store.ErrCursorExpired) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("replica %d: events after oldest cursor %d: %d, %v (after 0: %v); want 6 and expired", i, oldest, len(rest), err, err0)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	// Age bound: every event is older than 1 ns from now+1h: all go; a repeated trim is a no-op.
	before, err = st.EventTrimPoint(time.Now().Add(time.Hour), time.Nanosecond, 0)
	if err != nil || before != all[len(all)-1].Index+1 {
		t.Fatalf("age trim point %d, %v; want %d", before, err, all[len(all)-1].Index+1)
	}
	if err := st.TrimEvents(ctx, before, store.W{}); err != nil {
		t.Fatal(err)
	}
	if err := st.TrimEvents(ctx, before-3, store.W{}); err != nil {
		t.Fatal(err)
	}
	if evs, err := st.Events(before-1, 0); err != nil || len(evs) != 0 {
		t.Fatalf("after full trim: %d events, %v", len(evs), err)
	}
	if p, err := st.EventTrimPoint(time.Now().Add(time.Hour), time.Nanosecond, 1); err != nil || p != 0 {
		t.Fatalf("trim point of an empty log: %d, %v; want 0", p, err)
	}
}
