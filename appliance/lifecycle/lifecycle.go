package lifecycle

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"kiln/store"
)

// Errors of package lifecycle. Store errors (store.ErrNotFound,
// store.ErrConflict, store.ErrNotLeader, *store.IllegalTransitionError) are
// passed through wrapped with %w.
var (
	// ErrWrongState: the operation does not apply to the machine's current
	// state (the concrete error is *StateError naming the state).
	ErrWrongState = errors.New("lifecycle: machine is in the wrong state for this operation")
	// ErrInvalid: an argument is malformed; the message names the field.
	ErrInvalid = errors.New("lifecycle: invalid argument")
	// ErrNotEnough: ClaimMachines found fewer matching available machines than asked.
	ErrNotEnough = errors.New("lifecycle: not enough available machines")
	// ErrMachineMismatch: an agent message names a machine other than the one its token is for.
	ErrMachineMismatch = errors.New("lifecycle: agent message names another machine")
	// ErrBadReport: an agent report carries an unknown step, state or reason.
	ErrBadReport = errors.New("lifecycle: malformed agent report")
	// ErrNoSealer: EnrollBMC needs Config.Sealer.
	ErrNoSealer = errors.New("lifecycle: no credential sealer configured")
	// ErrNoCatalog: UploadImage needs Config.Catalog.
	ErrNoCatalog = errors.New("lifecycle: no image catalog configured")
	// ErrDigest: the uploaded image's SHA-256 differs from the declared one
	// (for gzip and zstd: the SHA-256 of the decompressed content).
	ErrDigest = errors.New("lifecycle: image digest mismatch")
	// ErrImageFormat: a gzip or zstd image's body does not decode in that
	// format (or holds data after the compressed stream).
	ErrImageFormat = errors.New("lifecycle: image body is not in its declared format")
	// ErrImageSize: a gzip or zstd image's decompressed content is not the
	// declared size.
	ErrImageSize = errors.New("lifecycle: image content is not the declared size")
	// ErrAgentActive: BootFor refused to issue a new per-boot token because
	// the machine's agent is (or may be) still running with the current one
	// (heard from within Controller.AgentLiveWindow). Not a failure: the
	// boot HTTP server answers with an iPXE script that sleeps and fetches
	// /ipxe/{mac} again; a machine that really rebooted gets its token once
	// the agent is stale.
	ErrAgentActive = errors.New("lifecycle: machine's agent is active; retry the boot later")
	// ErrConfig: Config.Validate failed; the message names the field.
	ErrConfig = errors.New("lifecycle: invalid config")
)

// StateError is returned (wrapping ErrWrongState) when an operation does
// not apply to the machine's current state: State is not one of Want, or
// (Claimed) State is wanted but the machine already carries a claim, whose
// image is ClaimedImage; the message then says that, instead of
// contrasting a state with itself.
type StateError struct {
	Op           string
	Machine      string
	State        store.MachineState
	Want         []store.MachineState
	Claimed      bool
	ClaimedImage string
}

func (e *StateError) Error() string {
	if e.Claimed {
		return fmt.Sprintf("lifecycle: %s machine %s: it is %s but already claimed (image %s); release it first",
			e.Op, e.Machine, e.State, e.ClaimedImage)
	}
	want := make([]string, len(e.Want))
	for i, s := range e.Want {
		want[i] = string(s)
	}
	return fmt.Sprintf("lifecycle: %s machine %s: state is %s, want %s", e.Op, e.Machine, e.State, strings.Join(want, " or "))
}

// Unwrap makes errors.Is(err, ErrWrongState) true.
func (e *StateError) Unwrap() error { return ErrWrongState }

