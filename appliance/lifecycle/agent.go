// The agent protocol (top-level DESIGN.md "The gated build"; the wire types
// are package agentapi): AgentRegister, AgentTask, AgentReport, the build's
// step order, the text rules of what an agent sends (sanitize, truncate)
// and stepTimer, this node's step start times for the duration histogram.
// Every report is one store command (report, update.go). Owner of
// stepTimer: this file only.

package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"kiln/api/agentapi"
	"kiln/appliance/lifecycle/rules"
	"kiln/store"
)

// buildSteps is the gated build's order (top-level DESIGN.md "The gated
// build").
var buildSteps = []string{agentapi.StepCheck, agentapi.StepWrite, agentapi.StepVerify,
	agentapi.StepStage, agentapi.StepFinalize, agentapi.StepReboot}

// buildOrder is buildSteps with the attest step (issue 16, attest.go),
// which runs only for a model that requires it, between check and write:
// the order of staleReport.
var buildOrder = []string{agentapi.StepCheck, agentapi.StepAttest, agentapi.StepWrite, agentapi.StepVerify,
	agentapi.StepStage, agentapi.StepFinalize, agentapi.StepReboot}

var knownSteps = map[string]bool{agentapi.StepInspect: true, agentapi.StepErase: true, agentapi.StepAttest: true, agentapi.StepBurnIn: true}

func init() {
	for _, s := range buildSteps {
		knownSteps[s] = true
	}
}

// AgentRegister handles the agent's first message (POST /v1/agent/register):
// it records the discovered hardware, moves registered/discovered machines
// to inspecting, computes the intended-vs-discovered diff and moves an
// inspecting machine to available (no blocking difference) or quarantined
// (reason hardware_mismatch). It returns the agent's next task: provision
// when a claim is already waiting, erase while erasing, else wait.
// Errors: ErrMachineMismatch, store.ErrNotFound, store errors.
func (c *Controller) AgentRegister(ctx context.Context, machineID string, reg agentapi.Registration) (agentapi.Task, error) {
	if reg.MachineID != "" && reg.MachineID != machineID {
		return agentapi.Task{}, fmt.Errorf("%w: token for %s, registration for %s", ErrMachineMismatch, machineID, reg.MachineID)
	}
	c.seen(machineID)
	now := c.now()
	hw := hardwareFrom(reg.Inventory)
	var extra []store.FieldDiff // MACs the store holds for other machines
	// inBuildFirst: whether the machine was in a build step when this
	// registration was first applied (nil before). A build step seen only
	// on a retry (after a conflict) began while this registration waited to
	// commit: it is older than the build (its agent has since taken the
	// claim, and may be the one building) and must not fail it.
	var inBuildFirst *bool
	record := func(m *store.Machine) error {
		inBuild := m.State == store.StateProvisioning && m.Step != nil && m.Step.State != stepPending
		if inBuildFirst == nil {
			inBuildFirst = &inBuild
		}
		if inBuild && !*inBuildFirst {
			return fmt.Errorf("%w: machine %s: its build began (step %s) while this registration waited to commit; register again if the agent restarted",
				errLateRegistration, machineID, m.Step.Step)
		}
		d := hw
		m.Discovered = &d
		m.Diff = append(computeDiff(*m, hw, c.cfg.DiffPolicy, c.cfg.MemoryTolerance), extra...)
		if m.Firmware != nil { // the baseline drift the BMC read found (firmware.go) stays in the diff
			m.Diff = append(m.Diff, m.Firmware.Drift...)
		}
		switch m.State {
		case store.StateRegistered, store.StateDiscovered:
			m.State = store.StateInspecting
			m.Reason, m.Message = ReasonAgentRegistered, ""
			m.Step = &store.StepStatus{Step: agentapi.StepInspect, State: string(agentapi.StateSucceeded), At: now}
		case store.StateInspecting:
			m.Step = &store.StepStatus{Step: agentapi.StepInspect, State: string(agentapi.StateSucceeded), At: now}
		case store.StateProvisioning:
			if m.Step != nil && m.Step.State != stepPending {
				// The agent rebooted in the middle of the build.
				m.State = store.StateFailed
				m.Reason = ReasonAgentRestarted
				m.Message = fmt.Sprintf("agent registered again during step %s", m.Step.Step)
			}
		}
		return nil
	}
	w := store.W{Actor: ActorController}
	m, err := c.report(ctx, machineID, nil, w, record)
	if errors.Is(err, store.ErrDuplicateMAC) {
		// A discovered MAC belongs to another machine's record (swapped NIC
		// or cabling): keep the machine's own MACs and block on the rest.
		var keep []store.NIC
		for _, n := range hw.NICs {
			if other, gerr := c.st.MachineByMAC(n.MAC); gerr == nil && other.ID != machineID {
				extra = append(extra, store.FieldDiff{Field: FieldNICs, Intended: "", Discovered: n.MAC + " (recorded on machine " + other.ID + ")",
					Blocking: c.cfg.DiffPolicy[FieldNICs] != PolicyIgnore})
				continue
			}
			keep = append(keep, n)
		}
		hw.NICs = keep
		m, err = c.report(ctx, machineID, nil, w, record)
	}
	if err != nil {
		return agentapi.Task{}, err
	}
	switch m.State {
	case store.StateInspecting:
		if m, err = c.finishInspection(ctx, m.ID); err != nil {
			return agentapi.Task{}, err
		}
	case store.StateAvailable:
		if len(blocking(m.Diff)) > 0 {
			// Hardware changed since inspection: inspect again, then quarantine.
			if _, err = c.transition(ctx, "reinspect", m.ID, []store.MachineState{store.StateAvailable}, store.StateInspecting,
				store.W{Actor: ActorController, Reason: "hardware_changed"}, nil); err != nil {
				return agentapi.Task{}, err
			}
			if m, err = c.finishInspection(ctx, m.ID); err != nil {
				return agentapi.Task{}, err
			}
		}
	}
	return c.AgentTask(ctx, machineID)
}

