// Burn-in (issue 17; DESIGN.md "Burn-in"): the policy per hardware model
// (BurnInConfig: its defaults as named constants, applyDefaults and
// Validate, the one check of the appliance config's `burn_in:` section),
// the gate in finishInspection (a machine whose policy requires a burn-in
// becomes available only with a passing Machine.BurnIn), the inspect task
// that runs step burn_in, and the record of the agent's result. Owner of
// Machine.BurnIn: this file (recordBurnIn, written by AgentReport).

package lifecycle

import (
	"fmt"
	"math"
	"strings"
	"time"

	"kiln/api/agentapi"
	"kiln/store"
)

// Burn-in modes (BurnInConfig.Mode).
const (
	BurnInOff      = "off"      // no burn-in: inspection alone makes a machine available
	BurnInRequired = "required" // a machine becomes available only after a passing burn-in
)

// Burn-in defaults (appliance config `burn_in:`; deploy/examples/kiln.yaml
// cites them). A policy field left zero takes the default policy's value,
// and a default-policy field left zero takes these.
const (
	DefaultBurnInMode           = BurnInOff
	DefaultBurnInCPUTime        = 2 * time.Minute
	DefaultBurnInMemoryFraction = 0.85 // of MemAvailable in the in-RAM environment
	DefaultBurnInMemoryTime     = 10 * time.Minute
	DefaultBurnInDiskBytes      = 1 << 30 // written and read back on the target disk
	DefaultBurnInDiskRegions    = 16      // spread evenly over the disk
	DefaultBurnInDiskTime       = 5 * time.Minute
	DefaultBurnInNICs           = agentapi.NICsProvisioning
	DefaultBurnInNICWait        = 30 * time.Second
	// DefaultBurnInDeadline is step burn_in's deadline (StepDeadlines["burn_in"]):
	// longer than the default policy's tests together.
	DefaultBurnInDeadline = time.Hour
)

// BurnInPolicy is one policy: which tests (agentapi.BurnInTests names;
// empty = all) and each test's bounds (agentapi.BurnInPolicy documents them).
type BurnInPolicy struct {
	Tests          []string
	CPUTime        time.Duration
	MemoryFraction float64
	MemoryMaxBytes uint64
	MemoryTime     time.Duration
	DiskBytes      uint64
	DiskRegions    int
	DiskTime       time.Duration
	NICs           string
	NICWait        time.Duration
}

// BurnInModel is the policy of one hardware model: Vendor and Product as
// the inspection discovers them (DMI sys_vendor and product_name; compared
// case-insensitively, spaces trimmed).
type BurnInModel struct {
	Vendor, Product string
	BurnInPolicy
}

// BurnInConfig is the burn-in's configuration (Config.BurnIn). The first
// Models entry matching a machine's discovered vendor and product is its
// policy, else Default.
type BurnInConfig struct {
	Mode    string
	Default BurnInPolicy
	Models  []BurnInModel
}

func (p *BurnInPolicy) fill(from BurnInPolicy) {
	if len(p.Tests) == 0 {
		p.Tests = append([]string(nil), from.Tests...)
	}
	set := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	set(&p.CPUTime, from.CPUTime)
	set(&p.MemoryTime, from.MemoryTime)
	set(&p.DiskTime, from.DiskTime)
	set(&p.NICWait, from.NICWait)
	if p.MemoryFraction == 0 {
		p.MemoryFraction = from.MemoryFraction
	}
	if p.MemoryMaxBytes == 0 {
		p.MemoryMaxBytes = from.MemoryMaxBytes
	}
	if p.DiskBytes == 0 {
		p.DiskBytes = from.DiskBytes
	}
	if p.DiskRegions == 0 {
		p.DiskRegions = from.DiskRegions
	}
	if p.NICs == "" {
		p.NICs = from.NICs
	}
}

func (b *BurnInConfig) applyDefaults() {
	if b.Mode == "" {
		b.Mode = DefaultBurnInMode
	}
	b.Default.fill(BurnInPolicy{Tests: agentapi.BurnInTests, CPUTime: DefaultBurnInCPUTime,
		MemoryFraction: DefaultBurnInMemoryFraction, MemoryTime: DefaultBurnInMemoryTime,
		DiskBytes: DefaultBurnInDiskBytes, DiskRegions: DefaultBurnInDiskRegions, DiskTime: DefaultBurnInDiskTime,
		NICs: DefaultBurnInNICs, NICWait: DefaultBurnInNICWait})
	for i := range b.Models {
		b.Models[i].fill(b.Default)
	}
}

