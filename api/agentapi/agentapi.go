// Package agentapi holds the wire types spoken between kiln-agent (the in-RAM
// provisioning environment) and the appliance. It imports nothing of Kiln's so
// that both cmd/kiln-agent and appliance/api can share it.
//
// Protocol (all JSON over HTTP, bearer token from the kernel command line, the
// machine ID in the X-Kiln-Machine header):
//
//	POST {url}/v1/agent/register   Registration      → Task
//	GET  {url}/v1/agent/task       (poll)            → Task
//	POST {url}/v1/agent/report     Report            → 204
//
// {url} is kiln.url, or another node of the site cluster from Task.Endpoints while
// kiln.url does not answer: the per-boot token is valid on every node. Reports are
// retried until acknowledged (a 5xx means "retry", a 4xx is final).
//
// Kernel arguments read by the agent: kiln.url=URL kiln.machine=ID kiln.token=TOKEN.
package agentapi

import "time"

// HeaderMachine names the machine on every agent request; the appliance checks
// the bearer token against it (and against a body's machine_id when present).
const HeaderMachine = "X-Kiln-Machine"

// Kernel command-line keys the agent reads (/proc/cmdline).
const (
	ArgURL     = "kiln.url"
	ArgMachine = "kiln.machine"
	ArgToken   = "kiln.token"
)

// Step names of the gated build (top-level DESIGN.md "The gated build"), plus
// inspect and erase.
const (
	StepInspect  = "inspect"
	StepCheck    = "check"
	StepWrite    = "write"
	StepVerify   = "verify"
	StepStage    = "stage"
	StepFinalize = "finalize"
	StepReboot   = "reboot"
	StepErase    = "erase"
	// StepAttest (issue 16): between check and write; the TPM proves the measured boot (attest.go).
	StepAttest = "attest"
	StepBurnIn = "burn_in" // issue 17: part of inspection, before available (burnin.go)
)

// State is the closed set of step states.
type State string

const (
	StateStarted   State = "started"
	StateRunning   State = "running" // progress update / heartbeat
	StateSucceeded State = "succeeded"
	StateFailed    State = "failed"
)

// Reason is the closed set of failure reasons.
type Reason string

const (
	ReasonNone             Reason = ""
	ReasonDiskNotFound     Reason = "disk_not_found"
	ReasonDiskTooSmall     Reason = "disk_too_small"
	ReasonDiskUnhealthy    Reason = "disk_unhealthy"
	ReasonDiskTooSlow      Reason = "disk_too_slow"
	ReasonForeignOSPresent Reason = "foreign_os_present"
	ReasonToolMissing      Reason = "tool_missing"
	ReasonImageFetchFailed Reason = "image_fetch_failed"
	ReasonDigestMismatch   Reason = "digest_mismatch"
	ReasonWriteFailed      Reason = "write_failed"
	ReasonVerifyMismatch   Reason = "verify_mismatch"
	ReasonStageFailed      Reason = "stage_failed"
	ReasonEraseFailed      Reason = "erase_failed"
	ReasonTimeout          Reason = "timeout"
	ReasonInternal         Reason = "internal_error"
	// ReasonAttestationFailed (issue 16): the measured boot does not match an approved state, or the quote was refused.
	ReasonAttestationFailed Reason = "attestation_failed"

	// Issue 15 (release.go):
	ReasonVersionMismatch     Reason = "version_mismatch"      // check: the claim's kubernetesVersion is not the release's kubeadm version
	ReasonVerityMismatch      Reason = "verity_mismatch"       // verify: veritysetup verify of the base root failed
	ReasonFirstBootNodeLayer  Reason = "first_boot_node_layer" // first boot: the per-node layer is missing or unreadable
	ReasonFirstBootJoin       Reason = "first_boot_join"       // first boot: joining (or making) the cluster failed
	ReasonFirstBootMismatch   Reason = "first_boot_mismatch"   // Kiln: the report's hostname or SSH host key is not the build's
	ReasonFirstBootUnreported Reason = "first_boot_unreported" // Kiln: no first-boot report within lifecycle.first_boot_timeout
	// Burn-in failures (issue 17, burnin.go): the machine is quarantined.
	ReasonBurnInCPU    Reason = "burnin_cpu_failed"
	ReasonBurnInMemory Reason = "burnin_memory_failed"
	ReasonBurnInDisk   Reason = "burnin_disk_failed"
	ReasonBurnInNIC    Reason = "burnin_nic_failed"
)

