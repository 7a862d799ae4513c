package lifecycle

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"kiln/api/agentapi"
	"kiln/store"
)

// startBuild seeds an available machine with a claim and takes the first
// provision task (attempt 1).
func startBuild(t *testing.T, h *harness, s *store.Store) (store.Machine, agentapi.Task) {
	t.Helper()
	img := h.image("retry.raw")
	m := seed(t, s, store.Machine{Name: "retry-1", Intended: store.Hardware{NICs: []store.NIC{{MAC: "52:54:00:00:12:01"}}}}, store.StateAvailable)
	_, err := h.c.Provision(bg, m.ID, store.Claim{Image: img.ID}, store.W{Actor: "test"})
	must(t, err)
	task, err := h.c.AgentTask(bg, m.ID)
	must(t, err)
	if task.Action != agentapi.ActionProvision || task.Attempt != 1 || task.Wipe {
		t.Fatalf("first task: action %s attempt %d wipe %v", task.Action, task.Attempt, task.Wipe)
	}
	return m, task
}

// TestAgentPollMidBuildServesBuildAgain (issue 12 item 6): the agent asks
// for work while the store says it is in the write step (its fetch broke and
// its failure report was lost, e.g. across an appliance restart). It is
// served the build again as attempt 2, with the disk wiped first (attempt 1
// had passed check and written part of the image); a late report of attempt
// 1 changes nothing; attempt 2 runs to build_complete; after
// MaxBuildAttempts the machine fails instead of looping.
func TestAgentPollMidBuildServesBuildAgain(t *testing.T) {
	s := newStore(t)
	h := newHarness(t, s, func(c *Config) {
		c.AgentEndpoints = []string{"http://10.99.0.1:8080", "http://10.99.0.2:8080"}
	})
	m, task := startBuild(t, h, s)
	if len(task.Endpoints) != 2 || task.Endpoints[1] != "http://10.99.0.2:8080" {
		t.Fatalf("task endpoints %v", task.Endpoints)
	}
	rep := func(step string, st agentapi.State, attempt int) {
		t.Helper()
		h.clk.Advance(time.Second)
		must(t, h.c.AgentReport(bg, m.ID, agentapi.Report{Step: step, State: st, Attempt: attempt}))
	}
	rep(agentapi.StepCheck, agentapi.StateStarted, 1)
	rep(agentapi.StepCheck, agentapi.StateSucceeded, 1)
	rep(agentapi.StepWrite, agentapi.StateStarted, 1)
	rep(agentapi.StepWrite, agentapi.StateRunning, 1)

	task, err := h.c.AgentTask(bg, m.ID)
	must(t, err)
	if task.Action != agentapi.ActionProvision || task.Attempt != 2 || !task.Wipe {
		t.Fatalf("re-served task: action %s attempt %d wipe %v", task.Action, task.Attempt, task.Wipe)
	}
	got := h.mustState(m.ID, store.StateProvisioning)
	if got.Reason != ReasonBuildRetried || got.Step.Step != agentapi.StepCheck || got.Step.State != stepPending || got.Step.Attempt != 2 {
		t.Fatalf("after re-serve: reason %q step %+v", got.Reason, got.Step)
	}
	// Polled again before it starts: the same attempt, not a third.
	if again, err := h.c.AgentTask(bg, m.ID); err != nil || again.Attempt != 2 || !again.Wipe {
		t.Fatalf("second poll: %+v %v", again, err)
	}

	// A late failure report of attempt 1 (delivered after the restart) moves nothing.
	h.clk.Advance(time.Second)
	must(t, h.c.AgentReport(bg, m.ID, agentapi.Report{Step: agentapi.StepWrite, State: agentapi.StateFailed,
		Reason: agentapi.ReasonImageFetchFailed, Attempt: 1}))
	if got := h.mustState(m.ID, store.StateProvisioning); got.Step.Attempt != 2 || got.Step.State != stepPending {
		t.Fatalf("late attempt-1 report moved the machine: %+v", got.Step)
	}
	recorded := false
	for _, e := range allEvents(t, s) {
		recorded = recorded || (e.Kind == "step" && e.To == string(agentapi.StateFailed) && e.Reason == string(agentapi.ReasonImageFetchFailed))
	}
	if !recorded {
		t.Fatal("the late report is not recorded as an event")
	}

	// Attempt 2 runs; a late heartbeat and a repeated report never move it backwards.
	for _, step := range buildSteps[:4] {
		rep(step, agentapi.StateStarted, 2)
		rep(step, agentapi.StateSucceeded, 2)
		rep(step, agentapi.StateSucceeded, 2) // repeated: acknowledged twice, changes nothing more
		rep(agentapi.StepCheck, agentapi.StateRunning, 2)
		if got := h.get(m.ID); got.Step.Step != step || got.Step.State != string(agentapi.StateSucceeded) || got.Step.Attempt != 2 {
			t.Fatalf("after %s: step %+v", step, got.Step)
		}
	}
	rep(agentapi.StepFinalize, agentapi.StateStarted, 2)
	rep(agentapi.StepFinalize, agentapi.StateSucceeded, 2)
	if got := h.mustState(m.ID, store.StateProvisioning); got.Reason != ReasonBuildComplete {
		t.Fatalf("attempt 2 did not complete: reason %q step %+v", got.Reason, got.Step)
	}
	if task, err := h.c.AgentTask(bg, m.ID); err != nil || task.Action != agentapi.ActionWait {
		t.Fatalf("a built machine's agent is not served the build again: %+v %v", task, err)
	}
}

