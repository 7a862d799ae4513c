package lifecycle

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"kiln/api/agentapi"
	"kiln/appliance/lifecycle/intake"
	"kiln/store"
)

var bg = context.Background()

const planCSV = `name,serial,vendor,model,site,rack,u,bmc_address,macs,cpus,memory_gib,disks,boot_mode,labels,root_disk_serial,wipe
node-a,SN-A,Dell,R650,hall1,r01,10,10.99.1.10,52:54:00:00:00:0a;52:54:00:00:01:0a,2,1,2x20GB,uefi,pool=gpu,DISK-SN-A-0,true
node-b,SN-B,Dell,R650,hall1,r02,11,10.99.1.11,52:54:00:00:00:0b,2,1,1x20GB,legacy,pool=gpu,,false
`

func importPlan(t *testing.T, h *harness) []store.Machine {
	t.Helper()
	res, err := h.c.Import(bg, strings.NewReader(planCSV), "csv", store.W{Actor: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	if res.Created != 2 || len(res.IDs) != 2 {
		t.Fatalf("import: %+v", res)
	}
	var out []store.Machine
	for _, id := range res.IDs {
		out = append(out, h.mustState(id, store.StateRegistered))
	}
	return out
}

// pathTo returns a legal sequence of states from registered to s (BFS over CanTransition).
func pathTo(s store.MachineState) []store.MachineState {
	type node struct {
		s    store.MachineState
		path []store.MachineState
	}
	q := []node{{store.StateRegistered, nil}}
	seen := map[store.MachineState]bool{store.StateRegistered: true}
	for len(q) > 0 {
		n := q[0]
		q = q[1:]
		if n.s == s {
			return n.path
		}
		for _, to := range store.AllStates {
			if store.CanTransition(n.s, to) && !seen[to] {
				seen[to] = true
				q = append(q, node{to, append(append([]store.MachineState(nil), n.path...), to)})
			}
		}
	}
	return nil
}

// TestTransitionTable drives every (from, to) pair of store.AllStates²
// through the controller's write path, against the local and the raft
// store: legal pairs succeed and record one transition event with actor and
// reason; illegal pairs are refused with an error naming both states and
// leave the machine unchanged.
func TestTransitionTable(t *testing.T) {
	for _, kind := range []string{"local", "raft"} {
		t.Run(kind, func(t *testing.T) {
			var st *store.Store
			if kind == "local" {
				st = newStore(t)
			} else {
				if testing.Short() {
					t.Skip("short: raft store")
				}
				st = openRealStore(t)
			}
			events := func() []store.Event { return allEvents(t, st) }
			h := newHarness(t, st, nil)
			legal, illegal := 0, 0
			// Build one machine per (from, to) pair in state from through
			// legal writes only, in a few batched commands.
			type pair struct{ from, to store.MachineState }
			var pairs []pair
			var batch []store.Machine
			for _, from := range store.AllStates {
				for _, to := range store.AllStates {
					create := store.StateRegistered
					if from == store.StateDiscovered {
						create = store.StateDiscovered
					}
					pairs = append(pairs, pair{from, to})
					batch = append(batch, store.Machine{Name: fmt.Sprintf("t-%s-%s", from, to), State: create})
				}
			}
			made, err := st.PutMachines(bg, batch, store.W{Actor: "test"})
			must(t, err)
			for depth := 0; ; depth++ {
				var step []store.Machine
				var idx []int
				for i, p := range pairs {
					if path := pathTo(p.from); p.from != store.StateDiscovered && depth < len(path) {
						m := made[i]
						m.State = path[depth]
						step, idx = append(step, m), append(idx, i)
					}
				}
				if len(step) == 0 {
					break
				}
				out, err := st.PutMachines(bg, step, store.W{Actor: "test", Reason: "setup"})
				must(t, err)
				for j, i := range idx {
					made[i] = out[j]
				}
			}
			for i, p := range pairs {
				from, to, m := p.from, p.to, made[i]
				if m.State != from {
					t.Fatalf("setup reached %s, want %s", m.State, from)
				}
				before := len(events())
				_, err = h.c.update(bg, m.ID, store.W{Actor: "tester", Reason: "table"}, func(x *store.Machine) error {
					x.State = to
					return nil
				})
				after := events()
				got := h.get(m.ID)
				switch {
				case from == to:
					must(t, err) // no transition: a plain update
				case store.CanTransition(from, to):
					legal++
					if err != nil {
						t.Fatalf("%s → %s legal, got %v", from, to, err)
					}
					if got.State != to || got.Reason != "table" {
						t.Fatalf("%s → %s: stored %s reason %q", from, to, got.State, got.Reason)
					}
					ev := after[len(after)-1]
					if len(after) != before+1 || ev.Kind != "transition" || ev.From != string(from) || ev.To != string(to) ||
						ev.Reason != "table" || ev.Subject != "machine/"+m.ID {
						t.Fatalf("%s → %s: events %d→%d, last %+v", from, to, before, len(after), ev)
					}
				default:
					illegal++
					if !isIllegal(err, from, to) {
						t.Fatalf("%s → %s illegal, got %v", from, to, err)
					}
					if !strings.Contains(err.Error(), string(from)) || !strings.Contains(err.Error(), string(to)) {
						t.Fatalf("error %q does not name both states", err)
					}
					if got.State != from || len(after) != before {
						t.Fatalf("%s → %s refused but state %s, events %d→%d", from, to, got.State, before, len(after))
					}
					// The store refuses it too when a writer bypasses the controller.
					direct := got
					direct.State = to
					if _, err := st.PutMachine(bg, direct, store.W{Actor: "rogue"}); !isIllegal(err, from, to) {
						t.Fatalf("store accepted %s → %s: %v", from, to, err)
					}
				}
			}
			if legal+illegal != len(store.AllStates)*(len(store.AllStates)-1) || legal == 0 || illegal == 0 {
				t.Fatalf("legal %d illegal %d", legal, illegal)
			}
			if v := h.metric("kiln_lifecycle_transitions_total", "from", "registered", "to", "inspecting"); v < 1 {
				t.Fatalf("transitions metric %v", v)
			}
		})
	}
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestFastTrackFlow runs a machine with a BMC through the whole lifecycle:
// import → BMC jobs → inspecting → agent registers → available → claim →
// provisioning → step reports (finalize: build complete, still
// provisioning) → reboot report → netboot answered with the local disk →
// provisioned (booted_local_disk) → release → erasing → erase → available.
func TestFastTrackFlow(t *testing.T) {
	f := newStore(t)
	h := newHarness(t, f, nil)
	ms := importPlan(t, h)
	a := ms[0]
	if _, err := h.c.EnrollBMC(bg, a.ID, store.BMC{Address: "10.99.1.10:623", Driver: "ipmi", Username: "admin"}, "s3cret", store.W{Actor: "alice"}); err != nil {
		t.Fatal(err)
	}
	img := h.image("flatcar-4081.raw")
	h.run()

	// Auto-inspection: boot_pxe then power_cycle, then inspecting.
	m := h.waitState(a.ID, store.StateInspecting)
	if m.Reason != ReasonInspectionStarted || m.Step == nil || m.Step.Deadline.IsZero() {
		t.Fatalf("inspecting: %+v step %+v", m.Reason, m.Step)
	}
	if calls := h.bmc.Calls(); len(calls) != 2 || calls[0] != "boot_pxe "+a.ID || calls[1] != "power_cycle "+a.ID {
		t.Fatalf("bmc calls %v", calls)
	}
	jobs := allJobs(t, f)
	if len(jobs) != 2 || jobs[0].State != JobSucceeded || jobs[1].State != JobSucceeded {
		t.Fatalf("jobs %+v", jobs)
	}
	// Machine b has no BMC: untouched.
	h.mustState(ms[1].ID, store.StateRegistered)

	// The machine netboots: agent with a fresh token.
	boot, err := h.c.BootFor(bg, "52:54:00:00:00:0A")
	must(t, err)
	if boot.Action != BootAgent || boot.MachineID != a.ID || len(boot.Token) != 64 {
		t.Fatalf("boot %+v", boot)
	}
	if !h.c.VerifyAgentToken(a.ID, boot.Token) || h.c.VerifyAgentToken(a.ID, strings.Repeat("0", 64)) || h.c.VerifyAgentToken(ms[1].ID, boot.Token) {
		t.Fatal("token verification wrong")
	}
	sum := sha256.Sum256([]byte(boot.Token))
	if got := h.get(a.ID).BootTokenHash; got != hex.EncodeToString(sum[:]) || strings.Contains(got, boot.Token) {
		t.Fatalf("stored hash %q", got)
	}

	task, err := h.c.AgentRegister(bg, a.ID, agentapi.Registration{MachineID: a.ID, AgentVersion: "test", Inventory: inventory(a)})
	must(t, err)
	if task.Action != agentapi.ActionWait {
		t.Fatalf("task %+v", task)
	}
	m = h.mustState(a.ID, store.StateAvailable)
	if m.Discovered == nil || m.Discovered.Serial != "SN-A" || len(m.Diff) != 0 {
		t.Fatalf("discovered %+v diff %+v", m.Discovered, m.Diff)
	}

	// Claim, then the waiting agent picks up the build.
	if _, err := h.c.Provision(bg, a.ID, store.Claim{Image: "nope"}, store.W{Actor: "capi"}); !errors.Is(err, store.ErrInvalid) {
		t.Fatalf("bad image: %v", err)
	}
	_, err = h.c.Provision(bg, a.ID, store.Claim{Image: img.ID, Role: "worker", Hostname: "w1.hall1", UserData: "#cloud-config\n",
		SSHKeys: []string{"ssh-ed25519 AAAA"}, Labels: map[string]string{"tier": "x"}}, store.W{Actor: "capi"})
	must(t, err)
	if _, err := h.c.Provision(bg, a.ID, store.Claim{Image: img.ID}, store.W{}); !errors.Is(err, ErrWrongState) {
		t.Fatalf("double claim: %v", err)
	}
	task, err = h.c.AgentTask(bg, a.ID)
	must(t, err)
	if task.Action != agentapi.ActionProvision || task.Image == nil || task.Stage == nil || !task.Reboot {
		t.Fatalf("task %+v", task)
	}
	if task.Image.URL != "http://10.99.0.1:8080/images/flatcar-4081.raw" || task.Image.SHA256 != img.SHA256 || task.Image.Size != img.Size {
		t.Fatalf("image ref %+v", task.Image)
	}
	if task.Disk.Serial != "DISK-SN-A-0" || !task.Wipe || task.Stage.Hostname != "w1.hall1" || task.Stage.Labels["kiln.io/role"] != "worker" ||
		task.Stage.Labels["pool"] != "gpu" || task.Stage.Labels["tier"] != "x" || task.Stage.UserData != "#cloud-config\n" {
		t.Fatalf("task details %+v stage %+v", task, task.Stage)
	}
	m = h.mustState(a.ID, store.StateProvisioning)
	if m.Reason != ReasonBuildStarted {
		t.Fatalf("reason %q", m.Reason)
	}

	for _, step := range buildSteps[:5] {
		for _, s := range []agentapi.State{agentapi.StateStarted, agentapi.StateRunning, agentapi.StateSucceeded} {
			h.clk.Advance(time.Second)
			must(t, h.c.AgentReport(bg, a.ID, agentapi.Report{MachineID: a.ID, Step: step, State: s, Progress: 0.5, Message: "ok"}))
		}
		h.mustState(a.ID, store.StateProvisioning) // finalize succeeded too: not booted from disk yet
	}
	m = h.get(a.ID)
	if m.Reason != ReasonBuildComplete || m.Message != msgRebooting || m.Step == nil || m.Step.Step != agentapi.StepFinalize ||
		!m.Step.Deadline.Equal(h.clk.Now().Add(DefaultRebootTimeout)) {
		t.Fatalf("build complete: reason %q message %q step %+v", m.Reason, m.Message, m.Step)
	}
	if n := h.series("kiln_lifecycle_step_seconds"); n != 5 {
		t.Fatalf("step histogram series %d", n)
	}
	// The agent reports its reboot; recorded as a step, nothing moves, the
	// deadline stays RebootTimeout from the build's completion.
	buildDone := h.clk.Now()
	h.clk.Advance(time.Second)
	must(t, h.c.AgentReport(bg, a.ID, agentapi.Report{MachineID: a.ID, Step: agentapi.StepReboot, State: agentapi.StateStarted}))
	m = h.mustState(a.ID, store.StateProvisioning)
	if m.Step.Step != agentapi.StepReboot || m.Step.State != string(agentapi.StateStarted) || m.Reason != ReasonBuildComplete ||
		!m.Step.Deadline.Equal(buildDone.Add(DefaultRebootTimeout)) {
		t.Fatalf("reboot report: reason %q step %+v", m.Reason, m.Step)
	}
	if task, err := h.c.AgentTask(bg, a.ID); err != nil || task.Action != agentapi.ActionWait {
		t.Fatalf("task after build %+v %v", task, err)
	}
	// The post-reboot iPXE fetch: exit to disk, and now provisioned.
	evBefore := len(allEvents(t, f))
	boot, err = h.c.BootFor(bg, "52:54:00:00:01:0a")
	must(t, err)
	if boot.Action != BootLocal || boot.Token != "" || boot.MachineID != a.ID {
		t.Fatalf("post-build boot %+v", boot)
	}
	m = h.mustState(a.ID, store.StateProvisioned)
	if m.Reason != ReasonBootedLocalDisk || !m.Step.Deadline.IsZero() {
		t.Fatalf("booted local: reason %q step %+v", m.Reason, m.Step)
	}
	var trans []store.Event
	for _, ev := range allEvents(t, f)[evBefore:] {
		if ev.Kind == "transition" {
			trans = append(trans, ev)
		}
	}
	if len(trans) != 1 || trans[0].From != "provisioning" || trans[0].To != "provisioned" ||
		trans[0].Reason != ReasonBootedLocalDisk || trans[0].Actor != ActorController {
		t.Fatalf("transition events %+v", trans)
	}
	boot, err = h.c.BootFor(bg, "52:54:00:00:00:0a")
	must(t, err)
	if boot.Action != BootLocal || boot.Token != "" {
		t.Fatalf("provisioned boot %+v", boot)
	}

	// Release: erasing (BMC PXE-boots it), erase task, erase succeeded → available.
	if _, err := h.c.Release(bg, ms[1].ID, store.W{}); !errors.Is(err, ErrWrongState) {
		t.Fatalf("release registered: %v", err)
	}
	m, err = h.c.Release(bg, a.ID, store.W{Actor: "capi"})
	must(t, err)
	if m.State != store.StateErasing || m.Claim != nil || m.Reason != ReasonReleased {
		t.Fatalf("released %+v", m)
	}
	deadline := time.Now().Add(5 * time.Second)
	for len(h.bmc.Calls()) < 4 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if calls := h.bmc.Calls(); len(calls) != 4 || calls[2] != "boot_pxe "+a.ID || calls[3] != "power_cycle "+a.ID {
		t.Fatalf("bmc calls after release %v", calls)
	}
	boot, err = h.c.BootFor(bg, "52:54:00:00:00:0a")
	must(t, err)
	if boot.Action != BootAgent {
		t.Fatalf("erasing boot %+v", boot)
	}
	task, err = h.c.AgentRegister(bg, a.ID, agentapi.Registration{MachineID: a.ID, Inventory: inventory(a)})
	must(t, err)
	if task.Action != agentapi.ActionErase || !task.Wipe {
		t.Fatalf("erase task %+v", task)
	}
	must(t, h.c.AgentReport(bg, a.ID, agentapi.Report{Step: agentapi.StepErase, State: agentapi.StateStarted}))
	must(t, h.c.AgentReport(bg, a.ID, agentapi.Report{Step: agentapi.StepErase, State: agentapi.StateSucceeded}))
	m = h.mustState(a.ID, store.StateAvailable)
	if m.Reason != ReasonEraseComplete {
		t.Fatalf("reason %q", m.Reason)
	}

	// The gauge follows the store once the loop ticks.
	deadline = time.Now().Add(5 * time.Second)
	for h.metric("kiln_lifecycle_machines", "state", "available") != 1 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if v := h.metric("kiln_lifecycle_machines", "state", "available"); v != 1 {
		t.Fatalf("gauge available %v", v)
	}
	if v := h.metric("kiln_lifecycle_jobs_total", "kind", JobPowerCycle, "result", JobSucceeded); v != 2 {
		t.Fatalf("jobs metric %v", v)
	}
	// Every transition event carries an actor and a reason.
	for _, ev := range allEvents(t, f) {
		if ev.Kind == "transition" && (ev.Actor == "" || ev.Reason == "") {
			t.Fatalf("transition without actor/reason: %+v", ev)
		}
	}
}

// TestAgentWithoutBMC: a registered machine without BMC goes inspecting when
// its agent registers, and a blocking mismatch quarantines it.
func TestAgentWithoutBMC(t *testing.T) {
	h := newHarness(t, newStore(t), nil)
	ms := importPlan(t, h)
	b := ms[1]
	inv := inventory(b)
	inv.Serial = "SN-WRONG"   // blocking
	inv.CPUs = 64             // warn
	inv.Disks = inv.Disks[:0] // blocking: missing disk
	task, err := h.c.AgentRegister(bg, b.ID, agentapi.Registration{Inventory: inv})
	must(t, err)
	if task.Action != agentapi.ActionWait {
		t.Fatalf("task %+v", task)
	}
	m := h.mustState(b.ID, store.StateQuarantined)
	if m.Reason != ReasonHardwareMismatch || !strings.Contains(m.Message, "serial") || !strings.Contains(m.Message, "disks") {
		t.Fatalf("quarantine %q %q", m.Reason, m.Message)
	}
	blockingFields := map[string]bool{}
	for _, d := range m.Diff {
		blockingFields[d.Field] = d.Blocking
	}
	if want := map[string]bool{"serial": true, "disks": true, "cpus": false}; fmt.Sprint(blockingFields) != fmt.Sprint(want) {
		t.Fatalf("diff %+v", m.Diff)
	}
	// quarantined is never told to boot its disk (issue 15): its live agent
	// holds the boot; Inspect brings it back to inspecting, fixed hardware → available.
	boot, err := h.c.BootFor(bg, "52:54:00:00:00:0b")
	if !errors.Is(err, ErrAgentActive) && boot.Action != BootAgent {
		t.Fatalf("quarantined boot %+v %v, want the agent", boot, err)
	}
	m, err = h.c.Inspect(bg, b.ID, store.W{Actor: "bob"})
	must(t, err)
	if m.State != store.StateInspecting || m.Reason != ReasonInspectionRequested {
		t.Fatalf("inspect %+v", m)
	}
	_, err = h.c.AgentRegister(bg, b.ID, agentapi.Registration{Inventory: inventory(b)})
	must(t, err)
	h.mustState(b.ID, store.StateAvailable)
	// A machine id in the registration other than the token's is refused.
	if _, err := h.c.AgentRegister(bg, b.ID, agentapi.Registration{MachineID: ms[0].ID}); !errors.Is(err, ErrMachineMismatch) {
		t.Fatalf("mismatch: %v", err)
	}
}

func TestDiffPolicyOverride(t *testing.T) {
	h := newHarness(t, newStore(t), func(c *Config) {
		c.DiffPolicy = map[string]Policy{FieldSerial: PolicyWarn, FieldCPUs: PolicyBlock, FieldDisks: PolicyIgnore}
	})
	ms := importPlan(t, h)
	inv := inventory(ms[1])
	inv.Serial, inv.Disks = "OTHER", nil
	_, err := h.c.AgentRegister(bg, ms[1].ID, agentapi.Registration{Inventory: inv})
	must(t, err)
	m := h.mustState(ms[1].ID, store.StateAvailable)
	if len(m.Diff) != 1 || m.Diff[0].Field != FieldSerial || m.Diff[0].Blocking {
		t.Fatalf("diff %+v", m.Diff)
	}
	inv = inventory(ms[0])
	inv.CPUs = 1
	_, err = h.c.AgentRegister(bg, ms[0].ID, agentapi.Registration{Inventory: inv})
	must(t, err)
	h.mustState(ms[0].ID, store.StateQuarantined)
	if _, err := New(Config{ImageBaseURL: "http://x", DiffPolicy: map[string]Policy{"colour": PolicyBlock}}, newStore(t), nil, nil); !errors.Is(err, ErrConfig) {
		t.Fatalf("bad policy field: %v", err)
	}
	if _, err := New(Config{ImageBaseURL: "ftp://x"}, newStore(t), nil, nil); !errors.Is(err, ErrConfig) {
		t.Fatalf("bad url: %v", err)
	}
}

// TestDeadlines: a step past its deadline fails the machine with reason
// timeout; heartbeats do not extend a step's deadline. (Remediation is off:
// the build_stalled condition would start the ladder on the claimed
// machine, TestBuildStallStartsLadder.)
func TestDeadlines(t *testing.T) {
	h := newHarness(t, newStore(t), func(c *Config) {
		c.StepDeadlines = map[string]time.Duration{"write": time.Minute}
		c.Remediation.Mode = RemediateOff
	})
	ms := importPlan(t, h)
	a := ms[0]
	img := h.image("img.raw")
	_, err := h.c.AgentRegister(bg, a.ID, agentapi.Registration{Inventory: inventory(a)})
	must(t, err)
	_, err = h.c.Provision(bg, a.ID, store.Claim{Image: img.ID}, store.W{})
	must(t, err)
	_, err = h.c.AgentTask(bg, a.ID)
	must(t, err)
	must(t, h.c.AgentReport(bg, a.ID, agentapi.Report{Step: "check", State: agentapi.StateSucceeded}))
	must(t, h.c.AgentReport(bg, a.ID, agentapi.Report{Step: "write", State: agentapi.StateStarted}))
	for i := 0; i < 5; i++ {
		h.clk.Advance(11 * time.Second)
		must(t, h.c.AgentReport(bg, a.ID, agentapi.Report{Step: "write", State: agentapi.StateRunning, Progress: float64(i) / 5}))
		must(t, h.c.Tick(bg))
		h.mustState(a.ID, store.StateProvisioning)
	}
	h.clk.Advance(10 * time.Second)
	must(t, h.c.Tick(bg))
	m := h.mustState(a.ID, store.StateFailed)
	if m.Reason != ReasonTimeout || m.Step.Reason != ReasonTimeout || !strings.Contains(m.Message, "write") {
		t.Fatalf("timeout: %q %q %+v", m.Reason, m.Message, m.Step)
	}
	// failed boots local; Erase from failed; its pending deadline (BootTimeout) also times out.
	m, err = h.c.Erase(bg, a.ID, store.W{Actor: "bob"})
	must(t, err)
	if m.State != store.StateErasing {
		t.Fatal(m.State)
	}
	h.clk.Advance(DefaultBootTimeout + time.Second)
	must(t, h.c.Tick(bg))
	h.mustState(a.ID, store.StateFailed)
}

// TestStepFailure: a failed report fails the machine with the report's reason.
func TestStepFailure(t *testing.T) {
	f := newStore(t)
	h := newHarness(t, f, nil)
	ms := importPlan(t, h)
	a := ms[0]
	img := h.image("img.raw")
	_, err := h.c.AgentRegister(bg, a.ID, agentapi.Registration{Inventory: inventory(a)})
	must(t, err)
	_, err = h.c.Provision(bg, a.ID, store.Claim{Image: img.ID}, store.W{})
	must(t, err)
	task, err := h.c.AgentRegister(bg, a.ID, agentapi.Registration{Inventory: inventory(a)}) // claim waiting → provision
	must(t, err)
	if task.Action != agentapi.ActionProvision {
		t.Fatalf("register with waiting claim: %+v", task)
	}
	long := "digest was \x1b[31mbad\x00 kiln.token=abcdef " + strings.Repeat("é", 400)
	must(t, h.c.AgentReport(bg, a.ID, agentapi.Report{Step: "verify", State: agentapi.StateFailed, Reason: agentapi.ReasonVerifyMismatch, Message: long}))
	m := h.mustState(a.ID, store.StateFailed)
	if m.Reason != string(agentapi.ReasonVerifyMismatch) {
		t.Fatalf("reason %q", m.Reason)
	}
	evs := allEvents(t, f)
	var step store.Event
	for _, e := range evs {
		if e.Kind == "step" {
			step = e
		}
	}
	if len(m.Step.Message) > agentapi.MaxMessageLen || strings.ContainsAny(m.Step.Message, "\x1b\x00") ||
		strings.Contains(m.Step.Message, "abcdef") || !strings.Contains(m.Step.Message, "REDACTED") {
		t.Fatalf("message not sanitised: %q", m.Step.Message)
	}
	if step.Subject != "machine/"+a.ID || step.To != "failed" || step.Reason != "verify_mismatch" || strings.Contains(step.Message, "abcdef") {
		t.Fatalf("step event %+v", step)
	}
	for _, bad := range []agentapi.Report{{Step: "dance", State: agentapi.StateStarted}, {Step: "write", State: "sleeping"},
		{Step: "write", State: agentapi.StateFailed, Reason: "cosmic_rays"}} {
		if err := h.c.AgentReport(bg, a.ID, bad); !errors.Is(err, ErrBadReport) {
			t.Fatalf("%+v: %v", bad, err)
		}
	}
	if err := h.c.AgentReport(bg, a.ID, agentapi.Report{MachineID: ms[1].ID, Step: "write", State: agentapi.StateStarted}); !errors.Is(err, ErrMachineMismatch) {
		t.Fatalf("mismatch: %v", err)
	}
	if err := h.c.AgentReport(bg, "m-nope", agentapi.Report{Step: "write", State: agentapi.StateStarted}); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("unknown machine: %v", err)
	}
}

// TestBMCFailure: a failing BMC leaves a registered machine registered with
// reason bmc_failed, retried with backoff; a failure during Inspect fails it.
func TestBMCFailure(t *testing.T) {
	f := newStore(t)
	h := newHarness(t, f, func(c *Config) { c.BMCBackoff = time.Hour })
	ms := importPlan(t, h)
	a := ms[0]
	_, err := h.c.EnrollBMC(bg, a.ID, store.BMC{Address: "10.99.1.10", Username: "admin"}, "pw", store.W{})
	must(t, err)
	h.bmc.setFail(JobBootPXE, errors.New("boot device read back: disk"))
	h.run()
	deadline := time.Now().Add(5 * time.Second)
	for h.get(a.ID).Reason != ReasonBMCFailed && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	m := h.mustState(a.ID, store.StateRegistered)
	if m.Reason != ReasonBMCFailed || !strings.Contains(m.Message, "read back") {
		t.Fatalf("%q %q", m.Reason, m.Message)
	}
	time.Sleep(100 * time.Millisecond) // several ticks: backoff holds retries
	if calls := h.bmc.Calls(); len(calls) != 1 {
		t.Fatalf("calls during backoff %v", calls)
	}
	jobs := allJobs(t, f)
	if len(jobs) != 2 || jobs[0].State != JobFailed || jobs[0].Reason != ReasonBMCFailed || jobs[1].State != JobFailed || jobs[1].Reason != "skipped" {
		t.Fatalf("jobs %+v", jobs)
	}
	// Operator inspection with the BMC still failing: inspecting → failed (bmc_failed).
	h.bmc.setFail(JobBootPXE, nil)
	h.bmc.setFail(JobPowerCycle, errors.New("no route to BMC"))
	_, err = h.c.Inspect(bg, a.ID, store.W{Actor: "bob"})
	must(t, err)
	m = h.waitState(a.ID, store.StateFailed)
	if m.Reason != ReasonBMCFailed {
		t.Fatalf("reason %q", m.Reason)
	}
}

func TestBootForUnknownAndNetbootOff(t *testing.T) {
	f := newStore(t)
	h := newHarness(t, f, nil)
	boot, err := h.c.BootFor(bg, "52-54-00-AA-BB-CC")
	must(t, err)
	if boot.Action != BootDiscover || boot.MachineID == "" || len(boot.Token) != 64 {
		t.Fatalf("discover %+v", boot)
	}
	m := h.mustState(boot.MachineID, store.StateDiscovered)
	if !h.c.VerifyAgentToken(m.ID, boot.Token) {
		t.Fatal("discover token")
	}
	// Booting again finds the record: agent, new token, old token dead.
	boot2, err := h.c.BootFor(bg, "52:54:00:aa:bb:cc")
	must(t, err)
	if boot2.Action != BootAgent || boot2.MachineID != m.ID || boot2.Token == boot.Token || h.c.VerifyAgentToken(m.ID, boot.Token) {
		t.Fatalf("second boot %+v", boot2)
	}
	inv := agentapi.Inventory{Serial: "X1", CPUs: 4, MemoryBytes: 1 << 30,
		NICs: []agentapi.NIC{{Name: "eth0", MAC: "52:54:00:aa:bb:cc"}, {Name: "eth1", MAC: "52:54:00:aa:bb:cd"}}}
	_, err = h.c.AgentRegister(bg, m.ID, agentapi.Registration{Inventory: inv})
	must(t, err)
	h.mustState(m.ID, store.StateAvailable)

	// netboot=false → local.
	no := false
	m.State = ""
	m = h.get(m.ID)
	m.Netboot = &no
	_, err = f.PutMachine(bg, m, store.W{})
	must(t, err)
	boot, err = h.c.BootFor(bg, "52:54:00:aa:bb:cc")
	must(t, err)
	if boot.Action != BootLocal {
		t.Fatalf("netboot off %+v", boot)
	}
	if _, err := h.c.BootFor(bg, "not-a-mac"); !errors.Is(err, ErrInvalid) {
		t.Fatalf("bad mac %v", err)
	}

	h2 := newHarness(t, newStore(t), func(c *Config) { c.UnknownMachines = UnknownExit })
	boot, err = h2.c.BootFor(bg, "52:54:00:aa:bb:cc")
	must(t, err)
	if boot.Action != BootLocal || boot.MachineID != "" {
		t.Fatalf("exit policy %+v", boot)
	}
}

// TestDuplicateMACOnOtherMachine: an agent reporting a NIC recorded on
// another machine (swapped cabling) quarantines rather than erroring.
func TestDuplicateMACOnOtherMachine(t *testing.T) {
	h := newHarness(t, newStore(t), nil)
	ms := importPlan(t, h)
	inv := inventory(ms[1])
	inv.NICs = append(inv.NICs, agentapi.NIC{Name: "eth9", MAC: "52:54:00:00:01:0a"}) // node-a's second NIC
	_, err := h.c.AgentRegister(bg, ms[1].ID, agentapi.Registration{Inventory: inv})
	must(t, err)
	m := h.mustState(ms[1].ID, store.StateQuarantined)
	if !strings.Contains(fmt.Sprint(m.Diff), ms[0].ID) {
		t.Fatalf("diff %+v", m.Diff)
	}
}

func TestClaimMachines(t *testing.T) {
	f := newStore(t)
	h := newHarness(t, f, nil)
	img := h.image("img.raw")
	var ids []string
	for i := 0; i < 6; i++ {
		m := seed(t, f, store.Machine{Meta: store.Meta{ID: fmt.Sprintf("m-%02d", i)},
			Rack: fmt.Sprintf("r%d", i%3), Labels: map[string]string{"pool": map[bool]string{true: "gpu", false: "cpu"}[i < 5]}}, store.StateAvailable)
		ids = append(ids, m.ID)
	}
	before := len(allEvents(t, f))
	if _, err := h.c.ClaimMachines(bg, "worker", map[string]string{"pool": "gpu"}, 6, store.Claim{Image: img.ID}, store.W{}); !errors.Is(err, ErrNotEnough) {
		t.Fatalf("want not enough: %v", err)
	}
	if len(allEvents(t, f)) != before {
		t.Fatal("a refused claim wrote something")
	}
	got, err := h.c.ClaimMachines(bg, "worker", map[string]string{"pool": "gpu"}, 3, store.Claim{Image: img.ID}, store.W{Actor: "capi"})
	must(t, err)
	racks := map[string]bool{}
	for _, m := range got {
		racks[m.Rack] = true
		if m.Claim == nil || m.Claim.Role != "worker" || m.Claim.Image != img.ID || m.Labels["pool"] != "gpu" {
			t.Fatalf("claimed %+v", m)
		}
	}
	if len(racks) != 3 {
		t.Fatalf("claims not spread over racks: %v", racks)
	}
	// Only 2 unclaimed gpu machines remain.
	if _, err := h.c.ClaimMachines(bg, "worker", map[string]string{"pool": "gpu"}, 3, store.Claim{Image: img.ID}, store.W{}); !errors.Is(err, ErrNotEnough) {
		t.Fatalf("second claim: %v", err)
	}
	// Release of a claimed-but-unstarted machine drops the claim.
	m, err := h.c.Release(bg, got[0].ID, store.W{})
	must(t, err)
	if m.Claim != nil || m.State != store.StateAvailable {
		t.Fatalf("released %+v", m)
	}
	if _, err := h.c.ClaimMachines(bg, "w", nil, 0, store.Claim{Image: img.ID}, store.W{}); !errors.Is(err, ErrInvalid) {
		t.Fatal(err)
	}
	// Image in use cannot be deleted.
	if err := h.c.DeleteImage(bg, img.ID, store.W{}); !errors.Is(err, store.ErrImageInUse) {
		t.Fatalf("delete in use: %v", err)
	}
}

func TestEnrollBMCSealsPassword(t *testing.T) {
	f := newStore(t)
	h := newHarness(t, f, nil)
	ms := importPlan(t, h)
	b, err := h.c.EnrollBMC(bg, ms[0].ID, store.BMC{Address: "bmc-r01-10.hall1:443", Driver: "redfish", Username: "root"}, "calvin", store.W{Actor: "alice"})
	must(t, err)
	if b.CredentialRef != "bmc/"+ms[0].ID || b.ID == "" || h.get(ms[0].ID).BMC != b.ID {
		t.Fatalf("bmc %+v", b)
	}
	sealed, err := f.Secret(b.CredentialRef)
	must(t, err)
	if len(sealed) == 0 || strings.Contains(string(sealed), "calvin") {
		t.Fatal("credential not sealed")
	}
	plain, err := h.c.cfg.Sealer.(*gcmSealer).Open(sealed)
	if err != nil || string(plain) != "calvin" {
		t.Fatalf("unseal %q %v", plain, err)
	}
	// Re-enrolment updates the same record.
	b2, err := h.c.EnrollBMC(bg, ms[0].ID, store.BMC{Address: "10.99.1.10", Driver: "ipmi", Username: "root"}, "new", store.W{})
	must(t, err)
	if b2.ID != b.ID || b2.Driver != "ipmi" {
		t.Fatalf("re-enrol %+v", b2)
	}
	for _, tc := range []struct {
		b  store.BMC
		pw string
	}{{store.BMC{Address: "", Username: "u"}, "p"}, {store.BMC{Address: "x:99999", Username: "u"}, "p"},
		{store.BMC{Address: "10.0.0.1", Username: "u", Driver: "amt"}, "p"}, {store.BMC{Address: "10.0.0.1"}, "p"},
		{store.BMC{Address: "10.0.0.1", Username: "u"}, ""}} {
		if _, err := h.c.EnrollBMC(bg, ms[0].ID, tc.b, tc.pw, store.W{}); !errors.Is(err, ErrInvalid) {
			t.Fatalf("%+v: %v", tc.b, err)
		}
	}
}

func TestUploadAndDeleteImage(t *testing.T) {
	f := newStore(t)
	h := newHarness(t, f, nil)
	data := strings.Repeat("kiln image bytes ", 4096)
	sum := sha256.Sum256([]byte(data))
	want := hex.EncodeToString(sum[:])
	im, err := h.c.UploadImage(bg, store.Image{Name: "os-1.raw", Version: "1", SHA256: strings.ToUpper(want)}, strings.NewReader(data), store.W{Actor: "alice"})
	must(t, err)
	if im.SHA256 != want || im.Size != uint64(len(data)) || im.Format != "raw" || im.ID == "" {
		t.Fatalf("image %+v", im)
	}
	if _, err := h.c.UploadImage(bg, store.Image{Name: "os-1.raw"}, strings.NewReader(data), store.W{}); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("duplicate name: %v", err)
	}
	if _, err := h.c.UploadImage(bg, store.Image{Name: "os-2.raw", SHA256: strings.Repeat("ab", 32)}, strings.NewReader(data), store.W{}); err == nil {
		t.Fatal("digest mismatch accepted")
	}
	if imgs, _ := f.ListImages(); len(imgs) != 1 {
		t.Fatalf("a failed upload was recorded: %+v", imgs)
	}
	for _, bad := range []store.Image{{Name: "../etc"}, {Name: "x.gz", Format: "gzip"}, {Name: "x", Format: "qcow2"}, {Name: "x", SHA256: "zz"}} {
		if _, err := h.c.UploadImage(bg, bad, strings.NewReader("x"), store.W{}); !errors.Is(err, ErrInvalid) {
			t.Fatalf("%+v: %v", bad, err)
		}
	}
	file := filepath.Join(h.c.cfg.Catalog.(dirCatalog).dir, "os-1.raw")
	if _, err := os.Stat(file); err != nil {
		t.Fatalf("catalog file: %v", err)
	}
	must(t, h.c.DeleteImage(bg, im.ID, store.W{Actor: "alice"}))
	if _, err := f.GetImage(im.ID); !errors.Is(err, store.ErrNotFound) {
		t.Fatal("image still there")
	}
	if _, err := os.Stat(file); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("catalog file not deleted: %v", err)
	}
}