// Reasons lists every non-empty Reason.
var Reasons = []Reason{ReasonDiskNotFound, ReasonDiskTooSmall, ReasonDiskUnhealthy, ReasonDiskTooSlow,
	ReasonForeignOSPresent, ReasonToolMissing, ReasonImageFetchFailed, ReasonDigestMismatch,
	ReasonWriteFailed, ReasonVerifyMismatch, ReasonStageFailed, ReasonEraseFailed, ReasonTimeout, ReasonInternal,
	ReasonVersionMismatch, ReasonVerityMismatch, ReasonFirstBootNodeLayer, ReasonFirstBootJoin,
	ReasonFirstBootMismatch, ReasonFirstBootUnreported,
	ReasonAttestationFailed,
	ReasonBurnInCPU, ReasonBurnInMemory, ReasonBurnInDisk, ReasonBurnInNIC}

// MaxMessageLen bounds Report.Message (bytes); longer messages are truncated by the receiver.
const MaxMessageLen = 512

// Disk as seen by the agent. SizeBytes in bytes. Health is "ok", "failing" or "not_reported".
type Disk struct {
	Name       string `json:"name"`
	Path       string `json:"path"`
	Serial     string `json:"serial,omitempty"`
	WWN        string `json:"wwn,omitempty"`
	Model      string `json:"model,omitempty"`
	SizeBytes  uint64 `json:"size_bytes"`
	Rotational bool   `json:"rotational"`
	Removable  bool   `json:"removable"`
	Health     string `json:"health"`
}

// NIC as seen by the agent; MAC lower-case colon form.
type NIC struct {
	Name   string `json:"name"`
	MAC    string `json:"mac"`
	LinkUp bool   `json:"link_up"`
}

// Inventory is the hardware the agent found.
type Inventory struct {
	Vendor      string `json:"vendor,omitempty"`
	Product     string `json:"product,omitempty"`
	Serial      string `json:"serial,omitempty"`
	UUID        string `json:"uuid,omitempty"`
	CPUs        int    `json:"cpus"`
	MemoryBytes uint64 `json:"memory_bytes"`
	Disks       []Disk `json:"disks"`
	NICs        []NIC  `json:"nics"`
	BMCAddress  string `json:"bmc_address,omitempty"`

	PCI      []PCIDevice `json:"pci,omitempty"`       // issue 15 (release.go): /sys/bus/pci/devices
	CPUFlags []string    `json:"cpu_flags,omitempty"` // issue 15: /proc/cpuinfo "flags"
	TPM      *TPMInfo    `json:"tpm,omitempty"`       // issue 15: /sys/class/tpm
}

// Registration is the agent's first message.
type Registration struct {
	MachineID    string    `json:"machine_id"`
	AgentVersion string    `json:"agent_version"`
	Inventory    Inventory `json:"inventory"`
}

// Action tells the agent what to do next.
type Action string

const (
	ActionWait Action = "wait" // poll GET /v1/agent/task again after PollAfter
	// ActionInspect: send the inventory. In answer to a registration (which has just sent
	// it) the inspection is done: wait. In answer to a poll, the running agent inspects
	// again: step inspect started, the inventory collected anew and sent with POST
	// /v1/agent/register, whose answer is the next task. An inspect task with BurnIn set
	// (issue 17) instead runs step burn_in on the inventory already sent (burnin.go).
	ActionInspect   Action = "inspect"
	ActionProvision Action = "provision" // run the gated build
	ActionErase     Action = "erase"
	ActionPowerOff  Action = "poweroff"
)

// DiskRule chooses the target disk: by serial, WWN, or the smallest
// non-removable disk of at least MinSizeBytes. Never "the first disk".
type DiskRule struct {
	Serial       string `json:"serial,omitempty"`
	WWN          string `json:"wwn,omitempty"`
	MinSizeBytes uint64 `json:"min_size_bytes,omitempty"`
}

// ImageRef is what the agent writes: URL served by the appliance, SHA-256 hex of
// the raw (decompressed) bytes written to disk, raw Size in bytes, Format raw|gzip|zstd.
type ImageRef struct {
	URL    string `json:"url"`
	SHA256 string `json:"sha256"`
	Size   uint64 `json:"size_bytes"`
	Format string `json:"format"`
}

