package lifecycle

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"kiln/api/agentapi"
	"kiln/bmc"
	"kiln/store"
)

// A power cycle that fixes the machine ends the run there: the owner
// reports OK again, and Settle after the cycle the machine is provisioned
// (remediated) with its claim; a later failure starts attempt 2.
func TestPowerCycleRemediates(t *testing.T) {
	f := newRemFleet(t, 1, 4, 0, nil)
	a := f.ids[0]
	f.critical(a, "node not ready")
	f.tick(0)
	f.mustState(a, store.StateRemediating)
	_, err := f.c.ReportHealth(bg, a, "Ready", store.HealthOK, "", "", store.W{Actor: "api:capi"})
	must(t, err)
	f.tick(10 * time.Second) // before Settle: still remediating
	f.mustState(a, store.StateRemediating)
	f.tick(25 * time.Second)
	m := f.mustState(a, store.StateProvisioned)
	if m.Claim == nil || m.Remediation.Outcome != OutcomeRemediated || steps(m.Remediation) != "power_cycle:succeeded" || m.Reason != ReasonRemediated {
		t.Fatalf("remediated: %s %+v", m.Reason, m.Remediation)
	}
	f.clk.Advance(time.Minute)
	f.critical(a, "again")
	f.tick(0)
	if m := f.mustState(a, store.StateRemediating); m.Remediation.Attempt != 2 {
		t.Fatalf("second run: %+v", m.Remediation)
	}
}

// A machine in maintenance is never touched automatically: its Critical
// condition starts no ladder, a running ladder stops advancing; clearing
// the flag lets it go on. Every change is audited.
func TestMaintenanceIsNeverTouched(t *testing.T) {
	f := newRemFleet(t, 2, 4, 0, nil)
	a, b := f.ids[0], f.ids[1]
	_, err := f.c.SetMaintenance(bg, a, true, store.W{Actor: "api:bob", Message: "fan swap"})
	must(t, err)
	f.critical(a, "down")
	f.critical(b, "down")
	f.tick(0)
	f.mustState(a, store.StateProvisioned)
	f.mustState(b, store.StateRemediating)
	_, err = f.c.SetMaintenance(bg, b, true, store.W{Actor: "api:bob", Message: "look at it"})
	must(t, err)
	actions := f.bmcs.actions()
	for i := 0; i < 10; i++ {
		f.tick(5 * time.Minute)
	}
	if m := f.get(b); m.State != store.StateRemediating || m.Remediation.Step != StepPowerCycle {
		t.Fatalf("maintenance machine moved: %s %+v", m.State, m.Remediation)
	}
	if f.bmcs.actions() != actions {
		t.Fatal("BMC action on a machine in maintenance")
	}
	m, err := f.c.SetMaintenance(bg, a, false, store.W{Actor: "api:bob", Message: "done"})
	must(t, err)
	if m.Maintenance != nil {
		t.Fatal("maintenance still set")
	}
	f.tick(0)
	f.mustState(a, store.StateRemediating)
	var kinds []string
	for _, ev := range allEvents(t, f.st) {
		if ev.Subject == "machine/"+a && (ev.Reason == ReasonMaintenanceOn || ev.Reason == ReasonMaintenanceOff) {
			kinds = append(kinds, ev.Reason+":"+ev.Actor+":"+ev.Message)
		}
	}
	if len(kinds) != 2 || kinds[0] != "maintenance_on:api:bob:fan swap" || kinds[1] != "maintenance_off:api:bob:done" {
		t.Fatalf("maintenance audit %v", kinds)
	}
}

