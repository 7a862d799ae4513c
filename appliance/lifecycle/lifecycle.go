// The controller: its Store, the Controller type that holds each concern's
// state (one small type per concern, see DESIGN.md "Who owns which state"),
// New, and Run/Tick, the leader-only loop. Errors are in errors.go, the
// configuration in config.go.

package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"kiln/store"
)

// Store is the part of *store.Store the controller uses (signatures per the
// store contract; see store package docs for errors).
type Store interface {
	IsLeader() bool
	GetMachine(id string) (store.Machine, error)
	MachineByMAC(mac string) (store.Machine, error)
	ListMachines(opt store.ListOptions) ([]store.Machine, string, error)
	PutMachine(ctx context.Context, m store.Machine, w store.W) (store.Machine, error)
	PutMachines(ctx context.Context, ms []store.Machine, w store.W) ([]store.Machine, error)
	// ReportAgent is one agent report: events and the machine's CAS write
	// in one command, both or neither (store command 17 agent_report).
	ReportAgent(ctx context.Context, m store.Machine, evs []store.Event, w store.W) (store.Machine, error)
	ImportMachines(ctx context.Context, ms []store.Machine, w store.W) ([]store.Machine, error)
	GetBMC(id string) (store.BMC, error)
	PutBMC(ctx context.Context, b store.BMC, w store.W) (store.BMC, error)
	PutSecret(ctx context.Context, key string, sealed []byte, w store.W) error
	Secret(key string) ([]byte, error) // issue 15: sealed cluster and first-boot tokens
	GetImage(id string) (store.Image, error)
	ListImages() ([]store.Image, error)
	PutImage(ctx context.Context, im store.Image, w store.W) (store.Image, error)
	DeleteImage(ctx context.Context, id string, w store.W) error
	PutJob(ctx context.Context, j store.Job, w store.W) (store.Job, error)
	AppendEvents(ctx context.Context, evs []store.Event) error
	CountByState() (map[store.MachineState]int, error)
	// GetRepairBrake and PutRepairBrake are the remediation brake record
	// (store command 26 put_remediation; brake.go).
	GetRepairBrake() (store.RepairBrake, error)
	PutRepairBrake(ctx context.Context, b store.RepairBrake, w store.W) (store.RepairBrake, error)
}

// Controller is the lifecycle controller. Its methods are safe for
// concurrent use; Run drives the leader-only loop and the BMC workers.
//
// Its per-node state is split by concern, each part a small type with its
// own lock that no other part takes (DESIGN.md "Who owns which state"):
// the BMC job queue (jobs), auto-inspection's backoff (backoff), the boot
// guard's memory of agents and tokens (guard), the discovery limiter
// (disc), step start times for the duration histogram (steps) and the
// uploads in progress (uploads). None is held across a store call, except
// the discovery limiter's serial lock, which serialises this node's
// discoveries (cap check + write) and guards no field.
type Controller struct {
	cfg Config
	st  Store
	bmc BMC
	m   *metrics

	jobs    *jobQueue        // jobs.go
	backoff inspectBackoff   // jobs.go
	guard   bootGuard        // bootguard.go
	cw      claimWakes       // claimwake.go
	disc    discoveryLimiter // discovery.go
	steps   stepTimer        // agent.go
	uploads uploadSet        // catalog.go
	health  healthPoller     // health.go
	spares  spareState       // spares.go
	rm      *remMetrics      // remediation.go
	httpc   *http.Client     // drain webhooks (drain.go)
	log     atomic.Pointer[slog.Logger]
}