// StageData is the node's own configuration, written to a NoCloud cidata partition.
type StageData struct {
	Hostname      string            `json:"hostname"`
	InstanceID    string            `json:"instance_id"`
	UserData      string            `json:"user_data,omitempty"`
	NetworkConfig string            `json:"network_config,omitempty"`
	SSHKeys       []string          `json:"ssh_keys,omitempty"`
	CABundle      string            `json:"ca_bundle,omitempty"`
	JoinData      string            `json:"join_data,omitempty"`
	Labels        map[string]string `json:"labels,omitempty"`
}

// Task is the appliance's instruction.
type Task struct {
	Action    Action        `json:"action"`
	PollAfter time.Duration `json:"poll_after_ns,omitempty"`
	// Heartbeat is how often the agent sends a running report during long steps.
	Heartbeat time.Duration `json:"heartbeat_ns,omitempty"`
	Disk      DiskRule      `json:"disk,omitempty"`
	Wipe      bool          `json:"wipe,omitempty"`
	Image     *ImageRef     `json:"image,omitempty"`
	Stage     *StageData    `json:"stage,omitempty"`
	// MinReadMBps is the floor of the check step's sequential read test (MB/s); 0 = no floor.
	MinReadMBps float64 `json:"min_read_mbps,omitempty"`
	// Reboot: after finalize, reboot (true) or power off (false).
	Reboot bool `json:"reboot"`
	// Attempt numbers the build a provision task starts (1, 2, ... per claim; 0 from an
	// appliance that does not count). A build the appliance serves again — the agent
	// came back asking for work while the store says it is in a step — has the next
	// number; the agent echoes it in Report.Attempt, and reports of an older attempt
	// change nothing.
	Attempt int `json:"attempt,omitempty"`
	// Endpoints are the agent API URLs (the value of kiln.url) of every node of the site
	// cluster, in no particular order. The agent keeps using the node it talks to and
	// moves on to another of these when that one does not answer. Empty from a one-node
	// appliance or one that does not send them.
	Endpoints []string `json:"endpoints,omitempty"`
	// ErasePolicy tunes an erase task; nil = the defaults documented on ErasePolicy.
	ErasePolicy *ErasePolicy `json:"erase_policy,omitempty"`

	Layers    []Layer       `json:"layers,omitempty"`     // issue 15: the release's chosen layers, base first (release.go); empty = the Image + Stage path
	NodeLayer *NodeLayer    `json:"node_layer,omitempty"` // issue 15: the per-node layer's non-secret files
	Cluster   *ClusterCheck `json:"cluster,omitempty"`    // issue 15: the check step's version comparison
	Attest    bool          `json:"attest,omitempty"`     // issue 16: run the attest step after check (attest.go)
	BurnIn    *BurnInPolicy `json:"burn_in,omitempty"`    // issue 17: an inspect task with it runs step burn_in (burnin.go)
}

// ErasePolicy tunes the erase of every disk of the machine (cmd/kiln-agent/DESIGN.md
// "Erase"). The zero value is the default.
type ErasePolicy struct {
	// OnFrozen: what follows an ATA drive whose security feature set is frozen (or
	// otherwise refuses SECURITY ERASE UNIT): "overwrite" (default; the frozen attempt is
	// in the certificate) or "fail" (the disk's outcome is frozen and the step fails).
	OnFrozen string `json:"on_frozen,omitempty"`
	// Verify chooses the overwrite's read-back: "sample" (default: the first and last MiB
	// plus SampleBlocks random 4 KiB blocks) or "full" (every byte).
	Verify string `json:"verify,omitempty"`
	// SampleBlocks is K of the sampled read-back (and the number of canary blocks checked
	// after a firmware erase); 0 = 1024.
	SampleBlocks int `json:"sample_blocks,omitempty"`
}

// Erase policy values.
const (
	OnFrozenOverwrite = "overwrite"
	OnFrozenFail      = "fail"
	VerifySample      = "sample"
	VerifyFull        = "full"
)