// Store is the part of *store.Store the controller uses (signatures per the
// store contract; see store package docs for errors).
type Store interface {
	IsLeader() bool
	GetMachine(id string) (store.Machine, error)
	MachineByMAC(mac string) (store.Machine, error)
	ListMachines(opt store.ListOptions) ([]store.Machine, string, error)
	PutMachine(ctx context.Context, m store.Machine, w store.W) (store.Machine, error)
	PutMachines(ctx context.Context, ms []store.Machine, w store.W) ([]store.Machine, error)
	ImportMachines(ctx context.Context, ms []store.Machine, w store.W) ([]store.Machine, error)
	GetBMC(id string) (store.BMC, error)
	PutBMC(ctx context.Context, b store.BMC, w store.W) (store.BMC, error)
	PutSecret(ctx context.Context, key string, sealed []byte, w store.W) error
	GetImage(id string) (store.Image, error)
	ListImages() ([]store.Image, error)
	PutImage(ctx context.Context, im store.Image, w store.W) (store.Image, error)
	DeleteImage(ctx context.Context, id string, w store.W) error
	PutJob(ctx context.Context, j store.Job, w store.W) (store.Job, error)
	AppendEvents(ctx context.Context, evs []store.Event) error
	CountByState() (map[store.MachineState]int, error)
}

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

// Sealer encrypts a secret (a BMC password) for storage.
type Sealer interface {
	Seal(plain []byte) ([]byte, error)
}

// CatalogEntry is a stored image file: Name, Size in bytes, SHA256 hex of its bytes.
type CatalogEntry struct {
	Name   string
	Size   int64
	SHA256 string
}

// Catalog stores image files served under ImageBaseURL + "/images/" + name.
// Upload streams r to the file; when wantSHA256 is not empty a mismatch is
// an error and nothing is kept; size < 0 means unknown.
type Catalog interface {
	Upload(ctx context.Context, name string, r io.Reader, wantSHA256 string, size int64) (CatalogEntry, error)
}

// CatalogDeleter is optionally implemented by a Catalog: DeleteImage then
// removes the image file too (a missing file, fs.ErrNotExist, is not an error).
type CatalogDeleter interface {
	Delete(name string) error
}

// Policy is the action on an intended-vs-discovered difference in one field.
type Policy string

// Diff policies.
const (
	PolicyBlock  Policy = "block"  // quarantine the machine
	PolicyWarn   Policy = "warn"   // record the difference only
	PolicyIgnore Policy = "ignore" // do not compare
)

// Diff fields (keys of Config.DiffPolicy).
const (
	FieldSerial   = "serial"
	FieldNICs     = "nics"  // every intended MAC must be present (set compare)
	FieldDisks    = "disks" // count of non-removable disks
	FieldMemory   = "memory"
	FieldCPUs     = "cpus"
	FieldVendor   = "vendor"
	FieldModel    = "model"
	FieldRootDisk = "root_disk" // RootDisk.Serial/WWN present among discovered disks
)

// DefaultDiffPolicy is the policy of fields Config.DiffPolicy does not name.
func DefaultDiffPolicy() map[string]Policy {
	return map[string]Policy{
		FieldSerial: PolicyBlock, FieldNICs: PolicyBlock, FieldDisks: PolicyBlock, FieldRootDisk: PolicyBlock,
		FieldMemory: PolicyWarn, FieldCPUs: PolicyWarn, FieldVendor: PolicyWarn, FieldModel: PolicyWarn,
	}
}

// Unknown-machine policies (Config.UnknownMachines), as in appliance config.
const (
	UnknownDiscover = "discover" // create a discovered record and boot the agent
	UnknownExit     = "exit"     // iPXE exits to the local disk; nothing recorded
)

// Inspection policies (Config.Inspection).
const (
	InspectAuto   = "auto"   // registered machines with a BMC are powered into inspection
	InspectManual = "manual" // only Inspect (or the agent registering) starts it
)

