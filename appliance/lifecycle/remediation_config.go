// RemediationConfig (issue 14): the ladder's step timeouts, the drain
// policy, the brake thresholds, the spare-pool alert threshold and the BMC
// health poll. Defaults and the one Validate the appliance's config also
// calls (appliance/config.go). Owner: New, through Config.

package lifecycle

import (
	"fmt"
	"math"
	"time"
)

// Remediation modes (RemediationConfig.Mode).
const (
	RemediateAuto = "auto" // the ladder starts on a Critical health condition of a claimed machine
	RemediateOff  = "off"  // health is recorded; nothing is repaired automatically
)

// Drain timeout policies (RemediationConfig.DrainPolicy).
const (
	DrainProceed = "proceed" // no ack by the deadline: the disruptive step runs
	DrainHold    = "hold"    // no ack by the deadline: the machine waits (a person decides)
)

// Remediation defaults.
const (
	DefaultPowerCycleTimeout  = 10 * time.Minute // power cycle → every condition OK
	DefaultReinspectTimeout   = 20 * time.Minute // PXE boot, inspection, comparison
	DefaultReprovisionTimeout = 90 * time.Minute // the gated build → healthy on its disk
	DefaultRemediationSettle  = 2 * time.Minute  // after a step's action, conditions must be OK this long after it
	DefaultDrainTimeout       = 10 * time.Minute
	DefaultBrakeWindow        = 15 * time.Minute
	DefaultSparesLow          = 1
	DefaultHealthPollInterval = time.Minute
	DefaultHealthPollWorkers  = 4
	DefaultHealthPollBackoff  = 30 * time.Second
	DefaultHealthPollMaxBack  = 10 * time.Minute
	DefaultWebhookTimeout     = 10 * time.Second
)

// BrakeThreshold bounds the failures of one scope (a rack, a claim, the
// site) within RemediationConfig.BrakeWindow. The brake engages when the
// failures counted exceed MaxFailures (0: no count limit), or when they are
// at least MinFailures and more than MaxPercent of the scope's machines
// (0: no share limit).
type BrakeThreshold struct {
	MaxFailures int
	MaxPercent  float64
	MinFailures int
}

// DefaultBrakeRack, DefaultBrakeClaim and DefaultBrakeSite are the
// thresholds of scopes the configuration leaves zero: more than half a
// rack (at least 2), more than 30 % of a claim (at least 3), more than
// 10 % of the site's claimed machines (at least 5).
var (
	DefaultBrakeRack  = BrakeThreshold{MaxPercent: 50, MinFailures: 2}
	DefaultBrakeClaim = BrakeThreshold{MaxPercent: 30, MinFailures: 3}
	DefaultBrakeSite  = BrakeThreshold{MaxPercent: 10, MinFailures: 5}
)

// RemediationConfig is the ladder's configuration (appliance config
// `remediation:`). Zero values take the defaults above.
type RemediationConfig struct {
	// Mode is RemediateAuto (default) or RemediateOff.
	Mode string
	// PowerCycleTimeout, ReinspectTimeout and ReprovisionTimeout bound each
	// step, from its start; past it the next step is taken.
	PowerCycleTimeout, ReinspectTimeout, ReprovisionTimeout time.Duration
	// Settle: a step repaired the machine when, Settle after its action
	// finished, no health condition is Critical.
	Settle time.Duration
	// DrainTimeout bounds the wait for the owner's drain ack (negative:
	// no drain is asked); DrainPolicy (DrainProceed default, DrainHold) is
	// what happens when it passes.
	DrainTimeout time.Duration
	DrainPolicy  string
	// WebhookTimeout bounds one drain webhook POST.
	WebhookTimeout time.Duration
	// EraseBeforeRMA (default true; false via NoEraseBeforeRMA): a machine
	// declared failed is erased (store erase task) before it becomes rma.
	NoEraseBeforeRMA bool
	// BrakeWindow is the window failures are counted in; BrakeRack,
	// BrakeClaim and BrakeSite the thresholds per scope.
	BrakeWindow                      time.Duration
	BrakeRack, BrakeClaim, BrakeSite BrakeThreshold
	// StartHold (default 0: none): a newly failed machine is counted in the
	// brake at once, but its run starts only once its Critical condition is
	// this old, so a mass failure that surfaces over one health-poll sweep
	// (several ticks) engages the brake before any of its machines is
	// touched. The controller holds at least as long as its last health
	// sweep took (sweepHold), whatever this says. Appliance key
	// remediation.hold.
	StartHold time.Duration
	// SparesLow is the spare count per hardware class at or below which a
	// spares_low event is recorded (and kiln_spares_low_threshold tells the
	// alert); SparesLowByClass overrides it per class.
	SparesLow        int
	SparesLowByClass map[string]int
	// HealthPollInterval is how often each machine's BMC health is read
	// (negative: never); HealthPollWorkers bounds concurrent reads;
	// HealthPollBackoff doubles per failed read of a machine up to
	// HealthPollMaxBackoff.
	HealthPollInterval                      time.Duration
	HealthPollWorkers                       int
	HealthPollBackoff, HealthPollMaxBackoff time.Duration
	// AgentSilentAfter: an agent in a running step whose record was not
	// refreshed for this long gets the kiln condition agent_silent
	// (default 2 × HeartbeatRecordEvery + AgentHeartbeat).
	AgentSilentAfter time.Duration
}

