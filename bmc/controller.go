package bmc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Defaults for Config fields left zero.
const (
	DefaultCallTimeout     = 20 * time.Second
	DefaultRetries         = 2
	DefaultBackoffBase     = 500 * time.Millisecond
	DefaultBackoffMax      = 8 * time.Second
	DefaultMaxConcurrent   = 32
	DefaultIPMICipherSuite = "17" // RMCP+ suite 17: HMAC-SHA256, AES-CBC-128 (IPMI 2.0 §22.15.2)
)

// Config tunes a Controller. Zero values take the Default* constants.
type Config struct {
	// CallTimeout bounds one attempt of one operation (connect, request(s), read-back).
	CallTimeout time.Duration
	// Retries is the number of further attempts after a retryable failure (0 = none;
	// negative is invalid). Non-idempotent actions (cycle, reset) retry only failures that
	// cannot have reached the BMC.
	Retries int
	// NoRetries forces Retries to 0 even though 0 means "default" otherwise.
	NoRetries bool
	// BackoffBase and BackoffMax shape the exponential backoff between attempts.
	BackoffBase, BackoffMax time.Duration
	// MaxConcurrent bounds operations in flight across all BMCs (site-wide semaphore).
	MaxConcurrent int
	// IPMICipherSuite is ipmitool's -C value ("3" for OpenIPMI's ipmi_sim).
	IPMICipherSuite string
	// IpmitoolPath is the ipmitool binary ("" = look up "ipmitool" in PATH).
	IpmitoolPath string
	// IPMIIgnoreValidBit accepts a boot-flags read-back whose "boot flag valid" bit is
	// clear, for BMCs that keep only the device selector (OpenIPMI's ipmi_sim). The
	// device selector, persistence and EFI bit are still checked.
	IPMIIgnoreValidBit bool
	// RedfishBasicAuth uses HTTP Basic auth instead of a Redfish session (DSP0266 §13.3).
	RedfishBasicAuth bool
	// Logger receives operation logs (component=bmc); nil discards.
	Logger *slog.Logger
}

// Validate reports a malformed Config.
func (c Config) Validate() error {
	if c.CallTimeout < 0 || c.BackoffBase < 0 || c.BackoffMax < 0 || c.Retries < 0 || c.MaxConcurrent < 0 {
		return fmt.Errorf("%w: negative duration or count in Config", ErrInvalidTarget)
	}
	if c.BackoffMax != 0 && c.BackoffBase > c.BackoffMax {
		return fmt.Errorf("%w: BackoffBase > BackoffMax", ErrInvalidTarget)
	}
	return nil
}

func (c *Config) defaults() {
	if c.CallTimeout == 0 {
		c.CallTimeout = DefaultCallTimeout
	}
	if c.Retries == 0 && !c.NoRetries {
		c.Retries = DefaultRetries
	}
	if c.NoRetries {
		c.Retries = 0
	}
	if c.BackoffBase == 0 {
		c.BackoffBase = DefaultBackoffBase
	}
	if c.BackoffMax == 0 {
		c.BackoffMax = DefaultBackoffMax
	}
	if c.MaxConcurrent == 0 {
		c.MaxConcurrent = DefaultMaxConcurrent
	}
	if c.IPMICipherSuite == "" {
		c.IPMICipherSuite = DefaultIPMICipherSuite
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
}

// driver is one protocol's implementation of the operations, bound to one Target for
// one attempt (it holds the attempt's connection state).
type driver interface {
	powerState(ctx context.Context) (PowerState, error)
	power(ctx context.Context, a PowerAction) error
	setNextBootPXE(ctx context.Context, m BootMode) error
	inventory(ctx context.Context) (Inventory, error)
	health(ctx context.Context) (Health, error)
	firmwareInventory(ctx context.Context) ([]FirmwareComponent, error)
	startUpdate(ctx context.Context, u FirmwareUpdate) (TaskStatus, error)
	taskStatus(ctx context.Context, prev TaskStatus) (TaskStatus, error)
	bios(ctx context.Context) (BIOS, error)
	setBIOS(ctx context.Context, attrs map[string]any) (BIOS, error)
	close()
}

// Controller runs BMC operations. It is safe for concurrent use; at most one operation
// runs per BMC address at a time and at most Config.MaxConcurrent site-wide.
type Controller struct {
	cfg Config
	log *slog.Logger
	sem chan struct{}

	mu    sync.Mutex
	locks map[string]chan struct{}
	auto  map[string]string // address -> resolved driver for Driver "auto"

	ops      *prometheus.CounterVec
	retries  *prometheus.CounterVec
	latency  *prometheus.HistogramVec
	inFlight prometheus.Gauge
}

// New returns a Controller. reg may be nil (no metrics exported). Metrics:
//
//	kiln_bmc_ops_total{op,driver,result}        operations by outcome (result = "ok" or a Reason)
//	kiln_bmc_op_duration_seconds{op,driver}     operation latency including retries
//	kiln_bmc_retries_total{op,driver}           attempts after the first
//	kiln_bmc_ops_in_flight                      operations holding the site-wide semaphore
func New(cfg Config, reg *prometheus.Registry) (*Controller, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.defaults()
	c := &Controller{
		cfg:   cfg,
		log:   cfg.Logger.With("component", "bmc"),
		sem:   make(chan struct{}, cfg.MaxConcurrent),
		locks: map[string]chan struct{}{},
		auto:  map[string]string{},
		ops: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kiln_bmc_ops_total",
			Help: "BMC operations by op, driver and result (ok or error reason)."}, []string{"op", "driver", "result"}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kiln_bmc_retries_total",
			Help: "BMC operation attempts after the first."}, []string{"op", "driver"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "kiln_bmc_op_duration_seconds",
			Help:    "BMC operation latency in seconds, including retries and lock waits.",
			Buckets: []float64{0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 40, 80}}, []string{"op", "driver"}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{Name: "kiln_bmc_ops_in_flight",
			Help: "BMC operations currently running."}),
	}
	if reg != nil {
		for _, m := range []prometheus.Collector{c.ops, c.retries, c.latency, c.inFlight} {
			if err := reg.Register(m); err != nil {
				return nil, fmt.Errorf("bmc: register metrics: %w", err)
			}
		}
	}
	return c, nil
}

