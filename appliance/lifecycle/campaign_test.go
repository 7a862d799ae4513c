package lifecycle

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"kiln/api/agentapi"
	"kiln/appliance/lifecycle/waves"
	"kiln/store"
	"kiln/store/storetest"
)

// campFleet is 24 claimed, provisioned machines in 6 racks of 4, the
// racks' machines alternating between two claims (roles a and b, 12 each),
// over the real store — one local store, or a 3-node raft cluster with a
// controller on every node — with every agent and owner played in process
// (inspection, the gated build's reports, the erase, drain acks), as the
// fleet test does. The BMC is the harness's recording BMC.
type campFleet struct {
	t      *testing.T
	clk    *clock
	nodes  []*campNode
	lead   int // the node whose controller ticks (the raft leader)
	rack   map[string]string
	role   map[string]string
	ids    []string
	img    store.Image
	newImg store.Image
	// failBuild: the machine's next build fails at the write step.
	failBuild map[string]bool
}

type campNode struct {
	st   *store.Store
	h    *harness
	stop context.CancelFunc
	wg   sync.WaitGroup
}

func newCampFleet(t *testing.T, stores []*store.Store, lead int, mod ...func(*Config)) *campFleet {
	clk := &clock{t: time.Date(2026, 12, 2, 8, 0, 0, 0, time.UTC)}
	f := &campFleet{t: t, clk: clk, lead: lead, rack: map[string]string{}, role: map[string]string{}, failBuild: map[string]bool{}}
	for _, st := range stores {
		h := newHarness(t, st, func(c *Config) {
			c.Inspection = InspectManual
			c.Workers = 4
			c.Now = clk.Now
			c.Remediation = RemediationConfig{PowerCycleTimeout: 5 * time.Minute, ReinspectTimeout: 10 * time.Minute,
				ReprovisionTimeout: 15 * time.Minute, Settle: time.Minute, DrainTimeout: 5 * time.Minute}
			for _, m := range mod {
				m(c)
			}
		})
		h.clk = clk
		n := &campNode{st: st, h: h}
		ctx, cancel := context.WithCancel(context.Background())
		n.stop = cancel
		for i := 0; i < h.c.cfg.Workers; i++ {
			n.wg.Add(1)
			go func() { defer n.wg.Done(); h.c.worker(ctx) }()
		}
		f.nodes = append(f.nodes, n)
		t.Cleanup(f.stopNode(len(f.nodes) - 1))
	}
	st := f.st()
	f.img, f.newImg = f.h().image("os-1.raw"), f.h().image("os-2.raw")
	var ms []store.Machine
	for i := 0; i < 24; i++ {
		mac := fmt.Sprintf("52:54:17:00:00:%02x", i)
		ms = append(ms, store.Machine{Meta: store.Meta{ID: fmt.Sprintf("m-%02d", i)}, Name: fmt.Sprintf("c%02d", i),
			Rack: fmt.Sprintf("rack-%d", i/4+1), BMC: "bmc", Labels: map[string]string{"pool": "web"},
			Intended: store.Hardware{Serial: fmt.Sprintf("CS%02d", i), CPUs: 8, MemoryBytes: 32 << 30, NICs: []store.NIC{{MAC: mac}}}})
	}
	out, err := st.PutMachines(bg, ms, store.W{Actor: "test", Reason: "setup"})
	must(t, err)
	for _, s := range []store.MachineState{store.StateInspecting, store.StateAvailable, store.StateProvisioning, store.StateProvisioned} {
		for i := range out {
			out[i].State = s
			if s == store.StateInspecting {
				d := out[i].Intended
				d.MemoryBytes -= d.MemoryBytes / 50
				out[i].Discovered = &d
			}
			if s == store.StateProvisioning {
				role := []string{"a", "b"}[i%2]
				out[i].Claim = &store.Claim{Image: f.img.ID, Role: role, Selector: map[string]string{"pool": "web"}}
			}
		}
		out, err = st.PutMachines(bg, out, store.W{Actor: "test", Reason: "setup"})
		must(t, err)
	}
	for _, m := range out {
		f.ids = append(f.ids, m.ID)
		f.rack[m.ID], f.role[m.ID] = m.Rack, m.Claim.Role
	}
	return f
}

