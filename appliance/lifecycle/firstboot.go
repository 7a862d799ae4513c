// First boot (issue 15; DESIGN.md "Release builds"): the installed OS
// reports once (POST /v1/agent/firstboot, bearer = the first-boot token
// of its per-node layer), and a release build's provisioned is recorded
// from that report only. No report by FirstBootTimeout after the build
// completed → failed, reason first_boot_unreported (the policy "fail":
// never provisioned silently).

package lifecycle

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"fmt"
	"time"

	"kiln/api/agentapi"
	"kiln/store"
)

// ReasonFirstBootReported: provisioned from the OS's first-boot report.
const ReasonFirstBootReported = "first_boot_reported"

// VerifyFirstBootToken reports whether sha256(token) is the first-boot
// token hash of machine id's build (constant-time compare). Every node
// answers it from its replica. False for unknown machines, machines with
// no release build, and empty tokens.
func (c *Controller) VerifyFirstBootToken(id, token string) bool {
	if id == "" || token == "" {
		return false
	}
	m, err := c.st.GetMachine(id)
	if err != nil || m.Build == nil || len(m.Build.FirstBootTokenHash) != sha256.Size*2 {
		return false
	}
	return subtle.ConstantTimeCompare([]byte(m.Build.FirstBootTokenHash), []byte(tokenHash(token))) == 1
}

// checkFirstBoot applies the closed enums of a first-boot report and
// sanitises its text in place (message to MaxFirstBootMessageLen bytes).
func checkFirstBoot(rep *agentapi.FirstBootReport) error {
	switch rep.Phase {
	case agentapi.PhaseNodeLayer, agentapi.PhaseJoin:
	default:
		return fmt.Errorf("%w: phase %q", ErrBadReport, rep.Phase)
	}
	switch rep.Outcome {
	case agentapi.OutcomeSucceeded, agentapi.OutcomeFailed:
	default:
		return fmt.Errorf("%w: outcome %q", ErrBadReport, rep.Outcome)
	}
	if rep.Reason != agentapi.ReasonNone {
		ok := false
		for _, r := range agentapi.Reasons {
			ok = ok || r == rep.Reason
		}
		if !ok {
			return fmt.Errorf("%w: reason %q", ErrBadReport, rep.Reason)
		}
	}
	rep.Message = truncate(sanitize(rep.Message), agentapi.MaxFirstBootMessageLen)
	rep.Hostname = truncate(sanitize(rep.Hostname), 253)
	rep.SSHHostKeyFingerprint = truncate(sanitize(rep.SSHHostKeyFingerprint), 64)
	rep.NodeLayerSHA256 = truncate(sanitize(rep.NodeLayerSHA256), 64)
	rep.BootID = truncate(sanitize(rep.BootID), 64)
	return nil
}

// FirstBoot records machine id's first-boot report (the caller checked
// the token, VerifyFirstBootToken) in Machine.Build.FirstBoot and moves
// the machine: a succeeded report whose hostname and SSH host key
// fingerprint (and node-layer hash, when sent) are the build record's →
// provisioned (reason first_boot_reported) from a completed build, or
// recorded while provisioned already (a later phase); a succeeded report
// that does not match → failed (first_boot_mismatch); a failed report →
// failed (its reason, else first_boot_node_layer or first_boot_join by
// phase). A report to a machine that already failed (it reported after
// FirstBootTimeout) is recorded and moves nothing. Errors: ErrBadReport,
// ErrMachineMismatch (the body names another machine), *StateError (no
// completed release build), store errors.
func (c *Controller) FirstBoot(ctx context.Context, id string, rep agentapi.FirstBootReport) (store.Machine, error) {
	if rep.MachineID != "" && rep.MachineID != id {
		return store.Machine{}, fmt.Errorf("%w: token for %s, report for %s", ErrMachineMismatch, id, rep.MachineID)
	}
	if err := checkFirstBoot(&rep); err != nil {
		return store.Machine{}, err
	}
	now := c.now()
	var why string
	w := store.W{Actor: "firstboot:" + id, Reason: ReasonFirstBootReported}
	return c.update(ctx, id, w, func(m *store.Machine) error {
		if m.Build == nil || !awaitsFirstBoot(*m) {
			return &StateError{Op: "first boot", Machine: id, State: m.State, Want: []store.MachineState{store.StateProvisioning}}
		}
		b := m.Build
		match := rep.Hostname == b.Hostname && rep.SSHHostKeyFingerprint == b.SSHHostKeyFingerprint &&
			(rep.NodeLayerSHA256 == "" || rep.NodeLayerSHA256 == b.NodeLayerSHA256)
		b.FirstBoot = &store.FirstBootRecord{At: now, Phase: rep.Phase, Outcome: rep.Outcome, Reason: string(rep.Reason),
			Message: rep.Message, Hostname: rep.Hostname, SSHHostKeyFingerprint: rep.SSHHostKeyFingerprint,
			NodeLayerSHA256: rep.NodeLayerSHA256, BootID: rep.BootID, Match: match}
		why = rep.Phase + " " + rep.Outcome
		if rep.Message != "" {
			why += ": " + rep.Message
		}
		switch {
		case m.State != store.StateProvisioning && m.State != store.StateProvisioned:
			return nil // recorded; moves nothing (failed by the timeout, or moved on)
		case m.State == store.StateProvisioning && !buildComplete(*m):
			return &StateError{Op: "first boot", Machine: id, State: m.State, Want: []store.MachineState{store.StateProvisioning}}
		case rep.Outcome == agentapi.OutcomeFailed:
			m.State = store.StateFailed
			m.Reason = string(rep.Reason)
			if m.Reason == "" {
				m.Reason = string(agentapi.ReasonFirstBootJoin)
				if rep.Phase == agentapi.PhaseNodeLayer {
					m.Reason = string(agentapi.ReasonFirstBootNodeLayer)
				}
			}
			m.Message = "first boot: " + why
		case !match:
			m.State = store.StateFailed
			m.Reason = string(agentapi.ReasonFirstBootMismatch)
			m.Message = fmt.Sprintf("first boot reported host %q key %s; the build wrote host %q key %s",
				rep.Hostname, rep.SSHHostKeyFingerprint, b.Hostname, b.SSHHostKeyFingerprint)
		case m.State == store.StateProvisioning:
			m.State = store.StateProvisioned
			m.Reason, m.Message = ReasonFirstBootReported, "first boot: "+why
			if m.Step != nil {
				m.Step.Deadline = time.Time{}
			}
		}
		return nil
	})
}

// firstBootUnreported: m is a completed release build whose first-boot
// report did not come by its deadline (Build.FirstBootDeadline).
func firstBootUnreported(m store.Machine, now time.Time) bool {
	return buildComplete(m) && awaitsFirstBoot(m) && m.Build.FirstBoot == nil &&
		!m.Build.FirstBootDeadline.IsZero() && now.After(m.Build.FirstBootDeadline)
}

// failUnreported applies the first-boot policy "fail" to machine id.
func (c *Controller) failUnreported(ctx context.Context, id string, now time.Time) (store.Machine, error) {
	r := string(agentapi.ReasonFirstBootUnreported)
	return c.update(ctx, id, store.W{Actor: ActorController, Reason: r}, func(m *store.Machine) error {
		if !firstBootUnreported(*m, now) {
			return errNoChange
		}
		m.State = store.StateFailed
		m.Reason = r
		m.Message = fmt.Sprintf("no first-boot report within %s of the build's completion", c.cfg.FirstBootTimeout)
		if m.Step != nil {
			m.Step.Deadline = time.Time{}
		}
		return nil
	})
}