// Two concurrent uploads of one name: the second is refused (conflict) while
// the first streams, so it cannot replace the first one's catalog file, and
// exactly one image is recorded, with the digest of the file on disk.
func TestConcurrentUploadSameName(t *testing.T) {
	f := newStore(t)
	h := newHarness(t, f, nil)
	a := strings.Repeat("image A ", 8192)
	b := strings.Repeat("image B ", 8192)
	sa, sb := sha256.Sum256([]byte(a)), sha256.Sum256([]byte(b))
	pr, pw := io.Pipe()
	first := make(chan error, 1)
	go func() {
		_, err := h.c.UploadImage(bg, store.Image{Name: "race.raw", Version: "1", SHA256: hex.EncodeToString(sa[:])}, pr, store.W{})
		first <- err
	}()
	if _, err := pw.Write([]byte(a[:100])); err != nil { // the first upload is now streaming
		t.Fatal(err)
	}
	_, err := h.c.UploadImage(bg, store.Image{Name: "race.raw", Version: "1", SHA256: hex.EncodeToString(sb[:])}, strings.NewReader(b), store.W{})
	if !errors.Is(err, store.ErrConflict) {
		t.Fatalf("second concurrent upload: %v, want ErrConflict", err)
	}
	if _, err := pw.Write([]byte(a[100:])); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	must(t, <-first)
	imgs, _ := f.ListImages()
	if len(imgs) != 1 || imgs[0].SHA256 != hex.EncodeToString(sa[:]) {
		t.Fatalf("recorded %+v, want one image with A's digest", imgs)
	}
	got, err := os.ReadFile(filepath.Join(h.c.cfg.Catalog.(dirCatalog).dir, "race.raw"))
	must(t, err)
	if string(got) != a {
		t.Fatal("the catalog file is not the recorded upload's bytes")
	}
	// Done: the name is free again (and now taken by the record).
	if _, err := h.c.UploadImage(bg, store.Image{Name: "race.raw", Version: "2"}, strings.NewReader(b), store.W{}); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("after the upload: %v", err)
	}
}