// PowerState reads the machine's power state. A garbled answer is ErrBadAnswer, never a
// state; "PoweringOn"/"PoweringOff" are retried and then reported as ErrBadAnswer.
func (c *Controller) PowerState(ctx context.Context, t Target) (PowerState, error) {
	var st PowerState
	err := c.run(ctx, t, "power_state", true, func(ctx context.Context, d driver) error {
		s, err := d.powerState(ctx)
		st = s
		return err
	})
	return st, err
}

// Power performs action a. "on" when on, and "off"/"soft_off" when off, succeed without
// touching the machine; a BMC that errors on off-when-off is re-read and, if off, counts
// as success. "cycle" and "reset" on a machine that is off power it on.
func (c *Controller) Power(ctx context.Context, t Target, a PowerAction) error {
	switch a {
	case ActionOn, ActionOff, ActionSoftOff, ActionCycle, ActionReset:
	default:
		return &OpError{Op: "power", Driver: t.Driver, Address: t.Address, Err: ErrInvalidTarget,
			Msg: fmt.Sprintf("unknown action %q", string(a))}
	}
	idem := a == ActionOn || a == ActionOff || a == ActionSoftOff
	return c.run(ctx, t, "power", idem, func(ctx context.Context, d driver) error {
		cur, err := d.powerState(ctx)
		if err != nil {
			return err
		}
		want := a
		switch {
		case a == ActionOn && cur == PowerOn, (a == ActionOff || a == ActionSoftOff) && cur == PowerOff:
			return nil
		case (a == ActionCycle || a == ActionReset) && cur == PowerOff:
			want = ActionOn
		}
		perr := d.power(ctx, want)
		if perr == nil || ctx.Err() != nil {
			return perr
		}
		if want == ActionOff || want == ActionSoftOff || want == ActionOn {
			// Some BMCs answer an error for a no-op (off when already off): trust the
			// state read after the error, not the error.
			if s, err := d.powerState(ctx); err == nil &&
				((want == ActionOn && s == PowerOn) || (want != ActionOn && s == PowerOff)) {
				c.log.InfoContext(ctx, "power action errored but state is as requested",
					"address", t.Address, "action", string(want), "error", scrub(perr.Error(), t.Password))
				return nil
			}
		}
		return perr
	})
}

// SetNextBootPXE sets a one-time network boot in mode m, then reads it back: any
// difference in target (Pxe), enabled (Once) or mode yields ErrBootNotApplied. Redfish:
// PATCH ComputerSystem Boot {BootSourceOverrideTarget, Enabled, Mode}; on a 4xx the
// state is re-read, only the differing fields are sent, and as a last resort the minimal
// {Target, Enabled}. IPMI: Set System Boot Options parameter 5 (IPMI 2.0 §28.13, EFI bit
// for UEFI) via "chassis bootdev pxe", read back with Get System Boot Options.
func (c *Controller) SetNextBootPXE(ctx context.Context, t Target, m BootMode) error {
	if m != BootUEFI && m != BootLegacy {
		return &OpError{Op: "boot", Driver: t.Driver, Address: t.Address, Err: ErrInvalidTarget,
			Msg: fmt.Sprintf("unknown boot mode %q", string(m))}
	}
	return c.run(ctx, t, "boot", true, func(ctx context.Context, d driver) error {
		return d.setNextBootPXE(ctx, m)
	})
}

// Inventory reads serial, manufacturer, model, UUID and NIC MACs where the BMC offers
// them (Redfish ComputerSystem and its EthernetInterfaces). IPMI yields ErrUnsupported.
func (c *Controller) Inventory(ctx context.Context, t Target) (Inventory, error) {
	var inv Inventory
	err := c.run(ctx, t, "inventory", true, func(ctx context.Context, d driver) error {
		i, err := d.inventory(ctx)
		inv = i
		return err
	})
	return inv, err
}

