package store_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"kiln/store"
	"kiln/store/storetest"
)

// TestLocalReopenContinues: a local store reopened on its directory has
// every record, the MAC index and the event log, and goes on from the
// stored index: new writes get higher ResourceVersions and event indexes, a
// compare-and-set with a version from before the reopen still works, a
// stale one still conflicts.
func TestLocalReopenContinues(t *testing.T) {
	dir := t.TempDir()
	ctx := ctxT(t)
	w := store.W{Actor: "test"}
	s := storetest.OpenLocal(t, dir)
	m, err := s.PutMachine(ctx, store.Machine{Name: "a", Intended: store.Hardware{NICs: []store.NIC{{MAC: "02:00:00:00:00:0A"}}}}, w)
	if err != nil {
		t.Fatal(err)
	}
	stale := m
	m.Name = "a2"
	if m, err = s.PutMachine(ctx, m, w); err != nil {
		t.Fatal(err)
	}
	// A refused write uses up its index, as a refused raft entry does.
	if _, err := s.PutMachine(ctx, stale, w); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("stale CAS: %v, want ErrConflict", err)
	}
	applied := s.Stats()["applied_index"]
	lastEv := s.LastEventIndex()
	evs, err := s.Events(0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.PutSite(ctx, store.Site{Name: "x"}, w); !errors.Is(err, store.ErrClosed) {
		t.Fatalf("write after Close: %v, want ErrClosed", err)
	}

	s = storetest.OpenLocal(t, dir)
	if !s.HasState() {
		t.Error("HasState false after reopen")
	}
	if got := s.Stats()["applied_index"]; got != applied {
		t.Fatalf("applied index %s after reopen, was %s", got, applied)
	}
	if got := s.LastEventIndex(); got != lastEv {
		t.Fatalf("LastEventIndex %d after reopen, was %d", got, lastEv)
	}
	if got, err := s.MachineByMAC("02:00:00:00:00:0a"); err != nil || got.ID != m.ID || got.ResourceVersion != m.ResourceVersion || got.Name != "a2" {
		t.Fatalf("MachineByMAC after reopen: %+v, %v (want %s at %d)", got.Meta, err, m.ID, m.ResourceVersion)
	}
	if again, err := s.Events(0, 0); err != nil || len(again) != len(evs) {
		t.Fatalf("events after reopen: %d, %v (was %d)", len(again), err, len(evs))
	}
	if _, err := s.PutMachine(ctx, stale, w); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("stale CAS after reopen: %v, want ErrConflict", err)
	}
	m.State = store.StateInspecting
	m2, err := s.PutMachine(ctx, m, w)
	if err != nil {
		t.Fatalf("CAS with the version from before the reopen: %v", err)
	}
	want, _ := strconv.ParseUint(applied, 10, 64)
	if want += 2; m2.ResourceVersion != want { // +1: the stale CAS just refused
		t.Fatalf("ResourceVersion %d after reopen, want %d (applied %s + refused + this)", m2.ResourceVersion, want, applied)
	}
	next, err := s.Events(lastEv, 0)
	if err != nil || len(next) != 1 || next[0].Kind != "transition" || next[0].Index != m2.ResourceVersion {
		t.Fatalf("events after the cursor of before the reopen: %+v, %v", next, err)
	}
	// A MAC held before the reopen is still refused to another machine.
	if _, err := s.PutMachine(ctx, store.Machine{Intended: store.Hardware{NICs: []store.NIC{{MAC: "02:00:00:00:00:0a"}}}}, w); !errors.Is(err, store.ErrDuplicateMAC) {
		t.Fatalf("MAC of a machine from before the reopen: %v, want ErrDuplicateMAC", err)
	}
}

