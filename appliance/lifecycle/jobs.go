package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"time"

	"kiln/store"
)

// Job kinds (store.Job.Kind) and states (store.Job.State).
const (
	JobBootPXE    = "boot_pxe"
	JobPowerOn    = "power_on"
	JobPowerCycle = "power_cycle"
	JobPowerOff   = "power_off"

	JobPending   = "pending"
	JobRunning   = "running"
	JobSucceeded = "succeeded"
	JobFailed    = "failed"
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
)

// bmcWork is one queued sequence of BMC jobs for a machine.
type bmcWork struct {
	machine string
	mode    store.BootMode
	jobs    []store.Job // created pending, run in order
	onDone  func(ctx context.Context, err error)
}

// enqueuePXEBoot queues "boot_pxe" then "power_cycle" for m and calls
// onDone with the outcome once a worker ran them. It returns false (and
// queues nothing) when a sequence for m is already queued or running.
func (c *Controller) enqueuePXEBoot(ctx context.Context, m store.Machine, onDone func(ctx context.Context, err error)) (bool, error) {
	c.mu.Lock()
	if c.inflight[m.ID] {
		c.mu.Unlock()
		return false, nil
	}
	c.inflight[m.ID] = true
	c.mu.Unlock()
	work := bmcWork{machine: m.ID, mode: m.BootMode, onDone: onDone}
	for _, kind := range []string{JobBootPXE, JobPowerCycle} {
		j, err := c.st.PutJob(ctx, store.Job{Machine: m.ID, Kind: kind, State: JobPending},
			store.W{Actor: ActorController, Reason: "queued"})
		if err != nil {
			// Jobs already created stay visible; close them as failed.
			for _, pj := range work.jobs {
				c.finishJob(ctx, pj, JobFailed, "queue_failed", err.Error())
			}
			c.mu.Lock()
			delete(c.inflight, m.ID)
			c.mu.Unlock()
			return false, fmt.Errorf("lifecycle: create %s job for %s: %w", kind, m.ID, err)
		}
		work.jobs = append(work.jobs, j)
	}
	c.mu.Lock()
	c.queue = append(c.queue, work)
	c.mu.Unlock()
	c.signal()
	return true, nil
}

func (c *Controller) signal() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// worker runs queued BMC sequences until ctx ends.
func (c *Controller) worker(ctx context.Context) {
	for {
		c.mu.Lock()
		var w bmcWork
		ok := len(c.queue) > 0
		if ok {
			w = c.queue[0]
			c.queue = c.queue[1:]
		}
		more := len(c.queue) > 0
		c.mu.Unlock()
		if more {
			c.signal()
		}
		if ok {
			c.runWork(ctx, w)
			continue
		}
		select {
		case <-ctx.Done():
			c.signal() // pass the wake-up on to the next worker
			return
		case <-c.wake:
		}
	}
}

// runWork executes one sequence; a failed job fails the rest unrun.
func (c *Controller) runWork(ctx context.Context, w bmcWork) {
	defer func() {
		c.mu.Lock()
		delete(c.inflight, w.machine)
		c.mu.Unlock()
	}()
	var failed error
	for _, j := range w.jobs {
		if failed != nil {
			c.finishJob(ctx, j, JobFailed, "skipped", "an earlier job of the sequence failed")
			continue
		}
		if ctx.Err() != nil || !c.st.IsLeader() {
			failed = errors.New("controller lost leadership or stopped")
			c.finishJob(context.WithoutCancel(ctx), j, JobFailed, "not_leader", failed.Error())
			continue
		}
		j, err := c.st.PutJob(ctx, setJob(j, JobRunning, "", ""), store.W{Actor: ActorController})
		if err != nil {
			failed = err
			continue
		}
		if j.Kind != JobBootPXE {
			c.agentReset(w.machine) // a power action ends any agent running on the machine
		}
		cctx, cancel := context.WithTimeout(ctx, c.cfg.BMCTimeout)
		switch j.Kind {
		case JobBootPXE:
			err = c.bmc.SetNextBootPXE(cctx, w.machine, w.mode)
		case JobPowerCycle:
			err = c.bmc.PowerCycle(cctx, w.machine)
		case JobPowerOn:
			err = c.bmc.PowerOn(cctx, w.machine)
		case JobPowerOff:
			err = c.bmc.PowerOff(cctx, w.machine)
		default:
			err = fmt.Errorf("unknown job kind %q", j.Kind)
		}
		cancel()
		if err != nil {
			failed = fmt.Errorf("%s: %w", j.Kind, err)
			c.finishJob(context.WithoutCancel(ctx), j, JobFailed, ReasonBMCFailed, truncate(sanitize(err.Error()), 256))
			continue
		}
		c.finishJob(ctx, j, JobSucceeded, "", "")
	}
	if w.onDone != nil {
		w.onDone(context.WithoutCancel(ctx), failed)
	}
}

func setJob(j store.Job, state, reason, msg string) store.Job {
	j.State, j.Reason, j.Message = state, reason, msg
	return j
}

