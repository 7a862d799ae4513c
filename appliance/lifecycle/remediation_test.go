package lifecycle

import (
	"strings"
	"testing"
	"time"

	"kiln/api/agentapi"
	"kiln/deploy/lab/vbmc/vbmc"
	"kiln/store"
)

func steps(r *store.Remediation) string {
	var s []string
	for _, h := range r.History {
		s = append(s, h.Step+":"+h.Result)
	}
	return strings.Join(s, " ")
}

// A machine that stays broken (its virtual BMC reports Critical throughout,
// read by bmc.Controller.Health; the vbmc's health knob) climbs
// the ladder power_cycle → reinspect → reprovision → erase → rma, each
// step on the real vbmc, each with its recorded why; its claim goes to a
// spare of the same class and selector, built by the same gated build.
func TestLadderClimbsToRMAAndSpareTakesClaim(t *testing.T) {
	f := newRemFleet(t, 1, 4, 1, nil)
	a, spare := f.ids[0], f.spares[0]
	// The virtual BMC starts reporting Critical, with an SEL entry.
	f.bmcs.setHealth(a, vbmc.HealthUpdate{System: "Critical", Chassis: "OK", Event: "Processor CPU1 IERR Asserted"})
	start := f.clk.Now()
	must(t, f.c.PollHealth(bg))
	m := f.get(a)
	if len(m.Health) == 0 || m.Health[0].Type != CondBMCSystem || m.Health[0].Status != store.HealthCritical || m.Health[0].Source != store.HealthSourceBMC {
		t.Fatalf("health after poll: %+v", m.Health)
	}

	// power_cycle: one Reset on the BMC.
	f.tick(0)
	m = f.mustState(a, store.StateRemediating)
	if m.Remediation.Step != StepPowerCycle || m.Remediation.Attempt != 1 || !strings.Contains(m.Remediation.Why, "bmc_system Critical") {
		t.Fatalf("ladder start: %+v", m.Remediation)
	}
	if ons, offs := f.bmcs.powerCalls(a); ons != 1 || offs != 1 {
		t.Fatalf("power cycle on the vbmc: %d on, %d off", ons, offs)
	}
	f.tick(10 * time.Second) // not settled yet
	f.mustState(a, store.StateRemediating)

	// reinspect: still Critical Settle after the power cycle, PXE boot into the agent.
	f.tick(21 * time.Second)
	m = f.mustState(a, store.StateInspecting)
	if m.Remediation.Step != StepReinspect || m.Remediation.Baseline == nil {
		t.Fatalf("reinspect: %+v", m.Remediation)
	}
	f.bmcs.mu.Lock()
	ov := append([]string(nil), f.bmcs.power[a].override...)
	f.bmcs.mu.Unlock()
	if ov[len(ov)-1] != "pxe" {
		t.Fatalf("reinspect boot override %v, want pxe last", ov)
	}
	// The agent registers with the same hardware: the inspection matches,
	// the same claim is built again (reprovision).
	task, err := f.c.AgentRegister(bg, a, agentapi.Registration{Inventory: inventory(m)})
	must(t, err)
	if task.Action != agentapi.ActionProvision {
		t.Fatalf("after the reinspection: task %s", task.Action)
	}
	m = f.mustState(a, store.StateProvisioning)
	if m.Remediation.Step != StepReprovision {
		t.Fatalf("reprovision: %+v", m.Remediation)
	}
	f.build(a)
	f.mustState(a, store.StateProvisioned)
	f.tick(0)
	f.tick(10 * time.Second)
	if r := f.get(a).Remediation; r.Outcome != "" || r.Step != StepReprovision || r.ActionDone.IsZero() {
		t.Fatalf("settling after the reprovision, but: %+v", r)
	}

	// Still Critical Settle after the reprovision: declared failed, erased, rma.
	f.tick(21 * time.Second)
	m = f.mustState(a, store.StateErasing)
	if m.Reason != ReasonEraseForRMA || m.Claim != nil || m.Remediation.Claim == nil || m.Remediation.Step != StepErase {
		t.Fatalf("declared failed: reason %s claim %v %+v", m.Reason, m.Claim, m.Remediation)
	}
	failedAt := f.clk.Now()
	// The next tick hands the claim to the spare (same class, selector pool=web).
	f.tick(0)
	m = f.get(a)
	if m.Remediation.Spare != spare {
		t.Fatalf("spare: %q, want %s", m.Remediation.Spare, spare)
	}
	sp := f.get(spare)
	if sp.Claim == nil || sp.Claim.Replaces != a || sp.Claim.Role != "web" || sp.Claim.Image != f.img.ID || sp.Claim.Selector["pool"] != "web" {
		t.Fatalf("spare's claim %+v", sp.Claim)
	}
	// The failed machine's agent erases its disks.
	task, err = f.c.AgentTask(bg, a)
	must(t, err)
	if task.Action != agentapi.ActionErase {
		t.Fatalf("task %s, want erase", task.Action)
	}
	must(t, f.c.AgentReport(bg, a, agentapi.Report{Step: agentapi.StepErase, State: agentapi.StateStarted}))
	must(t, f.c.AgentReport(bg, a, agentapi.Report{Step: agentapi.StepErase, State: agentapi.StateSucceeded}))
	f.mustState(a, store.StateErasing)
	f.tick(0)
	m = f.mustState(a, store.StateRMA)
	r := m.Remediation
	if r.Outcome != OutcomeRMA || r.Report == nil || r.Report.Erase != "erased" || len(r.Report.BMCEvents) != 1 ||
		r.Report.BMCEvents[0].Message != "Processor CPU1 IERR Asserted" || len(r.Report.Conditions) == 0 {
		t.Fatalf("rma record %+v report %+v", r, r.Report)
	}
	if got, want := steps(r), "power_cycle:failed reinspect:succeeded reprovision:failed erase:succeeded"; got != want {
		t.Fatalf("history %q, want %q", got, want)
	}
	for _, h := range r.History {
		if h.Why == "" || h.Started.IsZero() || h.Ended.Before(h.Started) {
			t.Fatalf("step without a why or times: %+v", h)
		}
	}
	if task, _ := f.c.AgentTask(bg, a); task.Action != agentapi.ActionPowerOff {
		t.Fatalf("rma machine's agent: %s, want poweroff", task.Action)
	}
	// The spare is built by the gated build and serves the claim.
	f.build(spare)
	sp = f.mustState(spare, store.StateProvisioned)
	t.Logf("remediation %s power_cycle→reinspect→reprovision→rma; spare %s provisioned; %s (test clock) from the vbmc's first Critical read to declared failed",
		a, spare, failedAt.Sub(start))
	// Every transition of the failed machine is audited with actor and reason.
	n := 0
	for _, ev := range allEvents(t, f.st) {
		if ev.Subject == "machine/"+a && ev.Kind == "transition" && ev.Time.After(start.Add(-time.Second)) {
			n++
			if ev.Actor == "" || ev.Reason == "" {
				t.Fatalf("unaudited transition %+v", ev)
			}
		}
	}
	if n < 6 {
		t.Fatalf("%d transitions audited, want ≥ 6 (provisioned→remediating→inspecting→available→provisioning→provisioned→erasing→rma)", n)
	}
	if v := f.metric("kiln_spares_available", "class", "gp"); v != 0 {
		t.Fatalf("kiln_spares_available{gp} %v after the spare was taken", v)
	}
	if v := f.metric("kiln_remediations_total", "step", "power_cycle", "result", "failed"); v != 1 {
		t.Fatalf("kiln_remediations_total{power_cycle,failed} %v", v)
	}
}

