package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"kiln/api/agentapi"
	"kiln/deploy/lab/testkit"
	"kiln/store"
)

// guardStore counts every write the store refused as an illegal
// transition: the controller must never request one.
type guardStore struct {
	*leaderFlag // the real store; leadership flaps are the walk's
	illegal     atomic.Int64
}

func (g *guardStore) PutMachine(ctx context.Context, m store.Machine, w store.W) (store.Machine, error) {
	out, err := g.Store.PutMachine(ctx, m, w)
	g.note(err)
	return out, err
}

func (g *guardStore) PutMachines(ctx context.Context, ms []store.Machine, w store.W) ([]store.Machine, error) {
	out, err := g.Store.PutMachines(ctx, ms, w)
	g.note(err)
	return out, err
}

func (g *guardStore) ReportAgent(ctx context.Context, m store.Machine, evs []store.Event, w store.W) (store.Machine, error) {
	out, err := g.Store.ReportAgent(ctx, m, evs, w)
	g.note(err)
	return out, err
}

func (g *guardStore) note(err error) {
	var ite *store.IllegalTransitionError
	if errors.As(err, &ite) {
		g.illegal.Add(1)
	}
}

// drain runs queued BMC sequences synchronously (the property test drives
// time and ordering itself instead of Run's workers).
func (c *Controller) drain(ctx context.Context) {
	for {
		w, ok, _ := c.jobs.pop()
		if !ok {
			return
		}
		c.runWork(ctx, w)
	}
}

// TestPropertyRandomEvents drives the controller with random sequences of
// agent registrations (matching or not), task polls, step reports with
// random steps/states/reasons, claims, releases, erases, inspections, boots
// of known and unknown MACs, BMC failures, leadership flaps and time jumps
// past deadlines. After every event it checks: no machine is in an invalid
// state; the store never refused a write as illegal; every machine's
// transition events form a legal chain from its creation to its current
// state; exactly one step event exists per accepted report; a netboot of
// a machine whose build completed gets the local disk and makes it
// provisioned (booted_local_disk); the
// transitions metric equals the transition events recorded; every BMC job
// ends succeeded or failed with a legal pending→running→end history.
func TestPropertyRandomEvents(t *testing.T) {
	seeds := []int64{1, 2, 3, 4, 5, 6}
	steps := 1000
	if testing.Short() {
		seeds, steps = seeds[:2], 500
	}
	reached := map[string]bool{}
	for _, seed := range seeds {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) { runProperty(t, seed, steps, reached) })
	}
	// Both ways a built machine becomes provisioned were taken (the short
	// walk is too short to be sure of both).
	for _, r := range []string{ReasonBootedLocalDisk, ReasonRebootUnobserved} {
		if !reached["provisioning>provisioned "+r] && !testing.Short() {
			t.Errorf("provisioning → provisioned (%s) never happened", r)
		}
	}
	// Every state was reached over the runs (the walk is not trivial).
	for _, s := range []store.MachineState{store.StateInspecting, store.StateAvailable, store.StateProvisioning,
		store.StateProvisioned, store.StateFailed, store.StateQuarantined, store.StateErasing} {
		if !reached[string(s)] {
			t.Errorf("state %s never reached", s)
		}
	}
}

