package agent

import (
	"fmt"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"kiln/api/agentapi"
)

// inspectCfg makes the agent's disks change from one inventory to the next
// (serial D1, D2, ...) and calls hook with the collection's number, so a
// test sees which inventory a registration carried. No root: the disks are
// only listed, the BMC device does not exist.
func inspectCfg(t *testing.T, hook func(n int)) func(*Config) {
	var n atomic.Int32
	return func(c *Config) {
		c.IPMIDevice = filepath.Join(t.TempDir(), "no-ipmi")
		c.ListDisks = func() ([]agentapi.Disk, error) {
			k := int(n.Add(1))
			if hook != nil {
				hook(k)
			}
			return []agentapi.Disk{{Name: "vda", Path: "/dev/vda", Serial: fmt.Sprintf("D%d", k), SizeBytes: 1 << 30, Health: "ok"}}, nil
		}
	}
}

// TestInspectAgain: an inspect task answering a poll makes the running agent
// inspect again (step inspect started, the inventory collected anew and sent
// with a second registration, whose answer is the next task); an inspect
// task answering a registration means that registration was the
// inspection, and the agent waits.
func TestInspectAgain(t *testing.T) {
	fa := newFakeAppliance(t)
	fa.tasks = []agentapi.Task{
		{Action: agentapi.ActionInspect, PollAfter: 1e7}, // answers the first registration: done, wait
		{Action: agentapi.ActionInspect, PollAfter: 1e7}, // answers a poll: inspect again
		{Action: agentapi.ActionWait, PollAfter: 1e7},    // answers the second registration
	} // then poweroff ends the run
	if rebooted := runAgentCfg(t, fa, "/dev/vda", "", inspectCfg(t, nil)); rebooted {
		t.Fatal("poweroff task rebooted")
	}
	fa.mu.Lock()
	regs, last, left := fa.regs, fa.reg, len(fa.tasks)
	fa.mu.Unlock()
	if regs != 2 || left != 0 {
		t.Fatalf("%d registrations, %d tasks left; want 2 and 0", regs, left)
	}
	if len(last.Inventory.Disks) != 1 || last.Inventory.Disks[0].Serial != "D2" || last.MachineID != "m-1" {
		t.Fatalf("second registration carries %+v, want the inventory collected anew (disk D2)", last)
	}
	var steps []string
	for _, r := range fa.Reports() {
		steps = append(steps, r.Step+" "+string(r.State))
	}
	// The registration is the inspection's result: started is the only report.
	if strings.Join(steps, ",") != "inspect started" {
		t.Fatalf("reports %v, want [inspect started]", steps)
	}
}

// TestInspectAgainRefused: a second registration that never gets through
// (503 past the retries) is reported as step inspect failed, and the agent
// goes on polling.
func TestInspectAgainRefused(t *testing.T) {
	fa := newFakeAppliance(t)
	fa.tasks = []agentapi.Task{
		{Action: agentapi.ActionWait, PollAfter: 1e7},
		{Action: agentapi.ActionInspect, PollAfter: 1e7},
	}
	hook := func(n int) {
		if n == 2 { // the re-inspection's inventory: refuse what follows
			fa.mu.Lock()
			fa.failRegister = 1000
			fa.mu.Unlock()
		}
	}
	runAgentCfg(t, fa, "/dev/vda", "", inspectCfg(t, hook))
	fa.mu.Lock()
	regs := fa.regs
	fa.mu.Unlock()
	if regs != 1+3 { // the first, then Config.Retries attempts
		t.Fatalf("%d registrations, want 4", regs)
	}
	r, ok := fa.final(agentapi.StepInspect)
	if !ok || r.State != agentapi.StateFailed || r.Reason != agentapi.ReasonInternal || !strings.Contains(r.Message, "503") {
		t.Fatalf("inspect final report %+v (found %v), want failed internal_error naming the 503", r, ok)
	}
}
