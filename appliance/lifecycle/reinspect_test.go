package lifecycle

import (
	"sort"
	"strings"
	"testing"
	"time"

	"kiln/api/agentapi"
	"kiln/store"
	"kiln/store/storetest"
)

// Issue 11, fixed on the way: an erase of a quarantined machine ends in a
// new inspection, not in available; a re-inspection of a machine whose
// agent runs is handed to that agent. Both against the real store's apply
// path (storetest.NewLocal: bbolt, no raft).

// reinspectHarness is a controller over the real store with two imported
// machines (planCSV), a BMC enrolled for the first, and no loop running:
// the test drives every agent call itself.
func reinspectHarness(t *testing.T) (*harness, *store.Store, store.Machine) {
	t.Helper()
	s := storetest.NewLocal(t)
	h := newHarness(t, s, func(c *Config) { c.Inspection = InspectManual })
	a := importPlan(t, h)[0]
	_, err := h.c.EnrollBMC(bg, a.ID, store.BMC{Address: "10.99.1.10:623", Driver: "ipmi", Username: "admin"}, "s3cret", store.W{Actor: "alice"})
	must(t, err)
	return h, s, h.get(a.ID)
}

// transitions lists machine id's transition events as "from>to reason".
func transitions(t *testing.T, s *store.Store, id string) []string {
	t.Helper()
	evs, err := s.Events(0, 1<<20)
	must(t, err)
	var out []string
	for _, ev := range evs {
		if ev.Kind == "transition" && ev.Subject == "machine/"+id {
			out = append(out, ev.From+">"+ev.To+" "+ev.Reason)
		}
	}
	return out
}

// jobKinds lists machine id's BMC jobs as "kind state", sorted.
func jobKinds(t *testing.T, s *store.Store, id string) []string {
	t.Helper()
	js, err := s.ListJobs(id)
	must(t, err)
	var out []string
	for _, j := range js {
		out = append(out, j.Kind+" "+j.State)
	}
	sort.Strings(out)
	return out
}