func (f *campFleet) stopNode(i int) func() {
	return func() {
		n := f.nodes[i]
		if n.stop == nil {
			return
		}
		n.stop()
		n.h.c.jobs.signal()
		n.wg.Wait()
		n.stop = nil
	}
}

func (f *campFleet) h() *harness      { return f.nodes[f.lead].h }
func (f *campFleet) c() *Controller   { return f.nodes[f.lead].h.c }
func (f *campFleet) st() *store.Store { return f.nodes[f.lead].st }

// play runs every agent and owner once, through the leading node.
func (f *campFleet) play() {
	t := f.t
	c := f.c()
	all, err := c.listAll(store.ListOptions{})
	must(t, err)
	for _, m := range all {
		switch {
		case m.State == store.StateInspecting && m.Step != nil && m.Step.State == stepPending:
			_, err := c.AgentRegister(bg, m.ID, agentapi.Registration{Inventory: inventory(m)})
			must(t, err)
			if cur, _ := f.st().GetMachine(m.ID); cur.State == store.StateProvisioning {
				f.build(cur)
			}
		case m.State == store.StateAvailable && m.Claim != nil,
			m.State == store.StateProvisioning && m.Step != nil && m.Step.State == stepPending && !buildComplete(m):
			f.build(m)
		case m.State == store.StateErasing && m.Step != nil && m.Step.State == stepPending:
			task, err := c.AgentTask(bg, m.ID)
			must(t, err)
			if task.Action == agentapi.ActionErase {
				must(t, c.AgentReport(bg, m.ID, agentapi.Report{Step: agentapi.StepErase, State: agentapi.StateStarted}))
				must(t, c.AgentReport(bg, m.ID, agentapi.Report{Step: agentapi.StepErase, State: agentapi.StateSucceeded}))
			}
		}
		if m.Drain != nil && m.Drain.Acked.IsZero() && (active(m) && m.Remediation.Step == StepDrain || strings.HasPrefix(m.Drain.Step, "campaign/")) {
			_, err := c.DrainAck(bg, m.ID, store.W{Actor: "owner"})
			must(t, err)
		}
	}
}

// build is the agent's side of one gated build; a machine in failBuild
// fails its write step (once).
func (f *campFleet) build(m store.Machine) {
	t := f.t
	c := f.c()
	task, err := c.AgentTask(bg, m.ID)
	must(t, err)
	if task.Action != agentapi.ActionProvision {
		return
	}
	for _, s := range buildSteps[:len(buildSteps)-1] {
		must(t, c.AgentReport(bg, m.ID, agentapi.Report{Step: s, State: agentapi.StateStarted, Attempt: task.Attempt}))
		if s == agentapi.StepWrite && f.failBuild[m.ID] {
			delete(f.failBuild, m.ID)
			must(t, c.AgentReport(bg, m.ID, agentapi.Report{Step: s, State: agentapi.StateFailed, Attempt: task.Attempt,
				Reason: agentapi.ReasonWriteFailed, Message: "injected: the disk refused the write"}))
			return
		}
		must(t, c.AgentReport(bg, m.ID, agentapi.Report{Step: s, State: agentapi.StateSucceeded, Attempt: task.Attempt}))
	}
	_, err = c.BootFor(bg, m.Intended.NICs[0].MAC)
	must(t, err)
}

// step advances the clock by d, ticks the leader, waits for its BMC
// queue and plays every agent and owner.
func (f *campFleet) step(d time.Duration) {
	f.clk.Advance(d)
	if err := f.c().Tick(bg); err != nil {
		f.t.Fatalf("tick: %v", err)
	}
	h := f.h()
	deadline := time.Now().Add(20 * time.Second)
	for {
		h.c.jobs.mu.Lock()
		n := len(h.c.jobs.inflight)
		h.c.jobs.mu.Unlock()
		h.c.campApply.mu.Lock()
		n += len(h.c.campApply.running)
		h.c.campApply.mu.Unlock()
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			f.t.Fatal("BMC queue never drained")
		}
		time.Sleep(2 * time.Millisecond)
	}
	f.play()
}

// runUntil steps every 20 s until done says so (or 400 steps, fatal).
func (f *campFleet) runUntil(id string, done func(store.Campaign) bool) store.Campaign {
	for i := 0; i < 400; i++ {
		f.step(20 * time.Second)
		camp, err := f.st().GetCampaign(id)
		must(f.t, err)
		if done(camp) {
			return camp
		}
	}
	camp, _ := f.st().GetCampaign(id)
	f.t.Fatalf("campaign never finished: %s wave %d/%d %s", camp.State, camp.Wave, camp.Waves, campaignSummary(camp))
	return camp
}

