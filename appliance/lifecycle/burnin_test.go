package lifecycle

import (
	"errors"
	"strings"
	"testing"
	"time"

	"kiln/api/agentapi"
	"kiln/store"
)

// burnInHarness is a harness whose burn-in mode is required, with a
// short default policy and one for the plan's model (Dell R650).
func burnInHarness(t *testing.T) *harness {
	return newHarness(t, newStore(t), func(c *Config) {
		c.BurnIn = BurnInConfig{Mode: BurnInRequired,
			Default: BurnInPolicy{CPUTime: 3 * time.Second, MemoryTime: 3 * time.Second, DiskTime: 3 * time.Second, NICWait: time.Second},
			Models: []BurnInModel{{Vendor: "dell ", Product: "r650", BurnInPolicy: BurnInPolicy{Tests: []string{"cpu", "disk"},
				CPUTime: 5 * time.Second, DiskBytes: 64 << 20}}}}
	})
}

// passedReport is the agent's succeeded report of a burn-in of tests.
func burnInResult(state agentapi.State, reason agentapi.Reason, tests ...agentapi.BurnInTest) agentapi.Report {
	return agentapi.Report{Step: agentapi.StepBurnIn, State: state, Reason: reason, Message: "done",
		BurnIn: &agentapi.BurnInReport{Policy: "dell/r650", Tests: tests}}
}