// Validate checks b (defaults applied) against step burn_in's deadline:
// the policy's test times together must fit in it. Messages name the
// appliance config's keys.
func (b *BurnInConfig) Validate(deadline time.Duration) error {
	switch b.Mode {
	case BurnInOff, BurnInRequired:
	default:
		return fmt.Errorf("%w: burn_in.mode %q: want off or required", ErrConfig, b.Mode)
	}
	if err := b.Default.validate("burn_in.default", deadline); err != nil {
		return err
	}
	seen := map[string]bool{}
	for i, m := range b.Models {
		key := fmt.Sprintf("burn_in.models[%d]", i)
		if strings.TrimSpace(m.Vendor) == "" || strings.TrimSpace(m.Product) == "" {
			return fmt.Errorf("%w: %s: vendor and product are required", ErrConfig, key)
		}
		if name := modelName(m.Vendor, m.Product); seen[name] {
			return fmt.Errorf("%w: %s: %s is listed twice", ErrConfig, key, name)
		} else {
			seen[name] = true
		}
		if err := m.validate(key, deadline); err != nil {
			return err
		}
	}
	return nil
}

func (p *BurnInPolicy) validate(key string, deadline time.Duration) error {
	known := map[string]bool{}
	for _, t := range agentapi.BurnInTests {
		known[t] = true
	}
	for _, t := range p.Tests {
		if !known[t] {
			return fmt.Errorf("%w: %s.tests: %q: want %s", ErrConfig, key, t, strings.Join(agentapi.BurnInTests, ", "))
		}
	}
	for _, d := range []struct {
		k string
		v time.Duration
	}{{"cpu_time", p.CPUTime}, {"memory_time", p.MemoryTime}, {"disk_time", p.DiskTime}, {"nic_wait", p.NICWait}} {
		if d.v < 0 {
			return fmt.Errorf("%w: %s.%s %s: must not be negative", ErrConfig, key, d.k, d.v)
		}
	}
	if f := p.MemoryFraction; math.IsNaN(f) || f <= 0 || f > 0.95 {
		return fmt.Errorf("%w: %s.memory_fraction %v: want 0 < f <= 0.95 of the available memory (the agent needs the rest)", ErrConfig, key, f)
	}
	if p.DiskRegions < 1 {
		return fmt.Errorf("%w: %s.disk_regions %d: want >= 1", ErrConfig, key, p.DiskRegions)
	}
	if p.DiskBytes < uint64(p.DiskRegions)<<20 {
		return fmt.Errorf("%w: %s.disk_bytes %d: want at least 1 MiB per region (%d regions)", ErrConfig, key, p.DiskBytes, p.DiskRegions)
	}
	switch p.NICs {
	case agentapi.NICsAll, agentapi.NICsProvisioning:
	default:
		return fmt.Errorf("%w: %s.nics %q: want all or provisioning", ErrConfig, key, p.NICs)
	}
	if total := p.maxTime(); total >= deadline {
		return fmt.Errorf("%w: %s: the tests take up to %s, step burn_in's deadline is %s (lifecycle step deadline burn_in)", ErrConfig, key, total, deadline)
	}
	return nil
}

// maxTime is the longest the policy's tests may take together (the agent
// runs each at least a second; the memory test stops at its time and
// verifies what it wrote, hence twice its time; the disk test then also
// zeroes what it wrote, three times).
func (p *BurnInPolicy) maxTime() time.Duration {
	var d time.Duration
	for _, t := range p.Tests {
		switch t {
		case agentapi.BurnInCPU:
			d += max(p.CPUTime, time.Second)
		case agentapi.BurnInMemory:
			d += 2 * max(p.MemoryTime, time.Second)
		case agentapi.BurnInDisk:
			d += 3 * max(p.DiskTime, time.Second)
		case agentapi.BurnInNIC:
			d += p.NICWait
		}
	}
	return d
}

// CheckBurnIn is Validate of b with the defaults applied and the default
// deadline (or deadline, when > 0): the appliance's config check, the same
// rules New applies.
func CheckBurnIn(b BurnInConfig, deadline time.Duration) error {
	if deadline <= 0 {
		deadline = DefaultBurnInDeadline
	}
	b.applyDefaults()
	return b.Validate(deadline)
}

func modelName(vendor, product string) string {
	return strings.ToLower(strings.TrimSpace(vendor)) + "/" + strings.ToLower(strings.TrimSpace(product))
}

// burnInPolicy returns m's policy and its name ("default" or the model's
// vendor/product), from m's discovered hardware.
func (c *Controller) burnInPolicy(m store.Machine) (BurnInPolicy, string) {
	if m.Discovered != nil {
		name := modelName(m.Discovered.Vendor, m.Discovered.Model)
		for _, p := range c.cfg.BurnIn.Models {
			if modelName(p.Vendor, p.Product) == name {
				return p.BurnInPolicy, name
			}
		}
	}
	return c.cfg.BurnIn.Default, "default"
}