func settled(camp store.Campaign) bool {
	if camp.State == store.CampaignCompleted {
		return true
	}
	if camp.State != store.CampaignHalted {
		return false
	}
	for _, m := range camp.Machines {
		if m.State == store.CampaignMachineActive {
			return false
		}
	}
	return true
}

// outAt replays the event history after index from and checks, after
// every event, that no claim and no rack has more machines out than the
// limits allow. A machine is out from its transition away from
// provisioned until its transition back (the machine's own events), and
// from its campaign_machine event to active until the one that ends it
// (the campaign's events): the union is checked. It returns the peaks.
func (f *campFleet) checkLimits(from uint64, l store.CampaignLimits) (peakClaim, peakRack int) {
	t := f.t
	outM, outC := map[string]bool{}, map[string]bool{}
	capOf := (waves.Limits{ClusterPercent: l.ClusterPercent}).GroupCap(12)
	for _, ev := range eventsAfter(t, f.st(), from) {
		switch {
		case strings.HasPrefix(ev.Subject, "machine/") && ev.Kind == "transition":
			id := strings.TrimPrefix(ev.Subject, "machine/")
			if ev.From == string(store.StateProvisioned) {
				outM[id] = true
			}
			if ev.To == string(store.StateProvisioned) {
				outM[id] = false
			}
		case strings.HasPrefix(ev.Subject, "campaign/") && ev.Kind == "campaign_machine":
			var id string
			fmt.Sscanf(ev.Message, "machine=%s", &id)
			if f.rack[id] == "" {
				t.Fatalf("campaign event names machine %q: %s", id, ev.Message)
			}
			outC[id] = ev.To == store.CampaignMachineActive
		default:
			continue
		}
		byRole, byRack := map[string]int{}, map[string]int{}
		for _, id := range f.ids {
			if outM[id] || outC[id] {
				byRole[f.role[id]]++
				byRack[f.rack[id]]++
			}
		}
		for r, n := range byRole {
			if n > capOf {
				t.Fatalf("event %d (%s %s %s→%s): %d machines of claim %s out, limit %d", ev.Index, ev.Subject, ev.Kind, ev.From, ev.To, n, r, capOf)
			}
			peakClaim = max(peakClaim, n)
		}
		for r, n := range byRack {
			if n > l.PerRack {
				t.Fatalf("event %d (%s %s %s→%s): %d machines of %s out, limit %d", ev.Index, ev.Subject, ev.Kind, ev.From, ev.To, n, r, l.PerRack)
			}
			peakRack = max(peakRack, n)
		}
	}
	return peakClaim, peakRack
}

func (f *campFleet) create(name string, l store.CampaignLimits) store.Campaign {
	camp, err := f.c().CreateCampaign(bg, CampaignSpec{Name: name, Action: store.CampaignActionOSImage, Image: f.newImg.ID,
		Selector: store.CampaignSelector{Labels: map[string]string{"pool": "web"}}, Limits: l}, store.W{Actor: "api:alice"})
	must(f.t, err)
	if len(camp.Machines) != 24 || camp.State != store.CampaignPlanned {
		f.t.Fatalf("created %+v", camp)
	}
	return camp
}

func lastIndex(t *testing.T, st *store.Store) uint64 {
	evs := allEvents(t, st)
	if len(evs) == 0 {
		return 0
	}
	return evs[len(evs)-1].Index
}

