package lifecycle

import (
	"testing"
	"time"

	"kiln/api/agentapi"
	"kiln/deploy/lab/vbmc/vbmc"
	"kiln/store"
)

// TestReprovisionWipesKilnsOwnBuild: the ladder's reprovision builds the
// same claim over the disk Kiln itself wrote, so its task carries Wipe
// (the agent's check step otherwise fails it with foreign_os_present, as
// the lab e2e with real VMs showed: the step failed in 0.7 s, untried).
// A spare's build stays guarded: what is on its disk is not Kiln's.
func TestReprovisionWipesKilnsOwnBuild(t *testing.T) {
	f := newRemFleet(t, 1, 4, 1, nil)
	a, spare := f.ids[0], f.spares[0]
	f.bmcs.setHealth(a, vbmc.HealthUpdate{System: "Critical", Event: "CPU1 IERR"})
	must(t, f.c.PollHealth(bg))
	f.tick(0)                // power_cycle
	f.tick(31 * time.Second) // still Critical after Settle: reinspect
	m := f.mustState(a, store.StateInspecting)
	task, err := f.c.AgentRegister(bg, a, agentapi.Registration{Inventory: inventory(m)})
	must(t, err)
	if task.Action != agentapi.ActionProvision || f.get(a).Remediation.Step != StepReprovision {
		t.Fatalf("after the reinspection: task %s, ladder %+v", task.Action, f.get(a).Remediation)
	}
	if !task.Wipe {
		t.Fatal("the reprovision's task does not wipe the disk holding Kiln's own build: the check step refuses it (foreign_os_present)")
	}
	// A retry of that build keeps the wipe (retryBuild carries Rewrite).
	must(t, f.c.AgentReport(bg, a, agentapi.Report{Step: agentapi.StepCheck, State: agentapi.StateStarted, Attempt: task.Attempt}))
	again, err := f.c.AgentTask(bg, a)
	must(t, err)
	if again.Action != agentapi.ActionProvision || !again.Wipe || again.Attempt != task.Attempt+1 {
		t.Fatalf("retried reprovision: action %s wipe %v attempt %d", again.Action, again.Wipe, again.Attempt)
	}
	f.build(a)
	f.tick(0)
	f.tick(31 * time.Second) // still Critical after the reprovision: declared failed
	f.mustState(a, store.StateErasing)
	f.tick(0) // the claim goes to the spare
	st, err := f.c.AgentTask(bg, spare)
	must(t, err)
	if st.Action != agentapi.ActionProvision || st.Wipe {
		t.Fatalf("spare's task: action %s wipe %v, want a provision that keeps the foreign-OS guard", st.Action, st.Wipe)
	}
}
