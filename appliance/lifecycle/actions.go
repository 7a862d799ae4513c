// Operator actions of issue 14 (DESIGN.md "Operator actions"): Power
// (on, off, cycle), SetMaintenance, Retire, RMA and Reprovision, each with
// a reason and an audit record (the machine's event, or the job's events
// for a power action, carry the actor, reason and message of the
// request). Release, Erase and Inspect are in ops.go.

package lifecycle

import (
	"context"
	"fmt"

	"kiln/api/agentapi"
	"kiln/appliance/lifecycle/rules"
	"kiln/store"
)

// Power actions (Power's action argument).
const (
	PowerOn    = "on"
	PowerOff   = "off"
	PowerCycle = "cycle"
)

// Reasons of operator actions.
const (
	ReasonPowerRequested       = "power_requested"
	ReasonMaintenanceOn        = "maintenance_on"
	ReasonMaintenanceOff       = "maintenance_off"
	ReasonEraseForRetire       = "erase_for_retire"
	ReasonRetired              = "retired"
	ReasonRMARequested         = "rma_requested"
	ReasonReprovisionRequested = "reprovision_requested"
)

// Power queues one BMC job for machine id — power_on, power_off or
// power_cycle for action on, off or cycle — with w (actor, reason
// power_requested by default, message), which its job events carry.
// It returns the machine; the job's outcome is in GET /v1/jobs?machine=.
// A power action ends any agent on the machine. Errors: ErrInvalid (action,
// or no BMC enrolled), store.ErrConflict (a BMC sequence for the machine
// is already queued or running), store errors.
func (c *Controller) Power(ctx context.Context, id, action string, w store.W) (store.Machine, error) {
	kind := map[string]string{PowerOn: JobPowerOn, PowerOff: JobPowerOff, PowerCycle: JobPowerCycle}[action]
	if kind == "" {
		return store.Machine{}, fmt.Errorf("%w: action %q: want on, off or cycle", ErrInvalid, action)
	}
	if err := checkReason(w.Message); err != nil {
		return store.Machine{}, err
	}
	m, err := c.st.GetMachine(id)
	if err != nil {
		return m, fmt.Errorf("lifecycle: power %s: %w", id, err)
	}
	if m.BMC == "" || c.bmc == nil {
		return m, fmt.Errorf("%w: machine %s has no BMC enrolled (POST /v1/machines/%s/bmc)", ErrInvalid, id, id)
	}
	w = withDefaults(w, ReasonPowerRequested)
	ok, err := c.enqueueJobs(ctx, m, []string{kind}, w, nil)
	if err != nil {
		return m, err
	}
	if !ok {
		return m, fmt.Errorf("%w: machine %s: a BMC sequence is already queued or running; see GET /v1/jobs?machine=%s", store.ErrConflict, id, id)
	}
	return m, nil
}

func checkReason(msg string) error {
	if err := rules.CheckText(msg, rules.MaxTextLen); err != nil {
		return fmt.Errorf("%w: reason: %v", ErrInvalid, err)
	}
	return nil
}

// SetMaintenance sets (on) or clears machine id's maintenance flag (Ironic
// maintenance; not a state): with it set nothing is done to the machine
// automatically — no ladder starts or advances, it is no spare. The
// reason (w.Message, free text) is kept on the flag; the write's event
// has reason maintenance_on or maintenance_off. Setting it again only
// replaces the reason. Errors: ErrInvalid (reason), store errors
// (store.ErrUnsupportedByCluster while a node predates command 25).
func (c *Controller) SetMaintenance(ctx context.Context, id string, on bool, w store.W) (store.Machine, error) {
	if err := checkReason(w.Message); err != nil {
		return store.Machine{}, err
	}
	reason := ReasonMaintenanceOff
	if on {
		reason = ReasonMaintenanceOn
	}
	w = withDefaults(w, reason)
	now := c.now()
	return c.update(ctx, id, w, func(m *store.Machine) error {
		if !on {
			if m.Maintenance == nil {
				return errNoChange
			}
			m.Maintenance = nil
			return nil
		}
		m.Maintenance = &store.Maintenance{Reason: w.Message, Actor: w.Actor, Since: now}
		return nil
	})
}

// retireDirect are the states Retire moves to retired at once (no disk of
// the machine holds anything Kiln wrote or trusted); retireErase those it
// erases first (erase_for_retire; the agent's erase success then retires it).
var (
	retireDirect = []store.MachineState{store.StateRegistered, store.StateDiscovered}
	retireErase  = []store.MachineState{store.StateAvailable, store.StateFailed, store.StateQuarantined,
		store.StateProvisioned, store.StateRMA}
)

