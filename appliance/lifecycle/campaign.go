// Campaigns (issue 17; DESIGN.md "Campaigns"): a change — an OS image, a
// firmware baseline, BIOS settings — rolled over the machines a selector
// picks, in waves that keep to the limits (at most ClusterPercent of any
// claim's machines and PerRack of one rack out of service at once), each
// wave gated on the previous one's machines being healthy again, halted
// when failures pass the threshold. The whole state is the store's
// campaign record (command 36), so the leader's next tick — this node's or
// a new leader's — takes it up where it was.

package lifecycle

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"sort"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"kiln/appliance/lifecycle/rules"
	"kiln/appliance/lifecycle/waves"
	"kiln/store"
)

// ActorCampaign is the actor of every write the campaign controller makes.
const ActorCampaign = "campaign"

// Reasons of campaign writes (on the campaign record and on the machines).
const (
	ReasonCampaignCreated   = "campaign_created"
	ReasonCampaignStarted   = "campaign_started"
	ReasonCampaignWave      = "campaign_wave"
	ReasonCampaignMachine   = "campaign_machine"
	ReasonCampaignFailures  = "campaign_failures" // halted: failures above the threshold
	ReasonCampaignHalted    = "campaign_halted"   // halted by an operator
	ReasonCampaignResumed   = "campaign_resumed"
	ReasonCampaignCompleted = "campaign_completed"
)

// CampaignAction is one kind of change, as the controller drives it on one
// machine: Start takes the machine out of service and begins the change
// (a drain first, DESIGN.md "Drain"); Judge tells, on every tick, whether
// the change is still running on the machine (CampaignMachineActive),
// done and the machine healthy again, or failed (with why). Both are
// called on the leader only and must be safe to call again after a
// failover (Start of a machine whose change already began changes
// nothing).
type CampaignAction interface {
	Start(ctx context.Context, c *Controller, camp store.Campaign, cm store.CampaignMachine, m store.Machine) error
	Judge(c *Controller, camp store.Campaign, cm store.CampaignMachine, m store.Machine) (state, why string)
}

// FirmwareApplier is what the firmware and bios actions need from the
// BMC side: kiln/bmc's Controller methods (UpdateFirmware through Redfish
// UpdateService, following the task; SetBIOSAttributes through the
// settings resource, applied on reset) behind the appliance's adapter by
// machine ID. Each call returns when the change is applied and read back,
// or fails (bmc.ErrUnsupported for an IPMI-only BMC). Config.Firmware; nil:
// firmware and bios campaigns are refused at create.
type FirmwareApplier interface {
	ApplyFirmware(ctx context.Context, machineID, baseline string) error
	ApplyBIOS(ctx context.Context, machineID string, attrs map[string]string) error
}

// campaignAction is the action of camp.
func (c *Controller) campaignAction(action string) (CampaignAction, error) {
	switch action {
	case store.CampaignActionOSImage:
		return osImageAction{}, nil
	case store.CampaignActionFirmware, store.CampaignActionBIOS:
		if c.firmwareApplier() == nil {
			return nil, fmt.Errorf("%w: action %s: no firmware applier is wired into this appliance (Config.Firmware)", ErrInvalid, action)
		}
		return bmcAction{kind: action}, nil
	}
	return nil, fmt.Errorf("%w: action %q: want os_image, firmware or bios", ErrInvalid, action)
}

// CampaignSpec is a campaign to plan or create.
type CampaignSpec struct {
	Name     string
	Action   string
	Image    string
	Baseline string
	BIOS     map[string]string
	Selector store.CampaignSelector
	Limits   store.CampaignLimits
	// MaxParallel bounds a site's machines at once in the plan only.
	MaxParallel int
}

// campMetrics are the campaign metrics (names shared with the alert rule,
// deploy/prometheus/kiln-alerts.yml).
type campMetrics struct {
	halted   *prometheus.GaugeVec
	machines *prometheus.GaugeVec
}

func newCampMetrics(reg *prometheus.Registry) (*campMetrics, error) {
	m := &campMetrics{
		halted: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "kiln_campaign_halted",
			Help: "1 while the campaign (by name) is halted: failures passed its threshold or an operator halted it; no machine is started until `kiln campaign resume`.",
		}, []string{"campaign"}),
		machines: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "kiln_campaign_machines",
			Help: "Machines of each running or halted campaign by campaign state (pending|active|done|failed|skipped).",
		}, []string{"campaign", "state"}),
	}
	if reg == nil {
		return m, nil
	}
	for _, x := range []prometheus.Collector{m.halted, m.machines} {
		if err := reg.Register(x); err != nil {
			return nil, err
		}
	}
	return m, nil
}

