package appliance

import (
	"time"

	"kiln/appliance/lifecycle"
)

// BurnInConfig is the appliance config's `burn_in:` section (issue 17;
// appliance/lifecycle/DESIGN.md "Burn-in"; deploy/examples/kiln.yaml).
// Zero values take the lifecycle defaults (lifecycle.DefaultBurnIn*): a
// models entry's zero fields take the default policy's. The one check is
// lifecycle.CheckBurnIn (Config.Validate calls it).
type BurnInConfig struct {
	// Mode: off (default) or required (a machine becomes available only
	// after a passing burn-in).
	Mode string `yaml:"mode"`
	// Deadline is step burn_in's deadline (default 1h); the policies' test
	// times together must fit in it.
	Deadline time.Duration      `yaml:"deadline"`
	Default  BurnInPolicyConfig `yaml:"default"`
	// Models: the first entry whose vendor and product match the machine's
	// discovered ones (case-insensitive) is its policy.
	Models []BurnInModelConfig `yaml:"models"`
}

// BurnInPolicyConfig is one policy (lifecycle.BurnInPolicy).
type BurnInPolicyConfig struct {
	Tests          []string      `yaml:"tests"` // cpu, memory, disk, nic (default all)
	CPUTime        time.Duration `yaml:"cpu_time"`
	MemoryFraction float64       `yaml:"memory_fraction"`
	MemoryMaxBytes uint64        `yaml:"memory_max_bytes"`
	MemoryTime     time.Duration `yaml:"memory_time"`
	DiskBytes      uint64        `yaml:"disk_bytes"`
	DiskRegions    int           `yaml:"disk_regions"`
	DiskTime       time.Duration `yaml:"disk_time"`
	NICs           string        `yaml:"nics"` // all | provisioning
	NICWait        time.Duration `yaml:"nic_wait"`
}

// BurnInModelConfig is one hardware model's policy.
type BurnInModelConfig struct {
	Vendor             string `yaml:"vendor"`
	Product            string `yaml:"product"`
	BurnInPolicyConfig `yaml:",inline"`
}

func (p BurnInPolicyConfig) lifecycle() lifecycle.BurnInPolicy {
	return lifecycle.BurnInPolicy{Tests: append([]string(nil), p.Tests...), CPUTime: p.CPUTime,
		MemoryFraction: p.MemoryFraction, MemoryMaxBytes: p.MemoryMaxBytes, MemoryTime: p.MemoryTime,
		DiskBytes: p.DiskBytes, DiskRegions: p.DiskRegions, DiskTime: p.DiskTime, NICs: p.NICs, NICWait: p.NICWait}
}

// lifecycle is the section as the controller takes it.
func (b BurnInConfig) lifecycle() lifecycle.BurnInConfig {
	out := lifecycle.BurnInConfig{Mode: b.Mode, Default: b.Default.lifecycle()}
	for _, m := range b.Models {
		out.Models = append(out.Models, lifecycle.BurnInModel{Vendor: m.Vendor, Product: m.Product, BurnInPolicy: m.lifecycle()})
	}
	return out
}

// stepDeadlines is the controller's StepDeadlines override of step burn_in (nil: the default).
func (b BurnInConfig) stepDeadlines() map[string]time.Duration {
	if b.Deadline <= 0 {
		return nil
	}
	return map[string]time.Duration{"burn_in": b.Deadline}
}
