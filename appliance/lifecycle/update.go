// The transitions' write path, the one place a machine record is written
// from a read: update (read, mutate, check store.CanTransition,
// compare-and-set, retry on conflict), report (the same loop for an agent
// report, one store command with its events), transition, and the closed
// sets of actors and reasons the controller records. The operations that
// call them are in ops.go, the deadlines in deadlines.go, the agent
// protocol in agent.go.

package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"time"

	"kiln/store"
)

// Actors of transitions this package owns.
const (
	ActorController = "controller"
	ActorAgent      = "agent"
)

// Machine reasons set by the controller (closed set, besides agentapi reasons).
const (
	ReasonInspectionStarted   = "inspection_started"
	ReasonInspectionRequested = "inspection_requested"
	ReasonInspectionPassed    = "inspection_passed"
	ReasonHardwareMismatch    = "hardware_mismatch"
	ReasonAgentRegistered     = "agent_registered"
	ReasonBuildStarted        = "build_started"
	ReasonBuildComplete       = "build_complete"    // finalize succeeded; still provisioning until the disk boots
	ReasonBootedLocalDisk     = "booted_local_disk" // the post-build netboot was told to exit to the disk
	ReasonRebootUnobserved    = "reboot_unobserved" // no netboot within RebootTimeout after the build completed
	ReasonReleased            = "released"
	ReasonEraseRequested      = "erase_requested"
	ReasonEraseComplete       = "erase_complete"
	ReasonEraseQuarantined    = "erase_quarantined" // erasing a quarantined machine: inspected again after the erase
	ReasonTimeout             = "timeout"
	ReasonBMCFailed           = "bmc_failed"
	ReasonAgentRestarted      = "agent_restarted"
	ReasonBuildRetried        = "build_retried" // the agent asked for work mid-build: the build is served again (next attempt)
	ReasonClaimed             = "claimed"
	ReasonDiscovered          = "discovered"
	ReasonBurnInStarted       = "burnin_started" // inspected; inspecting until step burn_in passes (burnin.go)
)

// errNoChange tells update that fn decided to write nothing.
var errNoChange = errors.New("no change")

// maxCASRetries bounds update's re-read-and-retry loop on store.ErrConflict.
const maxCASRetries = 8

// update reads machine id, lets fn mutate it and writes it back with
// compare-and-set, re-reading and re-running fn on store.ErrConflict. A
// state change is checked with store.CanTransition first (refused with
// *store.IllegalTransitionError) and recorded with w; m.Reason is set to
// w.Reason when fn leaves it unchanged. fn returning errNoChange skips the
// write and returns the current machine with a nil error.
func (c *Controller) update(ctx context.Context, id string, w store.W, fn func(m *store.Machine) error) (store.Machine, error) {
	return c.casLoop(ctx, id, w, fn, c.st.PutMachine)
}

// report is update for one agent report: the machine write and the
// report's events evs go to the store as ONE command (Store.ReportAgent,
// store command 17 agent_report), so a write refused on conflict stores
// none of evs and the retry sends them again with the re-read machine; a
// report that gives up (or fails) leaves no event. fn returning
// errNoChange writes nothing, evs included.
func (c *Controller) report(ctx context.Context, id string, evs []store.Event, w store.W, fn func(m *store.Machine) error) (store.Machine, error) {
	return c.casLoop(ctx, id, w, fn, func(ctx context.Context, m store.Machine, w store.W) (store.Machine, error) {
		return c.st.ReportAgent(ctx, m, evs, w)
	})
}

// casLoop is update and report: read, fn, check, put, retry on conflict.
func (c *Controller) casLoop(ctx context.Context, id string, w store.W, fn func(m *store.Machine) error,
	put func(ctx context.Context, m store.Machine, w store.W) (store.Machine, error)) (store.Machine, error) {
	var last error
	for attempt := 0; attempt < maxCASRetries; attempt++ {
		cur, err := c.st.GetMachine(id)
		if err != nil {
			return store.Machine{}, fmt.Errorf("lifecycle: machine %s: %w", id, err)
		}
		m := cloneMachine(cur)
		if err := fn(&m); err != nil {
			if errors.Is(err, errNoChange) {
				return cur, nil
			}
			return cur, err
		}
		from, to := cur.State, m.State
		if from != to {
			if !store.CanTransition(from, to) {
				return cur, fmt.Errorf("lifecycle: machine %s: %w", id, &store.IllegalTransitionError{From: from, To: to})
			}
			if m.Reason == cur.Reason && w.Reason != "" {
				m.Reason = w.Reason
			}
			if w.Reason == "" {
				w.Reason = m.Reason
			}
		}
		out, err := put(ctx, m, w)
		if errors.Is(err, store.ErrConflict) {
			last = err
			continue
		}
		if err != nil {
			return cur, fmt.Errorf("lifecycle: machine %s: %w", id, err)
		}
		if from != to {
			c.m.transitions.WithLabelValues(string(from), string(to)).Inc()
			c.logger().Info("transition", "machine", id, "from", from, "to", to, "actor", w.Actor, "reason", w.Reason)
		}
		return out, nil
	}
	return store.Machine{}, fmt.Errorf("lifecycle: machine %s: gave up after %d conflicting writes: %w", id, maxCASRetries, last)
}