// burnInDue reports whether m must pass a burn-in before it is available:
// the mode is required and m holds no passing burn-in.
func (c *Controller) burnInDue(m store.Machine) bool {
	return c.cfg.BurnIn.Mode == BurnInRequired && (m.BurnIn == nil || !m.BurnIn.Passed)
}

// burnInTask is the inspect task that runs step burn_in on m (AgentTask,
// while m is inspecting with step burn_in pending).
func (c *Controller) burnInTask(m store.Machine) agentapi.Task {
	p, name := c.burnInPolicy(m)
	var macs []string
	for _, n := range m.Intended.NICs {
		macs = append(macs, strings.ToLower(n.MAC))
	}
	return agentapi.Task{Action: agentapi.ActionInspect, PollAfter: c.cfg.AgentPollAfter, Heartbeat: c.cfg.AgentHeartbeat,
		Disk: agentapi.DiskRule(m.RootDisk), Wipe: m.Wipe,
		BurnIn: &agentapi.BurnInPolicy{Policy: name, Tests: append([]string(nil), p.Tests...), CPUTime: p.CPUTime,
			MemoryFraction: p.MemoryFraction, MemoryMaxBytes: p.MemoryMaxBytes, MemoryTime: p.MemoryTime,
			DiskBytes: p.DiskBytes, DiskRegions: p.DiskRegions, DiskTime: p.DiskTime,
			NICs: p.NICs, NICWait: p.NICWait, ProvisioningMACs: macs}}
}

// startBurnIn makes inspecting m wait for step burn_in (finishInspection,
// when burnInDue): the next task the agent gets is burnInTask.
func (c *Controller) startBurnIn(m *store.Machine, now time.Time) {
	_, name := c.burnInPolicy(*m)
	m.Reason = ReasonBurnInStarted
	m.Message = "burn-in (policy " + name + ") before the machine is available"
	m.Step = pendingStep(agentapi.StepBurnIn, now, c.stepDeadline(agentapi.StepBurnIn, now))
}

// burnInReasons are the failure reasons that quarantine a machine.
var burnInReasons = map[agentapi.Reason]bool{agentapi.ReasonBurnInCPU: true, agentapi.ReasonBurnInMemory: true,
	agentapi.ReasonBurnInDisk: true, agentapi.ReasonBurnInNIC: true}

// recordBurnIn applies step burn_in's final report to inspecting m:
// Machine.BurnIn from rep.BurnIn; passed → available (inspection_passed),
// a burnin_* failure → quarantined with that reason and the first error.
// Other failures (timeout, internal_error) are AgentReport's usual failed.
// It reports whether it decided m's state.
func (c *Controller) recordBurnIn(m *store.Machine, rep agentapi.Report, msg string, now time.Time) bool {
	if m.State != store.StateInspecting || rep.Step != agentapi.StepBurnIn ||
		(rep.State != agentapi.StateSucceeded && rep.State != agentapi.StateFailed) {
		return false
	}
	rec := &store.BurnInRecord{Passed: rep.State == agentapi.StateSucceeded, Reason: string(rep.Reason), At: now}
	if rep.BurnIn != nil {
		rec.Policy = truncate(sanitize(rep.BurnIn.Policy), 128)
		for _, t := range rep.BurnIn.Tests {
			if len(rec.Tests) >= len(agentapi.BurnInTests) {
				break
			}
			rec.Tests = append(rec.Tests, store.BurnInTestResult{Name: truncate(sanitize(t.Name), 32), Passed: t.Passed,
				Skipped: t.Skipped, Duration: t.Duration, Bytes: t.Bytes, Iterations: t.Iterations,
				Error: truncate(sanitize(t.Error), agentapi.MaxMessageLen)})
		}
	}
	if rec.Passed {
		// Passed only when every test the policy names passed or was skipped by rule.
		for _, t := range rec.Tests {
			rec.Passed = rec.Passed && (t.Passed || t.Skipped)
		}
	}
	m.BurnIn = rec
	m.Step.Deadline = time.Time{}
	switch {
	case rec.Passed:
		m.State = store.StateAvailable
		m.Reason, m.Message = ReasonInspectionPassed, "burn-in passed: "+msg
	case rep.State == agentapi.StateSucceeded:
		m.State = store.StateQuarantined
		m.Reason, m.Message = string(agentapi.ReasonInternal), "burn-in reported success with a failed test: "+msg
	case burnInReasons[rep.Reason]:
		m.State = store.StateQuarantined
		m.Reason, m.Message = string(rep.Reason), "burn-in: "+msg
	default:
		return false
	}
	return true
}