// TestImportChecksStoredRecords: against a real store holding the plan
// (node-a: SN-A, NICs 52:54:00:00:00:0a and 52:54:00:00:01:0a, BMC MAC
// 52:54:00:00:0b:0a), every row whose name, serial (any case), BMC MAC or NIC
// MAC a stored machine or an earlier row holds is reported with its line and
// column, and nothing is imported (issue 20: only rows of the same file were
// compared).
func TestImportChecksStoredRecords(t *testing.T) {
	if testing.Short() {
		t.Skip("short: real store")
	}
	s := openRealStore(t)
	h := newHarness(t, s, nil)
	plan := strings.Replace(planCSV, "name,serial,vendor,model,site,rack,u,bmc_address,macs,",
		"name,serial,vendor,model,site,rack,u,bmc_address,bmc_mac,macs,", 1)
	plan = strings.Replace(plan, "10.99.1.10,52:54", "10.99.1.10,52:54:00:00:0b:0a,52:54", 1)
	plan = strings.Replace(plan, "10.99.1.11,52:54", "10.99.1.11,,52:54", 1)
	res, err := h.c.Import(bg, strings.NewReader(plan), "csv", store.W{Actor: "alice"})
	must(t, err)
	a := h.get(res.IDs[0])
	if a.Name != "node-a" || a.Intended.BMCMAC != "52:54:00:00:0b:0a" {
		t.Fatalf("plan imported %+v", a)
	}
	evs, err := s.Events(0, 1<<20)
	must(t, err)
	before := len(evs)

	file := `name,serial,bmc_mac,macs
node-a,SN-NEW-1,,52:54:00:00:02:01
node-n,sn-a,,52:54:00:00:02:02
node-o,SN-O,52:54:00:00:01:0A,52:54:00:00:02:03
node-p,SN-P,,52:54:00:00:0b:0a
node-q,SN-Q,,52:54:00:00:02:05
node-q,SN-R,,52:54:00:00:02:05
node-s,SN-S,,52:54:00:00:02:07
`
	_, err = h.c.Import(bg, strings.NewReader(file), "csv", store.W{})
	var rows *intake.ErrRows
	if !errors.As(err, &rows) {
		t.Fatalf("want *intake.ErrRows, got %v", err)
	}
	want := []intake.RowError{
		{Line: 2, Field: "name", Msg: `name "node-a" already belongs to machine ` + a.ID + " (node-a)"},
		{Line: 3, Field: "serial", Msg: `serial "sn-a" already belongs to machine ` + a.ID + " (node-a)"},
		{Line: 4, Field: "bmc_mac", Msg: "mac 52:54:00:00:01:0a already belongs to machine " + a.ID + " (node-a)"},
		{Line: 5, Field: "macs", Msg: "mac 52:54:00:00:0b:0a already belongs to machine " + a.ID + " (node-a)"},
		{Line: 7, Field: "name", Msg: `name "node-q" already used on line 6`},
		{Line: 7, Field: "macs", Msg: "mac 52:54:00:00:02:05 already used on line 6"},
	}
	if !reflect.DeepEqual(rows.Rows, want) {
		t.Fatalf("rows\n got %+v\nwant %+v", rows.Rows, want)
	}
	evs, err = s.Events(0, 1<<20)
	must(t, err)
	if len(evs) != before {
		t.Fatalf("a rejected import wrote %d events", len(evs)-before)
	}
	if ms, _, _ := s.ListMachines(store.ListOptions{}); len(ms) != 2 {
		t.Fatalf("%d machines after a rejected import, want 2", len(ms))
	}
	// The clean row alone imports.
	res, err = h.c.Import(bg, strings.NewReader("name,serial,macs\nnode-s,SN-S,52:54:00:00:02:07\n"), "csv", store.W{})
	if err != nil || res.Created != 1 {
		t.Fatalf("clean import: %+v %v", res, err)
	}
}