func (r *RemediationConfig) applyDefaults(c *Config) {
	if r.Mode == "" {
		r.Mode = RemediateAuto
	}
	if r.DrainPolicy == "" {
		r.DrainPolicy = DrainProceed
	}
	setDur := func(d *time.Duration, def time.Duration) {
		if *d == 0 {
			*d = def
		}
	}
	setDur(&r.PowerCycleTimeout, DefaultPowerCycleTimeout)
	setDur(&r.ReinspectTimeout, DefaultReinspectTimeout)
	setDur(&r.ReprovisionTimeout, DefaultReprovisionTimeout)
	setDur(&r.Settle, DefaultRemediationSettle)
	setDur(&r.DrainTimeout, DefaultDrainTimeout)
	setDur(&r.WebhookTimeout, DefaultWebhookTimeout)
	setDur(&r.BrakeWindow, DefaultBrakeWindow)
	setDur(&r.HealthPollInterval, DefaultHealthPollInterval)
	setDur(&r.HealthPollBackoff, DefaultHealthPollBackoff)
	setDur(&r.HealthPollMaxBackoff, DefaultHealthPollMaxBack)
	hb := c.HeartbeatRecordEvery
	if hb < 0 {
		hb = 0
	}
	setDur(&r.AgentSilentAfter, 2*hb+c.AgentHeartbeat)
	if r.HealthPollWorkers == 0 {
		r.HealthPollWorkers = DefaultHealthPollWorkers
	}
	if r.SparesLow == 0 {
		r.SparesLow = DefaultSparesLow
	}
	if r.BrakeRack == (BrakeThreshold{}) {
		r.BrakeRack = DefaultBrakeRack
	}
	if r.BrakeClaim == (BrakeThreshold{}) {
		r.BrakeClaim = DefaultBrakeClaim
	}
	if r.BrakeSite == (BrakeThreshold{}) {
		r.BrakeSite = DefaultBrakeSite
	}
}

// Validate is the one check of the remediation settings (lifecycle New
// and the appliance's config both call it); errors wrap ErrConfig and name
// the field by its appliance config key.
func (r *RemediationConfig) Validate() error {
	switch r.Mode {
	case RemediateAuto, RemediateOff:
	default:
		return fmt.Errorf("%w: remediation.mode %q: want auto or off", ErrConfig, r.Mode)
	}
	switch r.DrainPolicy {
	case DrainProceed, DrainHold:
	default:
		return fmt.Errorf("%w: remediation.drain.policy %q: want proceed or hold", ErrConfig, r.DrainPolicy)
	}
	for name, d := range map[string]time.Duration{
		"remediation.steps.power_cycle": r.PowerCycleTimeout, "remediation.steps.reinspect": r.ReinspectTimeout,
		"remediation.steps.reprovision": r.ReprovisionTimeout, "remediation.settle": r.Settle,
		"remediation.drain.webhook_timeout": r.WebhookTimeout, "remediation.brake.window": r.BrakeWindow,
		"remediation.health.backoff": r.HealthPollBackoff, "remediation.health.max_backoff": r.HealthPollMaxBackoff,
		"remediation.agent_silent_after": r.AgentSilentAfter,
	} {
		if d <= 0 {
			return fmt.Errorf("%w: %s %v: want > 0", ErrConfig, name, d)
		}
	}
	if r.HealthPollMaxBackoff < r.HealthPollBackoff {
		return fmt.Errorf("%w: remediation.health.max_backoff %v below backoff %v", ErrConfig, r.HealthPollMaxBackoff, r.HealthPollBackoff)
	}
	if r.HealthPollWorkers < 1 || r.HealthPollWorkers > 256 {
		return fmt.Errorf("%w: remediation.health.workers %d: want 1..256", ErrConfig, r.HealthPollWorkers)
	}
	if r.StartHold < 0 {
		return fmt.Errorf("%w: remediation.hold %v: want >= 0", ErrConfig, r.StartHold)
	}
	if r.SparesLow < 0 {
		return fmt.Errorf("%w: remediation.spares.low %d: want >= 0", ErrConfig, r.SparesLow)
	}
	for cl, n := range r.SparesLowByClass {
		if n < 0 || cl == "" {
			return fmt.Errorf("%w: remediation.spares.low_by_class[%q] %d: want a class and >= 0", ErrConfig, cl, n)
		}
	}
	for name, b := range map[string]BrakeThreshold{"rack": r.BrakeRack, "claim": r.BrakeClaim, "site": r.BrakeSite} {
		if b.MaxFailures < 0 || b.MinFailures < 0 || math.IsNaN(b.MaxPercent) || b.MaxPercent < 0 || b.MaxPercent > 100 {
			return fmt.Errorf("%w: remediation.brake.%s %+v: want max_failures, min_failures >= 0 and 0 <= max_percent <= 100", ErrConfig, name, b)
		}
	}
	return nil
}

// CheckRemediation is Validate of r with the defaults applied (the
// appliance's config check: the same rules New applies).
func CheckRemediation(r RemediationConfig) error {
	c := Config{AgentHeartbeat: DefaultAgentHeartbeat, HeartbeatRecordEvery: DefaultHeartbeatRecordEvery}
	r.applyDefaults(&c)
	return r.Validate()
}
