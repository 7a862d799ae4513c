// The BMC job queue (DESIGN.md "BMC jobs"): jobQueue, the sequences waiting
// for a worker and the machines that have one; the workers that run them
// against the BMC and record each store.Job; auto-inspection, the loop's
// throttled producer, with its per-machine backoff (inspectBackoff). Owner
// of jobQueue and inspectBackoff: this file only.

package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"sync"
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

// BMC drives a machine's baseboard management controller. Implemented by the
// appliance's adapter over kiln/bmc and the sealed credentials. Every method
// returns when done or when ctx ends.
type BMC interface {
	PowerOn(ctx context.Context, machineID string) error
	// PowerCycle resets a machine that is on and powers on one that is off.
	PowerCycle(ctx context.Context, machineID string) error
	PowerOff(ctx context.Context, machineID string) error
	// SetNextBootPXE sets a one-time network boot in mode and reads it back.
	SetNextBootPXE(ctx context.Context, machineID string, mode store.BootMode) error
}

// bmcWork is one queued sequence of BMC jobs for a machine.
type bmcWork struct {
	machine string
	mode    store.BootMode
	jobs    []store.Job // created pending, run in order
	onDone  func(ctx context.Context, err error)
	// still, when set, is the sequence's precondition, checked against the
	// machine's current record before each job: "" while it holds, else why
	// the sequence no longer applies (runWork then supersedes the rest).
	still func(m store.Machine) string
}

// ReasonSuperseded is the reason of a job that did not run because the
// machine moved on after its sequence was queued (bmcWork.still): its
// agent took the claim or answered meanwhile.
const ReasonSuperseded = "superseded"

// enqueuePXEBoot queues "boot_pxe" then "power_cycle" for m and calls
// onDone with the outcome once a worker ran them. still is the sequence's
// precondition (bmcWork.still; nil: none). It returns false (and queues
// nothing) when a sequence for m is already queued or running.
func (c *Controller) enqueuePXEBoot(ctx context.Context, m store.Machine, still func(store.Machine) string, onDone func(ctx context.Context, err error)) (bool, error) {
	return c.enqueueGuarded(ctx, m, []string{JobBootPXE, JobPowerCycle}, store.W{Actor: ActorController, Reason: "queued"}, still, onDone)
}

// waitingIn is the precondition of a sequence that boots a machine into
// its agent for state: the machine is still in state and no agent has
// answered for it (no step, or its step pending). Once an agent runs, a
// power cycle would only kill it (an agent that registers again in the
// middle of a build fails the machine, agent_restarted).
func waitingIn(state store.MachineState) func(store.Machine) string {
	return func(m store.Machine) string {
		if m.State != state {
			return fmt.Sprintf("the machine moved from %s to %s before the job ran", state, m.State)
		}
		if m.Step != nil && m.Step.State != stepPending {
			return fmt.Sprintf("its agent answered (step %s %s) before the job ran", m.Step.Step, m.Step.State)
		}
		return ""
	}
}

// enqueueJobs queues the jobs kinds for m (created pending with w, so the
// job events carry who asked and why) and calls onDone with the outcome
// once a worker ran them. It returns false (and queues nothing) when a
// sequence for m is already queued or running.
func (c *Controller) enqueueJobs(ctx context.Context, m store.Machine, kinds []string, w store.W, onDone func(ctx context.Context, err error)) (bool, error) {
	return c.enqueueGuarded(ctx, m, kinds, w, nil, onDone)
}

// enqueueGuarded is enqueueJobs with the sequence's precondition still
// (bmcWork.still; nil: none).
func (c *Controller) enqueueGuarded(ctx context.Context, m store.Machine, kinds []string, w store.W, still func(store.Machine) string, onDone func(ctx context.Context, err error)) (bool, error) {
	if !c.jobs.reserve(m.ID) {
		return false, nil
	}
	work := bmcWork{machine: m.ID, mode: m.BootMode, onDone: onDone, still: still}
	for _, kind := range kinds {
		j, err := c.st.PutJob(ctx, store.Job{Machine: m.ID, Kind: kind, State: JobPending}, w)
		if err != nil {
			// Jobs already created stay visible; close them as failed.
			for _, pj := range work.jobs {
				c.finishJob(ctx, pj, JobFailed, "queue_failed", err.Error())
			}
			c.jobs.release(m.ID)
			return false, fmt.Errorf("lifecycle: create %s job for %s: %w", kind, m.ID, err)
		}
		work.jobs = append(work.jobs, j)
	}
	c.jobs.push(work)
	return true, nil
}