// TestImport2000RowsOneStoredDuplicate: one duplicate serial among 2,000
// rows, against a machine already stored, rejects the whole plan and names
// its line.
func TestImport2000RowsOneStoredDuplicate(t *testing.T) {
	if testing.Short() {
		t.Skip("short: real store")
	}
	s := openRealStore(t)
	h := newHarness(t, s, nil)
	_, err := h.c.Import(bg, strings.NewReader("name,serial,macs\nold,SN001234,02:00:00:99:00:01\n"), "csv", store.W{})
	must(t, err)
	var b strings.Builder
	b.WriteString("name,serial,macs\n")
	for i := 0; i < 2000; i++ {
		fmt.Fprintf(&b, "n%05d,SN%06d,02:00:00:%02x:%02x:01\n", i, i, i>>8, i&0xff)
	}
	_, err = h.c.Import(bg, strings.NewReader(b.String()), "csv", store.W{})
	var rows *intake.ErrRows
	if !errors.As(err, &rows) || len(rows.Rows) != 1 || rows.Rows[0].Line != 1236 || rows.Rows[0].Field != "serial" {
		t.Fatalf("want one serial conflict on line 1236, got %v", err)
	}
	if ms, _, _ := s.ListMachines(store.ListOptions{}); len(ms) != 1 {
		t.Fatalf("%d machines stored, want 1", len(ms))
	}
}

