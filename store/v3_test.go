package store

import (
	"errors"
	"testing"
)

// put_machines_v3 (25) applies the issue-14 table; the older machine
// commands keep the old table and the stored issue-14 fields, exactly as a
// node that predates command 25 does.
func TestPutMachinesV3Table(t *testing.T) {
	db := testDB(t)
	w := W{Actor: "test", Reason: "r"}
	ix := uint64(0)
	put := func(typ CommandType, m Machine) (Machine, error) {
		t.Helper()
		ix++
		_, err := run(t, db, ix, &command{Type: typ, W: w, Machines: []Machine{m}})
		got, _ := machineAt(t, db, m.ID)
		return got, err
	}
	if _, err := put(CmdPutMachinesV2, Machine{Meta: Meta{ID: "m-1"}, Intended: nic("aa:bb:cc:00:00:01")}); err != nil {
		t.Fatal(err)
	}
	// registered → inspecting → available → provisioning → provisioned (old table, old command).
	for _, s := range []MachineState{StateInspecting, StateAvailable, StateProvisioning, StateProvisioned} {
		if _, err := put(CmdPutMachinesV2, Machine{Meta: Meta{ID: "m-1"}, Intended: nic("aa:bb:cc:00:00:01"), State: s}); err != nil {
			t.Fatalf("→ %s: %v", s, err)
		}
	}
	// The old commands do not know remediating: refused as an unknown state.
	for _, typ := range []CommandType{CmdPutMachines, CmdPutMachinesV2} {
		if _, err := put(typ, Machine{Meta: Meta{ID: "m-1"}, Intended: nic("aa:bb:cc:00:00:01"), State: StateRemediating}); !errors.Is(err, ErrInvalid) {
			t.Fatalf("%s provisioned → remediating: err %v, want ErrInvalid (old table)", typ, err)
		}
	}
	// Command 25 applies the extended table and keeps the new fields.
	m, err := put(CmdPutMachinesV3, Machine{Meta: Meta{ID: "m-1"}, Intended: nic("aa:bb:cc:00:00:01"), State: StateRemediating,
		Remediation: &Remediation{Step: "power_cycle", Attempt: 1, Why: "bmc_system Critical"},
		Maintenance: &Maintenance{Reason: "fan swap"}})
	if err != nil || m.State != StateRemediating || m.Remediation == nil || m.Maintenance == nil {
		t.Fatalf("v3 provisioned → remediating: %v, %+v", err, m)
	}
	evs := allEvents(t, db)
	last := evs[len(evs)-1]
	if last.Kind != "transition" || last.From != "provisioned" || last.To != "remediating" || last.Actor != "test" || last.Reason != "r" {
		t.Fatalf("transition event %+v", last)
	}
	// An old command neither clears nor sets them: the stored values stay.
	m, err = put(CmdPutMachinesV2, Machine{Meta: Meta{ID: "m-1"}, Intended: nic("aa:bb:cc:00:00:01"), Name: "renamed",
		Health: []HealthCondition{{Type: "x", Status: HealthCritical}}})
	if err != nil || m.Name != "renamed" || m.Remediation == nil || m.Maintenance == nil || len(m.Health) != 0 || m.State != StateRemediating {
		t.Fatalf("v2 update of a v3 record: %v, %+v", err, m)
	}
	// Illegal under v3 too.
	if _, err := put(CmdPutMachinesV3, Machine{Meta: Meta{ID: "m-1"}, Intended: nic("aa:bb:cc:00:00:01"), State: StateAvailable}); err == nil {
		t.Fatal("remediating → available accepted")
	}
	// v3 clears what it does not carry.
	m, err = put(CmdPutMachinesV3, Machine{Meta: Meta{ID: "m-1"}, Intended: nic("aa:bb:cc:00:00:01"), State: StateRMA})
	if err != nil || m.State != StateRMA || m.Maintenance != nil || m.Remediation != nil {
		t.Fatalf("v3 → rma: %v %+v", err, m)
	}
	// A stored state the old table does not know still takes an old write that keeps it.
	if m, err = put(CmdPutMachinesV2, Machine{Meta: Meta{ID: "m-1"}, Intended: nic("aa:bb:cc:00:00:01"), Name: "again"}); err != nil || m.State != StateRMA {
		t.Fatalf("v2 write keeping rma: %v %+v", err, m)
	}
	if CanTransitionV2(StateProvisioned, StateRemediating) || !CanTransition(StateProvisioned, StateRemediating) {
		t.Fatal("tables")
	}
	checkIndex(t, db)
}

// put_remediation (26): compare-and-set of the one brake record, with an
// event when it engages or releases.
func TestPutRemediationBrake(t *testing.T) {
	db := testDB(t)
	w := W{Actor: "controller", Reason: "brake_rack"}
	vals, err := run(t, db, 1, &command{Type: CmdPutRemediation, W: w, Brake: &RepairBrake{Engaged: true, Scope: "rack", Key: "r1"}})
	if err != nil || len(vals) != 1 {
		t.Fatal(err, len(vals))
	}
	if _, err := run(t, db, 2, &command{Type: CmdPutRemediation, W: w, Brake: &RepairBrake{Meta: Meta{ResourceVersion: 7}}}); !errors.Is(err, ErrConflict) {
		t.Fatalf("stale resource_version: %v", err)
	}
	if _, err := run(t, db, 3, &command{Type: CmdPutRemediation, W: W{Actor: "api:alice", Reason: "resumed"},
		Brake: &RepairBrake{Meta: Meta{ResourceVersion: 1}, Engaged: false}}); err != nil {
		t.Fatal(err)
	}
	var kinds []string
	for _, ev := range allEvents(t, db) {
		if ev.Subject == "remediation/brake" {
			kinds = append(kinds, ev.Kind+":"+ev.Actor)
		}
	}
	if len(kinds) != 2 || kinds[0] != "brake_engaged:controller" || kinds[1] != "brake_released:api:alice" {
		t.Fatalf("brake events %v", kinds)
	}
}