// Defaults (named so the appliance's config docs can cite them).
const (
	DefaultInterval        = 2 * time.Second
	DefaultWorkers         = 8
	DefaultBMCTimeout      = 60 * time.Second
	DefaultBMCBackoff      = 30 * time.Second
	DefaultBMCMaxBackoff   = 10 * time.Minute
	DefaultBootTimeout     = 15 * time.Minute // power action / claim → agent's first report
	DefaultStepTimeout     = 30 * time.Minute // a step without its own entry in StepDeadlines
	DefaultRebootTimeout   = 3 * time.Minute  // build complete → the machine's next netboot
	DefaultAgentPollAfter  = 5 * time.Second
	DefaultAgentHeartbeat  = 30 * time.Second
	DefaultMemoryTolerance = 0.05 // discovered memory may be this fraction below intended
	DefaultDiscoverRate    = 2.0  // new discovered records per second (per node)
	DefaultDiscoverBurst   = 20   // discovered records created back to back
	DefaultMaxDiscovered   = 500  // machines in state discovered, site-wide
)

// DefaultStepDeadlines are the per-step deadlines (from a step's start)
// used for steps Config.StepDeadlines does not name.
func DefaultStepDeadlines() map[string]time.Duration {
	return map[string]time.Duration{
		"inspect": 15 * time.Minute, "check": 10 * time.Minute, "write": 60 * time.Minute,
		"verify": 60 * time.Minute, "stage": 5 * time.Minute, "finalize": 5 * time.Minute,
		"reboot": 10 * time.Minute, "erase": 4 * time.Hour,
	}
}

// Config is the controller's configuration. Zero values take the defaults above.
type Config struct {
	// ImageBaseURL is the appliance's boot HTTP base (http://host[:port]);
	// images are fetched from ImageBaseURL + "/images/" + Image.Name. Required.
	ImageBaseURL string
	// UnknownMachines is UnknownDiscover (default) or UnknownExit.
	UnknownMachines string
	// Inspection is InspectAuto (default) or InspectManual.
	Inspection string
	// DiffPolicy overrides DefaultDiffPolicy per field.
	DiffPolicy map[string]Policy
	// StepDeadlines overrides DefaultStepDeadlines per step (from the step's start).
	StepDeadlines map[string]time.Duration
	// DefaultStepTimeout bounds steps with no deadline of their own.
	DefaultStepTimeout time.Duration
	// BootTimeout bounds the wait from a power action or build start to the agent's first report.
	BootTimeout time.Duration
	// RebootTimeout bounds the wait from the build's completion (finalize
	// succeeded) to the machine's next netboot, which BootFor answers with
	// the local disk and records as provisioned (booted_local_disk). A
	// machine not seen netbooting by then (it boots its disk first) is
	// moved to provisioned with reason reboot_unobserved by the loop.
	RebootTimeout time.Duration
	// Interval is the loop period: deadline checks, auto-inspection, gauges.
	Interval time.Duration
	// Workers bounds concurrent BMC job sequences.
	Workers int
	// BMCTimeout bounds one BMC call.
	BMCTimeout time.Duration
	// BMCBackoff is the first retry delay after a failed auto-inspection (doubling to BMCMaxBackoff).
	BMCBackoff, BMCMaxBackoff time.Duration
	// AgentPollAfter and AgentHeartbeat are handed to the agent in every Task.
	AgentPollAfter, AgentHeartbeat time.Duration
	// AgentEndpoints are the agent API URLs (kiln.url values) of every node of
	// the site cluster, handed to the agent in every Task (agentapi.Task.Endpoints)
	// so that it moves on to another node when its own does not answer. Empty: none.
	AgentEndpoints []string
	// AgentStaleAfter: an agent not heard from for this long is presumed gone
	// (a claim then power-cycles the machine when it has a BMC). Default 3×AgentPollAfter.
	AgentStaleAfter time.Duration
	// DiscoverRate (records per second) and DiscoverBurst bound the
	// discovered records BootFor creates for unknown MACs: a token bucket
	// per controller (node) of DiscoverBurst tokens refilled at
	// DiscoverRate/s. MaxDiscovered caps the machines in state discovered
	// site-wide (counted from the store, whichever path created them).
	// Over either limit BootFor answers BootLocal and records nothing.
	// Defaults DefaultDiscoverRate, DefaultDiscoverBurst, DefaultMaxDiscovered.
	DiscoverRate  float64
	DiscoverBurst int
	MaxDiscovered int
	// MinReadMBps is the check step's disk read floor (MB/s); 0 = none.
	MinReadMBps float64
	// MemoryTolerance: discovered memory may be this fraction below intended without a diff.
	MemoryTolerance float64
	// Sealer encrypts BMC passwords (EnrollBMC). Catalog stores image files (UploadImage).
	Sealer  Sealer
	Catalog Catalog
	// Now and Rand are the clock and randomness (tests); default time.Now and crypto/rand.
	Now  func() time.Time
	Rand io.Reader
}