// Retire takes machine id out of service for good: registered or
// discovered → retired at once; available, failed, quarantined,
// provisioned or rma → erasing (reason erase_for_retire; the claim is
// dropped; with a BMC the machine is PXE-booted into the agent), and the
// erase's success retires it (the agent is then told to power off). Every
// disk is erased before retirement. Errors: *StateError, ErrInvalid
// (reason), store errors.
func (c *Controller) Retire(ctx context.Context, id string, w store.W) (store.Machine, error) {
	if err := checkReason(w.Message); err != nil {
		return store.Machine{}, err
	}
	cur, err := c.st.GetMachine(id)
	if err != nil {
		return cur, fmt.Errorf("lifecycle: retire %s: %w", id, err)
	}
	if hasState(retireDirect, cur.State) {
		return c.transition(ctx, "retire", id, retireDirect, store.StateRetired, withDefaults(w, ReasonRetired), nil)
	}
	w = withDefaults(w, ReasonEraseForRetire)
	w.Reason = ReasonEraseForRetire
	now := c.now()
	m, err := c.update(ctx, id, w, func(m *store.Machine) error {
		if !hasState(retireErase, m.State) || active(*m) {
			return &StateError{Op: "retire", Machine: id, State: m.State, Want: append(append([]store.MachineState(nil), retireDirect...), retireErase...)}
		}
		m.State = store.StateErasing
		m.Reason, m.Message = ReasonEraseForRetire, w.Message
		m.Claim = nil
		m.Step = pendingStep(agentapi.StepErase, now, now.Add(c.cfg.BootTimeout))
		return nil
	})
	if err != nil {
		return m, err
	}
	if !c.agentAlive(id) {
		c.powerIntoAgent(ctx, m, store.StateErasing)
	}
	return m, nil
}

// rmaFrom are the states RMA applies to.
var rmaFrom = []store.MachineState{store.StateAvailable, store.StateProvisioned, store.StateProvisioning, store.StateFailed,
	store.StateQuarantined, store.StateRemediating, store.StateInspecting}

// RMA declares machine id failed by hand (an operator's rma): as the
// ladder's declared failure, its claim (if any) is handed to a spare, and
// the machine is erased (erase_for_rma) and then rma — or rma at once with
// skipErase (the report says the disks were not erased, and why: w's
// message). Errors: *StateError, ErrInvalid (reason), store errors.
func (c *Controller) RMA(ctx context.Context, id string, skipErase bool, w store.W) (store.Machine, error) {
	if err := checkReason(w.Message); err != nil {
		return store.Machine{}, err
	}
	w = withDefaults(w, ReasonRMARequested)
	why := "rma requested by " + w.Actor
	if w.Message != "" {
		why += ": " + w.Message
	}
	now := c.now()
	alive := c.agentAlive(id)
	erase := false
	m, err := c.update(ctx, id, w, func(m *store.Machine) error {
		if !hasState(rmaFrom, m.State) {
			return &StateError{Op: "rma", Machine: id, State: m.State, Want: rmaFrom}
		}
		erase = c.markFailed(m, "operator", why, alive, skipErase, now)
		if skipErase && m.Remediation.Report != nil {
			m.Remediation.Report.Erase = "not_erased: the operator skipped the erase (" + truncate(why, 200) + ")"
		}
		return nil
	})
	if err != nil {
		return m, err
	}
	if erase && !alive {
		c.powerIntoAgent(ctx, m, store.StateErasing)
	}
	if m.State == store.StateRMA {
		return c.toRMA(ctx, id, "")
	}
	return m, nil
}

// Reprovision builds machine id's claim again, on request: a provisioned
// or failed claimed machine starts a ladder run at reinspect (no drain:
// the operator asked), so it is inspected, compared with its hardware
// before, and built with the same claim by the gated build; a difference
// declares it failed as in the ladder. Errors: *StateError (not
// provisioned or failed, no claim, or a run in progress), ErrInvalid,
// store errors.
func (c *Controller) Reprovision(ctx context.Context, id string, w store.W) (store.Machine, error) {
	if err := checkReason(w.Message); err != nil {
		return store.Machine{}, err
	}
	w = withDefaults(w, ReasonReprovisionRequested)
	cur, err := c.st.GetMachine(id)
	if err != nil {
		return cur, fmt.Errorf("lifecycle: reprovision %s: %w", id, err)
	}
	if cur.Claim == nil {
		return cur, &StateError{Op: "reprovision (no claim)", Machine: id, State: cur.State, Want: []store.MachineState{store.StateProvisioned, store.StateFailed}}
	}
	why := "reprovision requested by " + w.Actor
	if w.Message != "" {
		why += ": " + w.Message
	}
	return c.startLadder(ctx, id, why, StepReinspect, false)
}