// worker runs queued BMC sequences until ctx ends.
func (c *Controller) worker(ctx context.Context) {
	for {
		w, ok, more := c.jobs.pop()
		if more {
			c.jobs.signal()
		}
		if ok {
			c.runWork(ctx, w)
			continue
		}
		select {
		case <-ctx.Done():
			c.jobs.signal() // pass the wake-up on to the next worker
			return
		case <-c.jobs.wake:
		}
	}
}

// runWork executes one sequence; a failed job fails the rest unrun. When
// the sequence's precondition (still) no longer holds before a job, that
// job and the rest end failed with reason superseded and onDone gets nil:
// nothing failed, the machine moved on. The precondition is read from this
// node's store (the leader's, which has every committed write); an agent
// that takes the machine in the moment between that read and the BMC call
// is not covered.
func (c *Controller) runWork(ctx context.Context, w bmcWork) {
	defer c.jobs.release(w.machine)
	var failed error
	superseded := ""
	for _, j := range w.jobs {
		if failed != nil {
			c.finishJob(ctx, j, JobFailed, "skipped", "an earlier job of the sequence failed")
			continue
		}
		if ctx.Err() != nil || !c.st.IsLeader() {
			failed = errors.New("controller lost leadership or stopped")
			c.finishJob(ctx, j, JobFailed, "not_leader", failed.Error())
			continue
		}
		if superseded == "" && w.still != nil {
			if cur, err := c.st.GetMachine(w.machine); err == nil {
				superseded = w.still(cur)
			}
		}
		if superseded != "" {
			c.finishJob(ctx, j, JobFailed, ReasonSuperseded, truncate(superseded, 256))
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
			c.finishJob(ctx, j, JobFailed, ReasonBMCFailed, truncate(sanitize(err.Error()), 256))
			continue
		}
		c.finishJob(ctx, j, JobSucceeded, "", "")
	}
	if w.onDone != nil {
		dctx, cancel := afterStop(ctx)
		w.onDone(dctx, failed)
		cancel()
	}
}

func setJob(j store.Job, state, reason, msg string) store.Job {
	j.State, j.Reason, j.Message = state, reason, msg
	return j
}

// finishJob records j's end. The write is not abandoned when ctx ends: a
// job the controller stops must end failed, not stay pending or running.
// It is given stopGrace after ctx ends (afterStop), so a node that stops
// while it cannot commit (its peers gone) does not wait the store's
// ApplyTimeout for every job of every sequence.
func (c *Controller) finishJob(ctx context.Context, j store.Job, state, reason, msg string) {
	ctx, cancel := afterStop(ctx)
	defer cancel()
	if _, err := c.st.PutJob(ctx, setJob(j, state, reason, msg), store.W{Actor: ActorController, Reason: reason}); err != nil {
		c.logger().Warn("job update", "job", j.ID, "machine", j.Machine, "kind", j.Kind, "err", err)
	}
	c.m.jobs.WithLabelValues(j.Kind, state).Inc()
}

// abandonQueue closes the jobs of sequences no worker started (the
// controller is stopping) as failed, so none is left pending.
func (c *Controller) abandonQueue(ctx context.Context) {
	q := c.jobs.takeAll()
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	for _, w := range q {
		for _, j := range w.jobs {
			c.finishJob(sctx, j, JobFailed, "shutdown", "controller stopped before the job ran")
		}
	}
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
		busy, queued := c.jobs.state(m.ID)
		if queued >= c.cfg.Workers*queuePerWorker {
			return nil // the rest wait for a later tick: no mass power-on
		}
		if busy || now.Before(c.backoff.next(m.ID)) {
			continue
		}
		// ms is a snapshot: a sequence that ended after it was taken has
		// already moved the machine on (autoInspectDone, or its agent
		// registered) and cleared inflight. Without this re-read the machine,
		// now running, was power-cycled a second time (the fleet simulator:
		// 34 of 2,000 machines).
		if cur, err := c.st.GetMachine(m.ID); err != nil || cur.State != store.StateRegistered || cur.BMC == "" {
			continue
		}
		id := m.ID
		if _, err := c.enqueuePXEBoot(ctx, m, waitingIn(store.StateRegistered), func(ctx context.Context, err error) { c.autoInspectDone(ctx, id, err) }); err != nil {
			return err
		}
	}
	return nil
}