// Validate checks Config values (after defaults are applied by New).
func (c *Config) Validate() error {
	u, err := url.Parse(c.ImageBaseURL)
	if c.ImageBaseURL == "" || err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("%w: ImageBaseURL %q: want http(s)://host[:port]", ErrConfig, c.ImageBaseURL)
	}
	switch c.UnknownMachines {
	case UnknownDiscover, UnknownExit:
	default:
		return fmt.Errorf("%w: UnknownMachines %q: want discover or exit", ErrConfig, c.UnknownMachines)
	}
	switch c.Inspection {
	case InspectAuto, InspectManual:
	default:
		return fmt.Errorf("%w: Inspection %q: want auto or manual", ErrConfig, c.Inspection)
	}
	for f, p := range c.DiffPolicy {
		if _, ok := DefaultDiffPolicy()[f]; !ok {
			return fmt.Errorf("%w: DiffPolicy field %q unknown", ErrConfig, f)
		}
		switch p {
		case PolicyBlock, PolicyWarn, PolicyIgnore:
		default:
			return fmt.Errorf("%w: DiffPolicy[%s] %q: want block, warn or ignore", ErrConfig, f, p)
		}
	}
	for s, d := range c.StepDeadlines {
		if d <= 0 {
			return fmt.Errorf("%w: StepDeadlines[%s] must be > 0", ErrConfig, s)
		}
	}
	if c.RebootTimeout < 0 {
		return fmt.Errorf("%w: RebootTimeout %v must be > 0", ErrConfig, c.RebootTimeout)
	}
	if math.IsNaN(c.DiscoverRate) || math.IsInf(c.DiscoverRate, 0) || c.DiscoverRate <= 0 {
		return fmt.Errorf("%w: DiscoverRate %v: want > 0", ErrConfig, c.DiscoverRate)
	}
	if c.DiscoverBurst < 1 {
		return fmt.Errorf("%w: DiscoverBurst %d: want >= 1", ErrConfig, c.DiscoverBurst)
	}
	if c.MaxDiscovered < 1 {
		return fmt.Errorf("%w: MaxDiscovered %d: want >= 1", ErrConfig, c.MaxDiscovered)
	}
	if c.MemoryTolerance < 0 || c.MemoryTolerance >= 1 {
		return fmt.Errorf("%w: MemoryTolerance %v: want 0 <= x < 1", ErrConfig, c.MemoryTolerance)
	}
	return nil
}