// TestBurnInGate: with burn-in required, a machine whose inspection
// passed stays inspecting (step burn_in pending, reason burnin_started)
// and its agent's next task is the inspect task with its model's policy
// (the model entry's fields, the rest from the default); a passing report
// records Machine.BurnIn and makes it available. A failing one
// (burnin_disk_failed) quarantines it with that reason and the first
// error; inspected again it runs the burn-in again, and it is never
// available without a pass — an erase of the quarantined machine included.
func TestBurnInGate(t *testing.T) {
	h := burnInHarness(t)
	ms := importPlan(t, h)
	a, b := ms[0], ms[1]
	task, err := h.c.AgentRegister(bg, a.ID, agentapi.Registration{Inventory: inventory(a)})
	must(t, err)
	m := h.mustState(a.ID, store.StateInspecting)
	if m.Reason != ReasonBurnInStarted || m.Step == nil || m.Step.Step != agentapi.StepBurnIn || m.Step.State != stepPending || m.Step.Deadline.IsZero() {
		t.Fatalf("inspected: reason %s step %+v, want burn_in pending", m.Reason, m.Step)
	}
	p := task.BurnIn
	if task.Action != agentapi.ActionInspect || p == nil || p.Policy != "dell/r650" || strings.Join(p.Tests, ",") != "cpu,disk" ||
		p.CPUTime != 5*time.Second || p.DiskBytes != 64<<20 || p.DiskTime != 3*time.Second || p.DiskRegions != DefaultBurnInDiskRegions ||
		p.NICs != DefaultBurnInNICs || len(p.ProvisioningMACs) != 2 || task.Disk.Serial != "DISK-SN-A-0" || !task.Wipe {
		t.Fatalf("task %+v policy %+v", task, p)
	}
	if again, err := h.c.AgentTask(bg, a.ID); err != nil || again.BurnIn == nil {
		t.Fatalf("a poll while pending: %+v %v, want the burn-in task again", again, err)
	}
	must(t, h.c.AgentReport(bg, a.ID, agentapi.Report{Step: agentapi.StepBurnIn, State: agentapi.StateStarted}))
	must(t, h.c.AgentReport(bg, a.ID, agentapi.Report{Step: agentapi.StepBurnIn, State: agentapi.StateRunning, Progress: 0.5, Message: "cpu 50%"}))
	if w, err := h.c.AgentTask(bg, a.ID); err != nil || w.Action != agentapi.ActionWait {
		t.Fatalf("a poll while running: %+v %v, want wait", w, err)
	}
	must(t, h.c.AgentReport(bg, a.ID, burnInResult(agentapi.StateSucceeded, "",
		agentapi.BurnInTest{Name: "cpu", Passed: true, Duration: 5 * time.Second, Iterations: 900},
		agentapi.BurnInTest{Name: "disk", Passed: true, Duration: 2 * time.Second, Bytes: 64 << 20, Iterations: 16})))
	m = h.mustState(a.ID, store.StateAvailable)
	if m.Reason != ReasonInspectionPassed || m.BurnIn == nil || !m.BurnIn.Passed || m.BurnIn.Policy != "dell/r650" ||
		len(m.BurnIn.Tests) != 2 || m.BurnIn.Tests[1].Bytes != 64<<20 || m.BurnIn.Tests[0].Iterations != 900 {
		t.Fatalf("passed: %s %s %+v", m.State, m.Reason, m.BurnIn)
	}

	// b fails its disk test.
	_, err = h.c.AgentRegister(bg, b.ID, agentapi.Registration{Inventory: inventory(b)})
	must(t, err)
	must(t, h.c.AgentReport(bg, b.ID, agentapi.Report{Step: agentapi.StepBurnIn, State: agentapi.StateStarted}))
	fail := burnInResult(agentapi.StateFailed, agentapi.ReasonBurnInDisk,
		agentapi.BurnInTest{Name: "cpu", Passed: true},
		agentapi.BurnInTest{Name: "disk", Error: "write /dev/sda at offset 17825792: input/output error"})
	fail.Message = "disk test: write /dev/sda at offset 17825792: input/output error"
	must(t, h.c.AgentReport(bg, b.ID, fail))
	m = h.mustState(b.ID, store.StateQuarantined)
	if m.Reason != string(agentapi.ReasonBurnInDisk) || !strings.Contains(m.Message, "offset 17825792") || m.BurnIn == nil || m.BurnIn.Passed ||
		m.BurnIn.Reason != string(agentapi.ReasonBurnInDisk) || m.BurnIn.Tests[1].Error == "" {
		t.Fatalf("failed: %s %s %q %+v", m.State, m.Reason, m.Message, m.BurnIn)
	}
	var saw bool
	for _, ev := range allEvents(t, h.st.(*store.Store)) {
		saw = saw || (ev.Subject == "machine/"+b.ID && ev.Kind == "step" && ev.Reason == string(agentapi.ReasonBurnInDisk) &&
			strings.Contains(ev.Message, "burn_in: disk test"))
	}
	if !saw {
		t.Fatal("no step event with the burn-in failure")
	}
	// Inspected again: the burn-in is due again; the agent's re-registration gets it.
	_, err = h.c.Inspect(bg, b.ID, store.W{Actor: "op"})
	must(t, err)
	task, err = h.c.AgentRegister(bg, b.ID, agentapi.Registration{Inventory: inventory(b)})
	must(t, err)
	if task.BurnIn == nil || h.mustState(b.ID, store.StateInspecting).Step.Step != agentapi.StepBurnIn {
		t.Fatalf("re-inspected: task %+v", task)
	}
	must(t, h.c.AgentReport(bg, b.ID, fail))
	h.mustState(b.ID, store.StateQuarantined)
	// Erased: inspected again (and so burned in again), not available.
	_, err = h.c.Erase(bg, b.ID, store.W{Actor: "op"})
	must(t, err)
	must(t, h.c.AgentReport(bg, b.ID, agentapi.Report{Step: agentapi.StepErase, State: agentapi.StateSucceeded}))
	if m = h.get(b.ID); m.State == store.StateAvailable {
		t.Fatalf("erased without a passing burn-in: available (%s)", m.Reason)
	}
	// A burn-in that reports success with a failed test is not a pass.
	_, err = h.c.AgentRegister(bg, b.ID, agentapi.Registration{Inventory: inventory(b)})
	must(t, err)
	must(t, h.c.AgentReport(bg, b.ID, burnInResult(agentapi.StateSucceeded, "", agentapi.BurnInTest{Name: "cpu", Error: "wrong"})))
	if m = h.mustState(b.ID, store.StateQuarantined); m.BurnIn.Passed {
		t.Fatalf("a failed test recorded as a pass: %+v", m.BurnIn)
	}
}

// TestBurnInErasePassed: a machine with a passing burn-in on record is
// available again after an erase, without another.
func TestBurnInErasePassed(t *testing.T) {
	h := burnInHarness(t)
	a := importPlan(t, h)[0]
	_, err := h.c.AgentRegister(bg, a.ID, agentapi.Registration{Inventory: inventory(a)})
	must(t, err)
	must(t, h.c.AgentReport(bg, a.ID, burnInResult(agentapi.StateSucceeded, "", agentapi.BurnInTest{Name: "cpu", Passed: true})))
	h.mustState(a.ID, store.StateAvailable)
	_, err = h.c.Erase(bg, a.ID, store.W{Actor: "op"})
	must(t, err)
	must(t, h.c.AgentReport(bg, a.ID, agentapi.Report{Step: agentapi.StepErase, State: agentapi.StateSucceeded}))
	if m := h.mustState(a.ID, store.StateAvailable); !m.BurnIn.Passed {
		t.Fatalf("burn-in record lost: %+v", m.BurnIn)
	}
}