func runProperty(t *testing.T, seed int64, n int, reached map[string]bool) {
	rng := rand.New(rand.NewSource(seed))
	g := &guardStore{leaderFlag: &leaderFlag{Store: newStore(t)}}
	h := newHarness(t, g, func(c *Config) {
		c.StepDeadlines = map[string]time.Duration{"write": 10 * time.Minute}
		c.BMCBackoff = time.Minute
		c.Rand = rng // deterministic tokens
	})
	c := h.c
	ms := importPlan(t, h)
	var plan strings.Builder
	plan.WriteString("name,serial,macs,cpus,disks\n")
	for i := 0; i < 6; i++ {
		fmt.Fprintf(&plan, "p%d,PS%d,02:00:00:00:00:%02x,4,1x10GB\n", i, i, i)
	}
	res, err := c.Import(bg, strings.NewReader(plan.String()), "csv", store.W{Actor: "test"})
	must(t, err)
	ids := append([]string{ms[0].ID, ms[1].ID}, res.IDs...)
	for i, id := range ids {
		if i%2 == 0 {
			_, err := c.EnrollBMC(bg, id, store.BMC{Address: "10.99.1.1", Username: "u"}, "p", store.W{})
			must(t, err)
		}
	}
	img := h.image("img.raw")
	created := map[string]store.MachineState{} // machine → state at creation
	for _, ev := range allEvents(t, g.Store) {
		if ev.Kind == "created" && strings.HasPrefix(ev.Subject, "machine/") {
			created[strings.TrimPrefix(ev.Subject, "machine/")] = store.MachineState(ev.To)
		}
	}
	acceptedReports := 0
	k := &checker{cur: map[string]store.MachineState{}, jobState: map[string]string{}}
	reasons := append([]agentapi.Reason{""}, agentapi.Reasons...)
	allSteps := append(append([]string{}, buildSteps...), agentapi.StepInspect, agentapi.StepErase, "bogus")
	states := []agentapi.State{agentapi.StateStarted, agentapi.StateRunning, agentapi.StateSucceeded, agentapi.StateFailed, "weird"}
	pick := func() string { return ids[rng.Intn(len(ids))] }
	macOf := func(id string) string {
		m := h.get(id)
		if len(m.Intended.NICs) == 0 {
			return "02:ff:00:00:00:01"
		}
		return m.Intended.NICs[0].MAC
	}

	for i := 0; i < n; i++ {
		id := pick()
		var op string
		switch r := rng.Intn(16); r {
		case 0, 1:
			op = "register"
			m := h.get(id)
			inv := inventory(m)
			if rng.Intn(4) == 0 {
				inv.Serial = "WRONG"
			}
			_, err = c.AgentRegister(bg, id, agentapi.Registration{Inventory: inv})
		case 2:
			op = "task"
			_, err = c.AgentTask(bg, id)
		case 3, 4, 5:
			op = "report"
			rep := agentapi.Report{Step: allSteps[rng.Intn(len(allSteps))], State: states[rng.Intn(len(states))],
				Reason: reasons[rng.Intn(len(reasons))], Message: "m\x00sg", Progress: rng.Float64()*1.4 - 0.2}
			if rng.Intn(2) == 0 { // a plausible report for the machine's state
				switch h.get(id).State {
				case store.StateProvisioning:
					rep.Step, rep.State, rep.Reason = buildSteps[rng.Intn(len(buildSteps))], agentapi.StateSucceeded, ""
				case store.StateErasing:
					rep.Step, rep.State, rep.Reason = agentapi.StepErase, agentapi.StateSucceeded, ""
				}
			}
			err = c.AgentReport(bg, id, rep)
			if err == nil {
				acceptedReports++
			} else if !errors.Is(err, ErrBadReport) {
				t.Fatalf("step %d report %+v: %v", i, rep, err)
			}
			err = nil
		case 6:
			op = "provision"
			_, err = c.Provision(bg, id, store.Claim{Image: img.ID, Role: "worker"}, store.W{Actor: "capi"})
		case 7:
			op = "claim"
			_, err = c.ClaimMachines(bg, "worker", nil, 1+rng.Intn(3), store.Claim{Image: img.ID}, store.W{Actor: "capi"})
		case 8:
			op = "release"
			_, err = c.Release(bg, id, store.W{Actor: "capi"})
		case 9:
			op = "erase"
			_, err = c.Erase(bg, id, store.W{Actor: "op"})
		case 10:
			op = "inspect"
			_, err = c.Inspect(bg, id, store.W{Actor: "op"})
		case 11:
			op = "time"
			if rng.Intn(5) == 0 { // sometimes far past every deadline
				h.clk.Advance(time.Duration(rng.Int63n(int64(90 * time.Minute))))
			} else {
				h.clk.Advance(time.Duration(rng.Int63n(int64(2 * time.Minute))))
			}
			err = c.Tick(bg)
		case 12:
			op = "bmc"
			kinds := []string{JobBootPXE, JobPowerCycle}
			if rng.Intn(2) == 0 {
				h.bmc.setFail(kinds[rng.Intn(2)], errors.New("bmc unreachable"))
			} else {
				h.bmc.setFail(kinds[rng.Intn(2)], nil)
			}
			c.drain(bg)
		case 13:
			op = "boot"
			if rng.Intn(2) == 0 { // half the time, a built machine's post-build netboot when there is one
				for _, x := range ids {
					if buildComplete(h.get(x)) {
						id = x
						break
					}
				}
			}
			mac := macOf(id)
			if rng.Intn(5) == 0 {
				mac = fmt.Sprintf("02:ee:00:00:%02x:%02x", rng.Intn(4), rng.Intn(4))
			}
			before, _ := g.GetMachine(id)
			heldBefore, _ := g.MachineByMAC(mac)
			var b Boot
			b, err = c.BootFor(bg, mac)
			if err == nil && mac == macOf(id) && buildComplete(before) {
				// A built machine's netboot: the local disk, and provisioned.
				if after := h.get(id); b.Action != BootLocal || b.Token != "" || after.State != store.StateProvisioned ||
					after.Reason != ReasonBootedLocalDisk {
					t.Fatalf("step %d: built machine %s boot %+v, now %s (%s)", i, id, b, after.State, after.Reason)
				}
			}
			if errors.Is(err, ErrAgentActive) {
				// A live agent keeps its token: nothing is written.
				if after, _ := g.MachineByMAC(mac); heldBefore.ID == "" || after.BootTokenHash != heldBefore.BootTokenHash || b != (Boot{}) {
					t.Fatalf("step %d: held boot of %s changed the token or answered %+v", i, mac, b)
				}
				err = nil
			}
			if err == nil && b.Action == BootDiscover {
				ids = append(ids, b.MachineID)
				created[b.MachineID] = store.StateDiscovered
			}
			if err == nil && b.Token != "" && !c.VerifyAgentToken(b.MachineID, b.Token) {
				t.Fatalf("step %d: fresh token does not verify", i)
			}
		case 14:
			op = "leader"
			g.setLeader(rng.Intn(4) != 0)
			c.drain(bg)
		case 15:
			op = "tick"
			err = c.Tick(bg)
			c.drain(bg)
		}
		// Operations may be refused (wrong state, not enough machines) but
		// only with the package's documented errors.
		if err != nil && !errors.Is(err, ErrWrongState) && !errors.Is(err, ErrNotEnough) {
			t.Fatalf("step %d %s %s: unexpected error %v", i, op, id, err)
		}
		k.check(t, i, op, g, c, h.reg, created, acceptedReports)
	}
	cnt := map[string]int{}
	for _, ev := range allEvents(t, g.Store) {
		if ev.Kind == "transition" {
			reached[ev.To] = true
			reached[ev.From+">"+ev.To+" "+ev.Reason] = true
			cnt[ev.From+">"+ev.To+" "+ev.Reason]++
		}
	}
	t.Logf("seed %d: %d accepted reports; transitions %v", seed, acceptedReports, cnt)
}