// Erase methods (DiskErase.Method, EraseAttempt.Method).
const (
	EraseNVMeSanitizeCrypto  = "nvme-sanitize-crypto-erase"  // Sanitize (84h) SANACT 100b
	EraseNVMeSanitizeBlock   = "nvme-sanitize-block-erase"   // Sanitize (84h) SANACT 010b
	EraseNVMeFormatCrypto    = "nvme-format-crypto-erase"    // Format NVM (80h) SES 010b
	EraseNVMeFormatUserData  = "nvme-format-user-data-erase" // Format NVM (80h) SES 001b
	EraseATASecurityEnhanced = "ata-security-erase-enhanced" // SECURITY ERASE UNIT (F4h), enhanced
	EraseATASecurity         = "ata-security-erase"          // SECURITY ERASE UNIT (F4h), normal
	EraseOverwrite           = "overwrite"                   // one pass of a keyed pseudo-random pattern
	EraseNone                = "none"                        // skipped
)

// Erase outcomes (DiskErase.Outcome, EraseAttempt.Outcome).
const (
	EraseErased       = "erased"        // the method completed and its verification passed
	EraseVerifyFailed = "verify_failed" // the method completed but the read-back found data it should have replaced
	EraseFailed       = "failed"        // the method failed (command error, I/O error)
	EraseFrozen       = "frozen"        // ATA security frozen: NextStep says how to thaw it
	EraseUnsupported  = "unsupported"   // the device does not offer the method (attempts only)
	EraseSkipped      = "skipped"       // not erased, with Reason (read-only, boot medium)
)

// DiskErase is one disk's erase certificate: what was erased, how, and how that was
// checked. Times are UTC; SizeBytes in bytes; Coverage is the fraction (0..1) of the
// disk's bytes the verification read back.
type DiskErase struct {
	Name      string `json:"name"`
	Path      string `json:"path"`
	Serial    string `json:"serial,omitempty"`
	Model     string `json:"model,omitempty"`
	WWN       string `json:"wwn,omitempty"`
	SizeBytes uint64 `json:"size_bytes"`
	// Transport is nvme, ata, or other (virtio, SCSI, loop: only the overwrite applies).
	Transport string `json:"transport,omitempty"`
	Method    string `json:"method"`
	Outcome   string `json:"outcome"`
	// Reason says why this method (what the device reported) or why it was skipped or failed.
	Reason string `json:"reason,omitempty"`
	// NextStep tells an operator how to get a better outcome (thaw a frozen drive).
	NextStep string `json:"next_step,omitempty"`
	// Verification describes the read-back and its result; Verified is its verdict.
	Verification string  `json:"verification,omitempty"`
	Verified     bool    `json:"verified"`
	Coverage     float64 `json:"coverage"`
	// Mismatches counts 4 KiB blocks the verification found not erased (first at FirstMismatch bytes).
	Mismatches    int64     `json:"mismatches,omitempty"`
	FirstMismatch int64     `json:"first_mismatch,omitempty"`
	Started       time.Time `json:"started"`
	Ended         time.Time `json:"ended"`
	// Attempts lists every method tried, in order, the final one included.
	Attempts []EraseAttempt `json:"attempts,omitempty"`
}

// EraseAttempt is one method tried on a disk.
type EraseAttempt struct {
	Method  string `json:"method"`
	Outcome string `json:"outcome"`
	Message string `json:"message,omitempty"`
}

// Report is one step report. Progress is 0..1.
type Report struct {
	MachineID string  `json:"machine_id"`
	Step      string  `json:"step"`
	State     State   `json:"state"`
	Reason    Reason  `json:"reason,omitempty"`
	Message   string  `json:"message,omitempty"`
	Progress  float64 `json:"progress,omitempty"`
	// Written holds, on finalize, what went to disk (disk path, bytes, sha256).
	Written map[string]string `json:"written,omitempty"`
	// Attempt is the Task.Attempt of the build this report belongs to (0: not a build, or
	// an agent that does not count). Reports are idempotent by (Step, State, Attempt): a
	// repeated one changes nothing more, a late one never moves the machine backwards.
	Attempt int `json:"attempt,omitempty"`
	// Erase holds, on the erase step's succeeded or failed report, one certificate per
	// disk of the machine (skipped ones included); the appliance records each as an
	// "erase_certificate" event.
	Erase []DiskErase `json:"erase,omitempty"`

	Build  *BuildReport  `json:"build,omitempty"`   // issue 15: on finalize, what a release build wrote (release.go)
	BurnIn *BurnInReport `json:"burn_in,omitempty"` // issue 17: on step burn_in's succeeded or failed report
}