// Drain before disruption: the request is on the machine and POSTed to
// the claim's webhook; nothing disruptive happens before the ack; with
// policy hold a missed deadline holds the machine, with proceed it goes on.
func TestDrainBeforeDisruption(t *testing.T) {
	var mu sync.Mutex
	var got []DrainRequest
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var d DrainRequest
		_ = json.NewDecoder(r.Body).Decode(&d)
		mu.Lock()
		got = append(got, d)
		mu.Unlock()
		w.WriteHeader(http.StatusAccepted)
	}))
	defer hook.Close()
	for _, policy := range []string{DrainHold, DrainProceed} {
		t.Run(policy, func(t *testing.T) {
			f := newRemFleet(t, 2, 1, 0, func(c *Config) { // one machine per rack: two of two would trip the rack brake
				c.Remediation.DrainTimeout = 5 * time.Minute
				c.Remediation.DrainPolicy = policy
			})
			a, b := f.ids[0], f.ids[1]
			for _, id := range f.ids {
				m := f.get(id)
				m.Claim.DrainWebhook = hook.URL + "/drain"
				_, err := f.st.PutMachine(bg, m, store.W{Actor: "test", Reason: "setup"})
				must(t, err)
			}
			f.critical(a, "down")
			f.critical(b, "down")
			f.tick(0)
			for _, id := range f.ids {
				m := f.mustState(id, store.StateRemediating)
				if m.Remediation.Step != StepDrain || m.Drain == nil || m.Drain.Step != StepPowerCycle || m.Drain.Webhook == "" {
					t.Fatalf("drain request: %+v %+v", m.Remediation, m.Drain)
				}
			}
			deadline := time.Now().Add(5 * time.Second)
			for f.get(a).Drain.WebhookResult == "" || f.get(b).Drain.WebhookResult == "" {
				if time.Now().After(deadline) {
					t.Fatal("webhook result never recorded")
				}
				time.Sleep(5 * time.Millisecond)
			}
			if r := f.get(a).Drain.WebhookResult; r != "202 Accepted" {
				t.Fatalf("webhook result %q", r)
			}
			if f.bmcs.actions() != 0 {
				t.Fatal("BMC action before the drain was acknowledged")
			}
			if _, err := f.c.DrainAck(bg, a, store.W{Actor: "api:capi"}); err != nil {
				t.Fatal(err)
			}
			if _, err := f.c.DrainAck(bg, a, store.W{Actor: "api:capi"}); !errors.Is(err, ErrWrongState) {
				t.Fatalf("second ack: %v", err)
			}
			f.tick(time.Second)
			if m := f.get(a); m.Remediation.Step != StepPowerCycle || m.Remediation.History[0].Result != ResultSucceeded {
				t.Fatalf("after ack: %+v", m.Remediation)
			}
			if f.bmcs.actions() != 1 {
				t.Fatalf("BMC actions after one ack: %d", f.bmcs.actions())
			}
			f.tick(5 * time.Minute)
			m := f.get(b)
			switch policy {
			case DrainHold:
				if m.Remediation.Step != StepDrain || !m.Drain.TimedOut {
					t.Fatalf("hold: %+v %+v", m.Remediation, m.Drain)
				}
			case DrainProceed:
				if m.Remediation.Step != StepPowerCycle {
					t.Fatalf("proceed: %+v", m.Remediation)
				}
			}
		})
	}
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 4 || got[0].Step != StepPowerCycle || got[0].AckPath == "" || got[0].Role != "web" {
		t.Fatalf("webhook bodies %+v", got)
	}
}