func (c *Config) applyDefaults() {
	c.ImageBaseURL = strings.TrimRight(c.ImageBaseURL, "/")
	if c.UnknownMachines == "" {
		c.UnknownMachines = UnknownDiscover
	}
	if c.Inspection == "" {
		c.Inspection = InspectAuto
	}
	pol := DefaultDiffPolicy()
	for k, v := range c.DiffPolicy {
		pol[k] = v
	}
	c.DiffPolicy = pol
	dl := DefaultStepDeadlines()
	for k, v := range c.StepDeadlines {
		dl[k] = v
	}
	c.StepDeadlines = dl
	setDur := func(d *time.Duration, def time.Duration) {
		if *d == 0 {
			*d = def
		}
	}
	setDur(&c.DefaultStepTimeout, DefaultStepTimeout)
	setDur(&c.BootTimeout, DefaultBootTimeout)
	setDur(&c.RebootTimeout, DefaultRebootTimeout)
	setDur(&c.Interval, DefaultInterval)
	setDur(&c.BMCTimeout, DefaultBMCTimeout)
	setDur(&c.BMCBackoff, DefaultBMCBackoff)
	setDur(&c.BMCMaxBackoff, DefaultBMCMaxBackoff)
	setDur(&c.AgentPollAfter, DefaultAgentPollAfter)
	setDur(&c.AgentHeartbeat, DefaultAgentHeartbeat)
	setDur(&c.AgentStaleAfter, 3*c.AgentPollAfter)
	if c.Workers <= 0 {
		c.Workers = DefaultWorkers
	}
	if c.DiscoverRate == 0 {
		c.DiscoverRate = DefaultDiscoverRate
	}
	if c.DiscoverBurst == 0 {
		c.DiscoverBurst = DefaultDiscoverBurst
	}
	if c.MaxDiscovered == 0 {
		c.MaxDiscovered = DefaultMaxDiscovered
	}
	if c.MemoryTolerance == 0 {
		c.MemoryTolerance = DefaultMemoryTolerance
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Rand == nil {
		c.Rand = rand.Reader
	}
}

// Controller is the lifecycle controller. Its methods are safe for
// concurrent use; Run drives the leader-only loop and the BMC workers.
type Controller struct {
	cfg Config
	st  Store
	bmc BMC
	m   *metrics

	mu       sync.Mutex
	queue    []bmcWork            // BMC job sequences waiting for a worker
	inflight map[string]bool      // machine IDs with a queued or running sequence
	backoff  map[string]backoff   // auto-inspection retry state per machine
	lastSeen map[string]time.Time // machine ID → this node last heard its agent
	// resetAt: machine ID → this node last power-cycled it (agent gone).
	resetAt map[string]time.Time
	// tokenKnown: machine ID → hash of the token this node issued or
	// verified (its agent talks to this node, so lastSeen covers it).
	tokenKnown map[string]string
	// holdSince: machine ID → start of a bounded "unknown liveness" hold.
	holdSince map[string]time.Time
	// discTokens/discLast: the discovery token bucket. discMu serialises
	// discoveries on this node (cap check + write).
	discTokens float64
	discLast   time.Time
	discMu     sync.Mutex
	started    map[string]time.Time // machineID + "/" + step → start (step durations)
	// uploading holds the image names with an upload in progress on this
	// node: a second upload of the same name is refused before it can
	// replace the first one's file in the catalog.
	uploading map[string]bool
	wake      chan struct{}
	log       *slog.Logger
}

type backoff struct {
	next  time.Time
	delay time.Duration
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
	return &Controller{
		cfg: cfg, st: st, bmc: bmc, m: m,
		inflight: map[string]bool{}, backoff: map[string]backoff{},
		lastSeen: map[string]time.Time{}, started: map[string]time.Time{},
		resetAt: map[string]time.Time{}, tokenKnown: map[string]string{}, holdSince: map[string]time.Time{},
		wake: make(chan struct{}, 1),
		log:  slog.New(slog.DiscardHandler),
	}, nil
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
	c.mu.Lock()
	c.log = log
	c.mu.Unlock()
	var wg sync.WaitGroup
	for i := 0; i < c.cfg.Workers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.worker(ctx)
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
			c.signal() // wake workers so they see ctx end
			wg.Wait()
			c.abandonQueue(ctx)
			return nil
		case <-t.C:
		}
	}
}

// abandonQueue closes the jobs of sequences no worker started (the
// controller is stopping) as failed, so none is left pending.
func (c *Controller) abandonQueue(ctx context.Context) {
	c.mu.Lock()
	q := c.queue
	c.queue = nil
	for _, w := range q {
		delete(c.inflight, w.machine)
	}
	c.mu.Unlock()
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	for _, w := range q {
		for _, j := range w.jobs {
			c.finishJob(sctx, j, JobFailed, "shutdown", "controller stopped before the job ran")
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
	if c.cfg.Inspection == InspectAuto && c.bmc != nil {
		if err := c.autoInspect(ctx); err != nil {
			errs = append(errs, err)
		}
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

func (c *Controller) logger() *slog.Logger {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.log
}

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
