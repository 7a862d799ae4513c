package lifecycle

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"kiln/api/agentapi"
	"kiln/store"
)

// raceReports is the real store with a concurrent writer: before each of
// the first n ReportAgent calls it rewrites the reported machine (a label
// change through PutMachine, as another node's write would), so the
// report's compare-and-set is refused by the store with ErrConflict.
type raceReports struct {
	*store.Store
	n     atomic.Int32
	races atomic.Int32
}

func (r *raceReports) ReportAgent(ctx context.Context, m store.Machine, evs []store.Event, w store.W) (store.Machine, error) {
	if r.n.Add(-1) >= 0 {
		cur, err := r.Store.GetMachine(m.ID)
		if err != nil {
			return store.Machine{}, err
		}
		cur = cloneMachine(cur)
		if cur.Labels == nil {
			cur.Labels = map[string]string{}
		}
		cur.Labels["race"] = string(rune('a' + r.races.Add(1)))
		if _, err := r.Store.PutMachine(ctx, cur, store.W{Actor: "test"}); err != nil {
			return store.Machine{}, err
		}
	}
	return r.Store.ReportAgent(ctx, m, evs, w)
}

// provisioningMachine imports the plan's first machine and walks it into a
// build (registered, inspected, claimed, check step pending) on h.
func provisioningMachine(t *testing.T, h *harness) store.Machine {
	t.Helper()
	a := importPlan(t, h)[0]
	img := h.image("img.raw")
	_, err := h.c.AgentRegister(bg, a.ID, agentapi.Registration{Inventory: inventory(a)})
	must(t, err)
	_, err = h.c.Provision(bg, a.ID, store.Claim{Image: img.ID}, store.W{})
	must(t, err)
	_, err = h.c.AgentTask(bg, a.ID)
	must(t, err)
	return h.mustState(a.ID, store.StateProvisioning)
}

// stepEvents returns the "step" events of machine id with Index > after.
func stepEvents(t *testing.T, s *store.Store, id string, after uint64) []store.Event {
	t.Helper()
	var out []store.Event
	for _, ev := range eventsAfter(t, s, after) {
		if ev.Subject == "machine/"+id && ev.Kind == "step" {
			out = append(out, ev)
		}
	}
	return out
}

// TestHeartbeatIsOneWrite: an agent report (here a running heartbeat of the
// write step) is one store command: the machine's ResourceVersion moves by
// exactly one index (the local store gives each write the next index) and
// every event the report left — the step event and the machine's own — has
// that one index.
func TestHeartbeatIsOneWrite(t *testing.T) {
	s := newStore(t)
	h := newHarness(t, s, nil)
	a := provisioningMachine(t, h)
	must(t, h.c.AgentReport(bg, a.ID, agentapi.Report{Step: agentapi.StepCheck, State: agentapi.StateSucceeded}))
	must(t, h.c.AgentReport(bg, a.ID, agentapi.Report{Step: agentapi.StepWrite, State: agentapi.StateStarted}))
	before := h.get(a.ID).ResourceVersion
	if last := s.LastEventIndex(); last != before {
		t.Fatalf("last event index %d, machine at %d: something else wrote", last, before)
	}

	must(t, h.c.AgentReport(bg, a.ID, agentapi.Report{Step: agentapi.StepWrite, State: agentapi.StateRunning, Progress: 0.4}))

	after := h.get(a.ID)
	if after.ResourceVersion != before+1 {
		t.Fatalf("heartbeat moved the machine from index %d to %d, want one write (%d)", before, after.ResourceVersion, before+1)
	}
	evs := eventsAfter(t, s, before)
	if len(evs) != 2 {
		t.Fatalf("heartbeat left %d events, want 2 (step + updated): %+v", len(evs), evs)
	}
	for _, ev := range evs {
		if ev.Index != after.ResourceVersion {
			t.Fatalf("event %s/%s at index %d, want the report's one index %d", ev.Subject, ev.Kind, ev.Index, after.ResourceVersion)
		}
	}
	if evs[0].Kind != "step" || evs[0].To != string(agentapi.StateRunning) || evs[1].Kind != "updated" {
		t.Fatalf("heartbeat events %+v, want step (running) then updated", evs)
	}
	if after.Step == nil || after.Step.Step != agentapi.StepWrite || after.Step.Progress != 0.4 {
		t.Fatalf("machine step %+v, want write at 0.4", after.Step)
	}
}

// TestRefusedReportLeavesNoEvent: a report whose compare-and-set the store
// refuses (another write got there first) stores none of its events; the
// retry re-reads the machine and stores the step event once, with the
// machine write. A report that gives up after maxCASRetries refused writes
// leaves no step event at all and returns store.ErrConflict.
func TestRefusedReportLeavesNoEvent(t *testing.T) {
	s := newStore(t)
	rs := &raceReports{Store: s}
	h := newHarness(t, rs, nil)
	a := provisioningMachine(t, h)

	t.Run("retried", func(t *testing.T) {
		before := h.get(a.ID).ResourceVersion
		rs.n.Store(2)
		must(t, h.c.AgentReport(bg, a.ID, agentapi.Report{Step: agentapi.StepCheck, State: agentapi.StateStarted}))
		steps := stepEvents(t, s, a.ID, before)
		if len(steps) != 1 {
			t.Fatalf("after 2 refused writes and one stored: %d step events, want 1: %+v", len(steps), steps)
		}
		m := h.get(a.ID)
		if steps[0].Index != m.ResourceVersion || m.Labels["race"] == "" {
			t.Fatalf("step event at %d, machine at %d (labels %v): want the event with the stored write, after the racing writes",
				steps[0].Index, m.ResourceVersion, m.Labels)
		}
	})

	t.Run("gave up", func(t *testing.T) {
		before := h.get(a.ID).ResourceVersion
		rs.n.Store(maxCASRetries)
		err := h.c.AgentReport(bg, a.ID, agentapi.Report{Step: agentapi.StepCheck, State: agentapi.StateRunning})
		if !errors.Is(err, store.ErrConflict) {
			t.Fatalf("report refused %d times: %v, want store.ErrConflict", maxCASRetries, err)
		}
		if steps := stepEvents(t, s, a.ID, before); len(steps) != 0 {
			t.Fatalf("a refused report left %d step events: %+v", len(steps), steps)
		}
		if m := h.get(a.ID); m.Step == nil || m.Step.State != string(agentapi.StateStarted) {
			t.Fatalf("machine step %+v, want the previous report's (check started)", m.Step)
		}
	})
}