// finishInspection moves an inspecting machine to available or quarantined
// by its stored Diff — or, when its burn-in policy requires one and it has
// no passing burn-in, to step burn_in pending (it stays inspecting; the
// agent's burn-in report decides, recordBurnIn).
func (c *Controller) finishInspection(ctx context.Context, id string) (store.Machine, error) {
	return c.update(ctx, id, store.W{Actor: ActorController}, func(m *store.Machine) error {
		if m.State != store.StateInspecting || m.Discovered == nil {
			return errNoChange
		}
		if c.reinspected(m, c.now()) {
			return nil // the ladder's reinspect found a difference: declared failed (remediation.go)
		}
		if b := blocking(m.Diff); len(b) > 0 {
			m.State = store.StateQuarantined
			m.Reason = ReasonHardwareMismatch
			m.Message = "blocking difference in " + strings.Join(b, ", ")
		} else if c.burnInDue(*m) {
			c.startBurnIn(m, c.now()) // untrusted until it passes (burnin.go)
			return nil
		} else {
			m.State = store.StateAvailable
			m.Reason, m.Message = ReasonInspectionPassed, ""
		}
		if m.Step != nil {
			m.Step.Deadline = time.Time{}
		}
		return nil
	})
}

// AgentTask answers the agent's poll (GET /v1/agent/task): an available
// machine with a claim moves to provisioning (reason build_started, attempt
// 1) and gets the provision task; a provisioning machine whose build has not
// started gets it again; a provisioning machine whose store record says the
// agent is in a build step (the agent is asking for work, so it is not
// building: its build broke and the failure report was lost, or the appliance
// restarted under it) is served the build again as the next attempt (see
// retryBuild); erasing gets erase; inspecting (requested again) gets
// inspect; retired gets poweroff; anything else waits. Every task lists
// Config.AgentEndpoints (agentapi.Task.Endpoints).
func (c *Controller) AgentTask(ctx context.Context, machineID string) (agentapi.Task, error) {
	t, err := c.agentTask(ctx, machineID)
	if err == nil && len(c.cfg.AgentEndpoints) > 0 {
		t.Endpoints = append([]string(nil), c.cfg.AgentEndpoints...)
	}
	return t, err
}