// TestLeaderOnly: the loop does nothing while the store is not leader.
func TestLeaderOnly(t *testing.T) {
	f := &leaderFlag{Store: newStore(t)}
	h := newHarness(t, f, nil)
	ms := importPlan(t, h)
	_, err := h.c.EnrollBMC(bg, ms[0].ID, store.BMC{Address: "10.99.1.10", Username: "u"}, "p", store.W{})
	must(t, err)
	f.setLeader(false)
	h.run()
	time.Sleep(150 * time.Millisecond)
	if calls := h.bmc.Calls(); len(calls) != 0 {
		t.Fatalf("follower drove BMC: %v", calls)
	}
	f.setLeader(true)
	h.waitState(ms[0].ID, store.StateInspecting)
}

// TestRealStoreFlow runs the main path against a real single-node store.
func TestRealStoreFlow(t *testing.T) {
	if testing.Short() {
		t.Skip("short: real store")
	}
	s := openRealStore(t)
	h := newHarness(t, s, nil)
	ms := importPlan(t, h)
	a := ms[0]
	img := h.image("img.raw")
	_, err := h.c.EnrollBMC(bg, a.ID, store.BMC{Address: "10.99.1.10", Username: "u"}, "p", store.W{})
	must(t, err)
	h.run()
	h.waitState(a.ID, store.StateInspecting)
	boot, err := h.c.BootFor(bg, "52:54:00:00:00:0a")
	must(t, err)
	if !h.c.VerifyAgentToken(a.ID, boot.Token) {
		t.Fatal("token")
	}
	_, err = h.c.AgentRegister(bg, a.ID, agentapi.Registration{Inventory: inventory(a)})
	must(t, err)
	_, err = h.c.Provision(bg, a.ID, store.Claim{Image: img.ID, Role: "worker"}, store.W{Actor: "capi"})
	must(t, err)
	task, err := h.c.AgentTask(bg, a.ID)
	must(t, err)
	if task.Action != agentapi.ActionProvision {
		t.Fatalf("task %+v", task)
	}
	for _, step := range buildSteps[:5] {
		must(t, h.c.AgentReport(bg, a.ID, agentapi.Report{Step: step, State: agentapi.StateStarted}))
		must(t, h.c.AgentReport(bg, a.ID, agentapi.Report{Step: step, State: agentapi.StateSucceeded}))
	}
	must(t, h.c.AgentReport(bg, a.ID, agentapi.Report{Step: agentapi.StepReboot, State: agentapi.StateStarted}))
	if m := h.mustState(a.ID, store.StateProvisioning); m.Reason != ReasonBuildComplete {
		t.Fatalf("after build: reason %q", m.Reason)
	}
	boot, err = h.c.BootFor(bg, "52:54:00:00:00:0a")
	must(t, err)
	if boot.Action != BootLocal || boot.Token != "" {
		t.Fatalf("post-build boot %+v", boot)
	}
	h.mustState(a.ID, store.StateProvisioned)
	evs, err := s.Events(0, 100000)
	must(t, err)
	var chain []string
	steps := 0
	for _, e := range evs {
		if e.Subject == "machine/"+a.ID && e.Kind == "transition" {
			chain = append(chain, e.To+"/"+e.Reason)
			if e.Actor == "" {
				t.Fatalf("transition without actor %+v", e)
			}
		}
		if e.Subject == "machine/"+a.ID && e.Kind == "step" {
			steps++
		}
	}
	if got := strings.Join(chain, ">"); got != "inspecting/inspection_started>available/inspection_passed>provisioning/build_started>provisioned/booted_local_disk" || steps != 11 {
		t.Fatalf("transitions %s, %d step events", got, steps)
	}
	jobs, err := s.ListJobs(a.ID)
	must(t, err)
	if len(jobs) != 2 {
		t.Fatalf("jobs %+v", jobs)
	}
	// An unknown MAC is discovered, inspected by its agent and becomes available.
	boot, err = h.c.BootFor(bg, "52:54:00:99:00:01")
	must(t, err)
	if boot.Action != BootDiscover || !h.c.VerifyAgentToken(boot.MachineID, boot.Token) {
		t.Fatalf("discover %+v", boot)
	}
	_, err = h.c.AgentRegister(bg, boot.MachineID, agentapi.Registration{Inventory: agentapi.Inventory{Serial: "D1", CPUs: 2,
		NICs: []agentapi.NIC{{Name: "eth0", MAC: "52:54:00:99:00:01"}, {Name: "eth1", MAC: "52:54:00:99:00:02"}}}})
	must(t, err)
	h.mustState(boot.MachineID, store.StateAvailable)
	if m, err := s.MachineByMAC("52:54:00:99:00:02"); err != nil || m.ID != boot.MachineID {
		t.Fatalf("discovered NIC not indexed: %v", err)
	}
}