// Operator actions: power on/off/cycle reach the BMC as jobs audited with
// the operator; retire erases first; rma with skip_erase says so in the
// report and hands the claim to a spare; reprovision rebuilds the claim.
func TestOperatorActions(t *testing.T) {
	f := newRemFleet(t, 3, 4, 1, func(c *Config) { c.Remediation.Mode = RemediateOff })
	a, b, c3 := f.ids[0], f.ids[1], f.ids[2]
	for _, act := range []string{PowerOff, PowerOn, PowerCycle} {
		_, err := f.c.Power(bg, a, act, store.W{Actor: "api:alice", Message: "checking"})
		must(t, err)
		f.idle()
	}
	if ons, offs := f.bmcs.powerCalls(a); ons != 2 || offs != 2 {
		t.Fatalf("power calls %d on %d off", ons, offs)
	}
	if _, err := f.c.Power(bg, a, "sideways", store.W{}); !errors.Is(err, ErrInvalid) {
		t.Fatal(err)
	}
	n := 0
	for _, ev := range allEvents(t, f.st) {
		if ev.Kind == "job" && ev.To == JobPending && ev.Actor == "api:alice" && ev.Reason == ReasonPowerRequested && ev.Message == "checking" {
			n++
		}
	}
	if n != 3 {
		t.Fatalf("%d audited power jobs", n)
	}

	// rma, skipping the erase: the claim goes to the spare.
	m, err := f.c.RMA(bg, b, true, store.W{Actor: "api:alice", Message: "PSU smoke"})
	must(t, err)
	if m.State != store.StateRMA || m.Remediation.Report.Erase == "" || m.Remediation.Claim == nil {
		t.Fatalf("rma: %s %+v", m.State, m.Remediation)
	}
	f.c.cfg.Remediation.Mode = RemediateAuto // the spare is the ladder's (the tick)
	f.tick(0)
	if sp := f.get(f.spares[0]); sp.Claim == nil || sp.Claim.Replaces != b {
		t.Fatalf("spare after rma: %+v", sp.Claim)
	}

	// reprovision: inspect, compare, build the same claim.
	m, err = f.c.Reprovision(bg, c3, store.W{Actor: "api:alice", Message: "new kernel"})
	must(t, err)
	m = f.mustState(c3, store.StateInspecting)
	task, err := f.c.AgentRegister(bg, c3, agentapi.Registration{Inventory: inventory(m)})
	must(t, err)
	if task.Action != agentapi.ActionProvision {
		t.Fatalf("reprovision task %s", task.Action)
	}
	f.build(c3)
	f.tick(0)
	f.tick(31 * time.Second)
	if m := f.mustState(c3, store.StateProvisioned); m.Remediation.Outcome != OutcomeRemediated {
		t.Fatalf("reprovisioned: %+v", m.Remediation)
	}

	// retire: erase first, then retired.
	m, err = f.c.Retire(bg, a, store.W{Actor: "api:alice", Message: "end of life"})
	must(t, err)
	if m.State != store.StateErasing || m.Reason != ReasonEraseForRetire || m.Claim != nil {
		t.Fatalf("retire: %s %s", m.State, m.Reason)
	}
	f.idle()
	must(t, f.c.AgentReport(bg, a, agentapi.Report{Step: agentapi.StepErase, State: agentapi.StateStarted}))
	must(t, f.c.AgentReport(bg, a, agentapi.Report{Step: agentapi.StepErase, State: agentapi.StateSucceeded}))
	f.mustState(a, store.StateRetired)
}

// A reinspection that finds a part changed (a disk gone) declares the
// machine failed with the difference in its RMA report.
func TestReinspectDiffDeclaresFailed(t *testing.T) {
	f := newRemFleet(t, 1, 4, 0, func(c *Config) { c.Remediation.NoEraseBeforeRMA = true })
	a := f.ids[0]
	f.critical(a, "disk errors")
	f.tick(0)
	f.tick(3 * time.Minute) // power cycle did not help → reinspect
	m := f.mustState(a, store.StateInspecting)
	inv := inventory(m)
	inv.MemoryBytes /= 2 // a DIMM bank died
	_, err := f.c.AgentRegister(bg, a, agentapi.Registration{Inventory: inv})
	must(t, err)
	m = f.mustState(a, store.StateRMA)
	r := m.Remediation
	if r.Report == nil || len(r.Report.Diff) == 0 || r.Report.Diff[0].Field != FieldMemory || r.Outcome != OutcomeRMA {
		t.Fatalf("rma report %+v", r.Report)
	}
}

// Kiln's own signal: a claimed build that stalls past its step deadline
// fails with the kiln condition build_stalled (Critical, source kiln),
// which starts the ladder on the failed machine (failed → remediating).
func TestBuildStallStartsLadder(t *testing.T) {
	f := newRemFleet(t, 1, 1, 1, nil)
	s := f.spares[0]
	_, err := f.c.Provision(bg, s, store.Claim{Image: f.img.ID, Role: "db"}, store.W{Actor: "api:alice"})
	must(t, err)
	f.idle()
	task, err := f.c.AgentTask(bg, s)
	must(t, err)
	if task.Action != agentapi.ActionProvision {
		t.Fatal(task.Action)
	}
	must(t, f.c.AgentReport(bg, s, agentapi.Report{Step: "check", State: agentapi.StateSucceeded, Attempt: 1}))
	must(t, f.c.AgentReport(bg, s, agentapi.Report{Step: "write", State: agentapi.StateStarted, Attempt: 1}))
	f.tick(DefaultStepDeadlines()["write"] + time.Minute)
	m := f.get(s)
	found := false
	for _, h := range m.Health {
		found = found || (h.Type == CondBuildStalled && h.Source == store.HealthSourceKiln && h.Status == store.HealthCritical)
	}
	// The same tick failed it (timeout) and started the ladder on it.
	if !found || m.State != store.StateRemediating || m.Remediation.Step != StepPowerCycle || !strings.Contains(m.Remediation.Why, CondBuildStalled) {
		t.Fatalf("after the stall: %s %s %+v %+v", m.State, m.Reason, m.Health, m.Remediation)
	}
	var path []string
	for _, ev := range allEvents(t, f.st) {
		if ev.Subject == "machine/"+s && ev.Kind == "transition" {
			path = append(path, ev.To+"("+ev.Reason+")")
		}
	}
	if got := strings.Join(path[len(path)-2:], " "); got != "failed(timeout) remediating(remediation_started)" {
		t.Fatalf("transitions %v", path)
	}
}