// finishJob records j's end. The write is not abandoned when ctx ends (the
// store's ApplyTimeout bounds it): a job the controller stops must end
// failed, not stay pending or running.
func (c *Controller) finishJob(ctx context.Context, j store.Job, state, reason, msg string) {
	ctx = context.WithoutCancel(ctx)
	if _, err := c.st.PutJob(ctx, setJob(j, state, reason, msg), store.W{Actor: ActorController, Reason: reason}); err != nil {
		c.logger().Warn("job update", "job", j.ID, "machine", j.Machine, "kind", j.Kind, "err", err)
	}
	c.m.jobs.WithLabelValues(j.Kind, state).Inc()
}

// queuePerWorker bounds auto-inspection's queue: at most Workers ×
// queuePerWorker sequences wait, so a freshly imported hall is powered on
// gradually rather than all at once.
const queuePerWorker = 4

// autoInspect powers registered machines with a BMC into inspection
// (boot_pxe, power_cycle → inspecting), with per-machine backoff after BMC failures.
func (c *Controller) autoInspect(ctx context.Context) error {
	ms, err := c.listAll(store.ListOptions{State: store.StateRegistered})
	if err != nil {
		return err
	}
	now := c.now()
	for _, m := range ms {
		if m.BMC == "" {
			continue
		}
		c.mu.Lock()
		b := c.backoff[m.ID]
		busy := c.inflight[m.ID]
		full := len(c.queue) >= c.cfg.Workers*queuePerWorker
		c.mu.Unlock()
		if full {
			return nil // the rest wait for a later tick: no mass power-on
		}
		if busy || now.Before(b.next) {
			continue
		}
		id := m.ID
		if _, err := c.enqueuePXEBoot(ctx, m, func(ctx context.Context, err error) { c.autoInspectDone(ctx, id, err) }); err != nil {
			return err
		}
	}
	return nil
}

func (c *Controller) autoInspectDone(ctx context.Context, id string, bmcErr error) {
	now := c.now()
	if bmcErr != nil {
		c.mu.Lock()
		b := c.backoff[id]
		if b.delay == 0 {
			b.delay = c.cfg.BMCBackoff
		} else if b.delay *= 2; b.delay > c.cfg.BMCMaxBackoff {
			b.delay = c.cfg.BMCMaxBackoff
		}
		b.next = now.Add(b.delay)
		c.backoff[id] = b
		c.mu.Unlock()
		msg := truncate(sanitize(bmcErr.Error()), 256)
		_, err := c.update(ctx, id, store.W{Actor: ActorController, Reason: ReasonBMCFailed, Message: msg}, func(m *store.Machine) error {
			if m.State != store.StateRegistered || (m.Reason == ReasonBMCFailed && m.Message == msg) {
				return errNoChange
			}
			m.Reason, m.Message = ReasonBMCFailed, msg
			return nil
		})
		if err != nil {
			c.logger().Warn("record BMC failure", "machine", id, "err", err)
		}
		return
	}
	c.mu.Lock()
	delete(c.backoff, id)
	c.mu.Unlock()
	_, err := c.update(ctx, id, store.W{Actor: ActorController, Reason: ReasonInspectionStarted}, func(m *store.Machine) error {
		if m.State != store.StateRegistered {
			return errNoChange // the agent registered first, or an operator acted
		}
		m.State = store.StateInspecting
		m.Reason, m.Message = ReasonInspectionStarted, ""
		m.Step = pendingStep("inspect", now, now.Add(c.cfg.BootTimeout))
		return nil
	})
	if err != nil {
		c.logger().Warn("start inspection", "machine", id, "err", err)
	}
}

// powerDone is the onDone of a power sequence started for a machine
// already moved to state: a BMC failure fails the machine (reason
// bmc_failed) if it is still waiting for its agent in that state.
func (c *Controller) powerDone(id string, state store.MachineState) func(ctx context.Context, err error) {
	return func(ctx context.Context, bmcErr error) {
		if bmcErr == nil {
			return
		}
		msg := truncate(sanitize(bmcErr.Error()), 256)
		_, err := c.update(ctx, id, store.W{Actor: ActorController, Reason: ReasonBMCFailed, Message: msg}, func(m *store.Machine) error {
			if m.State != state || m.Step == nil || m.Step.State != stepPending {
				return errNoChange
			}
			m.State = store.StateFailed
			m.Message = msg
			m.Step.State, m.Step.Reason = string(JobFailed), ReasonBMCFailed
			return nil
		})
		if err != nil {
			c.logger().Warn("record BMC failure", "machine", id, "err", err)
		}
	}
}

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
			case rebootUnobserved(m, now):
				if _, err := c.finishUnobserved(ctx, m.ID, now); err != nil {
					errs = append(errs, err)
				}
			case pastDeadline(m, now):
				if _, err := c.failTimeout(ctx, m.ID, now); err != nil {
					errs = append(errs, err)
				}
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
func rebootUnobserved(m store.Machine, now time.Time) bool {
	return buildComplete(m) && m.Step != nil && !m.Step.Deadline.IsZero() && now.After(m.Step.Deadline)
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