// TestGradualPowerOnAndShutdown: a large registered hall is not powered on
// all at once (the queue is bounded), and stopping the controller closes
// every job it had queued as failed.
func TestGradualPowerOnAndShutdown(t *testing.T) {
	f := newStore(t)
	h := newHarness(t, f, func(c *Config) { c.Workers = 1 })
	h.bmc.gate = make(chan struct{})
	var b strings.Builder
	b.WriteString("name,macs\n")
	for i := 0; i < 30; i++ {
		fmt.Fprintf(&b, "g%02d,02:00:00:00:01:%02x\n", i, i)
	}
	res, err := h.c.Import(bg, strings.NewReader(b.String()), "csv", store.W{})
	must(t, err)
	for _, id := range res.IDs {
		_, err := h.c.EnrollBMC(bg, id, store.BMC{Address: "10.99.1.1", Username: "u"}, "p", store.W{})
		must(t, err)
	}
	ctx, cancel := context.WithCancel(bg)
	done := make(chan error, 1)
	go func() { done <- h.c.Run(ctx, nil) }()
	time.Sleep(200 * time.Millisecond) // ~10 ticks
	h.bmc.gate <- struct{}{}           // let one BMC call through
	time.Sleep(50 * time.Millisecond)
	jobs := allJobs(t, f)
	// 1 running sequence + at most Workers×queuePerWorker queued, 2 jobs each.
	if max := 2 * (1 + 1*queuePerWorker + 1); len(jobs) > max || len(jobs) < 4 {
		t.Fatalf("%d jobs created for 30 machines, want 4..%d", len(jobs), max)
	}
	cancel()
	must(t, <-done)
	for _, j := range allJobs(t, f) {
		if j.State != JobFailed && j.State != JobSucceeded {
			t.Fatalf("job %s left %s after shutdown", j.ID, j.State)
		}
	}
}

