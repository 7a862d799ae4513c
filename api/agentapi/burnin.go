package agentapi

import "time"

// Burn-in (issue 17; cmd/kiln-agent/DESIGN.md "Burn-in"): an inspect task
// whose BurnIn is set makes the agent run step burn_in (StepBurnIn) with
// the tests the policy names, heartbeating progress, and report each
// test's result in Report.BurnIn on the step's succeeded or failed report.
// The failure reason is the first failed test's: ReasonBurnInCPU,
// ReasonBurnInMemory, ReasonBurnInDisk or ReasonBurnInNIC.

// Burn-in test names (BurnInPolicy.Tests, BurnInTest.Name).
const (
	BurnInCPU    = "cpu"
	BurnInMemory = "memory"
	BurnInDisk   = "disk"
	BurnInNIC    = "nic"
)

// BurnInTests lists every burn-in test, in the order the agent runs them.
var BurnInTests = []string{BurnInCPU, BurnInMemory, BurnInDisk, BurnInNIC}

// NIC link policies (BurnInPolicy.NICs).
const (
	NICsAll          = "all"          // every NIC's link must be up
	NICsProvisioning = "provisioning" // the provisioning NIC's (one of ProvisioningMACs; any NIC when empty)
)

// BurnInPolicy is what the appliance asks of one machine's burn-in (the
// policy of its hardware model, appliance config `burn_in:`). Durations
// bound each test; sizes are bytes.
type BurnInPolicy struct {
	// Policy names the policy (the model entry or "default"), echoed in the report.
	Policy string   `json:"policy,omitempty"`
	Tests  []string `json:"tests"`
	// CPUTime: every online CPU computes known-answer work units this long.
	CPUTime time.Duration `json:"cpu_time_ns,omitempty"`
	// MemoryFraction of MemAvailable is tested (capped by MemoryMaxBytes when > 0),
	// in chunks, for at most MemoryTime.
	MemoryFraction float64       `json:"memory_fraction,omitempty"`
	MemoryMaxBytes uint64        `json:"memory_max_bytes,omitempty"`
	MemoryTime     time.Duration `json:"memory_time_ns,omitempty"`
	// DiskBytes of the target disk (Task.Disk) are written with a pattern
	// (O_DIRECT) in DiskRegions regions spread over the disk, read back and
	// compared, for at most DiskTime. Never on a disk holding a foreign OS
	// unless Task.Wipe.
	DiskBytes   uint64        `json:"disk_bytes,omitempty"`
	DiskRegions int           `json:"disk_regions,omitempty"`
	DiskTime    time.Duration `json:"disk_time_ns,omitempty"`
	// NICs is NICsAll or NICsProvisioning; NICWait is how long links may take to come up.
	NICs    string        `json:"nics,omitempty"`
	NICWait time.Duration `json:"nic_wait_ns,omitempty"`
	// ProvisioningMACs are the machine's intended NIC MACs (lower-case), one of
	// which it netboots on.
	ProvisioningMACs []string `json:"provisioning_macs,omitempty"`
}

// BurnInTest is one test's result. Bytes and Iterations say how much was
// done (bytes tested; work units or passes); Error is the first error.
type BurnInTest struct {
	Name       string        `json:"name"`
	Passed     bool          `json:"passed"`
	Skipped    bool          `json:"skipped,omitempty"`
	Duration   time.Duration `json:"duration_ns"`
	Bytes      uint64        `json:"bytes,omitempty"`
	Iterations uint64        `json:"iterations,omitempty"`
	Error      string        `json:"error,omitempty"`
}

// BurnInReport is Report.BurnIn: the policy run and every test's result.
type BurnInReport struct {
	Policy string       `json:"policy,omitempty"`
	Tests  []BurnInTest `json:"tests"`
}