// The brake: three of four machines in one rack failing within the window
// halts repair with an alert (event + kiln_remediation_brake_engaged) and
// no further BMC action, across a change of controller (leader); machines
// keep their state; a person resumes it.
func TestBrakeRackHaltsRepair(t *testing.T) {
	f := newRemFleet(t, 8, 4, 1, nil)
	rack1 := f.ids[:4]
	for _, id := range rack1 {
		if f.get(id).Rack != "rack-1" {
			t.Fatal("fleet layout")
		}
	}
	f.critical(rack1[0], "kubelet stopped posting status")
	f.tick(time.Second)
	f.critical(rack1[1], "kubelet stopped posting status")
	f.tick(time.Second)
	for _, id := range rack1[:2] {
		if m := f.mustState(id, store.StateRemediating); m.Remediation.Step != StepPowerCycle {
			t.Fatalf("%s: %+v", id, m.Remediation)
		}
	}
	before := f.bmcs.actions()
	if before != 2 {
		t.Fatalf("BMC actions before the brake: %d, want 2 power cycles", before)
	}
	f.critical(rack1[2], "kubelet stopped posting status")
	f.tick(time.Second)
	b, err := f.st.GetRepairBrake()
	must(t, err)
	if !b.Engaged || b.Scope != ScopeRack || b.Key != "rack-1" || len(b.Failures) != 3 {
		t.Fatalf("brake %+v", b)
	}
	if v := f.metric("kiln_remediation_brake_engaged", "scope", "rack"); v != 1 {
		t.Fatalf("kiln_remediation_brake_engaged{rack} %v", v)
	}
	var engaged *store.Event
	for _, ev := range allEvents(t, f.st) {
		if ev.Kind == "brake_engaged" {
			engaged = &ev
		}
	}
	if engaged == nil || engaged.Actor != ActorRemediation || !strings.Contains(engaged.Message, "3 of 4 machines of rack rack-1") {
		t.Fatalf("brake event %+v", engaged)
	}
	t.Logf("brake: %s", engaged.Message)
	// An hour of ticks: every deadline passes, nothing is repaired, no BMC call.
	for i := 0; i < 30; i++ {
		f.tick(2 * time.Minute)
	}
	// A new leader (another controller over the same replicated store) keeps the halt.
	f2 := newHarness(t, f.st, func(c *Config) { c.Inspection = InspectManual; c.Health = f.bmcs })
	f2.c.bmc = f.bmcs
	must(t, f2.c.Tick(bg))
	f.idle()
	if v := f2.metric("kiln_remediation_brake_engaged", "scope", "rack"); v != 1 {
		t.Fatalf("new leader's kiln_remediation_brake_engaged{rack} %v", v)
	}
	if after := f.bmcs.actions(); after != before {
		t.Fatalf("BMC actions behind the brake: %d → %d", before, after)
	}
	for i, id := range rack1[:3] {
		m := f.get(id)
		want := store.StateRemediating
		if i == 2 {
			want = store.StateProvisioned
		}
		if m.State != want || (i < 2 && m.Remediation.Step != StepPowerCycle) {
			t.Fatalf("%s behind the brake: %s %+v, want %s", id, m.State, m.Remediation, want)
		}
	}
	t.Logf("brake engaged: 3 of 4 machines of rack-1; BMC actions %d before, %d after an hour of ticks and a new leader", before, f.bmcs.actions())

	// A person resumes: the ladders go on, the third machine's ladder
	// starts without being counted again.
	b, err = f.c.ResumeRemediation(bg, store.W{Actor: "api:alice"})
	must(t, err)
	if b.Engaged || b.ResumedBy != "api:alice" || len(b.Failures) != 0 {
		t.Fatalf("resumed brake %+v", b)
	}
	f.tick(time.Second)
	for _, id := range rack1[:2] {
		f.mustState(id, store.StateInspecting)
	}
	f.mustState(rack1[2], store.StateRemediating)
	if b, _ := f.st.GetRepairBrake(); b.Engaged || len(b.Failures) != 0 {
		t.Fatalf("after resume: %+v", b)
	}
	if v := f.metric("kiln_remediation_brake_engaged", "scope", "rack"); v != 0 {
		t.Fatalf("gauge after resume %v", v)
	}
}

