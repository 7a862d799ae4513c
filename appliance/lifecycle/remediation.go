// The remediation ladder (issue 14; DESIGN.md "Remediation"): a claimed
// machine with a Critical health condition climbs, cheapest step first,
// drain → power_cycle → reinspect → reprovision → erase → rma, each step
// with its own timeout and a recorded why (Machine.Remediation); a
// declared failure hands its claim to a spare (spares.go). remediate runs
// in the leader's Tick; nothing is done to a machine in maintenance, and
// nothing at all while the brake is engaged (brake.go). Metrics of the
// day-2 concern are here too (remMetrics).

package lifecycle

import (
	"context"
	"errors"
	"sort"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"kiln/api/agentapi"
	"kiln/store"
)

// Ladder steps (store.Remediation.Step), in order.
const (
	StepDrain       = "drain"
	StepPowerCycle  = "power_cycle"
	StepReinspect   = "reinspect"
	StepReprovision = "reprovision"
	StepErase       = "erase"
	StepRMA         = "rma"
)

// Ladder outcomes (store.Remediation.Outcome) and step results.
const (
	OutcomeRemediated = "remediated"
	OutcomeRMA        = "rma"
	OutcomeStopped    = "stopped"

	ResultSucceeded = "succeeded"
	ResultFailed    = "failed"
	ResultSkipped   = "skipped"
	ResultStopped   = "stopped"
)

// ActorRemediation is the actor of every write the ladder makes.
const ActorRemediation = "remediation"

// Machine reasons the ladder sets.
const (
	ReasonRemediationStarted   = "remediation_started"
	ReasonRemediationStep      = "remediation_step"
	ReasonRemediationReinspect = "remediation_reinspect"
	ReasonRemediated           = "remediated"
	ReasonEraseForRMA          = "erase_for_rma"
	ReasonRMA                  = "rma"
	ReasonRemediationStopped   = "remediation_stopped"
)

// remMetrics are the day-2 metrics (names shared with the alert rules,
// deploy/prometheus/kiln-alerts.yml).
type remMetrics struct {
	brake        *prometheus.GaugeVec
	spares       *prometheus.GaugeVec
	sparesLow    *prometheus.GaugeVec
	remediations *prometheus.CounterVec
	healthReads  *prometheus.CounterVec
}

