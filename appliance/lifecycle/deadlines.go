// Step deadlines (DESIGN.md "Deadlines"): the loop's checkDeadlines fails a
// machine past its step's deadline (timeout) and moves a built machine not
// seen netbooting within RebootTimeout to provisioned (reboot_unobserved).
// Leader only (Tick); writes through update.

package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"time"

	"kiln/store"
)

// deadlineStates are the states in which a step deadline can fail a machine.
var deadlineStates = []store.MachineState{store.StateInspecting, store.StateProvisioning, store.StateErasing}

// checkDeadlines fails machines whose current step is past its deadline
// (reason timeout), and moves built machines not seen netbooting within
// RebootTimeout to provisioned (reason reboot_unobserved).
func (c *Controller) checkDeadlines(ctx context.Context) error {
	now := c.now()
	var errs []error
	for _, s := range deadlineStates {
		ms, err := c.listAll(store.ListOptions{State: s})
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, m := range ms {
			switch {
			case firstBootUnreported(m, now): // firstboot.go (issue 15)
				if _, err := c.failUnreported(ctx, m.ID, now); err != nil {
					errs = append(errs, err)
				}
			case rebootUnobserved(m, now):
				if _, err := c.finishUnobserved(ctx, m.ID, now); err != nil {
					errs = append(errs, err)
				}
			case pastDeadline(m, now):
				if _, err := c.failTimeout(ctx, m.ID, now); err != nil {
					errs = append(errs, err)
				} else {
					c.timeoutSignal(ctx, m)
				}
			case agentSilent(m, now, c.cfg.Remediation.AgentSilentAfter):
				c.recordKiln(ctx, m.ID, CondAgentSilent, store.HealthWarning, string(m.State),
					fmt.Sprintf("step %s (%s) not refreshed since %s", m.Step.Step, m.Step.State, m.Step.At.Format(time.RFC3339)))
			}
		}
	}
	return errors.Join(errs...)
}

// pastDeadline: m's current step passed its deadline and fails m. A built
// machine (buildComplete) never fails on time; see rebootUnobserved.
func pastDeadline(m store.Machine, now time.Time) bool {
	return hasState(deadlineStates, m.State) && !buildComplete(m) && m.Step != nil && !m.Step.Deadline.IsZero() &&
		now.After(m.Step.Deadline) && m.Step.State != string(JobFailed)
}

// rebootUnobserved: m's build completed and RebootTimeout (its Step.Deadline)
// passed without a netboot: it booted its disk without asking us first.
// A release build never is: it waits for its first-boot report instead.
func rebootUnobserved(m store.Machine, now time.Time) bool {
	return buildComplete(m) && !awaitsFirstBoot(m) && m.Step != nil && !m.Step.Deadline.IsZero() && now.After(m.Step.Deadline)
}

func (c *Controller) finishUnobserved(ctx context.Context, id string, now time.Time) (store.Machine, error) {
	return c.update(ctx, id, store.W{Actor: ActorController, Reason: ReasonRebootUnobserved}, func(m *store.Machine) error {
		if !rebootUnobserved(*m, now) { // re-checked on the current record
			return errNoChange
		}
		m.State = store.StateProvisioned
		m.Reason = ReasonRebootUnobserved
		m.Message = fmt.Sprintf("no netboot seen within %s of the build's completion; assumed booted from disk", c.cfg.RebootTimeout)
		m.Step.Deadline = time.Time{}
		return nil
	})
}

func (c *Controller) failTimeout(ctx context.Context, id string, now time.Time) (store.Machine, error) {
	return c.update(ctx, id, store.W{Actor: ActorController, Reason: ReasonTimeout}, func(m *store.Machine) error {
		if !pastDeadline(*m, now) { // re-checked on the current record
			return errNoChange
		}
		m.State = store.StateFailed
		m.Message = fmt.Sprintf("step %s (%s) passed its deadline %s", m.Step.Step, m.Step.State, m.Step.Deadline.Format(time.RFC3339))
		m.Step.State, m.Step.Reason = "failed", ReasonTimeout
		return nil
	})
}

// timeoutSignal records Kiln's own health condition for a machine that
// failed on time (m as it was before): boot_missing when the agent never
// reported after a power action (a pending step), build_stalled when a
// build step passed its deadline. Both Critical: a claimed machine's
// ladder starts on them.
func (c *Controller) timeoutSignal(ctx context.Context, m store.Machine) {
	switch {
	case m.Step.State == stepPending:
		c.recordKiln(ctx, m.ID, CondBootMissing, store.HealthCritical, string(m.State),
			fmt.Sprintf("no agent report for step %s by %s", m.Step.Step, m.Step.Deadline.Format(time.RFC3339)))
	case m.State == store.StateProvisioning:
		c.recordKiln(ctx, m.ID, CondBuildStalled, store.HealthCritical, m.Step.Step,
			fmt.Sprintf("step %s (%s) passed its deadline %s", m.Step.Step, m.Step.State, m.Step.Deadline.Format(time.RFC3339)))
	}
}

// agentSilent: m's agent is in a started or running step whose record was
// not refreshed for after, and m has no agent_silent condition yet.
func agentSilent(m store.Machine, now time.Time, after time.Duration) bool {
	if m.Step == nil || (m.Step.State != "started" && m.Step.State != "running") || now.Sub(m.Step.At) <= after {
		return false
	}
	for _, h := range m.Health {
		if h.Type == CondAgentSilent && h.Since.After(m.Step.At) {
			return false
		}
	}
	return true
}