// The BMC health poll reads at most HealthPollWorkers BMCs at a time,
// backs off a BMC that fails, and writes only on a change.
func TestPollHealthBoundedAndBackoff(t *testing.T) {
	f := newRemFleet(t, 6, 6, 0, func(c *Config) {
		c.Remediation.HealthPollWorkers = 2
		c.Remediation.HealthPollInterval = time.Minute
		c.Remediation.HealthPollBackoff = 2 * time.Minute
		c.Remediation.HealthPollMaxBackoff = 8 * time.Minute
	})
	f.c.cfg.Health = f.hr
	f.hr.delay = 20 * time.Millisecond
	f.hr.err[f.ids[0]] = &bmc.OpError{Op: "health", Msg: "connection refused"}
	must(t, f.c.PollHealth(bg))
	if f.hr.most > 2 || f.hr.most < 1 {
		t.Fatalf("%d reads at once, want ≤ 2", f.hr.most)
	}
	idx := f.st.LastEventIndex()
	must(t, f.c.PollHealth(bg)) // nothing due yet
	if f.hr.reads[f.ids[1]] != 1 {
		t.Fatalf("read again before the interval: %d", f.hr.reads[f.ids[1]])
	}
	f.clk.Advance(61 * time.Second)
	must(t, f.c.PollHealth(bg))
	if f.hr.reads[f.ids[1]] != 2 || f.hr.reads[f.ids[0]] != 1 {
		t.Fatalf("reads: ok %d, failing %d (backoff 2m)", f.hr.reads[f.ids[1]], f.hr.reads[f.ids[0]])
	}
	if f.st.LastEventIndex() != idx {
		t.Fatal("an unchanged health read wrote to the store")
	}
	f.clk.Advance(61 * time.Second)
	must(t, f.c.PollHealth(bg))
	if f.hr.reads[f.ids[0]] != 2 {
		t.Fatalf("failing BMC after its backoff: %d reads", f.hr.reads[f.ids[0]])
	}
	if v := f.metric("kiln_health_reads_total", "result", "failed"); v != 2 {
		t.Fatalf("failed reads %v", v)
	}
}

// The claim scope: more than 30 % of one claim's machines (at least 3)
// failing within the window engages the brake; failures outside the
// window are not counted.
func TestBrakeClaimScopeAndWindow(t *testing.T) {
	f := newRemFleet(t, 10, 1, 0, nil)
	f.critical(f.ids[0], "x")
	f.tick(0)
	f.tick(16 * time.Minute) // the first failure leaves the window
	for _, id := range f.ids[1:4] {
		f.critical(id, "x")
		f.tick(time.Second)
	}
	if b, _ := f.st.GetRepairBrake(); b.Engaged || len(b.Failures) != 3 {
		t.Fatalf("3 of 10 in the window (30 %%, not over): %+v", b)
	}
	f.critical(f.ids[4], "x")
	f.tick(time.Second)
	b, err := f.st.GetRepairBrake()
	must(t, err)
	if !b.Engaged || b.Scope != ScopeClaim || b.Key != "web" {
		t.Fatalf("4 of 10: %+v", b)
	}
	if v := f.metric("kiln_remediation_brake_engaged", "scope", "claim"); v != 1 {
		t.Fatalf("gauge %v", v)
	}
	f.mustState(f.ids[4], store.StateProvisioned)
}

