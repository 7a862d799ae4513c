package lifecycle

import (
	"strings"
	"testing"

	"kiln/api/agentapi"
	"kiln/store"
)

// threeNodes is the real store as one node of a three-node site cluster
// sees itself (store.Store.NodeIDs lists every node).
type threeNodes struct{ *store.Store }

func (threeNodes) NodeIDs() ([]string, error) { return []string{"kiln-a", "kiln-b", "kiln-c"}, nil }

// otherNode is a second controller over st, as another node of h's site:
// it shares h's clock (one site clock) but not its memory of agents.
func otherNode(t *testing.T, h *harness, st Store) *harness {
	o := newHarness(t, st, nil)
	o.clk = h.clk
	o.c.cfg.Now = h.clk.Now
	return o
}

// TestClaimWakeInCluster: on a node of a cluster of several, a claim does
// not power the machine at once, even through the leader, whose memory
// does not hold an agent that polls another node (e2e-ha saw that power
// cycle reboot a VM idling in "task wait" on another node, racing the
// agent for the build). The leader's loop PXE-boots a claimed machine
// that no agent has taken within AgentStaleAfter, once; one whose agent
// (on the other node) took the claim is left alone.
func TestClaimWakeInCluster(t *testing.T) {
	st := threeNodes{newStore(t)}
	h := newHarness(t, st, nil)  // the leader, where the claims land
	other := otherNode(t, h, st) // another node: the live agent polls it
	img := h.image("img.raw")
	alive := availableOn(t, st, "alive", "02:00:00:00:e0:01")
	dead := availableOn(t, st, "dead", "02:00:00:00:e0:02")
	for _, m := range []store.Machine{alive, dead} {
		if _, err := h.c.EnrollBMC(bg, m.ID, store.BMC{Address: "10.99.1.10:623", Driver: "ipmi", Username: "admin"}, "pw", store.W{Actor: "t"}); err != nil {
			t.Fatal(err)
		}
	}
	_, err := other.c.AgentRegister(bg, alive.ID, agentapi.Registration{Inventory: inventory(alive)})
	must(t, err)
	for _, m := range []store.Machine{alive, dead} {
		_, err := h.c.Provision(bg, m.ID, store.Claim{Image: img.ID}, store.W{Actor: "capi"})
		must(t, err)
	}
	must(t, h.c.Tick(bg))
	for _, m := range []store.Machine{alive, dead} {
		if got := jobKinds(t, st.Store, m.ID); len(got) != 0 {
			t.Fatalf("%s: jobs %v right after the claim; want none (its agent may be on another node)", m.Name, got)
		}
	}
	// The live agent polls its node and takes the claim.
	task, err := other.c.AgentTask(bg, alive.ID)
	must(t, err)
	if task.Action != agentapi.ActionProvision {
		t.Fatalf("alive's task %+v, want provision", task)
	}
	h.clk.Advance(h.c.cfg.AgentStaleAfter / 2)
	must(t, h.c.Tick(bg))
	if got := jobKinds(t, st.Store, dead.ID); len(got) != 0 {
		t.Fatalf("dead woken after %s: %v (want AgentStaleAfter %s)", h.c.cfg.AgentStaleAfter/2, got, h.c.cfg.AgentStaleAfter)
	}
	h.clk.Advance(h.c.cfg.AgentStaleAfter/2 + 1)
	must(t, h.c.Tick(bg))
	if got := strings.Join(jobKinds(t, st.Store, dead.ID), ","); got != "boot_pxe pending,power_cycle pending" {
		t.Fatalf("dead's jobs after AgentStaleAfter: %q, want boot_pxe and power_cycle", got)
	}
	if got := jobKinds(t, st.Store, alive.ID); len(got) != 0 {
		t.Fatalf("alive (building through the other node) got jobs %v", got)
	}
	h.mustState(alive.ID, store.StateProvisioning)
	// Once per claim: later ticks queue nothing more.
	h.clk.Advance(3 * h.c.cfg.AgentStaleAfter)
	must(t, h.c.Tick(bg))
	if got := jobKinds(t, st.Store, dead.ID); len(got) != 2 {
		t.Fatalf("dead's jobs after more ticks: %v, want the same two", got)
	}
}

