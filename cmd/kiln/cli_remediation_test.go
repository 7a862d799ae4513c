package main

import (
	"context"
	"strings"
	"testing"

	"kiln/store"
)

// `kiln machines maintenance|health|rma|retire` and `kiln remediation
// status|resume` against the real domain.
func TestCLIRemediation(t *testing.T) {
	e := newCLIEnv(t)
	m := e.machine("web-1", 1, store.StateAvailable)
	e.admin("machines", "maintenance", m.ID, "on", "--reason", "fan swap")
	if got, _ := e.st.GetMachine(m.ID); got.Maintenance == nil || got.Maintenance.Reason != "fan swap" {
		t.Fatalf("maintenance %+v", got.Maintenance)
	}
	out := e.admin("remediation", "status")
	for _, want := range []string{"MODE:", "auto", "BRAKE:", "released", "default", m.ID, "yes: fan swap"} {
		if !strings.Contains(out, want) {
			t.Fatalf("status lacks %q:\n%s", want, out)
		}
	}
	e.admin("machines", "maintenance", m.ID, "off")
	if _, stderr, err := e.run("--token", tAdmin, "machines", "health", m.ID, "--status", "Critical"); err == nil ||
		!strings.Contains(err.Error()+stderr, "wrong_state") && !strings.Contains(err.Error()+stderr, "claim") {
		t.Fatalf("health of an unclaimed machine: %v %s", err, stderr)
	}
	if _, _, err := e.run("--token", tViewer, "machines", "rma", m.ID); err == nil {
		t.Fatal("viewer may rma")
	}
	out = e.admin("machines", "rma", m.ID, "--skip-erase", "--reason", "PSU")
	if !strings.Contains(out, "rma") {
		t.Fatalf("rma: %s", out)
	}
	e.admin("machines", "retire", m.ID, "--reason", "end of life")
	if got, _ := e.st.GetMachine(m.ID); got.State != store.StateErasing || got.Reason != "erase_for_retire" {
		t.Fatalf("retire: %s %s", got.State, got.Reason)
	}
	// An engaged brake shows, and resume releases it.
	if _, err := e.st.PutRepairBrake(context.Background(), store.RepairBrake{Engaged: true, Scope: "rack", Key: "r1",
		Message: "3 of 4 machines of rack r1 failed"}, store.W{Actor: "remediation"}); err != nil {
		t.Fatal(err)
	}
	if out := e.admin("remediation", "status"); !strings.Contains(out, "ENGAGED (rack r1)") {
		t.Fatalf("engaged status:\n%s", out)
	}
	if out := e.admin("remediation", "resume", "--reason", "racks fixed"); !strings.Contains(out, "released") {
		t.Fatalf("resume:\n%s", out)
	}
	if b, _ := e.st.GetRepairBrake(); b.Engaged || b.ResumedBy != "token:admin" {
		t.Fatalf("after resume %+v", b)
	}
}
