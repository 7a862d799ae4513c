package main

import (
	"context"
	"strings"
	"testing"

	"kiln/store"
)

// `kiln baseline set|list` and `kiln firmware show` against the real domain:
// the baseline's flags (NAME=VERSION@URL, ATTR=VALUE) reach the store, and a
// machine's firmware record, drift and apply steps print.
func TestCLIBaselineAndFirmware(t *testing.T) {
	e := newCLIEnv(t)
	out := e.admin("baseline", "set", "--vendor", "Acme", "--model", "R1",
		"--firmware", "BIOS=2.1.0@http://10.0.0.1:8080/images/bios-2.1.0.fw", "--firmware", "BMC=7.0",
		"--bios", "ProcVirtualization=Disabled")
	id := store.BaselineID("acme", "r1")
	if !strings.Contains(out, id) || !strings.Contains(out, "BIOS=2.1.0,BMC=7.0") {
		t.Fatalf("set:\n%s", out)
	}
	b, err := e.st.GetBaseline(id)
	if err != nil || len(b.Firmware) != 2 || b.Firmware[0].ImageURI != "http://10.0.0.1:8080/images/bios-2.1.0.fw" || b.Firmware[1].ImageURI != "" ||
		b.BIOS["ProcVirtualization"] != "Disabled" {
		t.Fatalf("stored %+v, %v", b, err)
	}
	if _, _, err := e.run("--token", tViewer, "baseline", "set", "--vendor", "A", "--model", "B"); err == nil {
		t.Fatal("viewer may set a baseline")
	}
	if _, _, err := e.run("--token", tAdmin, "baseline", "set", "--vendor", "A", "--model", "B", "--firmware", "BIOS"); err == nil {
		t.Fatal("--firmware without a version accepted")
	}
	if out := e.admin("baseline", "list"); !strings.Contains(out, "Acme") || !strings.Contains(out, "ProcVirtualization=Disabled") {
		t.Fatalf("list:\n%s", out)
	}
	m := e.machine("fw-1", 1, store.StateAvailable)
	m.Firmware = &store.FirmwareRecord{Baseline: id, Components: []store.FirmwareVersion{{Name: "BIOS", Version: "1.0.0"}},
		BIOS:  map[string]string{"ProcVirtualization": "Enabled"},
		Drift: []store.FieldDiff{{Field: "firmware.BIOS", Intended: "2.1.0", Discovered: "1.0.0"}},
		Apply: &store.FirmwareApply{Baseline: id, State: "failed", Steps: []store.FirmwareStep{{Kind: "firmware", Target: "BIOS", From: "1.0.0",
			To: "2.1.0", State: "failed", Reason: "task_failed", Message: "Transfer of the image failed"}}}}
	if _, err := e.st.PutMachine(context.Background(), m, store.W{Actor: "test"}); err != nil {
		t.Fatal(err)
	}
	out = e.admin("firmware", "show", m.ID)
	for _, want := range []string{"BASELINE:", id, "firmware.BIOS", "2.1.0", "1.0.0", "ProcVirtualization", "APPLY:", "failed", "task_failed"} {
		if !strings.Contains(out, want) {
			t.Fatalf("firmware show lacks %q:\n%s", want, out)
		}
	}
	if _, stderr, err := e.run("--token", tAdmin, "firmware", "read", m.ID); err == nil || !strings.Contains(err.Error()+stderr, "BMC") {
		t.Fatalf("read without a BMC: %v %s", err, stderr)
	}
}