// The os_image campaign over 24 machines: every machine is reprovisioned
// on the new image (drained first), and at no instant of the event
// history are more than the limits out — with the defaults (5 % of a
// 12-machine claim rounds to 0, so 1 per claim: 12 waves) and with 50 %
// of a claim, where the 2-per-rack limit binds (2 waves of 12, each rack
// at 2). The plan's waves are what the campaign took.
func TestCampaignWavesKeepLimits(t *testing.T) {
	for _, tc := range []struct {
		name               string
		limits             store.CampaignLimits
		waves, claim, rack int
	}{
		{"defaults", store.CampaignLimits{}, 12, 1, 2},
		{"half-claim", store.CampaignLimits{ClusterPercent: 50}, 2, 6, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newCampFleet(t, []*store.Store{newStore(t)}, 0)
			camp := f.create("os-2-"+tc.name, tc.limits)
			if camp.Waves != tc.waves {
				t.Fatalf("plan: %d waves, want %d", camp.Waves, tc.waves)
			}
			from := lastIndex(t, f.st())
			_, err := f.c().StartCampaign(bg, camp.ID, store.W{Actor: "api:alice"})
			must(t, err)
			camp = f.runUntil(camp.ID, settled)
			if camp.State != store.CampaignCompleted || camp.Failures != 0 {
				t.Fatalf("campaign %s: %s", camp.State, campaignSummary(camp))
			}
			for _, id := range f.ids {
				m := f.h().get(id)
				if m.State != store.StateProvisioned || m.Claim.Image != f.newImg.ID || m.Remediation == nil ||
					m.Remediation.Outcome != OutcomeRemediated || len(m.Remediation.History) == 0 || m.Remediation.History[0].Step != StepDrain {
					t.Fatalf("machine %s after the campaign: %s image %s %+v", id, m.State, m.Claim.Image, m.Remediation)
				}
			}
			peakClaim, peakRack := f.checkLimits(from, camp.Limits)
			if peakClaim != tc.claim || peakRack != tc.rack {
				t.Fatalf("peaks: claim %d rack %d, want %d %d", peakClaim, peakRack, tc.claim, tc.rack)
			}
			// The plan now measures this site's steps.
			p, err := f.c().PlanCampaign(CampaignSpec{Name: "again", Action: store.CampaignActionOSImage, Image: f.img.ID})
			must(t, err)
			for _, s := range p.Steps {
				if !strings.HasPrefix(s.Source, "measured: median of the last 24") {
					t.Fatalf("step %+v not measured", s)
				}
			}
		})
	}
}

// An injected failure (one machine's build fails at the write step) halts
// the campaign (max_failures 0): the halt is an event and the gauge, and
// no machine that was not out at the halt is touched afterwards, through
// an hour of ticks. Resume goes on with the next machines.
func TestCampaignHaltsOnFailure(t *testing.T) {
	f := newCampFleet(t, []*store.Store{newStore(t)}, 0)
	camp := f.create("os-2", store.CampaignLimits{ClusterPercent: 50})
	// The failing machine is in the second wave: the first completes.
	var victim string
	for _, m := range camp.Machines {
		if m.Wave == 2 {
			victim = m.ID
			break
		}
	}
	f.failBuild[victim] = true
	_, err := f.c().StartCampaign(bg, camp.ID, store.W{Actor: "api:alice"})
	must(t, err)
	camp = f.runUntil(camp.ID, func(c store.Campaign) bool { return c.State == store.CampaignHalted })
	if camp.Reason != ReasonCampaignFailures || camp.Failures != 1 {
		t.Fatalf("halt: %s %s %d", camp.Reason, camp.Message, camp.Failures)
	}
	haltAt := lastIndex(t, f.st())
	var haltEv bool
	for _, ev := range allEvents(t, f.st()) {
		if ev.Subject == "campaign/"+camp.ID && ev.Kind == "campaign_halted" && ev.Reason == ReasonCampaignFailures {
			haltEv = true
		}
	}
	if !haltEv {
		t.Fatal("no campaign_halted event")
	}
	if v := gaugeValue(t, f.h(), "kiln_campaign_halted", "os-2"); v != 1 {
		t.Fatalf("kiln_campaign_halted = %v", v)
	}
	out := map[string]bool{}
	for _, m := range camp.Machines {
		if m.State == store.CampaignMachineActive || m.ID == victim {
			out[m.ID] = true
		}
	}
	for i := 0; i < 180; i++ {
		f.step(20 * time.Second)
	}
	for _, ev := range eventsAfter(t, f.st(), haltAt) {
		id, ok := strings.CutPrefix(ev.Subject, "machine/")
		if ok && !out[id] {
			t.Fatalf("machine %s touched after the halt: %s %s→%s %s", id, ev.Kind, ev.From, ev.To, ev.Reason)
		}
		if ev.Kind == "campaign_machine" && ev.To == store.CampaignMachineActive {
			t.Fatalf("a machine started after the halt: %s", ev.Message)
		}
	}
	if m := f.h().get(victim); m.State != store.StateRMA {
		t.Fatalf("victim %s", m.State)
	}
	f.checkLimits(0, camp.Limits)
	// Resume: the rest of the campaign runs; the failed machine is not tried again.
	_, err = f.c().ResumeCampaign(bg, camp.ID, store.W{Actor: "api:alice"})
	must(t, err)
	camp = f.runUntil(camp.ID, settled)
	n := map[string]int{}
	for _, m := range camp.Machines {
		n[m.State]++
	}
	if camp.State != store.CampaignCompleted || n[store.CampaignMachineFailed] != 1 || n[store.CampaignMachineDone] != 23 {
		t.Fatalf("after resume: %s %v", camp.State, n)
	}
	if v := gaugeValue(t, f.h(), "kiln_campaign_halted", "os-2"); v != 0 {
		t.Fatalf("kiln_campaign_halted after resume = %v", v)
	}
}