// TestEraseQuarantinedInspectsAgain: quarantined → erasing → (erase
// succeeded) → inspecting, with the inspect task handed to the agent that
// just erased; the inspection then decides: matching hardware → available,
// still mismatched → quarantined again. An erase of a trusted machine still
// ends in available.
func TestEraseQuarantinedInspectsAgain(t *testing.T) {
	for _, fixed := range []bool{true, false} {
		name := map[bool]string{true: "hardware fixed", false: "still mismatched"}[fixed]
		t.Run(name, func(t *testing.T) {
			h, s, a := reinspectHarness(t)
			bad := inventory(a)
			bad.Disks[0].Serial = "DISK-OTHER" // not the intended root disk: a blocking difference
			_, err := h.c.AgentRegister(bg, a.ID, agentapi.Registration{MachineID: a.ID, Inventory: bad})
			must(t, err)
			h.mustState(a.ID, store.StateQuarantined)

			m, err := h.c.Erase(bg, a.ID, store.W{Actor: "bob", Reason: "rma_return"})
			must(t, err)
			if m.State != store.StateErasing || m.Reason != ReasonEraseQuarantined {
				t.Fatalf("erase of quarantined: %s (%s), want erasing (%s)", m.State, m.Reason, ReasonEraseQuarantined)
			}
			// Not available: the agent is PXE-booted (a quarantined machine's
			// agent is not trusted to go on), and the erase task follows.
			if got := jobKinds(t, s, a.ID); strings.Join(got, ",") != "boot_pxe pending,power_cycle pending" {
				t.Fatalf("jobs after erase %v", got)
			}
			if fixed {
				bad = inventory(a) // the erase boot's agent sees hardware that matches now
			}
			task, err := h.c.AgentRegister(bg, a.ID, agentapi.Registration{MachineID: a.ID, Inventory: bad})
			must(t, err)
			if task.Action != agentapi.ActionErase {
				t.Fatalf("erasing: task %+v", task)
			}
			must(t, h.c.AgentReport(bg, a.ID, agentapi.Report{Step: agentapi.StepErase, State: agentapi.StateStarted}))
			must(t, h.c.AgentReport(bg, a.ID, agentapi.Report{Step: agentapi.StepErase, State: agentapi.StateSucceeded}))

			m = h.mustState(a.ID, store.StateInspecting)
			if m.Reason != ReasonEraseComplete || !strings.Contains(m.Message, "quarantined") ||
				m.Step == nil || m.Step.Step != agentapi.StepInspect || m.Step.State != stepPending ||
				!m.Step.Deadline.Equal(h.clk.Now().Add(DefaultStepDeadlines()[agentapi.StepInspect])) {
				t.Fatalf("after erase: %s (%s, %q) step %+v", m.State, m.Reason, m.Message, m.Step)
			}
			// The agent that erased is running: its next poll is the inspection.
			task, err = h.c.AgentTask(bg, a.ID)
			must(t, err)
			if task.Action != agentapi.ActionInspect {
				t.Fatalf("after erase: task %+v, want inspect", task)
			}
			must(t, h.c.AgentReport(bg, a.ID, agentapi.Report{Step: agentapi.StepInspect, State: agentapi.StateStarted}))
			if task, err = h.c.AgentTask(bg, a.ID); err != nil || task.Action != agentapi.ActionWait {
				t.Fatalf("inspection under way: task %+v %v, want wait", task, err)
			}
			task, err = h.c.AgentRegister(bg, a.ID, agentapi.Registration{MachineID: a.ID, Inventory: bad})
			must(t, err)
			if task.Action != agentapi.ActionWait {
				t.Fatalf("inspected: task %+v", task)
			}
			want := []string{
				"registered>inspecting " + ReasonAgentRegistered,
				"inspecting>quarantined " + ReasonHardwareMismatch,
				"quarantined>erasing rma_return", // the operator's reason in the event
				"erasing>inspecting " + ReasonEraseComplete,
			}
			if fixed {
				h.mustState(a.ID, store.StateAvailable)
				want = append(want, "inspecting>available "+ReasonInspectionPassed)
			} else {
				h.mustState(a.ID, store.StateQuarantined)
				want = append(want, "inspecting>quarantined "+ReasonHardwareMismatch)
			}
			if got := transitions(t, s, a.ID); strings.Join(got, "\n") != strings.Join(want, "\n") {
				t.Fatalf("transitions\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
			}
		})
	}

	t.Run("trusted", func(t *testing.T) {
		// An inspected, available machine erased: available again, no
		// second inspection (the release path is TestHappyPath's).
		h, s, a := reinspectHarness(t)
		_, err := h.c.AgentRegister(bg, a.ID, agentapi.Registration{MachineID: a.ID, Inventory: inventory(a)})
		must(t, err)
		h.mustState(a.ID, store.StateAvailable)
		m, err := h.c.Erase(bg, a.ID, store.W{Actor: "bob"})
		must(t, err)
		if m.Reason != ReasonEraseRequested {
			t.Fatalf("erase of available: reason %q", m.Reason)
		}
		if got := jobKinds(t, s, a.ID); len(got) != 0 {
			t.Fatalf("erase of an available machine with a live agent queued jobs %v", got)
		}
		task, err := h.c.AgentTask(bg, a.ID)
		must(t, err)
		if task.Action != agentapi.ActionErase {
			t.Fatalf("task %+v", task)
		}
		must(t, h.c.AgentReport(bg, a.ID, agentapi.Report{Step: agentapi.StepErase, State: agentapi.StateSucceeded}))
		if m = h.mustState(a.ID, store.StateAvailable); m.Reason != ReasonEraseComplete {
			t.Fatalf("reason %q", m.Reason)
		}
	})

	t.Run("never inspected", func(t *testing.T) {
		// Inspection requested, no agent within BootTimeout (failed,
		// timeout, nothing discovered), erased: inspected before it can be
		// available.
		h, _, a := reinspectHarness(t)
		_, err := h.c.Inspect(bg, a.ID, store.W{Actor: "bob"})
		must(t, err)
		h.clk.Advance(DefaultBootTimeout + time.Second)
		must(t, h.c.Tick(bg))
		if m := h.mustState(a.ID, store.StateFailed); m.Discovered != nil || m.Reason != ReasonTimeout {
			t.Fatalf("failed: reason %q discovered %+v", m.Reason, m.Discovered)
		}
		_, err = h.c.Erase(bg, a.ID, store.W{Actor: "bob"})
		must(t, err)
		must(t, h.c.AgentReport(bg, a.ID, agentapi.Report{Step: agentapi.StepErase, State: agentapi.StateSucceeded}))
		if m := h.mustState(a.ID, store.StateInspecting); !strings.Contains(m.Message, "no inspection on record") {
			t.Fatalf("message %q", m.Message)
		}
	})
}

// TestInspectRunningAgent: Inspect of a machine whose agent was heard within
// AgentStaleAfter queues no BMC job; the agent's next poll gets the inspect
// task (once: a started inspection is not handed out again), and its new
// registration finishes the inspection long before BootTimeout. Once the
// agent is stale, Inspect PXE-boots the machine instead.
func TestInspectRunningAgent(t *testing.T) {
	h, s, a := reinspectHarness(t)
	_, err := h.c.AgentRegister(bg, a.ID, agentapi.Registration{MachineID: a.ID, Inventory: inventory(a)})
	must(t, err)
	h.mustState(a.ID, store.StateAvailable)
	h.clk.Advance(DefaultAgentPollAfter)
	task, err := h.c.AgentTask(bg, a.ID) // the waiting agent polls
	must(t, err)
	if task.Action != agentapi.ActionWait {
		t.Fatalf("available: task %+v", task)
	}

	h.clk.Advance(DefaultAgentPollAfter)
	m, err := h.c.Inspect(bg, a.ID, store.W{Actor: "bob"})
	must(t, err)
	if m.State != store.StateInspecting || m.Reason != ReasonInspectionRequested {
		t.Fatalf("inspect: %s (%s)", m.State, m.Reason)
	}
	if got := jobKinds(t, s, a.ID); len(got) != 0 {
		t.Fatalf("live agent: jobs %v, want none", got)
	}
	task, err = h.c.AgentTask(bg, a.ID)
	must(t, err)
	if task.Action != agentapi.ActionInspect {
		t.Fatalf("live agent: task %+v, want inspect", task)
	}
	must(t, h.c.AgentReport(bg, a.ID, agentapi.Report{Step: agentapi.StepInspect, State: agentapi.StateStarted}))
	if task, err = h.c.AgentTask(bg, a.ID); err != nil || task.Action != agentapi.ActionWait {
		t.Fatalf("inspection started: task %+v %v, want wait", task, err)
	}
	// The agent sends the inventory collected anew: a disk was swapped.
	inv := inventory(a)
	inv.Disks[0].Serial = "DISK-NEW"
	h.clk.Advance(time.Second)
	task, err = h.c.AgentRegister(bg, a.ID, agentapi.Registration{MachineID: a.ID, Inventory: inv})
	must(t, err)
	if task.Action != agentapi.ActionWait {
		t.Fatalf("inspected: task %+v", task)
	}
	m = h.mustState(a.ID, store.StateQuarantined) // planCSV's root disk serial is DISK-SN-A-0
	if m.Discovered == nil || m.Discovered.Disks[0].Serial != "DISK-NEW" || m.Step.Step != agentapi.StepInspect ||
		m.Step.State != string(agentapi.StateSucceeded) {
		t.Fatalf("re-inspection not recorded: discovered %+v step %+v", m.Discovered, m.Step)
	}
	if got := jobKinds(t, s, a.ID); len(got) != 0 {
		t.Fatalf("jobs %v, want none", got)
	}

	// The agent goes silent; past AgentStaleAfter an Inspect powers the machine.
	h.clk.Advance(3*DefaultAgentPollAfter + time.Second)
	_, err = h.c.Inspect(bg, a.ID, store.W{Actor: "bob"})
	must(t, err)
	if got := jobKinds(t, s, a.ID); strings.Join(got, ",") != "boot_pxe pending,power_cycle pending" {
		t.Fatalf("stale agent: jobs %v, want boot_pxe then power_cycle", got)
	}
}