// TestBuildRetryBound: an agent that keeps asking for work mid-build fails
// the machine (agent_restarted) after MaxBuildAttempts; a build re-served
// before it passed check does not wipe the disk.
func TestBuildRetryBound(t *testing.T) {
	s := newStore(t)
	h := newHarness(t, s, nil)
	m, _ := startBuild(t, h, s)
	for attempt := 1; attempt <= MaxBuildAttempts; attempt++ {
		must(t, h.c.AgentReport(bg, m.ID, agentapi.Report{Step: agentapi.StepCheck, State: agentapi.StateStarted, Attempt: attempt}))
		task, err := h.c.AgentTask(bg, m.ID)
		must(t, err)
		if attempt == MaxBuildAttempts {
			if task.Action != agentapi.ActionWait {
				t.Fatalf("attempt %d: task %s, want wait", attempt, task.Action)
			}
			break
		}
		if task.Action != agentapi.ActionProvision || task.Attempt != attempt+1 || task.Wipe {
			t.Fatalf("attempt %d: re-served %s attempt %d wipe %v", attempt, task.Action, task.Attempt, task.Wipe)
		}
	}
	if got := h.mustState(m.ID, store.StateFailed); got.Reason != ReasonAgentRestarted {
		t.Fatalf("reason %q", got.Reason)
	}
}

func TestStaleReport(t *testing.T) {
	at := func(step string, st string, attempt int) *store.StepStatus {
		return &store.StepStatus{Step: step, State: st, Attempt: attempt}
	}
	r := func(step string, st agentapi.State, attempt int) agentapi.Report {
		return agentapi.Report{Step: step, State: st, Attempt: attempt}
	}
	for _, c := range []struct {
		prev  *store.StepStatus
		rep   agentapi.Report
		stale bool
	}{
		{nil, r("check", agentapi.StateStarted, 1), false},
		{at("write", "running", 2), r("write", agentapi.StateFailed, 1), true},       // older attempt
		{at("check", stepPending, 2), r("write", agentapi.StateRunning, 1), true},    // older attempt, pending
		{at("check", stepPending, 2), r("check", agentapi.StateStarted, 2), false},   // the awaited start
		{at("write", "succeeded", 1), r("write", agentapi.StateRunning, 1), true},    // late heartbeat
		{at("verify", "started", 1), r("write", agentapi.StateSucceeded, 1), true},   // late earlier step
		{at("write", "succeeded", 1), r("write", agentapi.StateSucceeded, 1), false}, // repeated
		{at("write", "running", 0), r("verify", agentapi.StateStarted, 0), false},    // uncounted
		{at("write", "running", 1), r("check", agentapi.StateStarted, 0), true},      // uncounted, backwards
		{at("inspect", "succeeded", 0), r("check", agentapi.StateStarted, 1), false},
	} {
		if got := staleReport(c.prev, c.rep); got != c.stale {
			t.Errorf("staleReport(%+v, %+v) = %v, want %v", c.prev, c.rep, got, c.stale)
		}
	}
}

// lateStore is the real store with one hook: before the first ReportAgent
// write goes through, before runs (another node's write landing while this
// one waits to commit).
type lateStore struct {
	*store.Store
	before func()
}

func (l *lateStore) ReportAgent(ctx context.Context, m store.Machine, evs []store.Event, w store.W) (store.Machine, error) {
	if f := l.before; f != nil {
		l.before = nil
		f()
	}
	return l.Store.ReportAgent(ctx, m, evs, w)
}

// TestLateRegistrationDoesNotFailBuild (issue 12 item 6, "a late report
// never moves a machine backwards"): a registration that read the machine
// available and claimed, and found on its retry after a conflict that the
// build had begun meanwhile (the agent, its answer slow, took the claim
// through another node), is refused as a conflict and writes nothing: the
// build goes on. A registration that arrives when the build is already
// under way still fails it (agent_restarted: the machine rebooted).
func TestLateRegistrationDoesNotFailBuild(t *testing.T) {
	s := newStore(t)
	ls := &lateStore{Store: s}
	h := newHarness(t, ls, nil)
	other := otherNode(t, h, s)
	img := h.image("late.raw")
	m := availableOn(t, s, "late-reg", "02:00:00:00:e1:01")
	_, err := h.c.Provision(bg, m.ID, store.Claim{Image: img.ID}, store.W{Actor: "capi"})
	must(t, err)
	var task agentapi.Task
	ls.before = func() {
		task, err = other.c.AgentTask(bg, m.ID)
		must(t, err)
		must(t, other.c.AgentReport(bg, m.ID, agentapi.Report{Step: agentapi.StepCheck, State: agentapi.StateStarted, Attempt: task.Attempt}))
	}
	_, rerr := h.c.AgentRegister(bg, m.ID, agentapi.Registration{Inventory: inventory(m)})
	if task.Action != agentapi.ActionProvision {
		t.Fatalf("the other node's task %+v, want provision", task)
	}
	if !errors.Is(rerr, store.ErrConflict) || !strings.Contains(rerr.Error(), "while this registration waited") {
		t.Fatalf("late registration: %v, want a conflict naming why", rerr)
	}
	got := h.mustState(m.ID, store.StateProvisioning)
	if got.Step == nil || got.Step.Step != agentapi.StepCheck || got.Step.State != string(agentapi.StateStarted) {
		t.Fatalf("after the late registration: %s %s step %+v", got.State, got.Reason, got.Step)
	}
	// Registered again now, mid-build: the machine rebooted.
	_, err = h.c.AgentRegister(bg, m.ID, agentapi.Registration{Inventory: inventory(m)})
	must(t, err)
	if got := h.mustState(m.ID, store.StateFailed); got.Reason != ReasonAgentRestarted {
		t.Fatalf("registration mid-build: reason %q, want %s", got.Reason, ReasonAgentRestarted)
	}
}