// TestLocalResourceVersionsLikeRaft: the same sequence of writes, with
// refusals, on a raft node and on a local store gives the same results and
// the same steps between ResourceVersions and event indexes (one index per
// write, refused or not; a write's events carry its index).
func TestLocalResourceVersionsLikeRaft(t *testing.T) {
	seq := func(t *testing.T, s *store.Store) (steps []uint64, errs []string) {
		ctx := ctxT(t)
		w := store.W{Actor: "test"}
		base := s.LastEventIndex()
		var last uint64
		note := func(rv uint64, err error) {
			if err != nil {
				errs = append(errs, fmt.Sprintf("write %d: conflict=%v", len(steps)+len(errs), errors.Is(err, store.ErrConflict)))
				return
			}
			steps = append(steps, rv-last)
			last = rv
		}
		last = base
		m, err := s.PutMachine(ctx, store.Machine{Meta: store.Meta{ID: "m-1"}}, w)
		note(m.ResourceVersion, err)
		stale := m
		m.State = store.StateInspecting
		m, err = s.PutMachine(ctx, m, w)
		note(m.ResourceVersion, err)
		_, err = s.PutMachine(ctx, stale, w)
		note(0, err)
		ms, err := s.PutMachines(ctx, []store.Machine{{Meta: store.Meta{ID: "m-2"}}, {Meta: store.Meta{ID: "m-3"}}}, w)
		if err == nil && ms[0].ResourceVersion != ms[1].ResourceVersion {
			t.Errorf("one command, two versions: %d, %d", ms[0].ResourceVersion, ms[1].ResourceVersion)
		}
		note(ms[1].ResourceVersion, err)
		if err := s.AppendEvents(ctx, []store.Event{{Subject: "machine/m-1", Kind: "step"}}); err != nil {
			t.Fatal(err)
		}
		evs, _ := s.Events(base, 0)
		for _, ev := range evs {
			steps = append(steps, ev.Index-base)
		}
		return steps, errs
	}
	var got [2][]uint64
	var gotErrs [2][]string
	i := 0
	eachStore(t, func(t *testing.T, s *store.Store, _ *prometheus.Registry) {
		got[i], gotErrs[i] = seq(t, s)
		i++
	})
	if len(got[0]) == 0 || !slicesEqual(got[0], got[1]) || !slicesEqual(gotErrs[0], gotErrs[1]) {
		t.Fatalf("raft: %v %v\nlocal: %v %v", got[0], gotErrs[0], got[1], gotErrs[1])
	}
	t.Logf("steps %v, refusals %v", got[0], gotErrs[0])
}

func slicesEqual[T comparable](a, b []T) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestLocalHasNoRaft: a local store leads and is ready from the start, its
// Barrier is a no-op, Run waits for its context, and the raft-only
// operations say why they cannot work.
func TestLocalHasNoRaft(t *testing.T) {
	s := storetest.NewLocal(t)
	ctx := ctxT(t)
	if !s.IsLeader() || !s.Ready() {
		t.Fatalf("IsLeader %v Ready %v, want both", s.IsLeader(), s.Ready())
	}
	if id, addr := s.Leader(); id != store.LocalNodeID || id != s.NodeID() || addr != "" {
		t.Fatalf("Leader() = %q, %q", id, addr)
	}
	if err := s.WaitLeader(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Barrier(ctx); err != nil {
		t.Fatal(err)
	}
	for name, err := range map[string]error{
		"Join":     s.Join(ctx, "n2", "127.0.0.1:1", ""),
		"Remove":   s.Remove(ctx, "n2"),
		"JoinVia":  s.JoinVia(ctx, []string{"127.0.0.1:1"}),
		"Snapshot": s.Snapshot(),
	} {
		if !errors.Is(err, store.ErrNoRaft) {
			t.Errorf("%s: %v, want ErrNoRaft", name, err)
		}
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- s.Run(rctx, nil) }()
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
	if s.RaftAddr() != "" || s.ForwardAddr() != "" {
		t.Fatalf("addresses %q %q, want none", s.RaftAddr(), s.ForwardAddr())
	}
}

// TestLocalAndRaftDirsApart: OpenLocal refuses a raft store's directory
// and Open refuses a local store's (its fsm.db has entries no raft log
// accounts for), each with ErrInconsistentDataDir and nothing changed.
func TestLocalAndRaftDirsApart(t *testing.T) {
	raftDir := t.TempDir()
	_, stop := openSingle(t, raftDir, nil)
	stop()
	before := dirSnapshot(t, raftDir)
	if _, err := store.OpenLocal(raftDir, nil); !errors.Is(err, store.ErrInconsistentDataDir) {
		t.Fatalf("OpenLocal on a raft dir: %v, want ErrInconsistentDataDir", err)
	} else {
		mustContain(t, err.Error(), filepath.Join(raftDir, store.RaftDBFile), "store.Open")
	}
	sameDir(t, before, dirSnapshot(t, raftDir))

	localDir := t.TempDir()
	s := storetest.OpenLocal(t, localDir)
	if _, err := s.PutSite(ctxT(t), store.Site{Name: "s"}, store.W{Actor: "test"}); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	before = dirSnapshot(t, localDir)
	if err := openRefused(t, localDir); !errors.Is(err, store.ErrInconsistentDataDir) {
		t.Fatalf("Open on a local dir: %v, want ErrInconsistentDataDir", err)
	}
	sameDir(t, before, dirSnapshot(t, localDir))
	if _, err := os.Stat(filepath.Join(localDir, store.RaftDBFile)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Open left %s: %v", store.RaftDBFile, err)
	}
}
