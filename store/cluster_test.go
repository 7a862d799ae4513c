package store_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"kiln/store"
	"kiln/store/storetest"
)

func putN(t *testing.T, s *store.Store, prefix string, from, to int) {
	t.Helper()
	ctx := ctxT(t)
	for i := from; i < to; i++ {
		// A create with an explicit ID and ResourceVersion 0 is idempotent,
		// so a write whose outcome is unknown (leadership lost under a
		// loaded CI machine) may be retried.
		var err error
		for try := 0; try < 5; try++ {
			_, err = s.PutMachine(ctx, store.Machine{Meta: store.Meta{ID: fmt.Sprintf("%s-%03d", prefix, i)}}, store.W{Actor: "test"})
			if err == nil {
				break
			}
			t.Logf("put %s-%d (retrying): %v", prefix, i, err)
			time.Sleep(100 * time.Millisecond)
		}
		if err != nil {
			t.Fatalf("put %s-%d: %v", prefix, i, err)
		}
	}
}

func waitMachines(t *testing.T, s *store.Store, n int) {
	t.Helper()
	ctx := ctxT(t)
	if err := s.Barrier(ctx); err != nil {
		t.Fatalf("barrier: %v", err)
	}
	items, _, err := s.ListMachines(store.ListOptions{})
	if err != nil || len(items) != n {
		t.Fatalf("%d machines after barrier (want %d): %v", len(items), n, err)
	}
}