// checker replays the event log incrementally and checks the invariants.
type checker struct {
	after       uint64 // index of the last event consumed
	cur         map[string]store.MachineState
	steps       int
	transitions int
	jobState    map[string]string
}

func (k *checker) check(t *testing.T, i int, op string, g *guardStore, c *Controller, reg *prometheus.Registry, created map[string]store.MachineState, accepted int) {
	t.Helper()
	if n := g.illegal.Load(); n != 0 {
		t.Fatalf("step %d (%s): the store refused %d illegal transitions requested by the controller", i, op, n)
	}
	for id, s := range created {
		if _, ok := k.cur[id]; !ok {
			k.cur[id] = s
		}
	}
	evs := eventsAfter(t, g.Store, k.after)
	for _, ev := range evs {
		id := strings.TrimPrefix(ev.Subject, "machine/")
		switch ev.Kind {
		case "transition":
			k.transitions++
			from, to := store.MachineState(ev.From), store.MachineState(ev.To)
			if k.cur[id] != from || !store.CanTransition(from, to) || ev.Actor == "" || ev.Reason == "" {
				t.Fatalf("step %d (%s): machine %s event %s→%s (actor %q reason %q) but chain at %s", i, op, id, from, to, ev.Actor, ev.Reason, k.cur[id])
			}
			k.cur[id] = to
		case "step":
			k.steps++
		case "job":
			jid := strings.TrimPrefix(ev.Subject, "job/")
			prev := k.jobState[jid]
			ok := (prev == "" && ev.To == JobPending) || (prev == JobPending && (ev.To == JobRunning || ev.To == JobFailed)) ||
				(prev == JobRunning && (ev.To == JobSucceeded || ev.To == JobFailed))
			if !ok {
				t.Fatalf("step %d: job %s %s → %s", i, jid, prev, ev.To)
			}
			k.jobState[jid] = ev.To
		}
	}
	if len(evs) > 0 {
		k.after = evs[len(evs)-1].Index
	}
	if k.steps != accepted {
		t.Fatalf("step %d (%s): %d step events for %d accepted reports", i, op, k.steps, accepted)
	}
	if metric := testkit.Sample(t, reg, "kiln_lifecycle_transitions_total"); int(metric) != k.transitions {
		t.Fatalf("step %d (%s): metric counts %v transitions, events %d", i, op, metric, k.transitions)
	}
	for id, want := range k.cur {
		m, err := g.GetMachine(id)
		if err != nil {
			t.Fatal(err)
		}
		if !m.State.Valid() || m.State != want {
			t.Fatalf("step %d (%s): machine %s is %s, events say %s", i, op, id, m.State, want)
		}
		if m.State == store.StateProvisioning && (m.Claim == nil || m.Step == nil) {
			t.Fatalf("step %d: provisioning without claim/step: %+v", i, m)
		}
	}
	_, queued := c.jobs.state("")
	if queued == 0 {
		for jid, st := range k.jobState {
			if st != JobSucceeded && st != JobFailed {
				t.Fatalf("step %d: job %s left %s with an empty queue", i, jid, st)
			}
		}
	}
}
