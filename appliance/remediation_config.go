package appliance

import (
	"context"
	"fmt"
	"time"

	"kiln/appliance/lifecycle"
	"kiln/bmc"
)

// RemediationConfig is the appliance config's `remediation:` section
// (issue 14; appliance/lifecycle/DESIGN.md "Remediation"). Zero values
// take the lifecycle defaults (lifecycle.Default*); the one check is
// lifecycle.RemediationConfig.Validate (Config.Validate calls it through
// CheckRemediation).
type RemediationConfig struct {
	// Mode: auto (default: a claimed machine with a Critical condition is
	// repaired) or off (health is recorded, nothing is repaired).
	Mode string `yaml:"mode"`
	// Settle: a step repaired the machine when no condition is Critical
	// this long after its action (default 2m).
	Settle time.Duration `yaml:"settle"`
	// Hold (default 0): a newly failed machine's run starts only once its
	// Critical condition is this old (it is counted in the brake at once):
	// about one health-poll sweep, so a mass failure read over several
	// ticks engages the brake before any machine is touched.
	Hold time.Duration `yaml:"hold"`
	// EraseBeforeRMA (default true): a machine declared failed is erased
	// before it becomes rma.
	EraseBeforeRMA *bool `yaml:"erase_before_rma"`
	// AgentSilentAfter: the kiln condition agent_silent after this long
	// without an agent's record refreshed in a running step.
	AgentSilentAfter time.Duration          `yaml:"agent_silent_after"`
	Steps            RemediationStepsConfig `yaml:"steps"`
	Drain            DrainConfig            `yaml:"drain"`
	Brake            BrakeConfig            `yaml:"brake"`
	Spares           SparesConfig           `yaml:"spares"`
	Health           HealthPollConfig       `yaml:"health"`
}

// RemediationStepsConfig is each ladder step's timeout (defaults 10m, 20m, 90m).
type RemediationStepsConfig struct {
	PowerCycle  time.Duration `yaml:"power_cycle"`
	Reinspect   time.Duration `yaml:"reinspect"`
	Reprovision time.Duration `yaml:"reprovision"`
}

// DrainConfig: Timeout (default 10m; negative: no drain is asked) bounds
// the wait for the owner's ack; Policy (proceed, default, or hold) is
// what happens when it passes; WebhookTimeout bounds one webhook POST.
type DrainConfig struct {
	Timeout        time.Duration `yaml:"timeout"`
	Policy         string        `yaml:"policy"`
	WebhookTimeout time.Duration `yaml:"webhook_timeout"`
}

// BrakeConfig: the window failures are counted in (default 15m) and the
// threshold per scope (defaults: rack >50 % with at least 2, claim >30 %
// with at least 3, site >10 % of claimed machines with at least 5).
type BrakeConfig struct {
	Window time.Duration   `yaml:"window"`
	Rack   ThresholdConfig `yaml:"rack"`
	Claim  ThresholdConfig `yaml:"claim"`
	Site   ThresholdConfig `yaml:"site"`
}

// ThresholdConfig is lifecycle.BrakeThreshold: more than MaxFailures, or
// at least MinFailures and more than MaxPercent of the scope's machines.
type ThresholdConfig struct {
	MaxFailures int     `yaml:"max_failures"`
	MaxPercent  float64 `yaml:"max_percent"`
	MinFailures int     `yaml:"min_failures"`
}

// SparesConfig: the spare count per hardware class (label kiln.io/class)
// at or below which spares are low (default 1), and per class.
type SparesConfig struct {
	Low        int            `yaml:"low"`
	LowByClass map[string]int `yaml:"low_by_class"`
}

// HealthPollConfig: how often each BMC's health is read (default 1m;
// negative: never), at most Workers at a time (default 4), with Backoff
// doubling to MaxBackoff per failing BMC (defaults 30s, 10m).
type HealthPollConfig struct {
	Interval   time.Duration `yaml:"interval"`
	Workers    int           `yaml:"workers"`
	Backoff    time.Duration `yaml:"backoff"`
	MaxBackoff time.Duration `yaml:"max_backoff"`
}

// lifecycle is the section as the controller takes it.
func (r RemediationConfig) lifecycle() lifecycle.RemediationConfig {
	th := func(t ThresholdConfig) lifecycle.BrakeThreshold {
		return lifecycle.BrakeThreshold{MaxFailures: t.MaxFailures, MaxPercent: t.MaxPercent, MinFailures: t.MinFailures}
	}
	return lifecycle.RemediationConfig{
		Mode: r.Mode, PowerCycleTimeout: r.Steps.PowerCycle, ReinspectTimeout: r.Steps.Reinspect,
		ReprovisionTimeout: r.Steps.Reprovision, Settle: r.Settle, StartHold: r.Hold,
		DrainTimeout: r.Drain.Timeout, DrainPolicy: r.Drain.Policy, WebhookTimeout: r.Drain.WebhookTimeout,
		NoEraseBeforeRMA: r.EraseBeforeRMA != nil && !*r.EraseBeforeRMA,
		BrakeWindow:      r.Brake.Window, BrakeRack: th(r.Brake.Rack), BrakeClaim: th(r.Brake.Claim), BrakeSite: th(r.Brake.Site),
		SparesLow: r.Spares.Low, SparesLowByClass: r.Spares.LowByClass,
		HealthPollInterval: r.Health.Interval, HealthPollWorkers: r.Health.Workers,
		HealthPollBackoff: r.Health.Backoff, HealthPollMaxBackoff: r.Health.MaxBackoff,
		AgentSilentAfter: r.AgentSilentAfter,
	}
}

// healthReader is lifecycle.HealthReader over the BMC adapter: each
// machine's BMC is read with its enrolled target through
// bmc.Controller.Health (Redfish Status.Health/HealthRollup of system and
// chassis and the SEL LogService; IPMI sdr/sel).
type healthReader struct{ a *bmcAdapter }

func (h healthReader) Health(ctx context.Context, id string) (bmc.Health, error) {
	t, err := h.a.target(id)
	if err != nil {
		return bmc.Health{}, err
	}
	out, err := h.a.ctl.Health(ctx, t)
	if err != nil {
		return bmc.Health{}, fmt.Errorf("bmc health (%s): %w", bmc.Reason(err), err)
	}
	return out, nil
}

// healthFor is the controller's HealthReader (nil without a BMC adapter).
func healthFor(a *bmcAdapter) lifecycle.HealthReader {
	if a == nil {
		return nil
	}
	return healthReader{a}
}