// TestBurnInOff: the default mode is off: inspection alone makes a
// machine available, and no task carries a burn-in.
func TestBurnInOff(t *testing.T) {
	h := newHarness(t, newStore(t), nil)
	a := importPlan(t, h)[0]
	task, err := h.c.AgentRegister(bg, a.ID, agentapi.Registration{Inventory: inventory(a)})
	must(t, err)
	if m := h.mustState(a.ID, store.StateAvailable); m.BurnIn != nil || task.BurnIn != nil {
		t.Fatalf("burn-in off: %+v %+v", m.BurnIn, task.BurnIn)
	}
}

// TestBurnInTimeout: a burn-in that passes step burn_in's deadline fails
// the machine (timeout), as any step does.
func TestBurnInTimeout(t *testing.T) {
	h := burnInHarness(t)
	a := importPlan(t, h)[0]
	_, err := h.c.AgentRegister(bg, a.ID, agentapi.Registration{Inventory: inventory(a)})
	must(t, err)
	must(t, h.c.AgentReport(bg, a.ID, agentapi.Report{Step: agentapi.StepBurnIn, State: agentapi.StateStarted}))
	h.clk.Advance(DefaultBurnInDeadline + time.Minute)
	must(t, h.c.checkDeadlines(bg))
	if m := h.mustState(a.ID, store.StateFailed); m.Reason != ReasonTimeout {
		t.Fatalf("timed out: %s", m.Reason)
	}
}

// TestBurnInConfigValidate: the one check of the `burn_in:` section.
func TestBurnInConfigValidate(t *testing.T) {
	ok := BurnInConfig{Mode: BurnInRequired, Models: []BurnInModel{{Vendor: "QEMU", Product: "Standard PC"}}}
	if err := CheckBurnIn(ok, 0); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	for _, tc := range []struct {
		b    BurnInConfig
		want string
	}{
		{BurnInConfig{Mode: "sometimes"}, "burn_in.mode"},
		{BurnInConfig{Default: BurnInPolicy{Tests: []string{"gpu"}}}, `burn_in.default.tests: "gpu"`},
		{BurnInConfig{Default: BurnInPolicy{MemoryFraction: 0.99}}, "burn_in.default.memory_fraction"},
		{BurnInConfig{Default: BurnInPolicy{CPUTime: -time.Second}}, "burn_in.default.cpu_time"},
		{BurnInConfig{Default: BurnInPolicy{NICs: "some"}}, "burn_in.default.nics"},
		{BurnInConfig{Default: BurnInPolicy{DiskBytes: 1 << 20, DiskRegions: 4}}, "burn_in.default.disk_bytes"},
		{BurnInConfig{Default: BurnInPolicy{CPUTime: 2 * time.Hour}}, "deadline is 1h0m0s"},
		{BurnInConfig{Models: []BurnInModel{{Vendor: "QEMU"}}}, "burn_in.models[0]: vendor and product"},
		{BurnInConfig{Models: []BurnInModel{{Vendor: "a", Product: "b"}, {Vendor: "A", Product: "B "}}}, "burn_in.models[1]: a/b is listed twice"},
		{BurnInConfig{Models: []BurnInModel{{Vendor: "a", Product: "b", BurnInPolicy: BurnInPolicy{DiskRegions: -1}}}}, "burn_in.models[0].disk_regions"},
	} {
		err := CheckBurnIn(tc.b, 0)
		if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want %q", tc.b, err, tc.want)
		}
	}
	// The controller applies the same check, against its step deadline.
	_, err := New(Config{ImageBaseURL: "http://x", BurnIn: BurnInConfig{Default: BurnInPolicy{CPUTime: 20 * time.Minute}},
		StepDeadlines: map[string]time.Duration{"burn_in": 10 * time.Minute}}, newStore(t), nil, nil)
	if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "deadline is 10m0s") {
		t.Fatalf("New: %v", err)
	}
}

// TestBurnInEraseUntrusted: a machine available without a burn-in on
// record (it predates the policy) is inspected again after an erase — and
// so burned in — instead of becoming available.
func TestBurnInEraseUntrusted(t *testing.T) {
	h := burnInHarness(t)
	hw := store.Hardware{Serial: "SN-OLD", NICs: []store.NIC{{MAC: "52:54:00:00:00:99"}}}
	a := seed(t, h.st.(*store.Store), store.Machine{Name: "old", Intended: hw, Discovered: &hw}, store.StateAvailable)
	_, err := h.c.Erase(bg, a.ID, store.W{Actor: "op"})
	must(t, err)
	must(t, h.c.AgentReport(bg, a.ID, agentapi.Report{Step: agentapi.StepErase, State: agentapi.StateSucceeded}))
	m := h.mustState(a.ID, store.StateInspecting)
	if !strings.Contains(m.Message, "no passing burn-in") {
		t.Fatalf("erased: %s %q", m.Reason, m.Message)
	}
}