// A leader failover in the middle of a campaign (3-node raft cluster, a
// controller on each node): the leader's node stops while its first wave
// is out; the new leader's controller resumes from the campaign record
// alone, finishes, and the limits held throughout the history (the
// default limits: 1 of each 12-machine claim at once).
func TestCampaignResumesOnNewLeader(t *testing.T) {
	cl := storetest.NewCluster(t, 3)
	lead := cl.Leader()
	stores := make([]*store.Store, 3)
	for i, n := range cl.Nodes {
		stores[i] = n.Store
	}
	f := newCampFleet(t, stores, lead)
	camp := f.create("os-2", store.CampaignLimits{})
	from := lastIndex(t, f.st())
	_, err := f.c().StartCampaign(bg, camp.ID, store.W{Actor: "api:alice"})
	must(t, err)
	// Until the fourth wave's machines are out in the middle of their
	// reprovision run (the leader's node then stops).
	camp = f.runUntil(camp.ID, func(c store.Campaign) bool {
		if c.Wave < 4 {
			return false
		}
		for _, m := range c.Machines {
			if m.State == store.CampaignMachineActive {
				if x, _ := f.st().GetMachine(m.ID); active(x) {
					return true
				}
			}
		}
		return false
	})
	old := lead
	f.stopNode(old)()
	cl.Stop(old)
	lead = cl.Leader()
	if lead == old {
		t.Fatal("no new leader")
	}
	f.lead = lead
	camp = f.runUntil(camp.ID, settled)
	if camp.State != store.CampaignCompleted || camp.Failures != 0 {
		t.Fatalf("after failover: %s %s", camp.State, campaignSummary(camp))
	}
	for _, id := range f.ids {
		if m := f.h().get(id); m.State != store.StateProvisioned || m.Claim.Image != f.newImg.ID {
			t.Fatalf("machine %s: %s %s", id, m.State, m.Claim.Image)
		}
	}
	// The new leader's writes are in the history, and the limits held.
	var newLeader bool
	for _, ev := range eventsAfter(t, f.st(), from) {
		if ev.Subject == "campaign/"+camp.ID && ev.Kind == "campaign_completed" {
			newLeader = true
		}
	}
	if !newLeader {
		t.Fatal("no campaign_completed event")
	}
	peakClaim, peakRack := f.checkLimits(from, camp.Limits)
	if peakClaim != 1 || peakRack != 2 {
		t.Fatalf("peaks %d %d", peakClaim, peakRack)
	}
}

// gaugeValue reads metric name{campaign=label} from h's registry.
func gaugeValue(t *testing.T, h *harness, name, label string) float64 {
	t.Helper()
	mfs, err := h.reg.Gather()
	must(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "campaign" && lp.GetValue() == label {
					return m.GetGauge().GetValue()
				}
			}
		}
	}
	t.Fatalf("no %s{campaign=%q}", name, label)
	return 0
}

// fwApplier stands in for the appliance's adapter over kiln/bmc's
// firmware methods (r17bmc's UpdateFirmware / SetBIOSAttributes against
// the vbmc's UpdateService): it records each call, how many run at once
// per rack and claim, and fails the machines in fail.
type fwApplier struct {
	f     *campFleet
	mu    sync.Mutex
	calls []string
	now   map[string]int // rack or claim → calls running
	peak  map[string]int
	fail  map[string]bool
}

