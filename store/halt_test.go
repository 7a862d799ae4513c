package store_test

import (
	"errors"
	"testing"
	"time"

	"kiln/store"
	"kiln/store/storetest"
)

// TestClusterNodeHaltsOnUnknownCommand: one node of three plays a binary
// that knows command types only up to 23 (the gate bypassed); the leader
// writes a 24 (trim_events). That node stops applying at the entry — later
// writes do not reach its replica, it is not Ready, its Barrier, Stats and
// Snapshot say so — while the others go on. Restarted on the full binary (an
// upgrade), it rebuilds from snapshot + log, applies the entry it had met
// and catches up: the entry was not skipped, nor compacted away.
func TestClusterNodeHaltsOnUnknownCommand(t *testing.T) {
	c := storetest.NewCluster(t, 3)
	ld := c.Leader()
	old := (ld + 1) % 3
	other := (ld + 2) % 3
	c.Nodes[old].Store.PlayMaxKnown(store.CmdTrimEvents - 1)
	ctx := ctxT(t)
	leader := c.Nodes[ld].Store
	if _, err := leader.PutSite(ctx, store.Site{Meta: store.Meta{ID: "before"}}, store.W{Actor: "test"}); err != nil {
		t.Fatal(err)
	}
	if err := leader.TrimEvents(ctx, 1, store.W{Actor: "test"}); err != nil {
		t.Fatalf("trim on the leader: %v", err)
	}
	if _, err := leader.PutSite(ctx, store.Site{Meta: store.Meta{ID: "after"}}, store.W{Actor: "test"}); err != nil {
		t.Fatal(err)
	}
	if err := c.Nodes[other].Store.Barrier(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Nodes[other].Store.GetSite("after"); err != nil {
		t.Fatalf("the up-to-date follower lacks the later write: %v", err)
	}
	st := c.Nodes[old].Store
	var h *store.HaltError
	for deadline := time.Now().Add(5 * time.Second); !errors.As(st.Halted(), &h); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("node %s did not halt: Halted() = %v", c.Nodes[old].ID, st.Halted())
		}
	}
	if h.Type != int(store.CmdTrimEvents) || h.Index == 0 {
		t.Fatalf("halt names %+v", h)
	}
	t.Logf("%s: %v", c.Nodes[old].ID, h)
	if _, err := st.GetSite("before"); err != nil {
		t.Fatalf("the entry before the unknown one is missing: %v", err)
	}
	time.Sleep(300 * time.Millisecond) // the later write had every chance to arrive
	if _, err := st.GetSite("after"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("the halted node applied a later entry: %v", err)
	}
	if st.Ready() {
		t.Fatal("a halted node reports Ready")
	}
	if got := st.Stats()["fsm_halted_at_index"]; got == "" {
		t.Fatalf("stats do not report the halt: %v", st.Stats())
	}
	if err := st.Barrier(ctx); !errors.Is(err, store.ErrFSMHalted) {
		t.Fatalf("barrier on the halted node: %v", err)
	}
	if err := st.Snapshot(); !errors.Is(err, store.ErrFSMHalted) {
		t.Fatalf("snapshot on the halted node: %v", err)
	}
	if c.Nodes[other].Store.Halted() != nil || leader.Halted() != nil {
		t.Fatal("a node that knows the type halted")
	}

	// The upgrade: restart on the full binary.
	c.Stop(old)
	c.Restart(old)
	st = c.Nodes[old].Store
	if err := st.Barrier(ctx); err != nil {
		t.Fatalf("barrier after the upgrade: %v", err)
	}
	if st.Halted() != nil {
		t.Fatalf("still halted after the upgrade: %v", st.Halted())
	}
	if _, err := st.GetSite("after"); err != nil {
		t.Fatalf("the upgraded node lacks the later write: %v", err)
	}
}

// TestClusterHaltsOnUnknownCommandNumber: an entry of a command number no
// binary knows (200) fed to the leader's raft log halts every node there;
// the leader's write gets the halt error, later writes fail with it, no
// node is Ready.
func TestClusterHaltsOnUnknownCommandNumber(t *testing.T) {
	c := storetest.NewCluster(t, 3)
	leader := c.Nodes[c.Leader()].Store
	err := leader.ApplyRaw(append([]byte{200}, `{"time":"2026-12-02T00:00:00Z"}`...))
	var h *store.HaltError
	if !errors.As(err, &h) || h.Type != 200 {
		t.Fatalf("leader's result for the unknown entry: %v", err)
	}
	for _, nd := range c.Nodes {
		for deadline := time.Now().Add(5 * time.Second); nd.Store.Halted() == nil; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s did not halt", nd.ID)
			}
		}
		if nd.Store.Ready() {
			t.Fatalf("%s is Ready while halted", nd.ID)
		}
	}
	_, err = leader.PutSite(ctxT(t), store.Site{Meta: store.Meta{ID: "x"}}, store.W{Actor: "test"})
	if !errors.Is(err, store.ErrFSMHalted) {
		t.Fatalf("write after the halt: %v", err)
	}
	t.Logf("write after the halt: %v", err)
}