// transition moves machine id from one of from to "to" (nil from: any state
// from which "to" is legal) with w and an optional extra mutation. A
// machine in another state gives *StateError.
func (c *Controller) transition(ctx context.Context, op, id string, from []store.MachineState, to store.MachineState, w store.W, mut func(m *store.Machine)) (store.Machine, error) {
	return c.update(ctx, id, w, func(m *store.Machine) error {
		if from != nil && !hasState(from, m.State) {
			return &StateError{Op: op, Machine: id, State: m.State, Want: from}
		}
		if !store.CanTransition(m.State, to) {
			return fmt.Errorf("lifecycle: %s machine %s: %w", op, id, &store.IllegalTransitionError{From: m.State, To: to})
		}
		if mut != nil {
			mut(m) // sees the state before the transition
		}
		m.State = to
		m.Reason = w.Reason
		m.Message = w.Message
		return nil
	})
}

func hasState(set []store.MachineState, s store.MachineState) bool {
	for _, x := range set {
		if x == s {
			return true
		}
	}
	return false
}

// withDefaults fills an operator's W: actor "operator" and reason when empty.
func withDefaults(w store.W, reason string) store.W {
	if w.Actor == "" {
		w.Actor = "operator"
	}
	if w.Reason == "" {
		w.Reason = reason
	}
	return w
}

// pendingStep marks "waiting for the agent to start step" with a deadline.
func pendingStep(step string, now, deadline time.Time) *store.StepStatus {
	return &store.StepStatus{Step: step, State: stepPending, At: now, Deadline: deadline}
}

// stepPending is StepStatus.State while the controller waits for the agent
// to begin a step (not an agent state).
const stepPending = "pending"

// cloneMachine deep-copies the parts of m that update's callers mutate.
func cloneMachine(m store.Machine) store.Machine {
	out := m
	if m.Labels != nil {
		out.Labels = make(map[string]string, len(m.Labels))
		for k, v := range m.Labels {
			out.Labels[k] = v
		}
	}
	if m.Discovered != nil {
		d := *m.Discovered
		out.Discovered = &d
	}
	out.Diff = append([]store.FieldDiff(nil), m.Diff...)
	if m.Claim != nil {
		cl := *m.Claim
		cl.Selector = cloneMap(m.Claim.Selector)
		out.Claim = &cl
	}
	if m.Maintenance != nil {
		mt := *m.Maintenance
		out.Maintenance = &mt
	}
	out.Health = append([]store.HealthCondition(nil), m.Health...)
	if len(m.Health) == 0 {
		out.Health = nil
	}
	if m.Remediation != nil {
		r := *m.Remediation
		r.History = append([]store.RemediationStep(nil), r.History...)
		if r.Baseline != nil {
			b := *r.Baseline
			r.Baseline = &b
		}
		if r.Report != nil {
			rep := *r.Report
			rep.Diff = append([]store.FieldDiff(nil), rep.Diff...)
			rep.BMCEvents = append([]store.BMCEvent(nil), rep.BMCEvents...)
			rep.Conditions = append([]store.HealthCondition(nil), rep.Conditions...)
			r.Report = &rep
		}
		if r.Claim != nil {
			cl := *r.Claim
			cl.Selector = cloneMap(r.Claim.Selector)
			r.Claim = &cl
		}
		out.Remediation = &r
	}
	if m.Drain != nil {
		d := *m.Drain
		out.Drain = &d
	}
	if m.Step != nil {
		s := *m.Step
		out.Step = &s
	}
	if m.Netboot != nil {
		b := *m.Netboot
		out.Netboot = &b
	}
	out.Intended.NICs = append([]store.NIC(nil), m.Intended.NICs...)
	out.Intended.Disks = append([]store.Disk(nil), m.Intended.Disks...)
	return out
}

func cloneMap(m map[string]string) map[string]string {
	if m == nil {
		return nil
	}
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}
