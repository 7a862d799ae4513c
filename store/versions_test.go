package store_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"kiln/store"
	"kiln/store/storetest"
)

// waitVersion waits until every running node's replica holds id's version
// record with max as its newest command type.
func waitVersion(t *testing.T, c *storetest.Cluster, id string, max store.CommandType) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		done := true
		for _, nd := range c.Nodes {
			vs, err := nd.Store.NodeVersions()
			if err != nil {
				t.Fatal(err)
			}
			if vs[id].MaxCommand != max {
				done = false
			}
		}
		if done {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("version record of %s never reached max_command %d on every node", id, max)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestMixedVersionsGate: every node registers its version; a node that
// claims a lower newest command type (an older binary) makes the cluster
// refuse a command above it, on the leader and forwarded from a follower,
// with an error naming that node; once it "upgrades" (re-registers with
// this binary's MaxCommand) the same write is accepted.
func TestMixedVersionsGate(t *testing.T) {
	c := storetest.NewCluster(t, 3, func(cfg *store.Config) { cfg.Version = "v1.2.3-" + cfg.NodeID })
	for _, nd := range c.Nodes {
		waitVersion(t, c, nd.ID, store.MaxCommand)
	}
	li := c.Leader()
	ms, err := c.Nodes[li].Store.Members()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range ms {
		if m.Version.Version != "v1.2.3-"+m.ID || m.Version.MaxCommand != store.MaxCommand {
			t.Fatalf("member %s version record %+v, want v1.2.3-%s / %d", m.ID, m.Version, m.ID, store.MaxCommand)
		}
	}
	ctx := ctxT(t)
	if _, _, err := c.Nodes[li].Store.CreateJoinToken(ctx, 0, store.W{Actor: "test"}); err != nil {
		t.Fatalf("join token (command %d) with every node current: %v", store.CmdPutJoinToken, err)
	}

	// A follower plays a binary that knows commands only up to 18.
	old := (li + 1) % 3
	oldID := c.Nodes[old].ID
	c.Nodes[old].Store.ClaimMaxCommand(store.CmdPutJoinToken - 1)
	waitVersion(t, c, oldID, store.CmdPutJoinToken-1)
	for _, via := range []int{li, (li + 2) % 3} { // the leader, and the other follower (forwarded)
		_, _, err := c.Nodes[via].Store.CreateJoinToken(ctx, 0, store.W{Actor: "test"})
		if !errors.Is(err, store.ErrUnsupportedByCluster) {
			t.Fatalf("via %s: join token with %s at max 18: err %v, want ErrUnsupportedByCluster", c.Nodes[via].ID, oldID, err)
		}
		if !strings.Contains(err.Error(), oldID) || !strings.Contains(err.Error(), "upgrade") {
			t.Fatalf("via %s: error does not name %s or say what to do: %v", c.Nodes[via].ID, oldID, err)
		}
		t.Logf("via %s: %v", c.Nodes[via].ID, err)
	}
	// Commands it knows are still written.
	putN(t, c.Nodes[li].Store, "mixed", 0, 3)

	// The node is upgraded: it re-registers with this binary's types.
	c.Nodes[old].Store.ClaimMaxCommand(0)
	waitVersion(t, c, oldID, store.MaxCommand)
	if _, _, err := c.Nodes[(li+2)%3].Store.CreateJoinToken(ctx, 0, store.W{Actor: "test"}); err != nil {
		t.Fatalf("join token after %s upgraded: %v", oldID, err)
	}
}