func (c *Controller) agentTask(ctx context.Context, machineID string) (agentapi.Task, error) {
	c.seen(machineID)
	m, err := c.st.GetMachine(machineID)
	if err != nil {
		return agentapi.Task{}, fmt.Errorf("lifecycle: agent task %s: %w", machineID, err)
	}
	wait := agentapi.Task{Action: agentapi.ActionWait, PollAfter: c.cfg.AgentPollAfter}
	switch m.State {
	case store.StateAvailable:
		if m.Claim == nil {
			return wait, nil
		}
		img, err := c.st.GetImage(m.Claim.Image)
		if err != nil {
			c.logger().Warn("claimed image missing", "machine", m.ID, "image", m.Claim.Image, "err", err)
			return wait, nil
		}
		if !c.imageHere(m, img) {
			return wait, nil
		}
		fbHash := ""
		if img.IsRelease() {
			// Issue 15: the first-boot token of this provisioning (its hash goes into Machine.Build).
			if fbHash, err = c.newFirstBootToken(ctx, m.ID); err != nil {
				return agentapi.Task{}, err
			}
		}
		now := c.now()
		m, err = c.update(ctx, m.ID, store.W{Actor: ActorController, Reason: ReasonBuildStarted}, func(m *store.Machine) error {
			if m.State != store.StateAvailable || m.Claim == nil {
				return errNoChange
			}
			m.State = store.StateProvisioning
			m.Reason, m.Message = ReasonBuildStarted, ""
			m.Step = pendingStep(agentapi.StepCheck, now, c.stepDeadline(agentapi.StepCheck, now))
			m.Step.Attempt = 1
			m.Build = nil // an earlier provisioning's record
			if img.IsRelease() {
				startRelease(m, img, fbHash, now) // build.go: layers chosen and why
			}
			invalidateAttestation(m)    // every build attests anew (attest.go)
			c.reprovisionStarts(m, now) // a ladder at reinspect moves to reprovision
			return nil
		})
		if err != nil {
			return agentapi.Task{}, err
		}
		if m.State != store.StateProvisioning {
			return wait, nil
		}
		if why := versionMismatch(m, img); why != "" {
			// The check step's cluster rule (build.go), before anything is written.
			if _, err := c.failVersionMismatch(ctx, m.ID, why); err != nil {
				return agentapi.Task{}, err
			}
			return wait, nil
		}
		return c.provisionTask(m, img)
	case store.StateProvisioning:
		if m.Claim == nil || m.Step == nil || buildComplete(m) {
			return wait, nil
		}
		if m.Step.State != stepPending {
			if !stepBelongs(m.State, m.Step.Step) {
				return wait, nil
			}
			if m, err = c.retryBuild(ctx, m.ID); err != nil || m.State != store.StateProvisioning {
				return wait, err
			}
		}
		img, err := c.st.GetImage(m.Claim.Image)
		if err != nil {
			return agentapi.Task{}, fmt.Errorf("lifecycle: machine %s image %s: %w", m.ID, m.Claim.Image, err)
		}
		if !c.imageHere(m, img) {
			return wait, nil
		}
		if why := versionMismatch(m, img); why != "" {
			if _, err := c.failVersionMismatch(ctx, m.ID, why); err != nil {
				return agentapi.Task{}, err
			}
			return wait, nil
		}
		return c.provisionTask(m, img)
	case store.StateErasing:
		if m.Step != nil && m.Step.Step == agentapi.StepErase && m.Step.State != stepPending {
			return wait, nil
		}
		return agentapi.Task{Action: agentapi.ActionErase, PollAfter: c.cfg.AgentPollAfter, Heartbeat: c.cfg.AgentHeartbeat,
			Disk: agentapi.DiskRule(m.RootDisk), Wipe: true}, nil
	case store.StateInspecting:
		if m.Step != nil && m.Step.Step == agentapi.StepInspect && m.Step.State == stepPending {
			return agentapi.Task{Action: agentapi.ActionInspect, PollAfter: c.cfg.AgentPollAfter}, nil
		}
		if m.Step != nil && m.Step.Step == agentapi.StepBurnIn && m.Step.State == stepPending {
			return c.burnInTask(m), nil
		}
		return wait, nil
	case store.StateRetired, store.StateRMA:
		return agentapi.Task{Action: agentapi.ActionPowerOff}, nil
	}
	return wait, nil
}

