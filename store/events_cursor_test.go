package store_test

import (
	"context"
	"math"
	"testing"

	"kiln/store"
	"kiln/store/storetest"
)

// A cursor at the largest index returns nothing (after+1 must not wrap to 0
// and replay the whole log).
func TestEventsCursorAtMaxIndex(t *testing.T) {
	t.Run("raft", func(t *testing.T) { testEventsCursorAtMaxIndex(t, storetest.NewCluster(t, 1).Nodes[0].Store) })
	t.Run("local", func(t *testing.T) { testEventsCursorAtMaxIndex(t, storetest.NewLocal(t)) })
}

func testEventsCursorAtMaxIndex(t *testing.T, st *store.Store) {
	if _, err := st.PutSite(context.Background(), store.Site{Name: "s"}, store.W{Actor: "t"}); err != nil {
		t.Fatal(err)
	}
	if evs, err := st.Events(0, 0); err != nil || len(evs) == 0 {
		t.Fatalf("events after 0: %d, %v", len(evs), err)
	}
	evs, err := st.Events(math.MaxUint64, 0)
	if err != nil || len(evs) != 0 {
		t.Fatalf("events after MaxUint64: %d events, %v", len(evs), err)
	}
}