func (a *fwApplier) apply(id, what string) error {
	a.mu.Lock()
	a.calls = append(a.calls, id+" "+what)
	for _, k := range []string{"rack:" + a.f.rack[id], "claim:" + a.f.role[id]} {
		a.now[k]++
		a.peak[k] = max(a.peak[k], a.now[k])
	}
	fail := a.fail[id]
	a.mu.Unlock()
	time.Sleep(5 * time.Millisecond) // the BMC's task
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, k := range []string{"rack:" + a.f.rack[id], "claim:" + a.f.role[id]} {
		a.now[k]--
	}
	if fail {
		return fmt.Errorf("UpdateService task ended Exception: image rejected")
	}
	return nil
}

func (a *fwApplier) ApplyFirmware(_ context.Context, id, baseline string) error {
	return a.apply(id, "firmware "+baseline)
}
func (a *fwApplier) ApplyBIOS(_ context.Context, id string, attrs map[string]string) error {
	return a.apply(id, fmt.Sprint("bios ", attrs))
}

// A firmware campaign through FirmwareApplier: each machine is drained
// (the owner acks), its firmware applied once, judged after the settle
// time, its drain dropped; the limits hold in the history and in the
// calls running at once; a failed apply halts the campaign.
func TestCampaignFirmwareThroughApplier(t *testing.T) {
	a := &fwApplier{now: map[string]int{}, peak: map[string]int{}, fail: map[string]bool{}}
	f := newCampFleet(t, []*store.Store{newStore(t)}, 0, func(c *Config) { c.Firmware = a })
	a.f = f
	camp, err := f.c().CreateCampaign(bg, CampaignSpec{Name: "bios-2.1", Action: store.CampaignActionFirmware, Baseline: "r650-2026-12",
		Selector: store.CampaignSelector{Claims: []string{"a", "b"}}, Limits: store.CampaignLimits{ClusterPercent: 50}}, store.W{Actor: "api:alice"})
	must(t, err)
	from := lastIndex(t, f.st())
	_, err = f.c().StartCampaign(bg, camp.ID, store.W{Actor: "api:alice"})
	must(t, err)
	camp = f.runUntil(camp.ID, settled)
	if camp.State != store.CampaignCompleted || len(a.calls) != 24 {
		t.Fatalf("%s %s, %d calls", camp.State, campaignSummary(camp), len(a.calls))
	}
	for _, id := range f.ids {
		if m := f.h().get(id); m.Drain != nil || m.State != store.StateProvisioned {
			t.Fatalf("machine %s after: %s drain %+v", id, m.State, m.Drain)
		}
	}
	var acks int
	for _, ev := range eventsAfter(t, f.st(), from) {
		if strings.HasPrefix(ev.Subject, "machine/") && ev.Reason == ReasonDrainAcked {
			acks++
		}
	}
	if acks != 24 {
		t.Fatalf("%d drain acks", acks)
	}
	peakClaim, peakRack := f.checkLimits(from, camp.Limits)
	if peakClaim != 6 || peakRack != 2 {
		t.Fatalf("history peaks %d %d", peakClaim, peakRack)
	}
	for k, n := range a.peak {
		if (strings.HasPrefix(k, "rack:") && n > 2) || n > 6 {
			t.Fatalf("%s: %d applies at once", k, n)
		}
	}
	// A failing apply halts the next campaign.
	a.fail[f.ids[5]] = true
	camp, err = f.c().CreateCampaign(bg, CampaignSpec{Name: "bios-attrs", Action: store.CampaignActionBIOS, BIOS: map[string]string{"SriovGlobalEnable": "Enabled"},
		Selector: store.CampaignSelector{Racks: []string{"rack-2", "rack-3"}}}, store.W{Actor: "api:alice"})
	must(t, err)
	_, err = f.c().StartCampaign(bg, camp.ID, store.W{Actor: "api:alice"})
	must(t, err)
	camp = f.runUntil(camp.ID, settled)
	if camp.State != store.CampaignHalted || camp.Failures != 1 || !strings.Contains(camp.Message, "1 machines failed") {
		t.Fatalf("%s %s", camp.State, camp.Message)
	}
	for _, m := range camp.Machines {
		if m.ID == f.ids[5] && (m.State != store.CampaignMachineFailed || !strings.Contains(m.Why, "image rejected")) {
			t.Fatalf("victim %+v", m)
		}
	}
}