// buildThrough claims machine a and reports check..finalize succeeded, one
// second apart: a is then provisioning with its build complete.
func buildThrough(t *testing.T, h *harness, a store.Machine) {
	t.Helper()
	img := h.image("img-" + a.ID + ".raw")
	_, err := h.c.AgentRegister(bg, a.ID, agentapi.Registration{Inventory: inventory(a)})
	must(t, err)
	_, err = h.c.Provision(bg, a.ID, store.Claim{Image: img.ID}, store.W{Actor: "capi"})
	must(t, err)
	task, err := h.c.AgentTask(bg, a.ID)
	must(t, err)
	if task.Action != agentapi.ActionProvision {
		t.Fatalf("task %+v", task)
	}
	for _, step := range buildSteps[:5] {
		h.clk.Advance(time.Second)
		must(t, h.c.AgentReport(bg, a.ID, agentapi.Report{Step: step, State: agentapi.StateStarted}))
		must(t, h.c.AgentReport(bg, a.ID, agentapi.Report{Step: step, State: agentapi.StateSucceeded}))
	}
	if m := h.mustState(a.ID, store.StateProvisioning); m.Reason != ReasonBuildComplete {
		t.Fatalf("after finalize: reason %q", m.Reason)
	}
}

// TestRebootUnobserved: a built machine that boots its disk without
// netbooting first is moved to provisioned (reboot_unobserved, actor
// controller) by the loop once RebootTimeout has passed since the build
// completed — not failed, even when the reboot step's own deadline is
// shorter — and a later netboot still gets the local disk.
func TestRebootUnobserved(t *testing.T) {
	f := newStore(t)
	h := newHarness(t, f, func(c *Config) {
		c.RebootTimeout = 90 * time.Second
		c.StepDeadlines = map[string]time.Duration{"reboot": 30 * time.Second}
	})
	ms := importPlan(t, h)
	a, b := ms[0], ms[1]
	buildThrough(t, h, a)
	doneA := h.clk.Now()
	buildThrough(t, h, b)
	doneB := h.clk.Now() // doneA + 5 s
	h.clk.Advance(10 * time.Second)
	must(t, h.c.AgentReport(bg, a.ID, agentapi.Report{Step: agentapi.StepReboot, State: agentapi.StateStarted}))
	must(t, h.c.AgentReport(bg, b.ID, agentapi.Report{Step: agentapi.StepReboot, State: agentapi.StateSucceeded}))
	for _, id := range []string{a.ID, b.ID} {
		if m := h.mustState(id, store.StateProvisioning); m.Reason != ReasonBuildComplete || m.Step.Step != agentapi.StepReboot {
			t.Fatalf("after reboot report: reason %q step %+v", m.Reason, m.Step)
		}
	}
	to := func(t0 time.Time) { h.clk.Advance(t0.Sub(h.clk.Now())) }
	// Past the reboot step's deadline (30 s) but inside RebootTimeout (90 s).
	to(doneA.Add(89 * time.Second))
	must(t, h.c.Tick(bg))
	h.mustState(a.ID, store.StateProvisioning)
	h.mustState(b.ID, store.StateProvisioning)
	// RebootTimeout counts from each machine's own build completion.
	to(doneA.Add(91 * time.Second))
	must(t, h.c.Tick(bg))
	h.mustState(a.ID, store.StateProvisioned)
	h.mustState(b.ID, store.StateProvisioning)
	to(doneB.Add(91 * time.Second))
	must(t, h.c.Tick(bg))
	for _, id := range []string{a.ID, b.ID} {
		m := h.mustState(id, store.StateProvisioned)
		if m.Reason != ReasonRebootUnobserved || !strings.Contains(m.Message, "1m30s") || !m.Step.Deadline.IsZero() {
			t.Fatalf("unobserved: reason %q message %q step %+v", m.Reason, m.Message, m.Step)
		}
	}
	var got []string
	for _, ev := range allEvents(t, f) {
		if ev.Kind == "transition" && ev.To == string(store.StateProvisioned) {
			got = append(got, ev.From+">"+ev.To+" "+ev.Reason+" "+ev.Actor)
		}
	}
	want := "provisioning>provisioned reboot_unobserved controller"
	if len(got) != 2 || got[0] != want || got[1] != want {
		t.Fatalf("transitions %v", got)
	}
	if v := h.metric("kiln_lifecycle_transitions_total", "from", "provisioning", "to", "provisioned"); v != 2 {
		t.Fatalf("transitions metric %v", v)
	}
	// Far later the loop changes nothing; a netboot now is simply local.
	h.clk.Advance(3 * time.Hour)
	must(t, h.c.Tick(bg))
	n := len(allEvents(t, f))
	boot, err := h.c.BootFor(bg, "52:54:00:00:00:0a")
	must(t, err)
	if boot.Action != BootLocal || boot.Token != "" {
		t.Fatalf("boot %+v", boot)
	}
	if m := h.mustState(a.ID, store.StateProvisioned); m.Reason != ReasonRebootUnobserved || len(allEvents(t, f)) != n {
		t.Fatalf("late boot moved the record: %q, events %d→%d", m.Reason, n, len(allEvents(t, f)))
	}
}

