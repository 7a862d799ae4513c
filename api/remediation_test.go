package api_test

import (
	"context"
	"testing"

	. "kiln/api"
	"kiln/store"
)

// The day-2 routes over the real domain: an owner's health report, the
// maintenance flag, rma of a claimed machine (its claim waits for a
// spare), retire (admin only), power without a BMC, the status and resume;
// every write audited with the caller.
func TestRemediationRoutes(t *testing.T) {
	h := newHarness(t)
	img := h.image([]byte("day-2 image"))
	m := h.machine("web-1", "52:54:00:aa:14:01", store.StateProvisioned, map[string]string{"pool": "web"})
	m.Claim = &store.Claim{Image: img.ID, Role: "web"}
	m, err := h.st.PutMachine(context.Background(), m, store.W{Actor: "test"})
	if err != nil {
		t.Fatal(err)
	}
	base := "/v1/machines/" + m.ID

	var got Machine
	r := h.do("POST", base+"/health", operatorTok, HealthReport{Type: "Ready", Status: "Critical", Reason: "NodeNotReady", Message: "kubelet down"})
	h.want(r, 200, "")
	r.into(t, &got)
	if len(got.Health) != 1 || got.Health[0].Type != "owner/Ready" || got.Health[0].Source != store.HealthSourceOwner || got.Health[0].Status != "Critical" {
		t.Fatalf("health %+v", got.Health)
	}
	h.want(h.do("POST", base+"/health", operatorTok, HealthReport{Type: "Ready", Status: "Sick"}), 400, CodeInvalid)
	h.want(h.do("POST", base+"/health", viewerTok, HealthReport{Type: "Ready", Status: "OK"}), 403, CodeForbidden)

	r = h.do("POST", base+"/maintenance", operatorTok, map[string]any{"maintenance": true, "reason": "fan swap"})
	h.want(r, 200, "")
	got = Machine{}
	r.into(t, &got)
	if got.Maintenance == nil || got.Maintenance.Reason != "fan swap" || got.Maintenance.Actor != "token:ops" {
		t.Fatalf("maintenance %+v", got.Maintenance)
	}
	h.want(h.do("POST", base+"/maintenance", operatorTok, map[string]any{}), 400, CodeInvalid)
	var st RemediationStatus
	r = h.do("GET", "/v1/remediation", viewerTok, nil)
	h.want(r, 200, "")
	r.into(t, &st)
	if st.Mode != "auto" || st.Brake.Engaged || len(st.Machines) != 1 || st.Machines[0].Maintenance == nil {
		t.Fatalf("status %+v", st)
	}
	h.want(h.do("POST", base+"/maintenance", operatorTok, map[string]any{"maintenance": false}), 200, "")

	h.want(h.do("POST", base+"/power", operatorTok, PowerRequest{Action: "sideways"}), 400, CodeInvalid)
	h.want(h.do("POST", base+"/power", operatorTok, PowerRequest{Action: "cycle"}), 400, CodeInvalid) // no BMC enrolled

	h.want(h.do("POST", base+"/retire", operatorTok, nil), 403, CodeForbidden)
	r = h.do("POST", base+"/rma", operatorTok, RMARequest{SkipErase: true, Reason: "PSU smoke"})
	h.want(r, 202, "")
	got = Machine{}
	r.into(t, &got)
	if got.State != store.StateRMA || got.Claim != nil || got.Remediation == nil || got.Remediation.Claim == nil ||
		got.Remediation.Report == nil || got.Remediation.Report.Erase == "" {
		t.Fatalf("rma %+v claim %+v %+v report %+v", got.State, got.Claim, got.Remediation, got.Remediation.Report)
	}
	h.want(h.do("POST", base+"/reprovision", operatorTok, nil), 409, "wrong_state")
	h.want(h.do("POST", base+"/drain/ack", operatorTok, nil), 409, "wrong_state")
	r = h.do("POST", base+"/retire", adminTok, ActionRequest{Message: "end of life"})
	h.want(r, 202, "")
	got = Machine{}
	r.into(t, &got)
	if got.State != store.StateErasing {
		t.Fatalf("retire from rma: %s", got.State)
	}
	var b Brake
	r = h.do("POST", "/v1/remediation/resume", operatorTok, nil)
	h.want(r, 200, "")
	r.into(t, &b)
	if b.Engaged {
		t.Fatal("brake engaged")
	}
	audited := map[string]string{}
	for _, ev := range h.events("machine/" + m.ID) {
		audited[ev.Reason] = ev.Actor
	}
	for reason, actor := range map[string]string{"health_reported": "token:ops", "maintenance_on": "token:ops", "maintenance_off": "token:ops",
		"rma_requested": "token:ops", "erase_for_retire": "token:root"} {
		if audited[reason] != actor {
			t.Errorf("audit of %s: actor %q, want %q (all: %v)", reason, audited[reason], actor, audited)
		}
	}
}
