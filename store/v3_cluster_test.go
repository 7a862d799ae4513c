package store_test

import (
	"errors"
	"testing"

	"kiln/store"
	"kiln/store/storetest"
)

// A rolling upgrade never diverges: while one node understands commands
// only up to 24, a write that needs put_machines_v3 (a maintenance flag,
// state remediating) is refused with ErrUnsupportedByCluster, on the
// leader and forwarded, and the brake (26) too; plain machine writes go on
// as put_machines_v2. Once the node is upgraded the same writes succeed,
// and a plain write is then written as v3, so it clears the fields it
// leaves out.
func TestPutMachinesV3Gate(t *testing.T) {
	c := storetest.NewCluster(t, 3, func(*store.Config) {})
	for _, nd := range c.Nodes {
		waitVersion(t, c, nd.ID, store.MaxCommand)
	}
	li := c.Leader()
	ctx := ctxT(t)
	m, err := c.Nodes[li].Store.PutMachine(ctx, store.Machine{Meta: store.Meta{ID: "m-v3"}}, store.W{Actor: "test"})
	if err != nil {
		t.Fatal(err)
	}
	old := (li + 1) % 3
	c.Nodes[old].Store.ClaimMaxCommand(store.CmdTrimEvents)
	waitVersion(t, c, c.Nodes[old].ID, store.CmdTrimEvents)
	for _, via := range []int{li, (li + 2) % 3} {
		mm := m
		mm.Maintenance = &store.Maintenance{Reason: "fan"}
		if _, err := c.Nodes[via].Store.PutMachine(ctx, mm, store.W{Actor: "test"}); !errors.Is(err, store.ErrUnsupportedByCluster) {
			t.Fatalf("via %s: maintenance with an old node: %v, want ErrUnsupportedByCluster", c.Nodes[via].ID, err)
		}
		if _, err := c.Nodes[via].Store.PutRepairBrake(ctx, store.RepairBrake{Engaged: true}, store.W{Actor: "test"}); !errors.Is(err, store.ErrUnsupportedByCluster) {
			t.Fatalf("via %s: brake with an old node: %v", c.Nodes[via].ID, err)
		}
	}
	m.Name = "plain"
	if m, err = c.Nodes[li].Store.PutMachine(ctx, m, store.W{Actor: "test"}); err != nil {
		t.Fatalf("plain write with an old node: %v", err)
	}
	c.Nodes[old].Store.ClaimMaxCommand(0)
	waitVersion(t, c, c.Nodes[old].ID, store.MaxCommand)
	m.Maintenance = &store.Maintenance{Reason: "fan"}
	if m, err = c.Nodes[(li+2)%3].Store.PutMachine(ctx, m, store.W{Actor: "test"}); err != nil || m.Maintenance == nil {
		t.Fatalf("maintenance after the upgrade: %v %+v", err, m)
	}
	m.Maintenance = nil
	if m, err = c.Nodes[li].Store.PutMachine(ctx, m, store.W{Actor: "test"}); err != nil || m.Maintenance != nil {
		t.Fatalf("clearing maintenance (a v2 write upgraded to v3): %v %+v", err, m)
	}
	if _, err := c.Nodes[li].Store.PutRepairBrake(ctx, store.RepairBrake{Engaged: true}, store.W{Actor: "test"}); err != nil {
		t.Fatal(err)
	}
	b, err := c.Nodes[li].Store.GetRepairBrake()
	if err != nil || !b.Engaged || b.ID != store.BrakeID {
		t.Fatalf("brake %+v %v", b, err)
	}
}
