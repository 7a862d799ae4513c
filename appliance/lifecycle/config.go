// Config, its defaults (named constants the appliance's config docs cite),
// applyDefaults and Validate. Owner: New, which applies and validates it
// once; nothing changes it afterwards.

package lifecycle

import (
	"crypto/rand"
	"fmt"
	"io"
	"math"
	"net/url"
	"strings"
	"time"

	"kiln/store"
)

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
	DefaultInterval      = 2 * time.Second
	DefaultWorkers       = 8
	DefaultBMCTimeout    = 60 * time.Second
	DefaultBMCBackoff    = 30 * time.Second
	DefaultBMCMaxBackoff = 10 * time.Minute
	DefaultBootTimeout   = 15 * time.Minute // power action / claim → agent's first report
	DefaultStepTimeout   = 30 * time.Minute // a step without its own entry in StepDeadlines
	DefaultRebootTimeout = 3 * time.Minute  // build complete → the machine's next netboot
	// DefaultFirstBootTimeout: a release build's completion → the OS's first-boot report (issue 15).
	DefaultFirstBootTimeout = 15 * time.Minute
	DefaultAgentPollAfter   = 5 * time.Second
	DefaultAgentHeartbeat   = 30 * time.Second
	// DefaultHeartbeatRecordEvery: a heartbeat (see Config.HeartbeatRecordEvery)
	// is written to the store at most this often per machine.
	DefaultHeartbeatRecordEvery = 5 * time.Minute
	DefaultMemoryTolerance      = 0.05 // discovered memory may be this fraction below intended
	DefaultDiscoverRate         = 2.0  // new discovered records per second (per node)
	DefaultDiscoverBurst        = 20   // discovered records created back to back
	DefaultMaxDiscovered        = 500  // machines in state discovered, site-wide
)

// DefaultStepDeadlines are the per-step deadlines (from a step's start)
// used for steps Config.StepDeadlines does not name.
func DefaultStepDeadlines() map[string]time.Duration {
	return map[string]time.Duration{
		"inspect": 15 * time.Minute, "check": 10 * time.Minute, "write": 60 * time.Minute,
		"verify": 60 * time.Minute, "stage": 5 * time.Minute, "finalize": 5 * time.Minute,
		"reboot": 10 * time.Minute, "erase": 4 * time.Hour,
		"burn_in": DefaultBurnInDeadline,
	}
}

// Config is the controller's configuration. Zero values take the defaults above.
type Config struct {
	// ImageBaseURL is the appliance's boot HTTP base (http://host[:port]);
	// images are fetched from ImageBaseURL + "/images/" + Image.Name. Required.
	ImageBaseURL string
	// ImageHere, when set, reports whether this node's catalog file of a
	// recorded image is that image's content (appliance/imagesync.go): an
	// agent is given a build only while it is, and is told to wait (poll
	// again) until then, so it fetches from this node only what this node
	// holds. nil = every recorded image is here (a single node).
	ImageHere func(store.Image) bool
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
	// HeartbeatRecordEvery coalesces heartbeats: a report that only says a
	// step is still running (same step and attempt, running before and
	// now, no reason; progress and message may change) is written to the store — the machine's
	// Step.At and Progress, with no "step" event — only when the stored
	// Step.At is at least this old; otherwise it only marks the agent live
	// on this node (AgentLive). So liveness costs one store write and one
	// event per machine per HeartbeatRecordEvery, not per AgentHeartbeat.
	// Default DefaultHeartbeatRecordEvery; negative: write every heartbeat.
	HeartbeatRecordEvery time.Duration
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
	// Remediation configures the day-2 ladder, drain, spares, brake and the
	// BMC health poll (remediation_config.go).
	Remediation RemediationConfig
	// Attest is the attestation policy per hardware model, the PCRs and
	// the challenge's life (issue 16, attest.go).
	Attest AttestConfig
	// BurnIn is the burn-in policy per hardware model (issue 17, burnin.go).
	BurnIn BurnInConfig
	// Health reads a machine's BMC health (nil: no BMC health poll).
	Health HealthReader
	// Firmware applies firmware baselines and BIOS settings through the
	// BMC for campaigns (campaign.go FirmwareApplier; nil: firmware and
	// bios campaigns are refused).
	Firmware FirmwareApplier
	// FirstBootTimeout (issue 15) bounds the wait from a release build's
	// completion (finalize succeeded) to the installed OS's first-boot
	// report (POST /v1/agent/firstboot). None by then: the policy "fail"
	// applies (failed, reason first_boot_unreported; never provisioned
	// without a report). Default DefaultFirstBootTimeout.
	FirstBootTimeout time.Duration
	// CredentialGate decides whether a machine's agent gets its secret files
	// (GET /v1/agent/credentials); nil = the attestation gate
	// (Controller.CredentialGate, attest.go: open for a model that does
	// not attest, else only after this build's passing attestation).
	CredentialGate CredentialGate
	// Sealer encrypts BMC passwords (EnrollBMC) and cluster and first-boot
	// tokens (issue 15; opening them needs it to be an Opener too).
	// Catalog stores image files (UploadImage).
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
	if c.FirstBootTimeout < 0 {
		return fmt.Errorf("%w: FirstBootTimeout %v must be > 0", ErrConfig, c.FirstBootTimeout)
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
	if err := c.BurnIn.Validate(c.StepDeadlines["burn_in"]); err != nil {
		return err
	}
	return c.Remediation.Validate()
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
	setDur(&c.FirstBootTimeout, DefaultFirstBootTimeout)
	setDur(&c.Interval, DefaultInterval)
	setDur(&c.BMCTimeout, DefaultBMCTimeout)
	setDur(&c.BMCBackoff, DefaultBMCBackoff)
	setDur(&c.BMCMaxBackoff, DefaultBMCMaxBackoff)
	setDur(&c.AgentPollAfter, DefaultAgentPollAfter)
	setDur(&c.AgentHeartbeat, DefaultAgentHeartbeat)
	setDur(&c.HeartbeatRecordEvery, DefaultHeartbeatRecordEvery)
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
	c.Remediation.applyDefaults(c)
	c.BurnIn.applyDefaults()
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Rand == nil {
		c.Rand = rand.Reader
	}
}
