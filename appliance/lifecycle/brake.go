// The remediation brake (issue 14; DESIGN.md "The brake"): failures counted
// per rack, per claim and per site within a window; over a threshold,
// automatic repair halts until a person resumes it. The record is the
// store's (store.RepairBrake, command 26), so a new leader keeps a halt.

package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"time"

	"kiln/store"
)

// Brake scopes (store.RepairBrake.Scope, label scope of
// kiln_remediation_brake_engaged).
const (
	ScopeSite  = "site"
	ScopeRack  = "rack"
	ScopeClaim = "claim"
)

// Reasons of brake writes.
const (
	ReasonFailureCounted = "failure_counted"
	ReasonBrakeEngaged   = "brake_engaged"
	ReasonBrakeResumed   = "resumed"
)

// brake returns the stored brake record (zero and released when none was
// ever written).
func (c *Controller) brake() (store.RepairBrake, error) {
	b, err := c.st.GetRepairBrake()
	if errors.Is(err, store.ErrNotFound) {
		return store.RepairBrake{}, nil
	}
	return b, err
}

// fleet is what the brake divides by: machines per rack, claimed machines
// per claim role and in the site (a machine whose claim waits for a spare
// counts for its role).
type fleet struct {
	rack    map[string]int
	role    map[string]int
	claimed int
}

func fleetOf(all []store.Machine) fleet {
	f := fleet{rack: map[string]int{}, role: map[string]int{}}
	for _, m := range all {
		if m.State == store.StateRetired {
			continue
		}
		if m.Rack != "" {
			f.rack[m.Rack]++
		}
		cl := m.Claim
		if cl == nil && m.Remediation != nil && m.Remediation.Spare == "" {
			cl = m.Remediation.Claim
		}
		if cl != nil {
			f.claimed++
			f.role[cl.Role]++
		}
	}
	return f
}

// over reports whether n failures of a scope of total machines exceed t.
func over(t BrakeThreshold, n, total int) bool {
	if t.MaxFailures > 0 && n > t.MaxFailures {
		return true
	}
	return t.MaxPercent > 0 && n >= max(t.MinFailures, 1) && total > 0 && float64(n)*100 > t.MaxPercent*float64(total)
}

// countFailure counts machine m's failure (why) in the brake record,
// dropping failures older than BrakeWindow, and engages the brake when a
// scope's failures exceed its threshold. It returns the record as written
// and whether the brake is engaged. A machine already counted within the
// window is not counted twice.
func (c *Controller) countFailure(ctx context.Context, m store.Machine, f fleet, why string) (store.RepairBrake, bool, error) {
	rc := c.cfg.Remediation
	for attempt := 0; attempt < maxCASRetries; attempt++ {
		b, err := c.brake()
		if err != nil {
			return b, false, err
		}
		if b.Engaged {
			return b, true, nil
		}
		now := c.now()
		var keep []store.RepairFailure
		seen := false
		for _, x := range b.Failures {
			if now.Sub(x.At) <= rc.BrakeWindow {
				keep = append(keep, x)
				seen = seen || x.Machine == m.ID
			}
		}
		if seen {
			return b, false, nil
		}
		role := ""
		if m.Claim != nil {
			role = m.Claim.Role
		}
		keep = append(keep, store.RepairFailure{Machine: m.ID, Rack: m.Rack, Claim: role, At: now, Why: truncate(why, 256)})
		b.Failures = keep
		var nRack, nRole int
		for _, x := range keep {
			if m.Rack != "" && x.Rack == m.Rack {
				nRack++
			}
			if m.Claim != nil && x.Claim == role {
				nRole++
			}
		}
		w := store.W{Actor: ActorRemediation, Reason: ReasonFailureCounted, Message: m.ID + ": " + truncate(why, 200)}
		trip := func(scope, key string, n, total int, t BrakeThreshold) {
			if b.Engaged {
				return
			}
			b.Engaged, b.Scope, b.Key, b.EngagedAt = true, scope, key, now
			b.ResumedAt, b.ResumedBy = time.Time{}, ""
			b.Reason = ReasonBrakeEngaged
			what := scope
			if key != "" {
				what += " " + key
			}
			b.Message = fmt.Sprintf("%d of %d machines of %s failed within %s (threshold: max_failures %d, max_percent %g, min_failures %d); automatic repair halted until `kiln remediation resume`",
				n, total, what, rc.BrakeWindow, t.MaxFailures, t.MaxPercent, t.MinFailures)
			w = store.W{Actor: ActorRemediation, Reason: ReasonBrakeEngaged, Message: b.Message}
		}
		if m.Rack != "" && over(rc.BrakeRack, nRack, f.rack[m.Rack]) {
			trip(ScopeRack, m.Rack, nRack, f.rack[m.Rack], rc.BrakeRack)
		}
		if m.Claim != nil && over(rc.BrakeClaim, nRole, f.role[role]) {
			trip(ScopeClaim, role, nRole, f.role[role], rc.BrakeClaim)
		}
		if over(rc.BrakeSite, len(keep), f.claimed) {
			trip(ScopeSite, "", len(keep), f.claimed, rc.BrakeSite)
		}
		out, err := c.st.PutRepairBrake(ctx, b, w)
		if errors.Is(err, store.ErrConflict) {
			continue
		}
		if err != nil {
			return b, false, fmt.Errorf("lifecycle: brake: %w", err)
		}
		if out.Engaged {
			c.logger().Error("remediation brake engaged", "scope", out.Scope, "key", out.Key, "message", out.Message)
		}
		c.setBrakeGauge(out)
		return out, out.Engaged, nil
	}
	return store.RepairBrake{}, false, fmt.Errorf("lifecycle: brake: gave up after %d conflicting writes", maxCASRetries)
}

// setBrakeGauge exports b: kiln_remediation_brake_engaged{scope} is 1 for
// the engaged scope, 0 for the others.
func (c *Controller) setBrakeGauge(b store.RepairBrake) {
	for _, s := range []string{ScopeSite, ScopeRack, ScopeClaim} {
		v := 0.0
		if b.Engaged && b.Scope == s {
			v = 1
		}
		c.rm.brake.WithLabelValues(s).Set(v)
	}
}

// ResumeRemediation releases the brake (`kiln remediation resume`): the
// failures counted so far are forgotten and ResumedAt/ResumedBy record the
// person; a machine whose Critical condition began before the resume is
// repaired without being counted again. Resuming a released brake changes
// nothing. Errors: store.ErrUnsupportedByCluster, store errors.
func (c *Controller) ResumeRemediation(ctx context.Context, w store.W) (store.RepairBrake, error) {
	w = withDefaults(w, ReasonBrakeResumed)
	for attempt := 0; attempt < maxCASRetries; attempt++ {
		b, err := c.brake()
		if err != nil {
			return b, err
		}
		if !b.Engaged {
			return b, nil
		}
		b.Engaged = false
		b.ResumedAt, b.ResumedBy = c.now(), w.Actor
		b.Failures = nil
		out, err := c.st.PutRepairBrake(ctx, b, w)
		if errors.Is(err, store.ErrConflict) {
			continue
		}
		if err != nil {
			return out, fmt.Errorf("lifecycle: resume remediation: %w", err)
		}
		c.setBrakeGauge(out)
		return out, nil
	}
	return store.RepairBrake{}, fmt.Errorf("lifecycle: resume remediation: gave up after %d conflicting writes", maxCASRetries)
}