// TestBuiltMachineBootsLocal: once the build completed, every netboot of
// the machine — even before the agent's reboot report, and with the loop
// past every step deadline — exits to the local disk; the first one makes
// it provisioned (booted_local_disk), so RebootTimeout never fires; a
// failed reboot report before the netboot fails the machine as usual.
func TestBuiltMachineBootsLocal(t *testing.T) {
	f := newStore(t)
	h := newHarness(t, f, nil)
	ms := importPlan(t, h)
	a, b := ms[0], ms[1]
	buildThrough(t, h, a)
	tokBefore := h.get(a.ID).BootTokenHash
	boot, err := h.c.BootFor(bg, "52:54:00:00:00:0A")
	must(t, err)
	if boot.Action != BootLocal || boot.Token != "" || boot.MachineID != a.ID {
		t.Fatalf("boot %+v", boot)
	}
	m := h.mustState(a.ID, store.StateProvisioned)
	if m.Reason != ReasonBootedLocalDisk || m.BootTokenHash != tokBefore {
		t.Fatalf("booted: reason %q token hash changed %v", m.Reason, m.BootTokenHash != tokBefore)
	}
	// The late reboot report is recorded but moves nothing.
	must(t, h.c.AgentReport(bg, a.ID, agentapi.Report{Step: agentapi.StepReboot, State: agentapi.StateStarted}))
	h.clk.Advance(DefaultRebootTimeout + DefaultStepDeadlines()["reboot"] + time.Minute)
	must(t, h.c.Tick(bg))
	if m := h.mustState(a.ID, store.StateProvisioned); m.Reason != ReasonBootedLocalDisk {
		t.Fatalf("after tick: reason %q", m.Reason)
	}
	n := 0
	for _, ev := range allEvents(t, f) {
		if ev.Kind == "transition" && ev.Subject == "machine/"+a.ID && ev.To == string(store.StateProvisioned) {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("%d provisioned transitions", n)
	}
	// b: the reboot itself fails before any netboot → failed with the reason.
	buildThrough(t, h, b)
	must(t, h.c.AgentReport(bg, b.ID, agentapi.Report{Step: agentapi.StepReboot, State: agentapi.StateFailed, Reason: agentapi.ReasonInternal}))
	if m := h.mustState(b.ID, store.StateFailed); m.Reason != string(agentapi.ReasonInternal) {
		t.Fatalf("reboot failed: reason %q", m.Reason)
	}
}

func TestRebootTimeoutConfig(t *testing.T) {
	c, err := New(Config{ImageBaseURL: "http://10.99.0.1"}, newStore(t), nil, nil)
	must(t, err)
	if c.cfg.RebootTimeout != DefaultRebootTimeout || DefaultRebootTimeout != 3*time.Minute {
		t.Fatalf("default %v", c.cfg.RebootTimeout)
	}
	if _, err := New(Config{ImageBaseURL: "http://10.99.0.1", RebootTimeout: -time.Second}, newStore(t), nil, nil); !errors.Is(err, ErrConfig) {
		t.Fatalf("negative RebootTimeout: %v", err)
	}
}
