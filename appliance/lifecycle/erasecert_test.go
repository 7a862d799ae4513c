package lifecycle

import (
	"strings"
	"testing"
	"time"

	"kiln/api/agentapi"
	"kiln/store"
)

// TestEraseCertificateEvents: an erase report's per-disk certificates become one
// erase_certificate event each (outcome, method, a key=value record), stored with the
// report's step event; a failed erase records its certificates too.
func TestEraseCertificateEvents(t *testing.T) {
	s := newStore(t)
	h := newHarness(t, s, nil)
	a := importPlan(t, h)[0]
	_, err := h.c.AgentRegister(bg, a.ID, agentapi.Registration{Inventory: inventory(a)})
	must(t, err)
	h.mustState(a.ID, store.StateAvailable)
	_, err = h.c.Erase(bg, a.ID, store.W{Actor: "alice"})
	must(t, err)
	task, err := h.c.AgentTask(bg, a.ID)
	must(t, err)
	if task.Action != agentapi.ActionErase {
		t.Fatalf("task %+v", task)
	}
	t0 := time.Date(2026, 12, 2, 1, 0, 0, 0, time.UTC)
	certs := []agentapi.DiskErase{
		{Name: "nvme0n1", Path: "/dev/nvme0n1", Serial: "NVME0001", Model: "QEMU NVMe Ctrl", SizeBytes: 64 << 20, Transport: "nvme",
			Method: agentapi.EraseNVMeFormatUserData, Outcome: agentapi.EraseErased, Verified: true, Coverage: 0.0628,
			Verification: "canary check: 1026 blocks, 0 survived", Started: t0, Ended: t0.Add(2 * time.Second),
			Attempts: []agentapi.EraseAttempt{{Method: agentapi.EraseNVMeSanitizeCrypto, Outcome: agentapi.EraseUnsupported},
				{Method: agentapi.EraseNVMeFormatUserData, Outcome: agentapi.EraseErased}}},
		{Name: "sda", Path: "/dev/sda", Serial: "SATA0001", SizeBytes: 64 << 20, Transport: "ata", Method: agentapi.EraseOverwrite,
			Outcome: agentapi.EraseVerifyFailed, Mismatches: 1, FirstMismatch: 4096, Coverage: 1, Started: t0, Ended: t0.Add(time.Second),
			NextStep: "thaw the drive: suspend to RAM\nand resume"},
		{Name: "sr0", Path: "/dev/sr0", Method: agentapi.EraseNone, Outcome: agentapi.EraseSkipped, Reason: "removable medium"},
	}
	before := s.LastEventIndex()
	must(t, h.c.AgentReport(bg, a.ID, agentapi.Report{Step: agentapi.StepErase, State: agentapi.StateStarted}))
	must(t, h.c.AgentReport(bg, a.ID, agentapi.Report{Step: agentapi.StepErase, State: agentapi.StateFailed,
		Reason: agentapi.ReasonEraseFailed, Message: "1 disks not erased", Erase: certs}))
	h.mustState(a.ID, store.StateFailed)
	var got []store.Event
	for _, ev := range eventsAfter(t, s, before) {
		if ev.Subject == "machine/"+a.ID && ev.Kind == EventEraseCertificate {
			got = append(got, ev)
		}
	}
	if len(got) != 3 {
		t.Fatalf("certificate events: %+v", got)
	}
	for _, ev := range got {
		t.Logf("event %s to=%s reason=%s: %s", ev.Kind, ev.To, ev.Reason, ev.Message)
	}
	want := []string{
		`disk=nvme0n1 path=/dev/nvme0n1 serial=NVME0001 model="QEMU NVMe Ctrl" size_bytes=67108864 transport=nvme method=nvme-format-user-data-erase outcome=erased verified=true coverage=6.2800%`,
		`mismatches=1 first_mismatch=4096`,
		`next_step="thaw the drive: suspend to RAM and resume"`,
		`disk=sr0 path=/dev/sr0 size_bytes=0 method=none outcome=skipped verified=false coverage=0.0000% reason="removable medium"`,
	}
	if !strings.HasPrefix(got[0].Message, want[0]) || !strings.Contains(got[0].Message, "started=2026-12-02T01:00:00Z ended=2026-12-02T01:00:02Z attempts=nvme-sanitize-crypto-erase:unsupported,nvme-format-user-data-erase:erased") {
		t.Errorf("nvme certificate: %s", got[0].Message)
	}
	if got[0].To != agentapi.EraseErased || got[0].Reason != agentapi.EraseNVMeFormatUserData || got[0].Actor != ActorAgent {
		t.Errorf("nvme event fields: %+v", got[0])
	}
	if !strings.Contains(got[1].Message, want[1]) || !strings.Contains(got[1].Message, want[2]) || got[1].To != agentapi.EraseVerifyFailed {
		t.Errorf("sata certificate: %+v", got[1])
	}
	if got[2].Message != want[3] {
		t.Errorf("skipped certificate: %s", got[2].Message)
	}
	// Certificates only come from an erase step's final report.
	if evs := eraseCertEvents(a.ID, agentapi.Report{Step: agentapi.StepErase, State: agentapi.StateRunning, Erase: certs}); evs != nil {
		t.Errorf("running report made certificates: %+v", evs)
	}
}
