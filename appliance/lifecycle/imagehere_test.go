package lifecycle

import (
	"sync/atomic"
	"testing"

	"kiln/api/agentapi"
	"kiln/store"
)

// TestBuildWaitsForImageHere: while Config.ImageHere says this node does
// not hold the claimed image, the agent is told to wait and the machine
// stays available; once it holds it, the build starts and the task's image
// URL is this node's.
func TestBuildWaitsForImageHere(t *testing.T) {
	var here atomic.Bool
	f := newStore(t)
	h := newHarness(t, f, func(c *Config) { c.ImageHere = func(store.Image) bool { return here.Load() } })
	a := importPlan(t, h)[1]
	boot, err := h.c.BootFor(bg, "52:54:00:00:00:0b")
	must(t, err)
	if boot.Action != BootAgent {
		t.Fatalf("first boot %+v", boot)
	}
	_, err = h.c.AgentRegister(bg, a.ID, agentapi.Registration{Inventory: inventory(a)})
	must(t, err)
	img := h.image("here.raw")
	_, err = h.c.Provision(bg, a.ID, store.Claim{Image: img.ID}, store.W{Actor: "capi"})
	must(t, err)
	task, err := h.c.AgentTask(bg, a.ID)
	must(t, err)
	if task.Action != agentapi.ActionWait {
		t.Fatalf("task while the image is not here: %q, want wait", task.Action)
	}
	h.mustState(a.ID, store.StateAvailable)
	here.Store(true)
	task, err = h.c.AgentTask(bg, a.ID)
	must(t, err)
	if task.Action != agentapi.ActionProvision || task.Image == nil || task.Image.URL != "http://10.99.0.1:8080/images/here.raw" {
		t.Fatalf("task once the image is here: %+v", task)
	}
	h.mustState(a.ID, store.StateProvisioning)
}