func (c *Controller) exportCampaign(camp store.Campaign) {
	v := 0.0
	if camp.State == store.CampaignHalted {
		v = 1
	}
	c.cm.halted.WithLabelValues(camp.Name).Set(v)
	n := map[string]int{}
	for _, m := range camp.Machines {
		n[m.State]++
	}
	for _, s := range []string{store.CampaignMachinePending, store.CampaignMachineActive, store.CampaignMachineDone,
		store.CampaignMachineFailed, store.CampaignMachineSkipped} {
		c.cm.machines.WithLabelValues(camp.Name, s).Set(float64(n[s]))
	}
}

// groupOf is the claim role a machine's out-of-service share counts
// against: its claim's, or the claim its repair run holds for a spare.
func groupOf(m store.Machine) string {
	if m.Claim != nil {
		return m.Claim.Role
	}
	if m.Remediation != nil && m.Remediation.Claim != nil {
		return m.Remediation.Claim.Role
	}
	return ""
}

// inService reports whether m is in service: provisioned, no repair run,
// no drain asked, nothing Critical. Everything else is out (the limits
// count it, whoever took it out).
func inService(m store.Machine) bool {
	return m.State == store.StateProvisioned && !active(m) && m.Drain == nil && len(criticalConditions(m)) == 0
}

// ready reports whether a campaign may take m now: provisioned (in
// service) or available (unclaimed: the bmc changes), no repair run, no
// drain, nothing Critical.
func ready(m store.Machine) bool {
	return (m.State == store.StateProvisioned || m.State == store.StateAvailable) && !active(m) && m.Drain == nil && len(criticalConditions(m)) == 0
}

// selects reports whether sel picks m.
func selects(sel store.CampaignSelector, m store.Machine) bool {
	for k, v := range sel.Labels {
		if m.Labels[k] != v {
			return false
		}
	}
	in := func(list []string, v string) bool {
		if len(list) == 0 {
			return true
		}
		for _, x := range list {
			if x == v {
				return true
			}
		}
		return false
	}
	return in(sel.Claims, groupOf(m)) && in(sel.Racks, m.Rack) && in(sel.Sites, m.Site)
}

func campaignLimits(l store.CampaignLimits) store.CampaignLimits {
	if l.ClusterPercent <= 0 {
		l.ClusterPercent = waves.DefaultClusterPercent
	}
	if l.PerRack <= 0 {
		l.PerRack = waves.DefaultPerRack
	}
	return l
}

func (c *Controller) checkSpec(s *CampaignSpec) error {
	if err := rules.CheckText(s.Name, 63); err != nil || s.Name == "" {
		return fmt.Errorf("%w: name: 1–63 printable characters", ErrInvalid)
	}
	if s.Limits.ClusterPercent < 0 || s.Limits.ClusterPercent > 100 || s.Limits.PerRack < 0 || s.Limits.MaxFailures < 0 || s.MaxParallel < 0 {
		return fmt.Errorf("%w: limits: cluster_percent 0–100, per_rack, max_failures and max_parallel not negative", ErrInvalid)
	}
	if _, err := c.campaignAction(s.Action); err != nil {
		return err
	}
	switch s.Action {
	case store.CampaignActionOSImage:
		if s.Image == "" {
			return fmt.Errorf("%w: os_image needs image", ErrInvalid)
		}
		if _, err := c.st.GetImage(s.Image); err != nil {
			return fmt.Errorf("%w: image %s: %v", ErrInvalid, s.Image, err)
		}
	case store.CampaignActionFirmware:
		if s.Baseline == "" {
			return fmt.Errorf("%w: firmware needs baseline", ErrInvalid)
		}
	case store.CampaignActionBIOS:
		if len(s.BIOS) == 0 {
			return fmt.Errorf("%w: bios needs attributes", ErrInvalid)
		}
	}
	s.Limits = campaignLimits(s.Limits)
	return nil
}