// run executes one operation with locking, the semaphore, timeouts, retries, metrics,
// logging and error scrubbing.
func (c *Controller) run(ctx context.Context, t Target, op string, idempotent bool, fn func(context.Context, driver) error) error {
	start := time.Now()
	drvName := t.Driver
	if drvName == "" {
		drvName = DriverAuto
	}
	fail := func(s error, msg string) error {
		e := &OpError{Op: op, Driver: drvName, Address: t.Address, Err: s, Msg: scrub(msg, t.Password)}
		c.ops.WithLabelValues(op, metricDriver(drvName), Reason(s)).Inc()
		c.latency.WithLabelValues(op, metricDriver(drvName)).Observe(time.Since(start).Seconds())
		c.log.WarnContext(ctx, "bmc operation failed", "op", op, "target", t, "reason", Reason(s), "error", e.Msg)
		return e
	}
	if drvName != DriverRedfish && drvName != DriverIPMI && drvName != DriverAuto {
		return fail(ErrInvalidTarget, fmt.Sprintf("unknown driver %q", t.Driver))
	}
	if _, _, err := t.endpoint(1); err != nil {
		return fail(ErrInvalidTarget, "bad address")
	}
	unlock, err := c.acquire(ctx, t.Address)
	if err != nil {
		s := ErrCanceled
		if errors.Is(err, context.DeadlineExceeded) {
			s = ErrTimeout
		}
		return fail(s, "waiting for a BMC slot: "+err.Error())
	}
	defer unlock()

	var last, lastS error
	for attempt := 0; attempt <= c.cfg.Retries; attempt++ {
		if attempt > 0 {
			c.retries.WithLabelValues(op, metricDriver(drvName)).Inc()
			back := c.cfg.BackoffBase << (attempt - 1)
			if back > c.cfg.BackoffMax || back <= 0 {
				back = c.cfg.BackoffMax
			}
			select {
			case <-ctx.Done():
				return fail(ErrCanceled, "during backoff after: "+last.Error())
			case <-time.After(back):
			}
		}
		actx, cancel := context.WithTimeout(ctx, c.cfg.CallTimeout)
		d, name, err := c.driverFor(actx, t)
		if err == nil {
			drvName = name
			err = fn(actx, d)
			d.close()
		}
		s := classify(actx, err)
		if s == ErrTimeout && ctx.Err() != nil && !errors.Is(ctx.Err(), context.DeadlineExceeded) {
			s = ErrCanceled
		}
		cancel()
		if err == nil {
			c.ops.WithLabelValues(op, metricDriver(drvName), "ok").Inc()
			c.latency.WithLabelValues(op, metricDriver(drvName)).Observe(time.Since(start).Seconds())
			c.log.DebugContext(ctx, "bmc operation done", "op", op, "target", t, "attempts", attempt+1,
				"seconds", time.Since(start).Seconds())
			return nil
		}
		last, lastS = err, s
		if ctx.Err() != nil || !retryable(s, idempotent) {
			break
		}
		c.log.InfoContext(ctx, "bmc operation attempt failed, retrying", "op", op, "target", t,
			"attempt", attempt+1, "reason", Reason(s), "error", scrub(err.Error(), t.Password))
	}
	return fail(lastS, strings.TrimPrefix(last.Error(), lastS.Error()+": "))
}

func metricDriver(d string) string {
	switch d {
	case DriverRedfish, DriverIPMI, DriverAuto:
		return d
	}
	return "invalid"
}

// acquire takes the per-address lock, then a site-wide slot; both honour ctx.
func (c *Controller) acquire(ctx context.Context, addr string) (func(), error) {
	c.mu.Lock()
	l, ok := c.locks[addr]
	if !ok {
		l = make(chan struct{}, 1)
		c.locks[addr] = l
	}
	c.mu.Unlock()
	select {
	case l <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	select {
	case c.sem <- struct{}{}:
	case <-ctx.Done():
		<-l
		return nil, ctx.Err()
	}
	c.inFlight.Inc()
	return func() {
		c.inFlight.Dec()
		<-c.sem
		<-l
	}, nil
}

// driverFor builds the driver for one attempt, resolving "auto" once per address.
func (c *Controller) driverFor(ctx context.Context, t Target) (driver, string, error) {
	name := t.Driver
	if name == "" || name == DriverAuto {
		c.mu.Lock()
		name = c.auto[t.Address]
		c.mu.Unlock()
		if name == "" {
			var err error
			name, err = c.probe(ctx, t)
			if err != nil {
				return nil, DriverAuto, err
			}
			c.mu.Lock()
			c.auto[t.Address] = name
			c.mu.Unlock()
		}
	}
	switch name {
	case DriverRedfish:
		d, err := newRedfishDriver(c, t)
		return d, name, err
	case DriverIPMI:
		d, err := newIPMIDriver(c, t)
		return d, name, err
	}
	return nil, name, fmt.Errorf("%w: driver %q", ErrInvalidTarget, name)
}