func newRemMetrics(reg *prometheus.Registry) (*remMetrics, error) {
	m := &remMetrics{
		brake: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "kiln_remediation_brake_engaged",
			Help: "1 while the remediation brake is engaged for the scope (site|rack|claim): automatic repair is halted until `kiln remediation resume`.",
		}, []string{"scope"}),
		spares: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "kiln_spares_available",
			Help: "Spare machines (available, unclaimed, not in maintenance) per hardware class (label kiln.io/class).",
		}, []string{"class"}),
		sparesLow: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "kiln_spares_low_threshold",
			Help: "The spare count per hardware class at or below which spares are low (remediation.spares.low).",
		}, []string{"class"}),
		remediations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kiln_remediations_total",
			Help: "Remediation ladder steps finished by this leader, by step (power_cycle|reinspect|reprovision|erase|rma|spare|drain) and result.",
		}, []string{"step", "result"}),
		healthReads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kiln_health_reads_total",
			Help: "BMC health reads by this leader's poll, by result (ok|failed).",
		}, []string{"result"}),
	}
	for _, s := range []string{ScopeSite, ScopeRack, ScopeClaim} {
		m.brake.WithLabelValues(s)
	}
	if reg == nil {
		return m, nil
	}
	for _, x := range []prometheus.Collector{m.brake, m.spares, m.sparesLow, m.remediations, m.healthReads} {
		if err := reg.Register(x); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// active reports whether m has a ladder run in progress.
func active(m store.Machine) bool { return m.Remediation != nil && m.Remediation.Outcome == "" }

// lastEnded is when m's last ladder run ended (zero: none).
func lastEnded(r *store.Remediation) time.Time {
	if r == nil || len(r.History) == 0 {
		return time.Time{}
	}
	return r.History[len(r.History)-1].Ended
}

// failure says why m should be repaired ("" = it should not): claimed,
// provisioned or failed, no ladder running, a Critical condition that
// began after its last run ended. since is the newest such condition's
// start.
func failure(m store.Machine) (why string, since time.Time) {
	if m.Claim == nil || active(m) || (m.State != store.StateProvisioned && m.State != store.StateFailed) {
		return "", since
	}
	end := lastEnded(m.Remediation)
	var parts []string
	for _, h := range criticalConditions(m) {
		if !h.Since.After(end) && !end.IsZero() {
			continue
		}
		s := h.Type + " " + h.Status
		if h.Reason != "" {
			s += " (" + h.Reason + ")"
		}
		if h.Message != "" {
			s += ": " + h.Message
		}
		parts = append(parts, s)
		if h.Since.After(since) {
			since = h.Since
		}
	}
	return truncate(strings.Join(parts, "; "), 512), since
}

// remediate is the ladder's pass of Tick (leader only): it exports the
// brake and the spare pools; counts this tick's newly failed machines in
// the brake, all at once; and, unless the brake is (then) engaged, hands
// waiting claims to spares, advances every running ladder and starts one
// for every newly failed machine. A machine in maintenance is skipped.
// Remediation mode off starts nothing (running ladders and spares still
// go on).
func (c *Controller) remediate(ctx context.Context) error {
	all, err := c.listAll(store.ListOptions{})
	if err != nil {
		return err
	}
	b, err := c.brake()
	if err != nil {
		return err
	}
	c.setBrakeGauge(b)
	c.refreshSpares(ctx, all)
	if b.Engaged {
		return nil
	}
	sort.Slice(all, func(i, j int) bool { return all[i].ID < all[j].ID })
	f := fleetOf(all)
	var errs []error
	// This tick's new failures are judged first and together: a mass
	// failure engages the brake before any machine is touched, and once it
	// is engaged nothing moves in this pass either.
	var fresh, counted []failed
	for _, m := range all {
		if m.Maintenance != nil || active(m) || c.cfg.Remediation.Mode != RemediateAuto {
			continue
		}
		if why, since := failure(m); why != "" {
			fresh = append(fresh, failed{m, why})
			if since.After(b.ResumedAt) {
				counted = append(counted, failed{m, why})
			}
		}
	}
	if len(counted) > 0 {
		engaged, err := c.countFailures(ctx, counted, f)
		if err != nil {
			return err
		}
		if engaged {
			return nil // halted until a person resumes
		}
	}
	for _, m := range all {
		// A waiting claim goes to a spare even when its failed machine is
		// in maintenance: that touches the spare, not the machine.
		if r := m.Remediation; r != nil && r.Claim != nil && r.Spare == "" {
			if err := c.assignSpare(ctx, m, all); err != nil {
				errs = append(errs, err)
			}
		}
		if m.Maintenance != nil {
			continue
		}
		if active(m) {
			if err := c.advance(ctx, m); err != nil {
				errs = append(errs, err)
			}
		}
	}
	now := c.now()
	hold := c.sweepHold()
	for _, x := range fresh {
		if _, since := failure(x.m); now.Sub(since) < hold {
			continue // counted; its run starts once the failure is hold old
		}
		if _, err := c.startLadder(ctx, x.m.ID, x.why, StepPowerCycle, true); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// sweepHold is how old a counted failure must be before its ladder
// starts: remediation.hold, and at least the last health sweep's duration,
// so that a failure of many machines at once (which surfaces over one
// sweep: 2,000 BMCs read by HealthPollWorkers take a while) is counted in
// the brake in full before any of its machines is touched. Found by the
// 2,000-machine day-2 run: with a 10 s hold and a longer sweep, 400
// machines failing at once started ~1,900 BMC actions and never engaged
// the brake.
func (c *Controller) sweepHold() time.Duration {
	return max(c.cfg.Remediation.StartHold, c.health.lastSweep())
}

// stepTimeout is step's timeout (zero: the step's own machinery bounds it).
func (c *Controller) stepTimeout(step string) time.Duration {
	rc := c.cfg.Remediation
	switch step {
	case StepDrain:
		return rc.DrainTimeout
	case StepPowerCycle:
		return rc.PowerCycleTimeout
	case StepReinspect:
		return rc.ReinspectTimeout
	case StepReprovision:
		return rc.ReprovisionTimeout
	}
	return 0
}

// enterStep ends r's current step with result/why and makes step current.
func (c *Controller) enterStep(r *store.Remediation, step, result, why string, now time.Time) {
	if r.Step != "" {
		r.History = append(r.History, store.RemediationStep{Step: r.Step, Result: result, Why: truncate(why, 512), Started: r.StepStarted, Ended: now})
		c.rm.remediations.WithLabelValues(r.Step, result).Inc()
	}
	r.Step, r.StepStarted, r.ActionDone, r.Why = step, now, time.Time{}, truncate(why, 512)
	r.Deadline = time.Time{}
	if d := c.stepTimeout(step); d > 0 {
		r.Deadline = now.Add(d)
	}
}

// startLadder starts a ladder run on machine id (provisioned or failed,
// claimed) at step first, after a drain when drain is set and wanted:
// state remediating, Remediation with the next attempt number. Then it
// takes the first step's action.
func (c *Controller) startLadder(ctx context.Context, id, why, first string, drain bool) (store.Machine, error) {
	return c.startLadderWith(ctx, id, why, first, drain, nil)
}

// startLadderWith is startLadder with pre applied to the machine in the
// same write, first (a campaign's os_image changes the claim's image
// there; pre returning errNoChange writes nothing and starts nothing).
func (c *Controller) startLadderWith(ctx context.Context, id, why, first string, drain bool, pre func(*store.Machine) error) (store.Machine, error) {
	now := c.now()
	w := store.W{Actor: ActorRemediation, Reason: ReasonRemediationStarted, Message: truncate(why, 512)}
	started := false
	m, err := c.update(ctx, id, w, func(m *store.Machine) error {
		started = false
		if pre != nil {
			if err := pre(m); err != nil {
				return err
			}
		}
		if active(*m) || (m.State != store.StateProvisioned && m.State != store.StateFailed) {
			return &StateError{Op: "remediate", Machine: id, State: m.State, Want: []store.MachineState{store.StateProvisioned, store.StateFailed}}
		}
		started = true
		attempt := 1
		if m.Remediation != nil {
			attempt = m.Remediation.Attempt + 1
		}
		r := &store.Remediation{Attempt: attempt, Started: now}
		step := first
		if drain && c.drainWanted(*m) {
			step = StepDrain
			m.Drain = c.newDrain(*m, first, why, now)
		} else {
			m.Drain = nil
		}
		c.enterStep(r, step, "", why, now)
		m.Remediation = r
		m.State = store.StateRemediating
		m.Reason, m.Message = ReasonRemediationStarted, truncate(why, 512)
		return nil
	})
	if err != nil || !started {
		return m, err
	}
	switch m.Remediation.Step {
	case StepDrain:
		c.sendDrainWebhook(ctx, m)
		return m, nil
	default:
		return c.act(ctx, m)
	}
}

// nextStep moves machine id's ladder from step from (result, why) to the
// step after it and takes its action; a stale from (the ladder moved
// meanwhile) changes nothing.
func (c *Controller) nextStep(ctx context.Context, id, from, result, why string) (store.Machine, error) {
	next := map[string]string{StepDrain: StepPowerCycle, StepPowerCycle: StepReinspect}[from]
	if from == StepDrain {
		// The drain waits for the run's first step (Drain.Step): power_cycle
		// for a failure, reinspect for a campaign's reprovision.
		if cur, err := c.st.GetMachine(id); err == nil && cur.Drain != nil && (cur.Drain.Step == StepReinspect || cur.Drain.Step == StepPowerCycle) {
			next = cur.Drain.Step
		}
	}
	if next == "" {
		return c.declareFailed(ctx, id, from, why)
	}
	now := c.now()
	m, err := c.update(ctx, id, store.W{Actor: ActorRemediation, Reason: ReasonRemediationStep, Message: next + ": " + truncate(why, 400)},
		func(m *store.Machine) error {
			if !active(*m) || m.Remediation.Step != from {
				return errNoChange
			}
			c.enterStep(m.Remediation, next, result, why, now)
			return nil
		})
	if err != nil || !active(m) || m.Remediation.Step != next {
		return m, err
	}
	return c.act(ctx, m)
}

// act takes the action of m's current step: power_cycle queues a BMC
// power cycle; reinspect PXE-boots the machine into the agent for an
// inspection (state inspecting, the discovered hardware kept as the
// baseline). A step that needs a BMC on a machine without one fails at
// once.
func (c *Controller) act(ctx context.Context, m store.Machine) (store.Machine, error) {
	r := m.Remediation
	hasBMC := m.BMC != "" && c.bmc != nil
	switch r.Step {
	case StepPowerCycle:
		if !hasBMC {
			return c.nextStep(ctx, m.ID, StepPowerCycle, ResultSkipped, "no BMC enrolled: cannot power cycle")
		}
		id, started := m.ID, r.StepStarted
		ok, err := c.enqueueJobs(ctx, m, []string{JobPowerCycle}, store.W{Actor: ActorRemediation, Reason: "queued"}, func(ctx context.Context, err error) {
			c.powerCycled(ctx, id, started, err)
		})
		if err != nil || !ok {
			why := "a BMC sequence is already queued or running"
			if err != nil {
				why = err.Error()
			}
			return c.nextStep(ctx, m.ID, StepPowerCycle, ResultFailed, why)
		}
		return m, nil
	case StepReinspect:
		if !hasBMC {
			return c.declareFailed(ctx, m.ID, StepReinspect, "no BMC enrolled: cannot boot the machine into the agent")
		}
		now := c.now()
		out, err := c.update(ctx, m.ID, store.W{Actor: ActorRemediation, Reason: ReasonRemediationReinspect, Message: r.Why}, func(x *store.Machine) error {
			if !active(*x) || x.Remediation.Step != StepReinspect || x.State != store.StateRemediating {
				return errNoChange
			}
			if x.Discovered != nil {
				d := *x.Discovered
				x.Remediation.Baseline = &d
			}
			x.State = store.StateInspecting
			x.Reason, x.Message = ReasonRemediationReinspect, x.Remediation.Why
			x.Step = pendingStep(agentapi.StepInspect, now, now.Add(c.cfg.BootTimeout))
			return nil
		})
		if err != nil || out.State != store.StateInspecting {
			return out, err
		}
		// A machine whose agent is alive (a failed build's agent waits and
		// polls) gets the inspect task at its next poll, as Inspect does;
		// booting it as well would power-cycle the build that follows that
		// inspection (CI saw agent_restarted in check).
		if !c.agentAlive(out.ID) {
			c.powerIntoAgent(ctx, out, store.StateInspecting)
		}
		return out, nil
	}
	return m, nil
}

// powerCycled records the end of the power_cycle step's BMC job: the
// action's time (the settle clock starts), or its failure (the next step
// at once).
func (c *Controller) powerCycled(ctx context.Context, id string, started time.Time, bmcErr error) {
	if bmcErr != nil {
		if _, err := c.nextStep(ctx, id, StepPowerCycle, ResultFailed, "power cycle failed: "+truncate(sanitize(bmcErr.Error()), 256)); err != nil {
			c.logger().Warn("remediation: next step", "machine", id, "err", err)
		}
		return
	}
	now := c.now()
	_, err := c.update(ctx, id, store.W{Actor: ActorRemediation, Reason: ReasonRemediationStep, Message: "power cycled"}, func(m *store.Machine) error {
		if !active(*m) || m.Remediation.Step != StepPowerCycle || !m.Remediation.StepStarted.Equal(started) {
			return errNoChange
		}
		m.Remediation.ActionDone = now
		return nil
	})
	if err != nil {
		c.logger().Warn("remediation: record power cycle", "machine", id, "err", err)
	}
}

// healthyAfter: the step's action finished, Settle has passed since, and
// no condition is Critical.
func (c *Controller) healthyAfter(m store.Machine, now time.Time) bool {
	r := m.Remediation
	return !r.ActionDone.IsZero() && !now.Before(r.ActionDone.Add(c.cfg.Remediation.Settle)) && len(criticalConditions(m)) == 0
}

// settled: the step's action finished Settle ago (or more) and a
// condition is still Critical: the step did not repair the machine.
func (c *Controller) settled(m store.Machine, now time.Time) bool {
	r := m.Remediation
	return !r.ActionDone.IsZero() && !now.Before(r.ActionDone.Add(c.cfg.Remediation.Settle)) && len(criticalConditions(m)) > 0
}

func describeCritical(m store.Machine) string {
	var parts []string
	for _, h := range criticalConditions(m) {
		s := h.Type + " " + h.Status
		if h.Message != "" {
			s += ": " + h.Message
		}
		parts = append(parts, s)
	}
	if len(parts) == 0 {
		return "no Critical condition"
	}
	return strings.Join(parts, "; ")
}

// advance moves m's running ladder on by what the record says now.
func (c *Controller) advance(ctx context.Context, m store.Machine) error {
	r := m.Remediation
	now := c.now()
	past := !r.Deadline.IsZero() && now.After(r.Deadline)
	var err error
	switch r.Step {
	case StepDrain:
		d := m.Drain
		switch {
		case d == nil:
			_, err = c.nextStep(ctx, m.ID, StepDrain, ResultSkipped, "no drain record")
		case !d.Acked.IsZero():
			_, err = c.nextStep(ctx, m.ID, StepDrain, ResultSucceeded, drainMessage(d, c.cfg.Remediation.DrainPolicy))
		case now.After(d.Deadline) && c.cfg.Remediation.DrainPolicy == DrainProceed:
			_, err = c.nextStep(ctx, m.ID, StepDrain, ResultFailed, drainMessage(d, DrainProceed))
		case now.After(d.Deadline) && !d.TimedOut:
			_, err = c.update(ctx, m.ID, store.W{Actor: ActorRemediation, Reason: ReasonDrainTimeout, Message: drainMessage(d, DrainHold)},
				func(x *store.Machine) error {
					if x.Drain == nil || x.Drain.TimedOut || !x.Drain.Acked.IsZero() {
						return errNoChange
					}
					x.Drain.TimedOut = true
					return nil
				})
		}
	case StepPowerCycle:
		switch {
		case m.State != store.StateRemediating:
			_, err = c.stopLadder(ctx, m.ID, "the machine left remediating (state "+string(m.State)+")")
		case c.healthyAfter(m, now):
			_, err = c.closeRemediated(ctx, m.ID, StepPowerCycle, "no Critical condition "+c.cfg.Remediation.Settle.String()+" after the power cycle")
		case c.settled(m, now):
			_, err = c.nextStep(ctx, m.ID, StepPowerCycle, ResultFailed, "still Critical "+c.cfg.Remediation.Settle.String()+" after the power cycle: "+describeCritical(m))
		case past:
			_, err = c.nextStep(ctx, m.ID, StepPowerCycle, ResultFailed, "still unhealthy "+c.cfg.Remediation.PowerCycleTimeout.String()+" after the step began: "+describeCritical(m))
		}
	case StepReinspect:
		switch {
		case m.State == store.StateFailed:
			_, err = c.declareFailed(ctx, m.ID, StepReinspect, "reinspection failed: "+m.Reason+": "+m.Message)
		case m.State == store.StateQuarantined:
			_, err = c.declareFailed(ctx, m.ID, StepReinspect, "reinspection found a blocking difference: "+m.Message)
		case past:
			_, err = c.declareFailed(ctx, m.ID, StepReinspect, "reinspection did not finish within "+c.cfg.Remediation.ReinspectTimeout.String()+" (state "+string(m.State)+")")
		}
	case StepReprovision:
		switch {
		case m.State == store.StateFailed:
			_, err = c.declareFailed(ctx, m.ID, StepReprovision, "reprovision failed: "+m.Reason+": "+m.Message)
		case m.State == store.StateProvisioned && r.ActionDone.IsZero():
			_, err = c.update(ctx, m.ID, store.W{Actor: ActorRemediation, Reason: ReasonRemediationStep, Message: "reprovisioned; settling"},
				func(x *store.Machine) error {
					if !active(*x) || x.Remediation.Step != StepReprovision || !x.Remediation.ActionDone.IsZero() {
						return errNoChange
					}
					x.Remediation.ActionDone = now
					return nil
				})
		case m.State == store.StateProvisioned && c.healthyAfter(m, now):
			_, err = c.closeRemediated(ctx, m.ID, StepReprovision, "no Critical condition "+c.cfg.Remediation.Settle.String()+" after the reprovision")
		case m.State == store.StateProvisioned && c.settled(m, now):
			_, err = c.declareFailed(ctx, m.ID, StepReprovision, "still Critical "+c.cfg.Remediation.Settle.String()+" after the reprovision: "+describeCritical(m))
		case past:
			_, err = c.declareFailed(ctx, m.ID, StepReprovision, "still unhealthy "+c.cfg.Remediation.ReprovisionTimeout.String()+" after the reprovision began (state "+string(m.State)+"): "+describeCritical(m))
		}
	case StepErase:
		switch {
		case m.State == store.StateErasing && m.Step != nil && m.Step.Step == agentapi.StepErase && m.Step.State == string(agentapi.StateSucceeded):
			_, err = c.toRMA(ctx, m.ID, "erased")
		case m.State == store.StateFailed:
			_, err = c.toRMA(ctx, m.ID, "not_erased: "+m.Reason+": "+m.Message)
		case m.State == store.StateRMA:
			_, err = c.toRMA(ctx, m.ID, "")
		}
	}
	return err
}

// closeRemediated ends machine id's run as remediated: remediating →
// provisioned (after a power cycle), or provisioned stays (after a
// reprovision); the drain record is dropped.
func (c *Controller) closeRemediated(ctx context.Context, id, step, why string) (store.Machine, error) {
	now := c.now()
	return c.update(ctx, id, store.W{Actor: ActorRemediation, Reason: ReasonRemediated, Message: why}, func(m *store.Machine) error {
		if !active(*m) || m.Remediation.Step != step {
			return errNoChange
		}
		c.enterStep(m.Remediation, "", ResultSucceeded, why, now)
		m.Remediation.Step, m.Remediation.Outcome, m.Remediation.Deadline = step, OutcomeRemediated, time.Time{}
		m.Drain = nil
		if m.State == store.StateRemediating {
			m.State = store.StateProvisioned
		}
		m.Reason, m.Message = ReasonRemediated, why
		return nil
	})
}

// stopLadder ends machine id's run as stopped (the machine was moved by
// someone else); its state stays.
func (c *Controller) stopLadder(ctx context.Context, id, why string) (store.Machine, error) {
	now := c.now()
	return c.update(ctx, id, store.W{Actor: ActorRemediation, Reason: ReasonRemediationStopped, Message: why}, func(m *store.Machine) error {
		if !active(*m) {
			return errNoChange
		}
		step := m.Remediation.Step
		c.enterStep(m.Remediation, "", ResultStopped, why, now)
		m.Remediation.Step, m.Remediation.Outcome = step, OutcomeStopped
		m.Drain = nil
		return nil
	})
}

// markFailed is the record change of a declared failure at step from
// (why): the claim is kept on the run for a spare, the report started,
// and the machine goes to erasing (reason erase_for_rma, the agent erases
// its disks: it is running, or the caller PXE-boots it) when erase before
// RMA is on and possible (a BMC, or the agent running: agentUp), else to
// rma at once. It reports whether the machine is to be erased.
func (c *Controller) markFailed(m *store.Machine, from, why string, agentUp, noErase bool, now time.Time) bool {
	r := m.Remediation
	if r == nil || r.Outcome != "" {
		attempt := 1
		if r != nil {
			attempt = r.Attempt + 1
		}
		r = &store.Remediation{Attempt: attempt, Started: now}
		m.Remediation = r
	}
	if r.Claim == nil && m.Claim != nil && r.Spare == "" {
		cl := *m.Claim
		r.Claim = &cl
	}
	if r.Report == nil {
		r.Report = &store.RMAReport{}
	}
	r.Report.Conditions = append([]store.HealthCondition(nil), m.Health...)
	result := ResultFailed
	if r.Step == "" {
		result = ""
	}
	m.Claim = nil
	m.Drain = nil
	noErase = noErase || c.cfg.Remediation.NoEraseBeforeRMA
	erase := !noErase && (agentUp || (m.BMC != "" && c.bmc != nil))
	if erase && store.CanTransition(m.State, store.StateErasing) {
		c.enterStep(r, StepErase, result, why, now)
		m.State = store.StateErasing
		m.Reason, m.Message = ReasonEraseForRMA, truncate("declared failed at "+from+": "+why, 512)
		m.Step = pendingStep(agentapi.StepErase, now, now.Add(c.cfg.BootTimeout))
		return true
	}
	c.enterStep(r, StepRMA, result, why, now)
	r.Outcome = OutcomeRMA
	r.Deadline = time.Time{}
	switch {
	case noErase:
		r.Report.Erase = "not_erased: erase before RMA is off (remediation.erase_before_rma)"
	default:
		r.Report.Erase = "not_erased: no BMC to boot the machine into the agent"
	}
	m.State = store.StateRMA
	m.Reason, m.Message = ReasonRMA, truncate("declared failed at "+from+": "+why, 512)
	return false
}

// declareFailed declares machine id failed at ladder step from (why):
// markFailed, then the erase's power sequence or, for rma at once, the
// report's BMC events. A later tick hands the claim to a spare.
func (c *Controller) declareFailed(ctx context.Context, id, from, why string) (store.Machine, error) {
	now := c.now()
	alive := c.agentAlive(id)
	erase, agentUp := false, false
	m, err := c.update(ctx, id, store.W{Actor: ActorRemediation, Reason: ReasonEraseForRMA, Message: truncate(from+": "+why, 512)}, func(m *store.Machine) error {
		if m.Remediation != nil && m.Remediation.Outcome == "" && m.Remediation.Step != from {
			return errNoChange // moved meanwhile
		}
		// A live agent takes the erase task at its next poll; the
		// machine is PXE-booted into one otherwise. Alive (it reported
		// within AgentStaleAfter) is not enough: a machine declared failed
		// after its reprovision has just rebooted into its disk, and its
		// agent reported seconds ago but is gone (agentInEnv).
		agentUp = alive && agentInEnv(m)
		erase = c.markFailed(m, from, why, alive && (m.State == store.StateInspecting || m.State == store.StateAvailable), false, now)
		return nil
	})
	if err != nil {
		return m, err
	}
	if erase {
		if !agentUp {
			c.powerIntoAgent(ctx, m, store.StateErasing)
		}
		return m, nil
	}
	if m.State == store.StateRMA {
		return c.toRMA(ctx, id, "")
	}
	return m, nil
}

// agentInEnv reports whether m's last known place is the in-RAM
// environment: not booted into its disk (provisioned, remediating: the
// power-cycle step runs on the installed OS) and not at the build's reboot.
func agentInEnv(m *store.Machine) bool {
	if m.State == store.StateProvisioned || m.State == store.StateRemediating {
		return false
	}
	return m.Step == nil || m.Step.Step != agentapi.StepReboot
}

// toRMA finishes a declared failure: erasing → rma (the erase's outcome in
// the report), the BMC's events read into the report.
func (c *Controller) toRMA(ctx context.Context, id, erased string) (store.Machine, error) {
	evs, evErr := c.bmcEvents(ctx, id)
	now := c.now()
	why := "declared failed"
	if erased != "" {
		why += "; " + erased
	}
	return c.update(ctx, id, store.W{Actor: ActorRemediation, Reason: ReasonRMA, Message: truncate(why, 512)}, func(m *store.Machine) error {
		r := m.Remediation
		if r == nil {
			return errNoChange
		}
		if r.Report == nil {
			r.Report = &store.RMAReport{}
		}
		changed := false
		if len(r.Report.BMCEvents) == 0 && len(evs) > 0 {
			r.Report.BMCEvents, changed = evs, true
		}
		if evErr != nil && r.Report.Erase == "" && erased == "" {
			c.logger().Warn("rma report: bmc events", "machine", id, "err", evErr)
		}
		if m.State == store.StateErasing && r.Step == StepErase && r.Outcome == "" {
			if erased != "" {
				r.Report.Erase = erased
			}
			c.enterStep(r, StepRMA, map[bool]string{true: ResultSucceeded, false: ResultFailed}[erased == "erased"], erased, now)
			r.Outcome = OutcomeRMA
			m.State = store.StateRMA
			m.Reason = ReasonRMA
			m.Message = truncate("declared failed; disks "+erased, 512)
			return nil
		}
		if m.State == store.StateFailed && r.Step == StepErase && r.Outcome == "" {
			r.Report.Erase = erased
			c.enterStep(r, StepRMA, ResultFailed, erased, now)
			r.Outcome = OutcomeRMA
			m.State = store.StateRMA
			m.Reason, m.Message = ReasonRMA, truncate("declared failed; disks "+erased, 512)
			return nil
		}
		if !changed {
			return errNoChange
		}
		return nil
	})
}

// reinspected is finishInspection's part for a machine whose ladder is at
// reinspect: the new inspection is compared with the baseline (the
// hardware before), with the same field policies; any difference, or a
// blocking difference from the intended fields, declares the machine
// failed (markFailed: erased by the running agent, then rma) with the
// difference in its report. It reports whether it changed m's state.
func (c *Controller) reinspected(m *store.Machine, now time.Time) bool {
	r := m.Remediation
	if r == nil || r.Outcome != "" || r.Step != StepReinspect || m.Discovered == nil {
		return false
	}
	var diff []store.FieldDiff
	if r.Baseline != nil {
		base := store.Machine{Intended: *r.Baseline, RootDisk: m.RootDisk}
		for _, d := range computeDiff(base, *m.Discovered, c.cfg.DiffPolicy, c.cfg.MemoryTolerance) {
			d.Blocking = true
			diff = append(diff, d)
		}
	}
	diff = append(diff, blockingDiffs(m.Diff)...)
	if len(diff) == 0 {
		return false
	}
	if r.Report == nil {
		r.Report = &store.RMAReport{}
	}
	r.Report.Diff = diff
	var fields []string
	for _, d := range diff {
		fields = append(fields, d.Field+": "+d.Intended+" → "+d.Discovered)
	}
	c.markFailed(m, StepReinspect, "the inspection differs from the hardware before: "+strings.Join(fields, "; "), true, false, now)
	return true
}

func blockingDiffs(ds []store.FieldDiff) []store.FieldDiff {
	var out []store.FieldDiff
	for _, d := range ds {
		if d.Blocking {
			out = append(out, d)
		}
	}
	return out
}

// reprovisionStarts is AgentTask's part for a build that starts on a
// machine whose ladder is at reinspect (the inspection matched): the
// ladder is at reprovision from now on, and the owner's and Kiln's
// conditions, which were about the old installation, are dropped. The
// disk holds Kiln's own build of this claim, so the task wipes it
// (Step.Rewrite): without it the check step refuses the disk as a
// foreign OS and the reprovision fails without being tried.
func (c *Controller) reprovisionStarts(m *store.Machine, now time.Time) {
	r := m.Remediation
	if r == nil || r.Outcome != "" || r.Step != StepReinspect {
		return
	}
	c.enterStep(r, StepReprovision, ResultSucceeded, "the inspection matched the hardware before; the same claim is built again", now)
	if m.Step != nil {
		m.Step.Rewrite = true
	}
	clearConditions(m, store.HealthSourceOwner, store.HealthSourceKiln)
}

// errNotV3 tells whether err is the store refusing a write because a node
// of the cluster predates command 25.
func errNotV3(err error) bool { return errors.Is(err, store.ErrUnsupportedByCluster) }