// MaxBuildAttempts bounds how often one claim's build is served (retryBuild):
// the agent asking for work mid-build that often fails the machine
// (agent_restarted) instead.
const MaxBuildAttempts = 3

// retryBuild serves machine id's build again (AgentTask, the agent polling
// while the store says it is in a build step): the step becomes check
// pending with the next attempt (reason build_retried), so the agent's
// reports of the earlier attempt change nothing any more. When the earlier
// attempt had passed check, the disk holds its partial write: Rewrite makes
// the task wipe it (the disk was accepted by this claim's check; what is on
// it now is Kiln's own). After MaxBuildAttempts the machine fails instead
// (agent_restarted). It returns the machine as written.
func (c *Controller) retryBuild(ctx context.Context, id string) (store.Machine, error) {
	now := c.now()
	return c.update(ctx, id, store.W{Actor: ActorController, Reason: ReasonBuildRetried}, func(m *store.Machine) error {
		if m.State != store.StateProvisioning || m.Claim == nil || m.Step == nil || m.Step.State == stepPending ||
			buildComplete(*m) || !stepBelongs(m.State, m.Step.Step) {
			return errNoChange // moved meanwhile (another poll, node or the loop)
		}
		prev := *m.Step
		attempt := max(prev.Attempt, 1) + 1
		if attempt > MaxBuildAttempts {
			m.State = store.StateFailed
			m.Reason = ReasonAgentRestarted
			m.Message = fmt.Sprintf("the agent asked for work during step %s of build attempt %d; gave up after %d attempts", prev.Step, attempt-1, MaxBuildAttempts)
			return nil
		}
		m.Reason = ReasonBuildRetried
		m.Message = fmt.Sprintf("the agent asked for work during step %s (%s) of attempt %d: build served again", prev.Step, prev.State, attempt-1)
		m.Step = pendingStep(agentapi.StepCheck, now, c.stepDeadline(agentapi.StepCheck, now))
		m.Step.Attempt = attempt
		m.Step.Rewrite = prev.Rewrite || (prev.Step != agentapi.StepCheck || prev.State == string(agentapi.StateSucceeded))
		if m.Build != nil {
			m.Build.Attempt = attempt // the same layers and first-boot token; digests come with this attempt's finalize
		}
		invalidateAttestation(m)
		return nil
	})
}

// staleReport reports whether rep is older than the step prev records, so
// that it must change nothing (its event is still recorded): a report of an
// earlier build attempt, or, within one attempt of the gated build, one that
// would move the step backwards (a late heartbeat after the step's end, a
// retried report delivered after a later one). Attempt 0 (an agent or
// record that does not count) matches any attempt. A repeated report ranks
// equal and is applied again, which changes nothing more.
func staleReport(prev *store.StepStatus, rep agentapi.Report) bool {
	if prev == nil {
		return false
	}
	if rep.Attempt != 0 && prev.Attempt != 0 && rep.Attempt != prev.Attempt {
		return rep.Attempt < prev.Attempt
	}
	pi, ri := buildIndex(prev.Step), buildIndex(rep.Step)
	if pi < 0 || ri < 0 {
		return false
	}
	return ri < pi || (ri == pi && stateRank(rep.State) < stateRank(agentapi.State(prev.State)))
}

// buildIndex is step's position in buildOrder, -1 when it is no build step.
func buildIndex(step string) int {
	for i, s := range buildOrder {
		if s == step {
			return i
		}
	}
	return -1
}

// stateRank orders a step's states: pending < started < running < succeeded|failed.
func stateRank(s agentapi.State) int {
	switch s {
	case agentapi.StateStarted:
		return 1
	case agentapi.StateRunning:
		return 2
	case agentapi.StateSucceeded, agentapi.StateFailed:
		return 3
	}
	return 0 // pending
}

