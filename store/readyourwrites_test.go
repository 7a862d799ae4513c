package store_test

import (
	"context"
	"fmt"
	"testing"

	"kiln/store"
	"kiln/store/storetest"
)

// TestFollowerReadsItsForwardedWrites: a write through a follower returns
// only once that follower has applied it, so a read-modify-write on a
// follower (the lifecycle serving an agent there) reads back what it wrote
// (issue 12 item 6: an agent registered through a follower stayed
// inspecting, its next step read the machine before its write arrived).
func TestFollowerReadsItsForwardedWrites(t *testing.T) {
	c := storetest.NewCluster(t, 3)
	f := c.Nodes[c.Follower()].Store
	ctx := context.Background()
	for i := 0; i < 50; i++ {
		m, err := f.PutMachine(ctx, store.Machine{Name: fmt.Sprintf("ryw-%d", i)}, store.W{Actor: "test"})
		if err != nil {
			t.Fatal(err)
		}
		got, err := f.GetMachine(m.ID)
		if err != nil || got.Name != m.Name {
			t.Fatalf("write %d: follower reads %+v, %v right after writing %s", i, got, err, m.ID)
		}
		got.State = store.StateInspecting
		w, err := f.PutMachine(ctx, got, store.W{Actor: "test", Reason: "ryw"})
		if err != nil {
			t.Fatalf("write %d: update: %v", i, err)
		}
		if again, err := f.GetMachine(m.ID); err != nil || again.State != store.StateInspecting || again.ResourceVersion != w.ResourceVersion {
			t.Fatalf("write %d: follower reads state %s version %d after writing version %d (%v)", i, again.State, again.ResourceVersion, w.ResourceVersion, err)
		}
	}
}