// New returns a controller over st and bmc (bmc may be nil: no machine is
// then driven by BMC). reg may be nil (metrics unregistered). Errors:
// ErrConfig, or the registry's error on a duplicate registration.
func New(cfg Config, st Store, bmc BMC, reg *prometheus.Registry) (*Controller, error) {
	if st == nil {
		return nil, fmt.Errorf("%w: nil store", ErrConfig)
	}
	cfg.applyDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	m, err := newMetrics(reg)
	if err != nil {
		return nil, err
	}
	rm, err := newRemMetrics(reg)
	if err != nil {
		return nil, err
	}
	c := &Controller{
		cfg: cfg, st: st, bmc: bmc, m: m, rm: rm, httpc: &http.Client{},
		jobs: newJobQueue(),
		disc: discoveryLimiter{rate: cfg.DiscoverRate, burst: float64(cfg.DiscoverBurst)},
	}
	c.log.Store(slog.New(slog.DiscardHandler))
	return c, nil
}

// Run drives the controller until ctx ends: every Interval, while the store
// is leader, it starts auto-inspection, fails machines past a step
// deadline and refreshes the state gauge; Workers goroutines run BMC job
// sequences. It returns nil when ctx ends.
func (c *Controller) Run(ctx context.Context, log *slog.Logger) error {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	log = log.With("component", "lifecycle")
	c.log.Store(log)
	var wg sync.WaitGroup
	for i := 0; i < c.cfg.Workers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.worker(ctx)
		}()
	}
	if c.cfg.Health != nil && c.cfg.Remediation.HealthPollInterval > 0 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.healthLoop(ctx)
		}()
	}
	t := time.NewTicker(c.cfg.Interval)
	defer t.Stop()
	for {
		if c.st.IsLeader() {
			if err := c.Tick(ctx); err != nil && ctx.Err() == nil {
				log.Warn("lifecycle tick", "err", err)
			}
		}
		select {
		case <-ctx.Done():
			c.jobs.signal() // wake workers so they see ctx end
			wg.Wait()
			c.abandonQueue(ctx)
			return nil
		case <-t.C:
		}
	}
}

// Tick runs one pass of the loop (deadlines, auto-inspection, gauges). Run
// calls it every Interval on the leader; tests call it directly.
func (c *Controller) Tick(ctx context.Context) error {
	var errs []error
	if err := c.checkDeadlines(ctx); err != nil {
		errs = append(errs, err)
	}
	if err := c.checkClaimWakes(ctx); err != nil {
		errs = append(errs, err)
	}
	if c.cfg.Inspection == InspectAuto && c.bmc != nil {
		if err := c.autoInspect(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	if err := c.remediate(ctx); err != nil && !errNotV3(err) {
		errs = append(errs, err)
	}
	if counts, err := c.st.CountByState(); err == nil {
		for _, s := range store.AllStates {
			c.m.machines.WithLabelValues(string(s)).Set(float64(counts[s]))
		}
	} else {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// healthLoop runs PollHealth every remediation HealthPollInterval while
// this node leads, until ctx ends.
func (c *Controller) healthLoop(ctx context.Context) {
	t := time.NewTicker(min(c.cfg.Remediation.HealthPollInterval, c.cfg.Remediation.HealthPollBackoff, c.cfg.Interval*5))
	defer t.Stop()
	for {
		if c.st.IsLeader() {
			if err := c.PollHealth(ctx); err != nil && ctx.Err() == nil {
				c.logger().Warn("bmc health poll", "err", err)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (c *Controller) logger() *slog.Logger { return c.log.Load() }

func (c *Controller) now() time.Time { return c.cfg.Now().UTC() }

// stepDeadline is the deadline of a step started at t.
func (c *Controller) stepDeadline(step string, t time.Time) time.Time {
	d, ok := c.cfg.StepDeadlines[step]
	if !ok {
		d = c.cfg.DefaultStepTimeout
	}
	return t.Add(d)
}

// listAll pages through ListMachines.
func (c *Controller) listAll(opt store.ListOptions) ([]store.Machine, error) {
	var out []store.Machine
	opt.Limit = 1000
	for {
		items, next, err := c.st.ListMachines(opt)
		if err != nil {
			return nil, err
		}
		out = append(out, items...)
		if next == "" || len(items) == 0 {
			return out, nil
		}
		opt.After = next
	}
}