// imageHere reports Config.ImageHere for img (true when unset), and for a
// release every layer image it names, logging a build held back because
// this node does not hold a file yet.
func (c *Controller) imageHere(m store.Machine, img store.Image) bool {
	if c.cfg.ImageHere == nil {
		return true
	}
	imgs := []store.Image{img}
	for _, l := range img.Layers {
		if l.Image == img.ID {
			continue
		}
		li, err := c.st.GetImage(l.Image)
		if err != nil {
			c.logger().Warn("release layer image missing", "machine", m.ID, "release", img.ID, "layer", l.Name, "err", err)
			return false
		}
		imgs = append(imgs, li)
	}
	for _, im := range imgs {
		if !c.cfg.ImageHere(im) {
			c.logger().Info("build waits: this node does not hold the image file yet (it is copied from a peer)",
				"machine", m.ID, "image", im.ID, "name", im.Name)
			return false
		}
	}
	return true
}

// provisionTask builds the gated build's instructions for m and img; a
// release build's (m.Build set) gets its layers, per-node layer and
// cluster check too (releaseTask, build.go).
func (c *Controller) provisionTask(m store.Machine, img store.Image) (agentapi.Task, error) {
	t := c.plainTask(m, img)
	if m.Build != nil && img.IsRelease() {
		if err := c.releaseTask(&t, m, img); err != nil {
			return agentapi.Task{}, err
		}
	}
	return t, nil
}

// plainTask is the task of a plain image: the image and the NoCloud stage data.
func (c *Controller) plainTask(m store.Machine, img store.Image) agentapi.Task {
	cl := m.Claim
	format := img.Format
	if format == "" {
		format = "raw"
	}
	host := cl.Hostname
	if host == "" {
		host = m.Name
	}
	if host == "" {
		host = m.ID
	}
	labels := map[string]string{}
	for k, v := range m.Labels {
		labels[k] = v
	}
	for k, v := range cl.Labels {
		labels[k] = v
	}
	if cl.Role != "" {
		labels["kiln.io/role"] = cl.Role
	}
	instance := m.ID
	attempt, rewrite := 0, false
	if m.Step != nil {
		instance += "-" + strconv.FormatInt(m.Step.At.Unix(), 10)
		attempt, rewrite = m.Step.Attempt, m.Step.Rewrite
	}
	stage := &agentapi.StageData{
		Hostname: host, InstanceID: instance, UserData: cl.UserData, NetworkConfig: cl.NetworkConfig,
		SSHKeys: cl.SSHKeys, CABundle: cl.CABundle, JoinData: cl.JoinData, Labels: labels,
	}
	attest := c.attestRequired(m)
	if attest {
		// The credential gate (attest.go): the join data and CA come with
		// the attestation's pass, not with the task.
		stage.JoinData, stage.CABundle = "", ""
	}
	return agentapi.Task{
		Action:    agentapi.ActionProvision,
		PollAfter: c.cfg.AgentPollAfter,
		Heartbeat: c.cfg.AgentHeartbeat,
		Disk:      agentapi.DiskRule(m.RootDisk),
		Wipe:      m.Wipe || rewrite,
		Image: &agentapi.ImageRef{
			URL:    c.cfg.ImageBaseURL + "/images/" + url.PathEscape(img.Name),
			SHA256: img.SHA256, Size: img.Size, Format: format,
		},
		Stage:       stage,
		MinReadMBps: c.cfg.MinReadMBps,
		Reboot:      true,
		Attempt:     attempt,
		Attest:      attest,
	}
}