func (c *Controller) autoInspectDone(ctx context.Context, id string, bmcErr error) {
	now := c.now()
	if bmcErr != nil {
		c.backoff.failed(id, now, c.cfg.BMCBackoff, c.cfg.BMCMaxBackoff)
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
	c.backoff.clear(id)
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

// jobQueue is this node's BMC job queue: the sequences waiting for a
// worker (FIFO), the machines with a sequence queued or running (at most
// one each), and the workers' wake-up channel (capacity 1: a wake-up is
// passed on while work remains). Its lock guards pending and inflight
// only; no store or BMC call runs under it.
type jobQueue struct {
	mu       sync.Mutex
	pending  []bmcWork
	inflight map[string]bool
	wake     chan struct{}
}

func newJobQueue() *jobQueue {
	return &jobQueue{inflight: map[string]bool{}, wake: make(chan struct{}, 1)}
}

// reserve marks machine id as having a sequence; false when it already has one.
func (q *jobQueue) reserve(id string) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.inflight[id] {
		return false
	}
	q.inflight[id] = true
	return true
}

// release ends machine id's sequence (run, abandoned or never queued).
func (q *jobQueue) release(id string) {
	q.mu.Lock()
	delete(q.inflight, id)
	q.mu.Unlock()
}

// push queues w (its machine reserved) and wakes a worker.
func (q *jobQueue) push(w bmcWork) {
	q.mu.Lock()
	q.pending = append(q.pending, w)
	q.mu.Unlock()
	q.signal()
}

// pop takes the oldest sequence (ok false: none); more reports whether
// others still wait. The machine stays reserved until release.
func (q *jobQueue) pop() (w bmcWork, ok, more bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.pending) > 0 {
		w, ok = q.pending[0], true
		q.pending = q.pending[1:]
	}
	return w, ok, len(q.pending) > 0
}

// takeAll empties the queue and releases the machines of what it held.
func (q *jobQueue) takeAll() []bmcWork {
	q.mu.Lock()
	defer q.mu.Unlock()
	out := q.pending
	q.pending = nil
	for _, w := range out {
		delete(q.inflight, w.machine)
	}
	return out
}

// state reports whether machine id has a sequence and how many wait.
func (q *jobQueue) state(id string) (busy bool, queued int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.inflight[id], len(q.pending)
}

// signal wakes one waiting worker (dropped when a wake-up is already pending).
func (q *jobQueue) signal() {
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// inspectBackoff is auto-inspection's retry state per machine after a BMC
// failure: the first retry waits BMCBackoff, each further failure doubles
// the delay up to BMCMaxBackoff; a success forgets the machine. Its own lock.
type inspectBackoff struct {
	mu sync.Mutex
	m  map[string]backoff
}

type backoff struct {
	next  time.Time
	delay time.Duration
}

// next is the earliest time machine id may be tried again (zero: now).
func (b *inspectBackoff) next(id string) time.Time {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.m[id].next
}

// failed records a failure of machine id at now.
func (b *inspectBackoff) failed(id string, now time.Time, first, most time.Duration) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.m == nil {
		b.m = map[string]backoff{}
	}
	e := b.m[id]
	if e.delay == 0 {
		e.delay = first
	} else if e.delay *= 2; e.delay > most {
		e.delay = most
	}
	e.next = now.Add(e.delay)
	b.m[id] = e
}

// clear forgets machine id (its sequence succeeded).
func (b *inspectBackoff) clear(id string) {
	b.mu.Lock()
	delete(b.m, id)
	b.mu.Unlock()
}

// stopGrace is how long a write that records an outcome (a job's end, a
// power sequence's result) may still run once the controller's context has
// ended.
const stopGrace = 2 * time.Second

// afterStop returns a context that outlives ctx by stopGrace: not cancelled
// while ctx runs, cancelled stopGrace after ctx ends (or by the returned
// cancel).
func afterStop(ctx context.Context) (context.Context, context.CancelFunc) {
	wctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	stop := context.AfterFunc(ctx, func() { time.AfterFunc(stopGrace, cancel) })
	return wctx, func() { stop(); cancel() }
}
