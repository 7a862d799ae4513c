// Health signals (issue 14; DESIGN.md "Remediation"), each recorded with
// its source on Machine.Health: the BMC (HealthReader, polled with bounded
// concurrency and per-machine backoff by pollHealth), the claim's owner
// (ReportHealth, POST /v1/machines/{id}/health) and Kiln itself
// (recordKiln: build stalled, agent silent, boot missing). Owner of
// healthPoller: this file only.

package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"kiln/appliance/lifecycle/rules"
	"kiln/bmc"
	"kiln/store"
)

// HealthReader reads the health a machine's BMC reports (the appliance's
// adapter over bmc.Controller.Health: Redfish Systems/{id} and Chassis/{id}
// Status.Health and HealthRollup, IPMI SEL and sensors). A BMC that cannot
// report returns an error, never HealthOK.
type HealthReader interface {
	Health(ctx context.Context, machineID string) (bmc.Health, error)
}

// Health condition types Kiln records (store.HealthCondition.Type); an
// owner's condition type is "owner/" + the type it gives.
const (
	CondBMCSystem    = "bmc_system"    // Redfish ComputerSystem Status.Health (IPMI: sensors, SEL)
	CondBMCChassis   = "bmc_chassis"   // Redfish Chassis Status.Health
	CondBuildStalled = "build_stalled" // a build step passed its deadline
	CondAgentSilent  = "agent_silent"  // an agent in a running step stopped refreshing its record
	CondBootMissing  = "boot_missing"  // a power action's expected boot into the agent never arrived
	ownerPrefix      = "owner/"
)

// Reasons of health writes.
const (
	ReasonHealthReported = "health_reported"
	ReasonHealthChanged  = "health_changed"
)

// setCondition puts cond on m (one condition per Type): a new condition or
// a change of Status, Reason or Message sets Since to now; At is always
// now. It reports whether anything but At changed.
func setCondition(m *store.Machine, cond store.HealthCondition, now time.Time) bool {
	cond.At = now
	for i := range m.Health {
		h := &m.Health[i]
		if h.Type != cond.Type {
			continue
		}
		changed := h.Status != cond.Status || h.Reason != cond.Reason || h.Message != cond.Message || h.Source != cond.Source
		cond.Since = h.Since
		if h.Status != cond.Status {
			cond.Since = now
		}
		*h = cond
		return changed
	}
	cond.Since = now
	m.Health = append(m.Health, cond)
	return true
}

// clearConditions drops m's conditions of the given sources; it reports
// whether it dropped any.
func clearConditions(m *store.Machine, sources ...string) bool {
	var keep []store.HealthCondition
	for _, h := range m.Health {
		drop := false
		for _, s := range sources {
			drop = drop || h.Source == s
		}
		if !drop {
			keep = append(keep, h)
		}
	}
	dropped := len(keep) != len(m.Health)
	m.Health = keep
	return dropped
}

// criticalConditions returns m's Critical conditions.
func criticalConditions(m store.Machine) []store.HealthCondition {
	var out []store.HealthCondition
	for _, h := range m.Health {
		if h.Status == store.HealthCritical {
			out = append(out, h)
		}
	}
	return out
}

// ReportHealth records a condition the owner of claimed machine id reports
// (POST /v1/machines/{id}/health, the role a Cluster API
// MachineHealthCheck plays): type condType (stored as "owner/"+condType,
// source owner), status OK, Warning or Critical, a reason and a message.
// A Critical condition starts the remediation ladder (DESIGN.md
// "Remediation") unless the machine is in maintenance, remediation is off
// or the brake is engaged. Errors: ErrInvalid (rules.CheckHealthReport),
// *StateError (no claim: only a claimed machine has an owner),
// store.ErrUnsupportedByCluster (a node predates command 25), store errors.
func (c *Controller) ReportHealth(ctx context.Context, id, condType, status, reason, message string, w store.W) (store.Machine, error) {
	if err := rules.CheckHealthReport(condType, status, reason, message); err != nil {
		return store.Machine{}, invalidField(err)
	}
	w = withDefaults(w, ReasonHealthReported)
	if w.Message == "" {
		w.Message = fmt.Sprintf("%s%s %s %s", ownerPrefix, condType, status, reason)
	}
	now := c.now()
	return c.update(ctx, id, w, func(m *store.Machine) error {
		if m.Claim == nil && !(m.Remediation != nil && m.Remediation.Outcome == "") {
			return &StateError{Op: "report health", Machine: id, State: m.State,
				Want: []store.MachineState{store.StateProvisioned, store.StateProvisioning, store.StateFailed, store.StateRemediating}}
		}
		setCondition(m, store.HealthCondition{Type: ownerPrefix + condType, Source: store.HealthSourceOwner, Status: status,
			Reason: reason, Message: message}, now)
		return nil
	})
}

// recordKiln records a condition Kiln observed itself (source kiln) on
// machine id, best effort: a failure (a node that predates command 25, a
// conflict) is logged, never returned, since the observation's own write
// (a failed step, say) has been made.
func (c *Controller) recordKiln(ctx context.Context, id, condType, status, reason, message string) {
	now := c.now()
	_, err := c.update(ctx, id, store.W{Actor: ActorController, Reason: ReasonHealthChanged, Message: condType + " " + status}, func(m *store.Machine) error {
		if !setCondition(m, store.HealthCondition{Type: condType, Source: store.HealthSourceKiln, Status: status, Reason: reason,
			Message: truncate(message, 256)}, now) {
			return errNoChange
		}
		return nil
	})
	if err != nil {
		c.logger().Warn("record health condition", "machine", id, "type", condType, "err", err)
	}
}

