package store

import "testing"

// put_machines_v4 (30) and agent_report_v2 (31) write the round-3 fields;
// the older machine commands keep what the stored record holds, exactly as
// a node that predates command 30 does.
func TestPutMachinesV4KeepsRound3Fields(t *testing.T) {
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
	base := Machine{Meta: Meta{ID: "m-1"}, Intended: nic("aa:bb:cc:00:00:01")}
	m, err := put(CmdPutMachinesV4, Machine{Meta: base.Meta, Intended: base.Intended,
		Build: &BuildRecord{}, Attestation: &AttestationRecord{}, BurnIn: &BurnInRecord{}, Firmware: &FirmwareRecord{}})
	if err != nil || m.Build == nil || m.Attestation == nil || m.BurnIn == nil || m.Firmware == nil {
		t.Fatalf("v4 create: %v %+v", err, m)
	}
	// Commands 3, 14 and 25 neither clear nor set them.
	for _, typ := range []CommandType{CmdPutMachines, CmdPutMachinesV2, CmdPutMachinesV3} {
		m, err = put(typ, Machine{Meta: base.Meta, Intended: base.Intended, Name: "n-" + typ.String()})
		if err != nil || m.Name != "n-"+typ.String() || m.Build == nil || m.Attestation == nil || m.BurnIn == nil || m.Firmware == nil {
			t.Fatalf("%s update of a v4 record: %v %+v", typ, err, m)
		}
	}
	// Command 17 keeps them too; command 31 writes them as given.
	ix++
	if _, err := run(t, db, ix, &command{Type: CmdAgentReport, W: w, Machines: []Machine{{Meta: Meta{ID: "m-1", ResourceVersion: m.ResourceVersion}, Intended: base.Intended}}}); err != nil {
		t.Fatal(err)
	}
	if m, _ = machineAt(t, db, "m-1"); m.Build == nil || m.Firmware == nil {
		t.Fatalf("agent_report cleared a round-3 field: %+v", m)
	}
	ix++
	if _, err := run(t, db, ix, &command{Type: CmdAgentReportV2, W: w, Machines: []Machine{{Meta: Meta{ID: "m-1", ResourceVersion: m.ResourceVersion}, Intended: base.Intended, Build: &BuildRecord{}}}}); err != nil {
		t.Fatal(err)
	}
	if m, _ = machineAt(t, db, "m-1"); m.Build == nil || m.Attestation != nil || m.BurnIn != nil || m.Firmware != nil {
		t.Fatalf("agent_report_v2 did not write the round-3 fields as given: %+v", m)
	}
	// v4 clears what it does not carry.
	if m, err = put(CmdPutMachinesV4, Machine{Meta: base.Meta, Intended: base.Intended}); err != nil || m.Build != nil {
		t.Fatalf("v4 clear: %v %+v", err, m)
	}
	checkIndex(t, db)
}