// A machine declared failed seconds after its reprovision rebooted it into
// its disk is PXE-booted for the erase: its agent reported moments ago, but
// it is gone. (Found by the 2,000-machine day-2 run, settle 2 s: every
// failed machine sat in erasing with the erase step pending, never booted.)
func TestDeclaredFailedAfterReprovisionIsBootedForErase(t *testing.T) {
	f := newRemFleet(t, 1, 4, 1, func(c *Config) { c.Remediation.Settle = 2 * time.Second })
	a := f.ids[0]
	f.bmcs.setHealth(a, vbmc.HealthUpdate{System: "Critical", Chassis: "OK", Event: "Processor CPU1 IERR Asserted"})
	must(t, f.c.PollHealth(bg))
	f.tick(0)
	f.mustState(a, store.StateRemediating)
	f.tick(3 * time.Second)
	m := f.mustState(a, store.StateInspecting)
	task, err := f.c.AgentRegister(bg, a, agentapi.Registration{Inventory: inventory(m)})
	must(t, err)
	if task.Action != agentapi.ActionProvision {
		t.Fatalf("after the reinspection: task %s", task.Action)
	}
	f.build(a)
	f.mustState(a, store.StateProvisioned)
	ons0, _ := f.bmcs.powerCalls(a)
	f.tick(0)
	// Its agent reported moments ago, but the machine netbooted and was
	// told to boot its disk: that agent is forgotten (bootedLocal).
	if f.c.agentAlive(a) {
		t.Fatal("the build's agent is still taken as alive after the machine booted its disk")
	}
	f.tick(3 * time.Second)
	f.mustState(a, store.StateErasing)
	deadline := time.Now().Add(5 * time.Second)
	for {
		ons, _ := f.bmcs.powerCalls(a)
		f.bmcs.mu.Lock()
		ov := append([]string(nil), f.bmcs.power[a].override...)
		f.bmcs.mu.Unlock()
		if ons > ons0 && len(ov) > 0 && ov[len(ov)-1] == "pxe" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("declared failed in its disk OS: power-ons %d (before %d), overrides %v: not booted into the agent for the erase", ons, ons0, ov)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A reprovision that fails while the agent runs (it registered again
// mid-build) is declared failed and erased by that same live agent: no
// power cycle kills it first.
func TestDeclaredFailedWithLiveAgentErasesWithoutPowerCycle(t *testing.T) {
	f := newRemFleet(t, 1, 4, 1, func(c *Config) { c.Remediation.Settle = 2 * time.Second })
	a := f.ids[0]
	f.bmcs.setHealth(a, vbmc.HealthUpdate{System: "Critical", Chassis: "OK", Event: "Processor CPU1 IERR Asserted"})
	must(t, f.c.PollHealth(bg))
	f.tick(0)
	f.tick(3 * time.Second)
	m := f.mustState(a, store.StateInspecting)
	task, err := f.c.AgentRegister(bg, a, agentapi.Registration{Inventory: inventory(m)})
	must(t, err)
	if task.Action != agentapi.ActionProvision {
		t.Fatalf("after the reinspection: task %s", task.Action)
	}
	must(t, f.c.AgentReport(bg, a, agentapi.Report{Step: agentapi.StepCheck, State: agentapi.StateStarted, Attempt: task.Attempt}))
	must(t, f.c.AgentReport(bg, a, agentapi.Report{Step: agentapi.StepCheck, State: agentapi.StateSucceeded, Attempt: task.Attempt}))
	must(t, f.c.AgentReport(bg, a, agentapi.Report{Step: agentapi.StepStage, State: agentapi.StateStarted, Attempt: task.Attempt}))
	// The agent restarts mid-build and registers again.
	_, _ = f.c.AgentRegister(bg, a, agentapi.Registration{Inventory: inventory(m)})
	if m = f.get(a); m.State != store.StateFailed {
		t.Fatalf("after the agent restarted mid-build: %s %s", m.State, m.Reason)
	}
	ons0, _ := f.bmcs.powerCalls(a)
	f.tick(0)
	f.mustState(a, store.StateErasing)
	task, err = f.c.AgentTask(bg, a)
	must(t, err)
	if task.Action != agentapi.ActionErase {
		t.Fatalf("live agent's task %s, want erase", task.Action)
	}
	time.Sleep(200 * time.Millisecond) // a power job, if one were queued, runs on the workers
	if ons, _ := f.bmcs.powerCalls(a); ons != ons0 {
		t.Fatalf("power-ons %d → %d: the live agent was power-cycled away", ons0, ons)
	}
}