// selection is the machines spec picks — provisioned or available ones;
// os_image: only claimed ones — and the size of every claim role.
func (c *Controller) selection(spec CampaignSpec) ([]store.Machine, map[string]int, error) {
	all, err := c.listAll(store.ListOptions{})
	if err != nil {
		return nil, nil, err
	}
	size := map[string]int{}
	var out []store.Machine
	for _, m := range all {
		g := groupOf(m)
		if g != "" {
			size[m.Site+"/"+g]++
		}
		if (m.State != store.StateProvisioned && m.State != store.StateAvailable) || !selects(spec.Selector, m) {
			continue
		}
		if spec.Action == store.CampaignActionOSImage && g == "" {
			continue
		}
		out = append(out, m)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, size, nil
}

// PlanCampaign computes spec's waves and time to finish over the machines
// its selector picks now, with the step durations measured on this site
// where there are any (measuredSteps).
func (c *Controller) PlanCampaign(spec CampaignSpec) (waves.Plan, error) {
	if err := c.checkSpec(&spec); err != nil {
		return waves.Plan{}, err
	}
	ms, size, err := c.selection(spec)
	if err != nil {
		return waves.Plan{}, err
	}
	return c.plan(spec, ms, size), nil
}

func (c *Controller) plan(spec CampaignSpec, ms []store.Machine, size map[string]int) waves.Plan {
	in := make([]waves.Machine, len(ms))
	for i, m := range ms {
		in[i] = waves.Machine{ID: m.ID, Site: m.Site, Rack: m.Rack, Group: groupOf(m)}
	}
	l := waves.Limits{ClusterPercent: spec.Limits.ClusterPercent, PerRack: spec.Limits.PerRack, MaxParallel: spec.MaxParallel}
	steps := c.measuredSteps(spec.Action)
	return waves.Compute(in, size, l, steps, true)
}

// measuredSteps is the action's steps with the durations this site has
// measured: the median of the last 50 succeeded drain, reinspect and
// reprovision steps in the machines' repair histories (the reprovision
// step runs from the build's start to the end of the settle time); the
// stated defaults (waves.DefaultSteps) where there are none.
func (c *Controller) measuredSteps(action string) []waves.Step {
	steps := waves.DefaultSteps(action)
	all, err := c.listAll(store.ListOptions{})
	if err != nil {
		return steps
	}
	type sample struct {
		end time.Time
		d   time.Duration
	}
	got := map[string][]sample{}
	for _, m := range all {
		if m.Remediation == nil {
			continue
		}
		for _, h := range m.Remediation.History {
			if h.Result == ResultSucceeded && !h.Ended.Before(h.Started) && !h.Started.IsZero() {
				got[h.Step] = append(got[h.Step], sample{h.Ended, h.Ended.Sub(h.Started)})
			}
		}
	}
	for i, s := range steps {
		xs := got[s.Name]
		if len(xs) == 0 {
			continue
		}
		sort.Slice(xs, func(a, b int) bool { return xs[a].end.After(xs[b].end) })
		xs = xs[:min(len(xs), 50)]
		ds := make([]time.Duration, len(xs))
		for j, x := range xs {
			ds[j] = x.d
		}
		sort.Slice(ds, func(a, b int) bool { return ds[a] < ds[b] })
		steps[i].Duration = ds[len(ds)/2].Round(time.Second)
		steps[i].Source = fmt.Sprintf("measured: median of the last %d", len(ds))
	}
	return steps
}

func newCampaignID(r io.Reader) (string, error) {
	b := make([]byte, 6)
	if _, err := io.ReadFull(r, b); err != nil {
		return "", err
	}
	return "cmp-" + hex.EncodeToString(b), nil
}

// CreateCampaign plans spec and stores it as a planned campaign: every
// selected machine with its wave. Nothing is touched until StartCampaign.
// Errors: ErrInvalid (spec; no machine selected), store errors.
func (c *Controller) CreateCampaign(ctx context.Context, spec CampaignSpec, w store.W) (store.Campaign, error) {
	if err := c.checkSpec(&spec); err != nil {
		return store.Campaign{}, err
	}
	if list, err := c.st.ListCampaigns(); err == nil {
		for _, x := range list {
			if x.Name == spec.Name {
				return store.Campaign{}, fmt.Errorf("%w: campaign %q exists (%s)", store.ErrConflict, spec.Name, x.ID)
			}
		}
	}
	ms, size, err := c.selection(spec)
	if err != nil {
		return store.Campaign{}, err
	}
	if len(ms) == 0 {
		return store.Campaign{}, fmt.Errorf("%w: the selector picks no machine (os_image: claimed machines only)", ErrInvalid)
	}
	p := c.plan(spec, ms, size)
	id, err := newCampaignID(c.cfg.Rand)
	if err != nil {
		return store.Campaign{}, err
	}
	camp := store.Campaign{Meta: store.Meta{ID: id}, Name: spec.Name, Action: spec.Action, Image: spec.Image, Baseline: spec.Baseline,
		BIOS: spec.BIOS, Selector: spec.Selector, Limits: spec.Limits, State: store.CampaignPlanned, Waves: p.Waves}
	for _, m := range ms {
		camp.Machines = append(camp.Machines, store.CampaignMachine{ID: m.ID, Site: m.Site, Rack: m.Rack, Group: groupOf(m),
			Wave: p.Assign[m.ID], State: store.CampaignMachinePending})
	}
	sort.SliceStable(camp.Machines, func(i, j int) bool { return camp.Machines[i].Wave < camp.Machines[j].Wave })
	w = withDefaults(w, ReasonCampaignCreated)
	return c.st.PutCampaign(ctx, camp, w)
}

// setCampaign changes campaign id through fn with compare-and-set,
// retrying on conflict with the controller's own writes.
func (c *Controller) setCampaign(ctx context.Context, id string, w store.W, fn func(*store.Campaign) error) (store.Campaign, error) {
	var last error
	for attempt := 0; attempt < maxCASRetries; attempt++ {
		camp, err := c.st.GetCampaign(id)
		if err != nil {
			return camp, fmt.Errorf("lifecycle: campaign %s: %w", id, err)
		}
		camp.Machines = append([]store.CampaignMachine(nil), camp.Machines...)
		if err := fn(&camp); err != nil {
			return camp, err
		}
		out, err := c.st.PutCampaign(ctx, camp, w)
		if err == nil {
			c.exportCampaign(out)
			return out, nil
		}
		if !errors.Is(err, store.ErrConflict) {
			return out, err
		}
		last = err
	}
	return store.Campaign{}, last
}

func campaignStateError(camp store.Campaign, op string, want ...string) error {
	return fmt.Errorf("%w: campaign %s is %s; %s needs %v", store.ErrConflict, camp.Name, camp.State, op, want)
}

// StartCampaign moves a planned campaign to running: the leader's next
// tick takes its first wave.
func (c *Controller) StartCampaign(ctx context.Context, id string, w store.W) (store.Campaign, error) {
	now := c.now()
	return c.setCampaign(ctx, id, withDefaults(w, ReasonCampaignStarted), func(camp *store.Campaign) error {
		if camp.State != store.CampaignPlanned {
			return campaignStateError(*camp, "start", store.CampaignPlanned)
		}
		camp.State, camp.StartedAt, camp.Reason, camp.Message = store.CampaignRunning, now, ReasonCampaignStarted, ""
		return nil
	})
}

// HaltCampaign halts a running (or planned) campaign: no machine is
// started until ResumeCampaign; machines already out finish their change.
func (c *Controller) HaltCampaign(ctx context.Context, id string, w store.W) (store.Campaign, error) {
	if err := checkReason(w.Message); err != nil {
		return store.Campaign{}, err
	}
	now := c.now()
	return c.setCampaign(ctx, id, withDefaults(w, ReasonCampaignHalted), func(camp *store.Campaign) error {
		if camp.State != store.CampaignRunning && camp.State != store.CampaignPlanned {
			return campaignStateError(*camp, "halt", store.CampaignRunning, store.CampaignPlanned)
		}
		camp.State, camp.HaltedAt, camp.Reason, camp.Message = store.CampaignHalted, now, ReasonCampaignHalted, truncate("halted by "+w.Actor+": "+w.Message, 512)
		return nil
	})
}

// ResumeCampaign moves a halted campaign back to running; the failures
// counted so far are forgotten (the failed machines stay failed: they are
// not tried again).
func (c *Controller) ResumeCampaign(ctx context.Context, id string, w store.W) (store.Campaign, error) {
	if err := checkReason(w.Message); err != nil {
		return store.Campaign{}, err
	}
	return c.setCampaign(ctx, id, withDefaults(w, ReasonCampaignResumed), func(camp *store.Campaign) error {
		if camp.State != store.CampaignHalted {
			return campaignStateError(*camp, "resume", store.CampaignHalted)
		}
		camp.State, camp.Failures, camp.Reason, camp.Message = store.CampaignRunning, 0, ReasonCampaignResumed, truncate("resumed by "+w.Actor, 512)
		return nil
	})
}

// campaigns is the campaign pass of Tick (leader only): every running
// campaign is stepped once (stepCampaign); a halted one only has its
// machines out judged as they finish.
func (c *Controller) campaigns(ctx context.Context) error {
	if !c.st.IsLeader() {
		return nil
	}
	list, err := c.st.ListCampaigns()
	if err != nil {
		return err
	}
	var all []store.Machine
	var errs []error
	// Machines out for any campaign (running or halted) count as out
	// whatever their record says (a bmc change without a drain keeps the
	// machine provisioned).
	busy := map[string]bool{}
	for _, camp := range list {
		if camp.State == store.CampaignRunning || camp.State == store.CampaignHalted {
			for _, m := range camp.Machines {
				if m.State == store.CampaignMachineActive {
					busy[m.ID] = true
				}
			}
		}
	}
	for _, camp := range list {
		c.exportCampaign(camp)
		if camp.State != store.CampaignRunning && camp.State != store.CampaignHalted {
			continue
		}
		if all == nil {
			if all, err = c.listAll(store.ListOptions{}); err != nil {
				return err
			}
		}
		if err := c.stepCampaign(ctx, camp, all, busy); errors.Is(err, store.ErrConflict) {
			continue // written meanwhile (an apply's end, an operator): the next tick steps it
		} else if err != nil {
			errs = append(errs, fmt.Errorf("campaign %s: %w", camp.Name, err))
		}
	}
	return errors.Join(errs...)
}

// stepCampaign is one step of a running campaign, from its record and the
// machines as stored:
//
//  1. every active machine is judged: still running, done (healthy again
//     with the change) or failed; a failure counts;
//  2. failures above Limits.MaxFailures halt the campaign (nothing more
//     starts);
//  3. a wave whose machines are all done, failed or skipped is over: the
//     next one begins (the gate), after the last one the campaign is
//     completed;
//  4. the current wave's pending machines are taken while the limits
//     hold, counting every machine out of service now, the campaign's and
//     any other (inService): at most GroupCap of a claim, PerRack of a
//     rack.
//
// The record is written (one compare-and-set) before any machine is
// touched, so a new leader finds every taken machine marked active and
// starts (again) only those whose change has not begun.
func (c *Controller) stepCampaign(ctx context.Context, camp store.Campaign, all []store.Machine, busy map[string]bool) error {
	act, err := c.campaignAction(camp.Action)
	if err != nil {
		return err
	}
	now := c.now()
	byID := make(map[string]store.Machine, len(all))
	size := map[string]int{}
	outG, outR := map[string]int{}, map[string]int{}
	for _, m := range all {
		byID[m.ID] = m
		g := groupOf(m)
		if g != "" {
			size[g]++
		}
		// Out of service: a machine that serves a claim (or whose claim
		// waits for a spare) and is not in service now.
		out := (g != "" && !inService(m)) || busy[m.ID]
		if out && g != "" {
			outG[g]++
		}
		if out && m.Rack != "" {
			outR[m.Rack]++
		}
	}
	var restart []int // active machines whose change has not begun (Judge said so)
	var ended []int   // machines whose change ended in this step
	changed := false
	for i := range camp.Machines {
		cm := &camp.Machines[i]
		if cm.State != store.CampaignMachineActive {
			continue
		}
		m, ok := byID[cm.ID]
		if !ok {
			cm.State, cm.Ended, cm.Why, changed = store.CampaignMachineFailed, now, "the machine was deleted", true
			camp.Failures++
			continue
		}
		switch st, why := act.Judge(c, camp, *cm, m); st {
		case store.CampaignMachineDone, store.CampaignMachineFailed, store.CampaignMachineSkipped:
			cm.State, cm.Ended, cm.Why, changed = st, now, truncate(why, 256), true
			ended = append(ended, i)
			if st == store.CampaignMachineFailed {
				camp.Failures++
			}
		case campaignNotBegun:
			restart = append(restart, i)
		}
	}
	w := store.W{Actor: ActorCampaign, Reason: ReasonCampaignMachine}
	if camp.State == store.CampaignHalted {
		// Halted: the machines out finish their change and are judged;
		// nothing is started.
		if !changed {
			return nil
		}
		out, err := c.writeCampaign(ctx, camp, w)
		if err == nil {
			if fin, ok := act.(campaignFinisher); ok {
				for _, i := range ended {
					_ = fin.Finish(ctx, c, out, out.Machines[i])
				}
			}
		}
		return err
	}
	if camp.Failures > camp.Limits.MaxFailures {
		camp.State, camp.HaltedAt, camp.Reason = store.CampaignHalted, now, ReasonCampaignFailures
		camp.Message = fmt.Sprintf("%d machines failed, more than max_failures %d: halted, no machine is started until `kiln campaign resume`",
			camp.Failures, camp.Limits.MaxFailures)
		out, err := c.writeCampaign(ctx, camp, store.W{Actor: ActorCampaign, Reason: ReasonCampaignFailures, Message: camp.Message})
		if err == nil {
			if fin, ok := act.(campaignFinisher); ok {
				for _, i := range ended {
					_ = fin.Finish(ctx, c, out, out.Machines[i])
				}
			}
		}
		return err
	}
	// The gate: the wave is over when none of its machines is pending or active.
	for camp.Wave <= camp.Waves {
		open := false
		for _, cm := range camp.Machines {
			if cm.Wave == camp.Wave && (cm.State == store.CampaignMachinePending || cm.State == store.CampaignMachineActive) {
				open = true
				break
			}
		}
		if open && camp.Wave > 0 {
			break
		}
		camp.Wave++
		changed = true
		w.Reason = ReasonCampaignWave
	}
	if camp.Wave > camp.Waves {
		camp.State, camp.EndedAt, camp.Reason = store.CampaignCompleted, now, ReasonCampaignCompleted
		camp.Message = campaignSummary(camp)
		out, err := c.writeCampaign(ctx, camp, store.W{Actor: ActorCampaign, Reason: ReasonCampaignCompleted, Message: camp.Message})
		if err == nil {
			if fin, ok := act.(campaignFinisher); ok {
				for _, i := range ended {
					_ = fin.Finish(ctx, c, out, out.Machines[i])
				}
			}
		}
		return err
	}
	var take []int
	for i := range camp.Machines {
		cm := &camp.Machines[i]
		if cm.Wave != camp.Wave || cm.State != store.CampaignMachinePending {
			continue
		}
		m, ok := byID[cm.ID]
		switch {
		case !ok:
			cm.State, cm.Ended, cm.Why, changed = store.CampaignMachineSkipped, now, "the machine was deleted", true
			continue
		case m.Maintenance != nil:
			cm.State, cm.Ended, cm.Why, changed = store.CampaignMachineSkipped, now, "in maintenance: "+truncate(m.Maintenance.Reason, 200), true
			continue
		case camp.Action == store.CampaignActionOSImage && m.Claim == nil:
			cm.State, cm.Ended, cm.Why, changed = store.CampaignMachineSkipped, now, "no claim (state "+string(m.State)+")", true
			continue
		case !ready(m) || busy[m.ID]:
			continue // out already (counted): it waits until it is back in service
		}
		g := groupOf(m)
		if g != "" && outG[g]+1 > (waves.Limits{ClusterPercent: camp.Limits.ClusterPercent}).GroupCap(size[g]) {
			continue
		}
		if m.Rack != "" && outR[m.Rack]+1 > camp.Limits.PerRack {
			continue
		}
		if g != "" {
			outG[g]++
		}
		if m.Rack != "" {
			outR[m.Rack]++
		}
		busy[m.ID] = true
		cm.State, cm.Started, cm.Why, changed = store.CampaignMachineActive, now, "", true
		cm.BaseAttempt = 0
		if m.Remediation != nil {
			cm.BaseAttempt = m.Remediation.Attempt
		}
		take = append(take, i)
	}
	if changed {
		out, err := c.writeCampaign(ctx, camp, w)
		if err != nil {
			return err // nothing touched: the next tick judges again
		}
		camp = out
	}
	var errs []error
	if fin, ok := act.(campaignFinisher); ok {
		for _, i := range ended {
			if err := fin.Finish(ctx, c, camp, camp.Machines[i]); err != nil {
				errs = append(errs, fmt.Errorf("machine %s: %w", camp.Machines[i].ID, err))
			}
		}
	}
	for _, i := range append(restart, take...) {
		cm := camp.Machines[i]
		if err := act.Start(ctx, c, camp, cm, byID[cm.ID]); err != nil {
			errs = append(errs, fmt.Errorf("machine %s: %w", cm.ID, err))
		}
	}
	return errors.Join(errs...)
}

// campaignFinisher is an action with work after a machine's change
// ended (done or failed), once the record says so: the bmc actions drop
// their drain record.
type campaignFinisher interface {
	Finish(ctx context.Context, c *Controller, camp store.Campaign, cm store.CampaignMachine) error
}

// campaignNotBegun is Judge's answer for an active machine whose change
// has not begun (the leader failed between marking it and starting it, or
// the start failed): the controller starts it again.
const campaignNotBegun = "not_begun"

func (c *Controller) writeCampaign(ctx context.Context, camp store.Campaign, w store.W) (store.Campaign, error) {
	out, err := c.st.PutCampaign(ctx, camp, w)
	if err == nil {
		c.exportCampaign(out)
	}
	return out, err
}

func campaignSummary(camp store.Campaign) string {
	n := map[string]int{}
	for _, m := range camp.Machines {
		n[m.State]++
	}
	return fmt.Sprintf("%d waves: %d done, %d failed, %d skipped", camp.Waves, n[store.CampaignMachineDone], n[store.CampaignMachineFailed], n[store.CampaignMachineSkipped])
}

// osImageAction is the os_image change: the claim's image becomes the
// campaign's and the machine is reprovisioned through the remediation
// ladder's reprovision path (drain, reinspect, the gated build of the
// claim, settle), the run started with the claim's image changed in the
// same write. Done when the run ended remediated with the machine
// provisioned on the new image; failed when it ended otherwise (declared
// failed: the ladder erases it and hands its claim to a spare).
type osImageAction struct{}

func (osImageAction) Start(ctx context.Context, c *Controller, camp store.Campaign, cm store.CampaignMachine, _ store.Machine) error {
	why := fmt.Sprintf("campaign %s wave %d: image %s", camp.Name, camp.Wave, camp.Image)
	_, err := c.startLadderWith(ctx, cm.ID, why, StepReinspect, true, func(m *store.Machine) error {
		if m.Claim == nil {
			return &StateError{Op: "campaign os_image (no claim)", Machine: m.ID, State: m.State, Want: []store.MachineState{store.StateProvisioned}}
		}
		if m.Remediation != nil && m.Remediation.Attempt > cm.BaseAttempt {
			return errNoChange // begun already (a previous leader's start)
		}
		m.Claim.Image = camp.Image
		return nil
	})
	return err
}

func (osImageAction) Judge(c *Controller, camp store.Campaign, cm store.CampaignMachine, m store.Machine) (string, string) {
	r := m.Remediation
	if r == nil || r.Attempt <= cm.BaseAttempt {
		if m.Maintenance != nil || !inService(m) {
			return store.CampaignMachineActive, "" // waits: nothing is started on a machine out of service
		}
		return campaignNotBegun, ""
	}
	switch r.Outcome {
	case "":
		return store.CampaignMachineActive, ""
	case OutcomeRemediated:
		if m.State == store.StateProvisioned && m.Claim != nil && m.Claim.Image == camp.Image {
			return store.CampaignMachineDone, "reprovisioned with image " + camp.Image
		}
		return store.CampaignMachineFailed, "the run ended but the machine is " + string(m.State) + " without the new image"
	}
	last := r.Why
	if n := len(r.History); n > 0 {
		last = r.History[n-1].Step + ": " + r.History[n-1].Why
	}
	return store.CampaignMachineFailed, "reprovision " + r.Outcome + ": " + last
}

// bmcAction is the firmware and bios changes through FirmwareApplier, on
// a machine that stays provisioned. Its progress is the campaign record's
// (CampaignMachine.Step): drain — a drain asked on the machine
// (Machine.Drain, step "campaign/<id>", the claim's webhook; the owner's
// ack, or the drain policy at its timeout; no drain wanted: at once);
// apply — the applier runs on the leader in the background (it returns
// when the BMC's task ended and the value was read back; after a failover
// the new leader runs it again: bringing a machine to a baseline twice is
// the same as once); settle — Remediation.Settle after the apply, done
// when nothing is Critical then, failed otherwise. The drain record is
// dropped when the machine's change ends.
type bmcAction struct{ kind string }

// bmc action steps (CampaignMachine.Step).
const (
	campStepDrain  = "drain"
	campStepApply  = "apply"
	campStepSettle = "settle"
)

func drainTag(camp store.Campaign) string { return "campaign/" + camp.ID }

func (a bmcAction) Start(ctx context.Context, c *Controller, camp store.Campaign, cm store.CampaignMachine, _ store.Machine) error {
	why := fmt.Sprintf("campaign %s wave %d: %s", camp.Name, camp.Wave, a.kind)
	now := c.now()
	m, err := c.update(ctx, cm.ID, store.W{Actor: ActorCampaign, Reason: ReasonDrainRequested, Message: why}, func(x *store.Machine) error {
		if x.Drain != nil && x.Drain.Step == drainTag(camp) {
			return errNoChange
		}
		if !c.drainWanted(*x) {
			return errNoChange
		}
		x.Drain = c.newDrain(*x, drainTag(camp), why, now)
		return nil
	})
	if err != nil {
		return err
	}
	if m.Drain != nil && m.Drain.Step == drainTag(camp) && m.Drain.Acked.IsZero() {
		c.sendDrainWebhook(context.WithoutCancel(ctx), m)
	}
	_, err = c.setCampaign(ctx, camp.ID, store.W{Actor: ActorCampaign, Reason: ReasonCampaignMachine}, func(x *store.Campaign) error {
		for i := range x.Machines {
			if x.Machines[i].ID == cm.ID && x.Machines[i].State == store.CampaignMachineActive && x.Machines[i].Step == "" {
				x.Machines[i].Step, x.Machines[i].StepAt = campStepDrain, now
				return nil
			}
		}
		return errNoChange
	})
	if errors.Is(err, errNoChange) {
		err = nil
	}
	return err
}

func (a bmcAction) Judge(c *Controller, camp store.Campaign, cm store.CampaignMachine, m store.Machine) (string, string) {
	now := c.now()
	switch cm.Step {
	case "":
		return campaignNotBegun, ""
	case campStepDrain:
		d := m.Drain
		drained := d == nil || d.Step != drainTag(camp) || !d.Acked.IsZero() ||
			(now.After(d.Deadline) && c.cfg.Remediation.DrainPolicy == DrainProceed)
		if drained {
			c.applyBMC(camp, cm.ID, a.kind)
		}
	case campStepApply:
		c.applyBMC(camp, cm.ID, a.kind) // no-op while this node runs it; a new leader runs it again
	case campStepSettle:
		if now.Sub(cm.StepAt) < c.cfg.Remediation.Settle {
			break
		}
		if crit := criticalConditions(m); len(crit) > 0 {
			return store.CampaignMachineFailed, a.kind + " applied, then Critical after " + c.cfg.Remediation.Settle.String() + ": " + describeCritical(m)
		}
		return store.CampaignMachineDone, a.kind + " applied; nothing Critical " + c.cfg.Remediation.Settle.String() + " after"
	}
	return store.CampaignMachineActive, ""
}

func (a bmcAction) Finish(ctx context.Context, c *Controller, camp store.Campaign, cm store.CampaignMachine) error {
	_, err := c.update(ctx, cm.ID, store.W{Actor: ActorCampaign, Reason: ReasonCampaignMachine, Message: "campaign " + camp.Name + ": " + cm.State},
		func(x *store.Machine) error {
			if x.Drain == nil || x.Drain.Step != drainTag(camp) {
				return errNoChange
			}
			x.Drain = nil
			return nil
		})
	return err
}

// applyBMC runs the applier for machine id in the background, at most once
// at a time per machine on this node (campApply): the record moves to
// apply first, then to settle (or the machine fails) when it returns.
func (c *Controller) applyBMC(camp store.Campaign, id, kind string) {
	key := camp.ID + "/" + id
	if !c.campApply.begin(key) {
		return
	}
	go func() {
		defer c.campApply.end(key)
		ctx, cancel := context.WithTimeout(context.Background(), c.cfg.Remediation.ReprovisionTimeout)
		defer cancel()
		w := store.W{Actor: ActorCampaign, Reason: ReasonCampaignMachine}
		// mark writes the machine's progress; the applies of one wave
		// write the same record at once, so a conflict is retried until
		// the write lands (a lost "settle" would apply the change again).
		mark := func(fn func(*store.CampaignMachine, *store.Campaign)) error {
			for {
				_, err := c.setCampaign(ctx, camp.ID, w, func(x *store.Campaign) error {
					for i := range x.Machines {
						if x.Machines[i].ID == id && x.Machines[i].State == store.CampaignMachineActive {
							fn(&x.Machines[i], x)
							return nil
						}
					}
					return errNoChange
				})
				if !errors.Is(err, store.ErrConflict) || ctx.Err() != nil {
					return err
				}
				time.Sleep(time.Duration(1+len(id)%7) * time.Millisecond)
			}
		}
		if err := mark(func(m *store.CampaignMachine, _ *store.Campaign) {
			if m.Step != campStepApply {
				m.Step, m.StepAt = campStepApply, c.now()
			}
		}); err != nil {
			return
		}
		var err error
		if kind == store.CampaignActionFirmware {
			err = c.firmwareApplier().ApplyFirmware(ctx, id, camp.Baseline)
		} else {
			err = c.firmwareApplier().ApplyBIOS(ctx, id, camp.BIOS)
		}
		now := c.now()
		if err != nil {
			why := truncate(kind+" failed: "+sanitize(err.Error()), 256)
			_ = mark(func(m *store.CampaignMachine, x *store.Campaign) {
				m.State, m.Ended, m.Why = store.CampaignMachineFailed, now, why
				x.Failures++
			})
			_ = bmcAction{kind: kind}.Finish(ctx, c, camp, store.CampaignMachine{ID: id, State: store.CampaignMachineFailed})
			return
		}
		_ = mark(func(m *store.CampaignMachine, _ *store.Campaign) { m.Step, m.StepAt = campStepSettle, now })
	}()
}

// campApplies is the set of bmc applies this node runs (its lock guards
// only the set).
type campApplies struct {
	mu      sync.Mutex
	running map[string]bool
}

func (s *campApplies) begin(key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.running[key] {
		return false
	}
	if s.running == nil {
		s.running = map[string]bool{}
	}
	s.running[key] = true
	return true
}

func (s *campApplies) end(key string) {
	s.mu.Lock()
	delete(s.running, key)
	s.mu.Unlock()
}