// healthPollStates are the states whose BMC health is polled.
var healthPollStates = []store.MachineState{store.StateAvailable, store.StateProvisioning, store.StateProvisioned,
	store.StateFailed, store.StateRemediating, store.StateInspecting, store.StateErasing}

// healthPoller is this node's BMC health poll state: when each machine is
// due next and its backoff after failed reads. Its own lock.
type healthPoller struct {
	mu   sync.Mutex
	next map[string]time.Time
	back inspectBackoff
	// sweep is how long the last PollHealth that read at least one BMC
	// took (controller clock): the time a failure of many machines at once
	// takes to surface (see sweepHold).
	sweep time.Duration
}

// lastSweep is the duration of the last PollHealth pass that read a BMC.
func (p *healthPoller) lastSweep() time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.sweep
}

func (p *healthPoller) due(id string, now time.Time) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return !now.Before(p.next[id]) && !now.Before(p.back.next(id))
}

func (p *healthPoller) done(id string, at time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.next == nil {
		p.next = map[string]time.Time{}
	}
	p.next[id] = at
}

// PollHealth reads the BMC health of every machine with a BMC in a polled
// state that is due (HealthPollInterval since its last read, and past its
// backoff after a failed one), at most HealthPollWorkers reads at a time,
// each bounded by BMCTimeout, and records conditions bmc_system and
// bmc_chassis when their status changes (an unknown status, "", records
// nothing). It returns when every read it started has ended. Leader only
// (Run calls it every HealthPollInterval); tests call it directly.
func (c *Controller) PollHealth(ctx context.Context) error {
	if c.cfg.Health == nil || c.cfg.Remediation.HealthPollInterval < 0 {
		return nil
	}
	var ms []store.Machine
	for _, s := range healthPollStates {
		l, err := c.listAll(store.ListOptions{State: s})
		if err != nil {
			return err
		}
		ms = append(ms, l...)
	}
	now := c.now()
	sem := make(chan struct{}, c.cfg.Remediation.HealthPollWorkers)
	var wg sync.WaitGroup
	read := 0
	defer func() {
		if read > 0 {
			d := c.now().Sub(now)
			c.health.mu.Lock()
			c.health.sweep = d
			c.health.mu.Unlock()
		}
	}()
	for _, m := range ms {
		if m.BMC == "" || !c.health.due(m.ID, now) {
			continue
		}
		read++
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			wg.Wait()
			return ctx.Err()
		}
		wg.Add(1)
		go func(id string) {
			defer wg.Done()
			defer func() { <-sem }()
			c.pollOne(ctx, id)
		}(m.ID)
	}
	wg.Wait()
	return nil
}

func (c *Controller) pollOne(ctx context.Context, id string) {
	cctx, cancel := context.WithTimeout(ctx, c.cfg.BMCTimeout)
	h, err := c.cfg.Health.Health(cctx, id)
	cancel()
	now := c.now()
	if err != nil {
		c.health.back.failed(id, now, c.cfg.Remediation.HealthPollBackoff, c.cfg.Remediation.HealthPollMaxBackoff)
		c.rm.healthReads.WithLabelValues("failed").Inc()
		c.logger().Debug("bmc health", "machine", id, "err", err)
		return
	}
	c.health.back.clear(id)
	c.health.done(id, now.Add(c.cfg.Remediation.HealthPollInterval))
	c.rm.healthReads.WithLabelValues("ok").Inc()
	msg := ""
	for _, ev := range h.Events {
		if ev.Severity == bmc.HealthCritical || (msg == "" && ev.Severity == bmc.HealthWarning) {
			msg = truncate(sanitize(ev.Message), 256)
			if ev.Severity == bmc.HealthCritical {
				break
			}
		}
	}
	_, err = c.update(ctx, id, store.W{Actor: ActorController, Reason: ReasonHealthChanged}, func(m *store.Machine) error {
		changed := false
		for _, x := range []struct {
			typ string
			st  bmc.HealthState
		}{{CondBMCSystem, h.System}, {CondBMCChassis, h.Chassis}} {
			if x.st == bmc.HealthUnknown {
				continue
			}
			cm := ""
			if x.st != bmc.HealthOK {
				cm = msg
			}
			if setCondition(m, store.HealthCondition{Type: x.typ, Source: store.HealthSourceBMC, Status: string(x.st), Message: cm}, now) {
				changed = true
			}
		}
		if !changed {
			return errNoChange
		}
		return nil
	})
	if err != nil && !errors.Is(err, context.Canceled) {
		c.logger().Warn("record bmc health", "machine", id, "err", err)
	}
}

// bmcEvents reads machine id's BMC events for an RMA report (nil when
// there is no health reader or the read fails; the failure is in the
// report's erase/notes instead).
func (c *Controller) bmcEvents(ctx context.Context, id string) ([]store.BMCEvent, error) {
	if c.cfg.Health == nil {
		return nil, nil
	}
	cctx, cancel := context.WithTimeout(ctx, c.cfg.BMCTimeout)
	defer cancel()
	h, err := c.cfg.Health.Health(cctx, id)
	if err != nil {
		return nil, err
	}
	out := make([]store.BMCEvent, 0, len(h.Events))
	for i, ev := range h.Events {
		if i == 32 {
			break
		}
		out = append(out, store.BMCEvent{Time: ev.Time.UTC(), Source: ev.Source, Severity: string(ev.Severity),
			Message: truncate(sanitize(ev.Message), 256), ID: truncate(sanitize(ev.ID), 64)})
	}
	return out, nil
}