func validReport(rep agentapi.Report) error {
	if !knownSteps[rep.Step] {
		return fmt.Errorf("%w: step %q", ErrBadReport, rep.Step)
	}
	switch rep.State {
	case agentapi.StateStarted, agentapi.StateRunning, agentapi.StateSucceeded, agentapi.StateFailed:
	default:
		return fmt.Errorf("%w: state %q", ErrBadReport, rep.State)
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
	return nil
}

// AgentReport records one step report (POST /v1/agent/report): a "step"
// event (message sanitised, truncated to agentapi.MaxMessageLen bytes),
// Machine.Step with the step's deadline, and the resulting transition:
// step burn_in's final report while inspecting → Machine.BurnIn, then
// available or quarantined with a burnin_* reason (recordBurnIn, burnin.go);
// failed → machine failed (reason = the report's reason); erase succeeded
// while erasing → available (erase_complete), or inspecting
// (erase_complete, step inspect pending) when reinspectAfterErase says the
// machine must be inspected again first or its burn-in policy wants a
// passing burn-in it does not have. Finalize (or reboot)
// succeeded while provisioning moves nothing: the machine stays
// provisioning with Reason build_complete (the durable "build complete"
// marker) and Step.Deadline = now + RebootTimeout; later reports (the
// agent's reboot step) are recorded and keep that deadline. BootFor or the
// loop then makes it provisioned. A heartbeat (a running report of the
// running step, see heartbeat) is coalesced: written, without its "step"
// event, only when the stored Step.At is HeartbeatRecordEvery old;
// otherwise it only marks the agent live on this node. The event and the
// machine write are one store command (Store.ReportAgent): a write refused
// on conflict is retried from a fresh read, and a report that fails stores
// no event. Errors: ErrMachineMismatch, ErrBadReport, store.ErrNotFound,
// store.ErrConflict (gave up after maxCASRetries), store errors.
func (c *Controller) AgentReport(ctx context.Context, machineID string, rep agentapi.Report) error {
	if rep.MachineID != "" && rep.MachineID != machineID {
		return fmt.Errorf("%w: token for %s, report for %s", ErrMachineMismatch, machineID, rep.MachineID)
	}
	if err := validReport(rep); err != nil {
		return err
	}
	if math.IsNaN(rep.Progress) || rep.Progress < 0 {
		rep.Progress = 0
	} else if rep.Progress > 1 {
		rep.Progress = 1
	}
	msg := truncate(sanitize(rep.Message), agentapi.MaxMessageLen)
	cur, err := c.st.GetMachine(machineID)
	if err != nil {
		return fmt.Errorf("lifecycle: agent report %s: %w", machineID, err)
	}
	c.seen(machineID)
	now := c.now()
	evMsg := rep.Step
	if msg != "" {
		evMsg += ": " + msg
	}
	ev := []store.Event{{Subject: "machine/" + machineID, Kind: "step", Actor: ActorAgent,
		To: string(rep.State), Reason: string(rep.Reason), Message: evMsg}}
	ev = append(ev, eraseCertEvents(machineID, rep)...) // erasecert.go
	c.observeStep(machineID, rep, now)
	if heartbeat(cur.Step, rep) {
		if every := c.cfg.HeartbeatRecordEvery; every > 0 && now.Sub(cur.Step.At) < every {
			return nil // coalesced: live on this node (seen), nothing written
		}
		ev = nil // liveness is no audit event; the machine write records Step.At and Progress
	}
	_, err = c.report(ctx, machineID, ev, store.W{Actor: ActorController}, func(m *store.Machine) error {
		prev := m.Step
		if m.State == store.StateProvisioning && staleReport(prev, rep) {
			return nil // the machine as it is, with the report's event: recorded, moves nothing
		}
		done := buildComplete(*m)
		st := &store.StepStatus{Step: rep.Step, State: string(rep.State), Reason: string(rep.Reason),
			Message: msg, Progress: rep.Progress, At: now}
		if prev != nil && m.State == store.StateProvisioning {
			st.Attempt, st.Rewrite = prev.Attempt, prev.Rewrite
		}
		switch rep.State {
		case agentapi.StateStarted:
			st.Deadline = c.stepDeadline(rep.Step, now)
			if prev != nil && prev.Step == rep.Step && prev.State == string(rep.State) && !prev.Deadline.IsZero() {
				st.Deadline = prev.Deadline // a repeated started report restarts no clock
			}
		case agentapi.StateRunning:
			if prev != nil && prev.Step == rep.Step && prev.State != stepPending && !prev.Deadline.IsZero() {
				st.Deadline = prev.Deadline
			} else {
				st.Deadline = c.stepDeadline(rep.Step, now)
			}
		case agentapi.StateSucceeded:
			if m.State == store.StateProvisioning {
				if next := nextStep(rep.Step); next != "" {
					st.Deadline = c.stepDeadline(next, now) // the gap to the next step's start counts too
				}
			}
		}
		if done {
			// The build is complete: the only clock that runs is the wait
			// for the disk boot (RebootTimeout from the build's completion).
			st.Deadline = rebootDeadline(prev, now, c.cfg.RebootTimeout)
		}
		m.Step = st
		gate := c.attestGateReport(*m, rep)
		switch {
		case gate != "":
			// The build went on past attest without a pass (attest.go): it
			// stops here, before anything it writes gets credentials.
			m.State = store.StateFailed
			m.Reason, m.Message = ReasonAttestationFailed, gate
		case c.recordBurnIn(m, rep, msg, now): // burnin.go
		case rep.State == agentapi.StateFailed && stepBelongs(m.State, rep.Step):
			m.State = store.StateFailed
			m.Reason = string(rep.Reason)
			if m.Reason == "" {
				m.Reason = string(agentapi.ReasonInternal)
			}
			m.Message = rep.Step + ": " + msg
		case rep.State == agentapi.StateSucceeded && m.State == store.StateProvisioning && !done &&
			(rep.Step == agentapi.StepFinalize || rep.Step == agentapi.StepReboot):
			// The disk is written, verified and staged, but the machine has
			// not booted it yet: it stays provisioning until its next netboot
			// (BootFor → local disk) or RebootTimeout.
			if awaitsFirstBoot(*m) {
				// A release build (build.go): the written digests are
				// recorded, and provisioned comes only from the OS's
				// first-boot report (firstboot.go) by FirstBootTimeout.
				if m.Build.Built.IsZero() {
					if err := recordBuild(m, rep.Build, now); err != nil {
						m.State = store.StateFailed
						m.Reason = string(agentapi.ReasonDigestMismatch)
						m.Message = rep.Step + ": " + truncate(sanitize(err.Error()), agentapi.MaxMessageLen)
						break
					}
				}
				m.Reason, m.Message = ReasonBuildComplete, msgFirstBootWait
				m.Build.FirstBootDeadline = now.Add(c.cfg.FirstBootTimeout)
				m.Step.Deadline = m.Build.FirstBootDeadline
				break
			}
			m.Reason, m.Message = ReasonBuildComplete, msgRebooting
			m.Step.Deadline = now.Add(c.cfg.RebootTimeout)
		case rep.State == agentapi.StateSucceeded && m.State == store.StateErasing && rep.Step == agentapi.StepErase &&
			m.Reason == ReasonEraseForRMA:
			// Declared failed: the ladder's next tick moves it to rma (the
			// erase's outcome goes into its report; remediation.go).
			m.Claim = nil
			m.Message = "erased; rma follows"
			m.Step.Deadline = time.Time{}
		case rep.State == agentapi.StateSucceeded && m.State == store.StateErasing && rep.Step == agentapi.StepErase &&
			m.Reason == ReasonEraseForRetire:
			m.Claim = nil
			m.State = store.StateRetired
			m.Reason, m.Message = ReasonRetired, "every disk erased; retired"
			m.Step.Deadline = time.Time{}
		case rep.State == agentapi.StateSucceeded && m.State == store.StateErasing && rep.Step == agentapi.StepErase:
			m.Claim = nil
			why := reinspectAfterErase(*m)
			if why == "" && c.burnInDue(*m) {
				why = "no passing burn-in on record" // untrusted until one passes (burnin.go)
			}
			if why != "" {
				// Not trusted yet: the running agent inspects again (its
				// next poll gets the inspect task), then finishInspection
				// decides available or quarantined.
				m.State = store.StateInspecting
				m.Reason, m.Message = ReasonEraseComplete, "erased; inspecting again: "+why
				m.Step = pendingStep(agentapi.StepInspect, now, c.stepDeadline(agentapi.StepInspect, now))
				break
			}
			m.State = store.StateAvailable
			m.Reason, m.Message = ReasonEraseComplete, ""
			m.Step.Deadline = time.Time{}
		}
		return nil
	})
	return err
}

// heartbeat reports whether rep only says that the step prev records is
// still running: same step and attempt, state running before and now, and
// no reason. Progress and message may differ: a running report is a
// progress update (agentapi.StateRunning; the agent sends "NN%"), which is
// liveness, not audit.
func heartbeat(prev *store.StepStatus, rep agentapi.Report) bool {
	return prev != nil && rep.State == agentapi.StateRunning && prev.State == string(agentapi.StateRunning) &&
		prev.Step == rep.Step && (rep.Attempt == 0 || prev.Attempt == 0 || rep.Attempt == prev.Attempt) &&
		rep.Reason == "" && prev.Reason == ""
}

// stepBelongs reports whether step is one the agent runs in state: inspect
// and burn_in while inspecting, the build steps while provisioning, erase while
// erasing. A failure of any other step is recorded but moves nothing.
func stepBelongs(state store.MachineState, step string) bool {
	switch state {
	case store.StateInspecting:
		return step == agentapi.StepInspect || step == agentapi.StepBurnIn
	case store.StateProvisioning:
		return nextStep(step) != "" || step == agentapi.StepReboot
	case store.StateErasing:
		return step == agentapi.StepErase
	}
	return false
}

func nextStep(step string) string {
	if step == agentapi.StepAttest {
		return agentapi.StepWrite
	}
	for i, s := range buildSteps {
		if s == step && i+1 < len(buildSteps) {
			return buildSteps[i+1]
		}
	}
	return ""
}

// observeStep feeds the step-duration histogram (started → succeeded/failed).
func (c *Controller) observeStep(id string, rep agentapi.Report, now time.Time) {
	key := id + "/" + rep.Step
	switch rep.State {
	case agentapi.StateStarted:
		c.steps.start(key, now)
	case agentapi.StateSucceeded, agentapi.StateFailed:
		if t, ok := c.steps.stop(key); ok {
			c.m.steps.WithLabelValues(rep.Step, string(rep.State)).Observe(now.Sub(t).Seconds())
		}
	}
}

// stepTimer holds when this node heard each agent step start (key machine
// ID + "/" + step), for kiln_lifecycle_step_seconds. Its own lock.
type stepTimer struct {
	mu      sync.Mutex
	started map[string]time.Time
}

func (s *stepTimer) start(key string, now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.started == nil {
		s.started = map[string]time.Time{}
	}
	s.started[key] = now
}

// stop forgets key and returns its start (ok false: not heard starting here).
func (s *stepTimer) stop(key string) (time.Time, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t, ok := s.started[key]
	delete(s.started, key)
	return t, ok
}

// msgRebooting is Machine.Message while a built machine reboots to its disk.
const msgRebooting = "build complete; rebooting to disk"

// msgFirstBootWait is Machine.Message while a built release waits for its first-boot report.
const msgFirstBootWait = "build complete; rebooting to disk; waiting for the first-boot report"

// buildComplete reports whether m is provisioning and its build completed
// (finalize succeeded): it must boot its local disk from now on. The marker
// is Reason build_complete, which only AgentReport sets while provisioning
// and every transition replaces.
func buildComplete(m store.Machine) bool {
	return m.State == store.StateProvisioning && m.Reason == ReasonBuildComplete
}

// rebootDeadline is the disk-boot deadline a built machine keeps: prev's
// deadline (set when the build completed), or now + d when it has none.
func rebootDeadline(prev *store.StepStatus, now time.Time, d time.Duration) time.Time {
	if prev != nil && !prev.Deadline.IsZero() {
		return prev.Deadline
	}
	return now.Add(d)
}

// tokenArg hides a kernel-argument token that an agent message might echo.
var tokenArg = regexp.MustCompile(`(?i)(kiln\.token=|bearer\s+)\S+`)

// sanitize makes agent or BMC text safe to store and show: valid UTF-8,
// every character free text may not hold (rules.TextRune) replaced by a
// space, tokens redacted. Length is the caller's (truncate).
func sanitize(s string) string {
	s = rules.SanitizeText(s, -1)
	s = tokenArg.ReplaceAllString(s, "${1}REDACTED")
	return strings.TrimSpace(s)
}

// truncate cuts s to at most n bytes on a rune boundary.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}
