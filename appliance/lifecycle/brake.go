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

// failed is one machine a tick found failing, with why.
type failed struct {
	m   store.Machine
	why string
}

// countFailures counts the failures fs (one tick's, all at once, so a
// mass failure is judged whole before any repair starts) in the brake
// record, dropping failures older than BrakeWindow, and engages the brake
// when a scope's failures exceed its threshold. It returns whether the
// brake is engaged. A machine already counted within the window is not
// counted twice.
func (c *Controller) countFailures(ctx context.Context, fs []failed, f fleet) (bool, error) {
	rc := c.cfg.Remediation
	for attempt := 0; attempt < maxCASRetries; attempt++ {
		b, err := c.brake()
		if err != nil {
			return false, err
		}
		if b.Engaged {
			return true, nil
		}
		now := c.now()
		var keep []store.RepairFailure
		seen := map[string]bool{}
		for _, x := range b.Failures {
			if now.Sub(x.At) <= rc.BrakeWindow {
				keep = append(keep, x)
				seen[x.Machine] = true
			}
		}
		var added []store.RepairFailure
		for _, x := range fs {
			if seen[x.m.ID] {
				continue
			}
			seen[x.m.ID] = true
			role := ""
			if x.m.Claim != nil {
				role = x.m.Claim.Role
			}
			added = append(added, store.RepairFailure{Machine: x.m.ID, Rack: x.m.Rack, Claim: role, At: now, Why: truncate(x.why, 256)})
		}
		if len(added) == 0 {
			return false, nil
		}
		keep = append(keep, added...)
		b.Failures = keep
		nRack, nRole := map[string]int{}, map[string]int{}
		for _, x := range keep {
			if x.Rack != "" {
				nRack[x.Rack]++
			}
			nRole[x.Claim]++
		}
		msg := added[0].Machine + ": " + truncate(added[0].Why, 200)
		if len(added) > 1 {
			msg = fmt.Sprintf("%d machines failed: %s and %d more", len(added), msg, len(added)-1)
		}
		w := store.W{Actor: ActorRemediation, Reason: ReasonFailureCounted, Message: msg}
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
		for _, x := range added {
			if x.Rack != "" && over(rc.BrakeRack, nRack[x.Rack], f.rack[x.Rack]) {
				trip(ScopeRack, x.Rack, nRack[x.Rack], f.rack[x.Rack], rc.BrakeRack)
			}
		}
		for _, x := range added {
			if x.Claim != "" && over(rc.BrakeClaim, nRole[x.Claim], f.role[x.Claim]) {
				trip(ScopeClaim, x.Claim, nRole[x.Claim], f.role[x.Claim], rc.BrakeClaim)
			}
		}
		if over(rc.BrakeSite, len(keep), f.claimed) {
			trip(ScopeSite, "", len(keep), f.claimed, rc.BrakeSite)
		}
		out, err := c.st.PutRepairBrake(ctx, b, w)
		if errors.Is(err, store.ErrConflict) {
			continue
		}
		if err != nil {
			return false, fmt.Errorf("lifecycle: brake: %w", err)
		}
		if out.Engaged {
			c.logger().Error("remediation brake engaged", "scope", out.Scope, "key", out.Key, "message", out.Message)
		}
		c.setBrakeGauge(out)
		return out.Engaged, nil
	}
	return false, fmt.Errorf("lifecycle: brake: gave up after %d conflicting writes", maxCASRetries)
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