// TestClaimWakeOneNode: a node alone still PXE-boots a claimed machine
// whose agent it has not heard at once (its memory covers every agent).
func TestClaimWakeOneNode(t *testing.T) {
	st := newStore(t)
	h := newHarness(t, st, nil)
	img := h.image("img.raw")
	m := availableOn(t, st, "solo", "02:00:00:00:e0:03")
	_, err := h.c.EnrollBMC(bg, m.ID, store.BMC{Address: "10.99.1.10:623", Driver: "ipmi", Username: "admin"}, "pw", store.W{Actor: "t"})
	must(t, err)
	_, err = h.c.Provision(bg, m.ID, store.Claim{Image: img.ID}, store.W{Actor: "capi"})
	must(t, err)
	if got := strings.Join(jobKinds(t, st, m.ID), ","); got != "boot_pxe pending,power_cycle pending" {
		t.Fatalf("jobs right after the claim on a single node: %q", got)
	}
}

// TestClaimWakeSuperseded: a wake queued from the loop's snapshot does not
// run once the machine's agent has taken the claim (it polled another node,
// or its polls failed through an election and it came back late): its jobs
// end failed with reason superseded and the BMC is never called, so the
// build the agent started is not power-cycled away (the fleet simulator's
// leader kill: agent_restarted during write). A wake whose machine still
// waits runs as before.
func TestClaimWakeSuperseded(t *testing.T) {
	st := threeNodes{newStore(t)}
	h := newHarness(t, st, nil)
	other := otherNode(t, h, st)
	img := h.image("img.raw")
	late := availableOn(t, st, "late", "02:00:00:00:e0:04")
	idle := availableOn(t, st, "idle", "02:00:00:00:e0:05")
	for _, m := range []store.Machine{late, idle} {
		_, err := h.c.EnrollBMC(bg, m.ID, store.BMC{Address: "10.99.1.10:623", Driver: "ipmi", Username: "admin"}, "pw", store.W{Actor: "t"})
		must(t, err)
		_, err = h.c.Provision(bg, m.ID, store.Claim{Image: img.ID}, store.W{Actor: "capi"})
		must(t, err)
	}
	must(t, h.c.Tick(bg))
	h.clk.Advance(h.c.cfg.AgentStaleAfter + 1)
	must(t, h.c.Tick(bg))
	for _, m := range []store.Machine{late, idle} {
		if got := strings.Join(jobKinds(t, st.Store, m.ID), ","); got != "boot_pxe pending,power_cycle pending" {
			t.Fatalf("%s: jobs %q after AgentStaleAfter, want the wake queued", m.Name, got)
		}
	}
	// late's agent takes the claim through the other node before a worker
	// runs the wake.
	task, err := other.c.AgentTask(bg, late.ID)
	must(t, err)
	if task.Action != agentapi.ActionProvision {
		t.Fatalf("late's task %+v, want provision", task)
	}
	must(t, other.c.AgentReport(bg, late.ID, agentapi.Report{Step: agentapi.StepCheck, State: agentapi.StateStarted, Attempt: task.Attempt}))
	h.c.drain(bg)
	if got := strings.Join(jobKinds(t, st.Store, late.ID), ","); got != "boot_pxe failed,power_cycle failed" {
		t.Fatalf("late's jobs %q, want both failed (superseded)", got)
	}
	js, err := st.ListJobs(late.ID)
	must(t, err)
	for _, j := range js {
		if j.Reason != ReasonSuperseded || !strings.Contains(j.Message, "provisioning") {
			t.Errorf("late's job %s: reason %q message %q, want superseded naming the state it moved to", j.Kind, j.Reason, j.Message)
		}
	}
	calls := strings.Join(h.bmc.Calls(), ",")
	if strings.Contains(calls, late.ID) {
		t.Fatalf("BMC calls %s: the building machine %s was touched", calls, late.ID)
	}
	if !strings.Contains(calls, "power_cycle "+idle.ID) {
		t.Fatalf("BMC calls %s: the idle machine %s was not woken", calls, idle.ID)
	}
	if m := h.mustState(late.ID, store.StateProvisioning); m.Step == nil || m.Step.Step != agentapi.StepCheck {
		t.Fatalf("late's step %+v, want its build's check", m.Step)
	}
}