// An owner's conditions end with its claim: a machine released while its
// owner said Critical is not repaired under its next claim.
func TestOwnerConditionsEndWithTheClaim(t *testing.T) {
	f := newRemFleet(t, 1, 1, 0, func(c *Config) { c.Remediation.Mode = RemediateOff })
	a := f.ids[0]
	f.critical(a, "old tenant's node is broken")
	m, err := f.c.Release(bg, a, store.W{Actor: "api:alice"})
	must(t, err)
	if len(m.Health) != 0 {
		t.Fatalf("health after release: %+v", m.Health)
	}
	f.idle()
	must(t, f.c.AgentReport(bg, a, agentapi.Report{Step: agentapi.StepErase, State: agentapi.StateStarted}))
	must(t, f.c.AgentReport(bg, a, agentapi.Report{Step: agentapi.StepErase, State: agentapi.StateSucceeded}))
	f.mustState(a, store.StateAvailable)
	_, err = f.c.Provision(bg, a, store.Claim{Image: f.img.ID, Role: "next"}, store.W{Actor: "api:bob"})
	must(t, err)
	f.idle()
	f.build(a)
	f.c.cfg.Remediation.Mode = RemediateAuto
	f.tick(time.Second)
	f.mustState(a, store.StateProvisioned)
}

// Kiln's own signal: an agent in a running step whose record is not
// refreshed for AgentSilentAfter gets agent_silent (Warning), once; a
// power action whose agent never reports gets boot_missing (Critical).
func TestAgentSilentAndBootMissing(t *testing.T) {
	f := newRemFleet(t, 0, 1, 2, func(c *Config) { c.Remediation.Mode = RemediateOff })
	s, s2 := f.spares[0], f.spares[1]
	_, err := f.c.Provision(bg, s, store.Claim{Image: f.img.ID}, store.W{Actor: "api:alice"})
	must(t, err)
	task, err := f.c.AgentTask(bg, s)
	must(t, err)
	must(t, f.c.AgentReport(bg, s, agentapi.Report{Step: "check", State: agentapi.StateSucceeded, Attempt: task.Attempt}))
	must(t, f.c.AgentReport(bg, s, agentapi.Report{Step: "write", State: agentapi.StateStarted, Attempt: task.Attempt}))
	must(t, f.c.AgentReport(bg, s, agentapi.Report{Step: "write", State: agentapi.StateRunning, Attempt: task.Attempt}))
	f.tick(f.c.cfg.Remediation.AgentSilentAfter + time.Second)
	n := 0
	for _, h := range f.get(s).Health {
		if h.Type == CondAgentSilent && h.Status == store.HealthWarning && h.Source == store.HealthSourceKiln {
			n++
		}
	}
	if n != 1 || f.get(s).State != store.StateProvisioning {
		t.Fatalf("agent_silent: %+v", f.get(s).Health)
	}
	idx := f.st.LastEventIndex()
	f.tick(time.Minute)
	if f.st.LastEventIndex() != idx {
		t.Fatal("agent_silent recorded twice")
	}
	// s2: inspected by hand, its agent never boots.
	_, err = f.c.Inspect(bg, s2, store.W{Actor: "api:alice"})
	must(t, err)
	f.idle()
	f.tick(DefaultBootTimeout + time.Second)
	m := f.mustState(s2, store.StateFailed)
	found := false
	for _, h := range m.Health {
		found = found || (h.Type == CondBootMissing && h.Status == store.HealthCritical)
	}
	if !found {
		t.Fatalf("boot_missing: %+v", m.Health)
	}
}

// A reprovision of a failed machine whose agent is alive (the failed
// build's agent waits and polls) hands that agent the inspect task and
// queues no BMC sequence: a power cycle queued as well would land in the
// build that follows the inspection (agent_restarted).
func TestReprovisionLiveAgentIsNotPowerCycled(t *testing.T) {
	f := newRemFleet(t, 1, 4, 0, nil)
	a := f.ids[0]
	m := f.get(a)
	m.State, m.Reason = store.StateFailed, "digest_mismatch"
	if _, err := f.st.PutMachine(bg, m, store.W{Actor: "test"}); err != nil {
		t.Fatal(err)
	}
	f.idle()
	before, err := f.st.ListJobs(a)
	must(t, err)
	f.c.seen(a) // the agent polled just now
	_, err = f.c.Reprovision(bg, a, store.W{Actor: "api:alice", Message: "layer restored"})
	must(t, err)
	f.mustState(a, store.StateInspecting)
	f.idle()
	after, err := f.st.ListJobs(a)
	must(t, err)
	if len(after) != len(before) {
		t.Fatalf("%d BMC jobs queued for a machine whose agent is alive", len(after)-len(before))
	}
	task, err := f.c.AgentTask(bg, a)
	must(t, err)
	if task.Action != agentapi.ActionInspect {
		t.Fatalf("the live agent's task %s, want inspect", task.Action)
	}
}