// TestClusterForwardFailoverCatchUp: three nodes; writes accepted on every
// node (followers forward); the leader is stopped (a clean shutdown: its
// store closes; the SIGKILL of a node process is cmd/kiln's
// TestServeClusterLeaderSIGKILL) and a new one is elected with no
// acknowledged write lost; the old leader, restarted after missing writes
// and a snapshot, catches up from snapshot + log.
func TestClusterForwardFailoverCatchUp(t *testing.T) {
	c := storetest.NewCluster(t, 3, func(cfg *store.Config) {
		cfg.SnapshotThreshold = 64
		cfg.TrailingLogs = 8
		cfg.SnapshotInterval = 50 * time.Millisecond
	})
	leader := c.Leader()
	// A write on each node, including followers.
	var acked []string
	for i, nd := range c.Nodes { // one write on each node: leader and both followers
		putN(t, nd.Store, "first", i, i+1)
		acked = append(acked, fmt.Sprintf("first-%03d", i))
	}
	// Follower-side errors come back typed through the forward RPC.
	f := c.Follower()
	if err := c.Nodes[f].Store.Barrier(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	m0, err := c.Nodes[f].Store.GetMachine(acked[0])
	if err != nil {
		t.Fatalf("follower read after barrier: %v", err)
	}
	stale := m0
	stale.ResourceVersion = 1
	if _, err := c.Nodes[f].Store.PutMachine(ctxT(t), stale, store.W{}); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("forwarded CAS conflict: %v", err)
	}
	m0.State = store.StateProvisioned
	var ite *store.IllegalTransitionError
	if _, err := c.Nodes[f].Store.PutMachine(ctxT(t), m0, store.W{}); !errors.As(err, &ite) {
		t.Fatalf("forwarded illegal transition: %v", err)
	}
	// Concurrent writers on all nodes while the leader is stopped.
	var mu sync.Mutex
	var wg sync.WaitGroup
	stopW := make(chan struct{})
	for i := range c.Nodes {
		if i == leader {
			continue
		}
		s := c.Nodes[i].Store
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			for k := 0; ; k++ {
				select {
				case <-stopW:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
				m, err := s.PutMachine(ctx, store.Machine{Meta: store.Meta{ID: fmt.Sprintf("w%d-%04d", i, k)}}, store.W{})
				cancel()
				if err == nil {
					mu.Lock()
					acked = append(acked, m.ID)
					mu.Unlock()
				}
			}
		}(i)
	}
	time.Sleep(300 * time.Millisecond)
	c.Stop(leader)
	newLeader := c.Leader()
	if newLeader == leader {
		t.Fatal("stopped node still leader")
	}
	time.Sleep(300 * time.Millisecond)
	close(stopW)
	wg.Wait()
	// Everything acknowledged is on every surviving node.
	for i, nd := range c.Nodes {
		if nd.Store == nil {
			continue
		}
		if err := nd.Store.Barrier(ctxT(t)); err != nil {
			t.Fatalf("%s barrier: %v", nd.ID, err)
		}
		for _, id := range acked {
			if _, err := nd.Store.GetMachine(id); err != nil {
				t.Fatalf("node %d lost acknowledged write %s: %v", i, id, err)
			}
		}
	}
	t.Logf("%d acknowledged writes survived leader loss", len(acked))
	// More writes while the old leader is down, then a snapshot with short
	// trailing logs so it must be sent a snapshot.
	putN(t, c.Nodes[newLeader].Store, "late", 0, 100)
	if err := c.Nodes[newLeader].Store.Snapshot(); err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	putN(t, c.Nodes[newLeader].Store, "after", 0, 10)
	c.Restart(leader)
	old := c.Nodes[leader].Store
	for i := 0; i < 100; i++ {
		acked = append(acked, fmt.Sprintf("late-%03d", i))
	}
	for i := 0; i < 10; i++ {
		acked = append(acked, fmt.Sprintf("after-%03d", i))
	}
	deadline := time.Now().Add(15 * time.Second)
	for _, id := range acked {
		for {
			if _, err := old.GetMachine(id); err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("restarted node never got %s", id)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	if st := old.Stats(); st["last_snapshot_index"] == "0" {
		t.Fatalf("restarted node did not install a snapshot: %v", st)
	}
	ln := c.Leader()
	if err := c.Nodes[ln].Store.Barrier(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	all, _, _ := c.Nodes[ln].Store.ListMachines(store.ListOptions{})
	waitMachines(t, old, len(all))
	newLeader = ln
	// Event feeds agree across nodes.
	e1, _ := old.Events(0, 100000)
	e2, _ := c.Nodes[newLeader].Store.Events(0, 100000)
	if len(e1) != len(e2) || e1[len(e1)-1] != e2[len(e2)-1] {
		t.Fatalf("event feeds differ: %d vs %d", len(e1), len(e2))
	}
}

// TestClusterMinorityCannotCommit: the partition is made by stopping the
// two other nodes (closing their raft transports and listeners), which
// leaves the old leader as an isolated minority of one. Its write must not
// commit: it fails with ErrTimeout/ErrNotLeader/unknown-outcome, no node
// applies it, and the node steps down (no leader known). When the majority
// comes back a leader is elected and writes commit again.
func TestClusterMinorityCannotCommit(t *testing.T) {
	c := storetest.NewCluster(t, 3)
	leader := c.Leader()
	putN(t, c.Nodes[leader].Store, "pre", 0, 5)
	for i := range c.Nodes {
		if i != leader {
			c.Stop(i)
		}
	}
	iso := c.Nodes[leader].Store
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	_, err := iso.PutMachine(ctx, store.Machine{Meta: store.Meta{ID: "minority"}}, store.W{})
	cancel()
	if err == nil {
		t.Fatal("an isolated minority committed a write")
	}
	t.Logf("minority write refused: %v", err)
	if _, err := iso.GetMachine("minority"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("minority applied its write: %v", err)
	}
	if !waitTrue(5*time.Second, func() bool { return !iso.IsLeader() }) {
		t.Fatal("isolated node kept leadership")
	}
	if iso.Ready() {
		t.Fatal("isolated node reports Ready")
	}
	bctx, bcancel := context.WithTimeout(context.Background(), time.Second)
	if err := iso.Barrier(bctx); !errors.Is(err, store.ErrNotLeader) {
		t.Fatalf("consistent read on an isolated node: %v, want ErrNotLeader", err)
	}
	bcancel()
	// Now a follower with no reachable leader: writes fail with ErrNotLeader.
	wctx, wcancel := context.WithTimeout(context.Background(), time.Second)
	_, err = iso.PutMachine(wctx, store.Machine{Meta: store.Meta{ID: "minority-2"}}, store.W{})
	wcancel()
	var nle *store.NotLeaderError
	if !errors.As(err, &nle) || !errors.Is(err, store.ErrNotLeader) {
		t.Fatalf("write on leaderless follower: %v, want *NotLeaderError", err)
	}
	for i := range c.Nodes {
		if i != leader {
			c.Restart(i)
		}
	}
	l2 := c.Leader()
	putN(t, c.Nodes[l2].Store, "post", 0, 3)
	for _, nd := range c.Nodes {
		n := 8
		if _, err := nd.Store.GetMachine("minority"); err == nil {
			n = 9 // raft may commit the old leader's entry after healing; it was never acknowledged
		}
		waitMachines(t, nd.Store, n)
	}
}

// TestClusterJoinRemoveViaFollower: membership changes sent to a follower
// are forwarded to the leader.
func TestClusterJoinRemoveViaFollower(t *testing.T) {
	c := storetest.NewCluster(t, 2)
	f := c.Follower()
	cfg := storetest.Config("n9", t.TempDir())
	s, err := store.Open(cfg, storetest.Logger(), nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx, nil) }()
	defer func() { cancel(); <-done; s.Close() }()
	if err := c.Nodes[f].Store.Join(ctxT(t), "n9", s.RaftAddr(), s.ForwardAddr()); err != nil {
		t.Fatal(err)
	}
	if err := s.WaitLeader(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.PutSite(ctxT(t), store.Site{Name: "via-n9"}, store.W{}); err != nil {
		t.Fatalf("write on joined node: %v", err)
	}
	if err := c.Nodes[f].Store.Remove(ctxT(t), "n9"); err != nil {
		t.Fatal(err)
	}
	l := c.Leader()
	if !waitTrue(5*time.Second, func() bool {
		st := c.Nodes[l].Store.Stats()
		return st["num_peers"] == "1"
	}) {
		t.Fatalf("n9 still a peer: %v", c.Nodes[l].Store.Stats()["latest_configuration"])
	}
}

// TestRestartedFollowerReadyAfterBarriers: a follower restarted while the
// log ends in entries the FSM never sees (raft barriers from consistent
// reads, a new leader's no-op) becomes Ready without waiting for a write.
// (Ready compared the FSM's applied index with raft's commit index, which
// counts those entries: found by cmd/kiln's TestServeClusterLeaderSIGKILL,
// where the restarted node stayed not ready.)
func TestRestartedFollowerReadyAfterBarriers(t *testing.T) {
	c := storetest.NewCluster(t, 3)
	leader := c.Leader()
	putN(t, c.Nodes[leader].Store, "rb", 0, 5)
	f := c.Follower()
	waitMachines(t, c.Nodes[f].Store, 5)
	c.Stop(f)
	for i := 0; i < 3; i++ { // consistent reads on the leader: barrier entries after the last command
		if err := c.Nodes[leader].Store.Barrier(ctxT(t)); err != nil {
			t.Fatal(err)
		}
	}
	c.Restart(f)
	s := c.Nodes[f].Store
	if !waitTrue(10*time.Second, s.Ready) {
		st := s.Stats()
		t.Fatalf("restarted follower not Ready in 10 s: commit_index %s applied_index %s fsm_applied_index %s",
			st["commit_index"], st["applied_index"], st["fsm_applied_index"])
	}
	if _, err := s.GetMachine("rb-004"); err != nil {
		t.Fatalf("ready follower lacks a committed write: %v", err)
	}
}
