package store

import (
	"fmt"
	"time"
)

// Meta is carried by every record. ResourceVersion is the raft index of the
// command that last wrote the record; an update that names a ResourceVersion
// other than the current one fails with ErrConflict (compare-and-set).
// Times are fixed by the leader before the command is logged (UTC).
type Meta struct {
	ID              string    `json:"id"`
	ResourceVersion uint64    `json:"resource_version"`
	CreatedAt       time.Time `json:"created_at"`
	UpdatedAt       time.Time `json:"updated_at"`
}

// Site is one data-center hall served by one Kiln cluster.
type Site struct {
	Meta
	Name        string `json:"name"`
	Description string `json:"description,omitempty"`
}

// Rack is a rack of a site. Units is its height in rack units (U).
type Rack struct {
	Meta
	Site  string `json:"site"`
	Name  string `json:"name"`
	Row   string `json:"row,omitempty"`
	Units int    `json:"units,omitempty"`
}

// MachineState is a machine's lifecycle state (top-level DESIGN.md
// "Lifecycle").
type MachineState string

// Lifecycle states. Terms follow Ironic/Metal3 where they exist.
const (
	StateDiscovered   MachineState = "discovered"   // a MAC no record knows asked for DHCP
	StateRegistered   MachineState = "registered"   // imported from a purchase record / rack plan
	StateInspecting   MachineState = "inspecting"   // booted into the in-RAM agent, reporting hardware
	StateAvailable    MachineState = "available"    // inspected, matches intent, may be claimed
	StateProvisioning MachineState = "provisioning" // the gated build is running
	StateProvisioned  MachineState = "provisioned"  // image written, verified, staged; boots from disk
	StateFailed       MachineState = "failed"       // a gate or step failed; Reason says which
	StateQuarantined  MachineState = "quarantined"  // discovered hardware differs from intent in a blocking field
	StateErasing      MachineState = "erasing"      // disks being wiped before reuse or retirement
	StateRetired      MachineState = "retired"      // out of service for good
	// Issue 14 (day 2), written only by put_machines_v3 (command 25):
	StateRemediating MachineState = "remediating" // automatic repair of a claimed machine: drain, power cycle (Machine.Remediation)
	StateRMA         MachineState = "rma"         // declared failed: returned to the vendor (Remediation.Report says why)
)

// AllStates lists every MachineState, in lifecycle order.
var AllStates = []MachineState{
	StateDiscovered, StateRegistered, StateInspecting, StateAvailable, StateProvisioning,
	StateProvisioned, StateFailed, StateQuarantined, StateErasing, StateRemediating, StateRMA, StateRetired,
}

// transitionsV2 is the legal-transition table of the commands before issue
// 14 (put_machines 3, put_machines_v2 14, import_machines 16,
// agent_report 17): from → allowed destinations. It never changes: an
// old entry replays with the rules it was written under.
var transitionsV2 = map[MachineState][]MachineState{
	StateDiscovered:   {StateRegistered, StateInspecting, StateRetired},
	StateRegistered:   {StateInspecting, StateRetired},
	StateInspecting:   {StateAvailable, StateQuarantined, StateFailed},
	StateAvailable:    {StateProvisioning, StateInspecting, StateErasing, StateRetired},
	StateProvisioning: {StateProvisioned, StateFailed},
	StateProvisioned:  {StateErasing, StateFailed},
	StateFailed:       {StateInspecting, StateErasing, StateRetired},
	StateQuarantined:  {StateInspecting, StateErasing, StateRetired},
	StateErasing:      {StateAvailable, StateInspecting, StateRetired, StateFailed},
	StateRetired:      {},
}

// transitionsV3 is the table of put_machines_v3 (command 25, issue 14):
// transitionsV2 plus the states remediating and rma
// (appliance/lifecycle/DESIGN.md "Transitions and their owners"):
//
//   - provisioned, failed → remediating: the ladder starts (or an operator's
//     reprovision of a provisioned machine passes through it);
//   - remediating → provisioned (a power cycle repaired it), inspecting
//     (the reinspect step), erasing (declared failed: erase before rma),
//     rma, failed (the ladder was stopped by an operator);
//   - inspecting, provisioning → erasing (declared failed during the
//     reinspect or the reprovision: erase before rma while the agent runs),
//     inspecting → rma;
//   - available, provisioned, provisioning, failed, quarantined, erasing → rma;
//   - rma → inspecting (back from repair), erasing, retired.
var transitionsV3 = map[MachineState][]MachineState{
	StateDiscovered:   {StateRegistered, StateInspecting, StateRetired},
	StateRegistered:   {StateInspecting, StateRetired},
	StateInspecting:   {StateAvailable, StateQuarantined, StateFailed, StateErasing, StateRMA},
	StateAvailable:    {StateProvisioning, StateInspecting, StateErasing, StateRetired, StateRMA},
	StateProvisioning: {StateProvisioned, StateFailed, StateErasing, StateRMA},
	StateProvisioned:  {StateErasing, StateFailed, StateRemediating, StateRMA},
	StateFailed:       {StateInspecting, StateErasing, StateRetired, StateRemediating, StateRMA},
	StateQuarantined:  {StateInspecting, StateErasing, StateRetired, StateRMA},
	StateErasing:      {StateAvailable, StateInspecting, StateRetired, StateFailed, StateRMA},
	StateRemediating:  {StateProvisioned, StateInspecting, StateErasing, StateRMA, StateFailed},
	StateRMA:          {StateInspecting, StateErasing, StateRetired},
	StateRetired:      {},
}

// Valid reports whether s is one of AllStates.
func (s MachineState) Valid() bool { _, ok := transitionsV4[s]; return ok }

// CanTransition reports whether from → to is a legal lifecycle transition
// under the current table (put_machines_v4, the one the lifecycle checks
// before it writes).
func CanTransition(from, to MachineState) bool { return canTransition(transitionsV4, from, to) }

// CanTransitionV2 is CanTransition under the table of the commands before
// issue 14 (what a node that does not understand command 25 applies).
func CanTransitionV2(from, to MachineState) bool { return canTransition(transitionsV2, from, to) }

func canTransition(tab map[MachineState][]MachineState, from, to MachineState) bool {
	for _, s := range tab[from] {
		if s == to {
			return true
		}
	}
	return false
}

// IllegalTransitionError names both states of a refused transition.
type IllegalTransitionError struct{ From, To MachineState }

func (e *IllegalTransitionError) Error() string {
	return fmt.Sprintf("illegal transition %s → %s", e.From, e.To)
}

// Disk is one block device as intended or as discovered. SizeBytes in bytes.
type Disk struct {
	Name       string `json:"name,omitempty"` // kernel name, e.g. "vda" (discovered only)
	Serial     string `json:"serial,omitempty"`
	WWN        string `json:"wwn,omitempty"`
	Model      string `json:"model,omitempty"`
	SizeBytes  uint64 `json:"size_bytes,omitempty"`
	Rotational bool   `json:"rotational,omitempty"`
	Removable  bool   `json:"removable,omitempty"`
}

// NIC is one network interface. MAC is lower-case colon form.
type NIC struct {
	Name   string `json:"name,omitempty"`
	MAC    string `json:"mac"`
	LinkUp bool   `json:"link_up,omitempty"`
}

// Hardware is a machine's hardware description, used for both intended
// (purchase record, rack plan) and discovered (agent, BMC) fields.
type Hardware struct {
	Serial      string `json:"serial,omitempty"`
	Vendor      string `json:"vendor,omitempty"`
	Model       string `json:"model,omitempty"`
	UUID        string `json:"uuid,omitempty"`
	CPUs        int    `json:"cpus,omitempty"`
	MemoryBytes uint64 `json:"memory_bytes,omitempty"`
	Disks       []Disk `json:"disks,omitempty"`
	NICs        []NIC  `json:"nics,omitempty"`
	GPUs        int    `json:"gpus,omitempty"`
	BMCAddress  string `json:"bmc_address,omitempty"`
	BMCMAC      string `json:"bmc_mac,omitempty"`
	Firmware    string `json:"firmware,omitempty"` // firmware floor (intended) or version (discovered)

	// Issue 15 (discovered only, from the agent's inventory): what layer
	// choice needs (appliance/lifecycle/layers.go).
	PCI      []PCIDevice `json:"pci,omitempty"`
	CPUFlags []string    `json:"cpu_flags,omitempty"`
	TPM      *TPMInfo    `json:"tpm,omitempty"`
}

// FieldDiff is one difference between intended and discovered hardware.
// Blocking differences quarantine the machine.
type FieldDiff struct {
	Field      string `json:"field"`
	Intended   string `json:"intended"`
	Discovered string `json:"discovered"`
	Blocking   bool   `json:"blocking"`
}

// DiskRule chooses the root disk: by serial, by WWN, or the smallest
// non-removable disk of at least MinSizeBytes. Never "the first disk".
type DiskRule struct {
	Serial       string `json:"serial,omitempty"`
	WWN          string `json:"wwn,omitempty"`
	MinSizeBytes uint64 `json:"min_size_bytes,omitempty"`
}

// Claim is a provisioning request placed on an available machine.
type Claim struct {
	Image         string            `json:"image"` // Image ID
	Role          string            `json:"role,omitempty"`
	Hostname      string            `json:"hostname,omitempty"`
	UserData      string            `json:"user_data,omitempty"`      // cloud-init user-data (bootstrap data)
	NetworkConfig string            `json:"network_config,omitempty"` // cloud-init network-config v2
	SSHKeys       []string          `json:"ssh_keys,omitempty"`
	CABundle      string            `json:"ca_bundle,omitempty"`
	JoinData      string            `json:"join_data,omitempty"`
	Labels        map[string]string `json:"labels,omitempty"`

	// Issue 14 (kept only by put_machines_v3, command 25; an older command
	// keeps the stored claim's values):
	// Selector is the machine labels the claim was placed by (ClaimMachines):
	// a spare that replaces a failed machine must match it.
	Selector map[string]string `json:"selector,omitempty"`
	// DrainWebhook (http or https URL), when set, is POSTed a DrainRequest
	// before a disruptive remediation step.
	DrainWebhook string `json:"drain_webhook,omitempty"`
	// Replaces is the ID of the failed machine this claim was moved from (a spare).
	Replaces string `json:"replaces,omitempty"`

	// Issue 15 (kept only by put_machines_v4, command 30; keepV4Fields):
	// the cluster block (store/release.go).
	Cluster *ClusterSpec `json:"cluster,omitempty"`
}

// BootMode is the firmware mode a machine boots in.
type BootMode string

const (
	BootModeUEFI   BootMode = "uefi"
	BootModeLegacy BootMode = "legacy"
)

// Machine is one server of the site.
type Machine struct {
	Meta
	Name       string            `json:"name,omitempty"`
	Site       string            `json:"site,omitempty"`
	Rack       string            `json:"rack,omitempty"`
	RackUnit   int               `json:"rack_unit,omitempty"`
	Labels     map[string]string `json:"labels,omitempty"`
	Intended   Hardware          `json:"intended"`
	Discovered *Hardware         `json:"discovered,omitempty"`
	Diff       []FieldDiff       `json:"diff,omitempty"`

	State   MachineState `json:"state"`
	Reason  string       `json:"reason,omitempty"`  // closed enum of the step or controller that set State
	Message string       `json:"message,omitempty"` // free text, sanitised

	BootMode     BootMode `json:"boot_mode,omitempty"`
	IPv4         string   `json:"ipv4,omitempty"`          // DHCP reservation on the provisioning network
	BootOverride string   `json:"boot_override,omitempty"` // first-stage override, e.g. "snp.efi"
	Netboot      *bool    `json:"netboot,omitempty"`       // nil = policy default (true)
	RootDisk     DiskRule `json:"root_disk"`
	Wipe         bool     `json:"wipe,omitempty"` // may overwrite a disk holding a foreign OS
	BMC          string   `json:"bmc,omitempty"`  // BMC record ID
	Claim        *Claim   `json:"claim,omitempty"`

	// BootTokenHash is the SHA-256 (hex) of the current per-boot agent token.
	BootTokenHash string `json:"boot_token_hash,omitempty"`
	// Step is the last step report received from the agent.
	Step *StepStatus `json:"step,omitempty"`

	// Issue 14 (day 2): written only by put_machines_v3 (command 25). The
	// older machine commands (3, 14, 16, 17) keep what the stored record
	// holds in these fields, as a node that predates them does (it does not
	// know them), so replicas never diverge in a rolling upgrade.

	// Maintenance, when set, is Ironic's maintenance flag: nothing is done
	// to the machine automatically (no remediation, no spare taken from it).
	// It is a flag with a reason, not a state.
	Maintenance *Maintenance `json:"maintenance,omitempty"`
	// Health is the machine's current health conditions, one per Type,
	// each with its source.
	Health []HealthCondition `json:"health,omitempty"`
	// Remediation is the repair ladder's record (the current run, or the
	// last one, with its history).
	Remediation *Remediation `json:"remediation,omitempty"`
	// Drain is the request to the claim's owner before a disruptive step.
	Drain *Drain `json:"drain,omitempty"`

	// Round 3 (issues 15, 16, 17): written only by put_machines_v4 (30)
	// and agent_report_v2 (31). The older machine commands keep what the
	// stored record holds (keepV4Fields), as a node that predates them does.

	// Build is the gated build's record: the release and layers chosen and
	// why, the per-node layer hash, the first-boot report (issue 15,
	// store/build_record.go).
	Build *BuildRecord `json:"build,omitempty"`
	// Attestation is the last TPM attestation result (issue 16,
	// store/attest_record.go).
	Attestation *AttestationRecord `json:"attestation,omitempty"`
	// BurnIn is the last burn-in result (issue 17, store/burnin_record.go).
	BurnIn *BurnInRecord `json:"burn_in,omitempty"`
	// Firmware is the firmware inventory, BIOS attributes and drift from
	// the model's baseline as last read from the BMC (issue 17,
	// store/firmware_record.go).
	Firmware *FirmwareRecord `json:"firmware,omitempty"`
}

// Maintenance is the maintenance flag (Ironic: maintenance + maintenance_reason).
type Maintenance struct {
	Reason string    `json:"reason"` // the operator's reason (free text, rules.CheckText)
	Actor  string    `json:"actor,omitempty"`
	Since  time.Time `json:"since"`
}

// Health states (the Redfish Resource.Health enum, DSP0268 Resource
// schema): a condition is failing when Critical.
const (
	HealthOK       = "OK"
	HealthWarning  = "Warning"
	HealthCritical = "Critical"
)

// Health condition sources.
const (
	HealthSourceBMC   = "bmc"   // Redfish Status.Health / IPMI SEL and sensors, polled by Kiln
	HealthSourceOwner = "owner" // the claim's owner (POST /v1/machines/{id}/health), as a Cluster API MachineHealthCheck
	HealthSourceKiln  = "kiln"  // Kiln's own observation (build stalled, agent silent, boot missing)
)

// HealthCondition is one health signal of a machine. Type names it
// ("bmc_system", "bmc_chassis", "owner/<type>", "build_stalled",
// "agent_silent", "boot_missing"); Status is HealthOK, HealthWarning or
// HealthCritical; Since is when Status last changed, At the last report.
type HealthCondition struct {
	Type    string    `json:"type"`
	Source  string    `json:"source"`
	Status  string    `json:"status"`
	Reason  string    `json:"reason,omitempty"`
	Message string    `json:"message,omitempty"`
	Since   time.Time `json:"since"`
	At      time.Time `json:"at"`
}

// Remediation is the repair ladder's record on a machine
// (appliance/lifecycle/DESIGN.md "Remediation"). Step is the current step
// (drain, power_cycle, reinspect, reprovision, erase, rma); Outcome is ""
// while the ladder runs, then remediated, rma or stopped. Attempt numbers
// the ladder runs of this machine. Started is the run's start,
// StepStarted and Deadline the current step's; Why says why the run (or
// the current step) was taken. History holds every finished step.
type Remediation struct {
	Step        string            `json:"step"`
	Attempt     int               `json:"attempt"`
	Started     time.Time         `json:"started"`
	StepStarted time.Time         `json:"step_started"`
	Deadline    time.Time         `json:"deadline,omitempty"`
	ActionDone  time.Time         `json:"action_done,omitempty"` // the step's action (BMC job, build) finished
	Why         string            `json:"why"`
	Outcome     string            `json:"outcome,omitempty"`
	History     []RemediationStep `json:"history,omitempty"`
	// Baseline is the discovered hardware before the reinspect step, to
	// compare the new inspection with.
	Baseline *Hardware `json:"baseline,omitempty"`
	// Report is the RMA report once the machine is declared failed.
	Report *RMAReport `json:"report,omitempty"`
	// Claim is the claim the machine held when declared failed, until a
	// spare takes it (Spare is then that machine's ID).
	Claim *Claim `json:"claim,omitempty"`
	Spare string `json:"spare,omitempty"`
}

// RemediationStep is one finished step of a ladder run: Result is
// succeeded, failed, skipped or stopped.
type RemediationStep struct {
	Step    string    `json:"step"`
	Result  string    `json:"result"`
	Why     string    `json:"why,omitempty"`
	Started time.Time `json:"started"`
	Ended   time.Time `json:"ended"`
}

// RMAReport is what points at the failed part: the inspection difference
// (baseline → reinspection), the BMC's events, the health conditions at
// the time and the erase outcome.
type RMAReport struct {
	Diff       []FieldDiff       `json:"diff,omitempty"`
	BMCEvents  []BMCEvent        `json:"bmc_events,omitempty"`
	Conditions []HealthCondition `json:"conditions,omitempty"`
	Erase      string            `json:"erase,omitempty"` // erased | not_erased: <why>
}

// BMCEvent is one BMC log entry (Redfish LogEntry, IPMI SEL record).
type BMCEvent struct {
	Time     time.Time `json:"time"`
	Source   string    `json:"source"` // sel | sensor | redfish
	Severity string    `json:"severity"`
	Message  string    `json:"message"`
	ID       string    `json:"id,omitempty"`
}

// Drain is a request to a claimed machine's owner to move its work off
// before a disruptive step: Step is the step waiting, Deadline when the
// timeout policy applies, Acked/AckedBy the owner's acknowledgement,
// Webhook the URL told (Claim.DrainWebhook) and WebhookResult its outcome.
type Drain struct {
	Step          string    `json:"step"`
	Reason        string    `json:"reason,omitempty"`
	Requested     time.Time `json:"requested"`
	Deadline      time.Time `json:"deadline"`
	Acked         time.Time `json:"acked,omitempty"`
	AckedBy       string    `json:"acked_by,omitempty"`
	Webhook       string    `json:"webhook,omitempty"`
	WebhookResult string    `json:"webhook_result,omitempty"`
	// TimedOut: the deadline passed without an ack (the policy then proceeds or holds).
	TimedOut bool `json:"timed_out,omitempty"`
}

// UsesV3 reports whether m holds anything only put_machines_v3 keeps: a
// state of issue 14 or one of its fields.
func (m *Machine) UsesV3() bool {
	if m.State == StateRemediating || m.State == StateRMA {
		return true
	}
	return m.Maintenance != nil || len(m.Health) > 0 || m.Remediation != nil || m.Drain != nil
}

// keepV3Fields is the rule of the machine commands before issue 14: the
// issue-14 fields are what the stored record holds (old; nil on create),
// whatever the command carries, as on a node that does not know them.
func keepV3Fields(m, old *Machine) {
	if old == nil {
		old = &Machine{}
	}
	m.Maintenance, m.Health, m.Remediation, m.Drain = old.Maintenance, old.Health, old.Remediation, old.Drain
	if m.Claim != nil {
		var sel map[string]string
		var hook, repl string
		if old.Claim != nil {
			sel, hook, repl = old.Claim.Selector, old.Claim.DrainWebhook, old.Claim.Replaces
		}
		m.Claim.Selector, m.Claim.DrainWebhook, m.Claim.Replaces = sel, hook, repl
	}
}

// RepairBrake is the site's remediation brake (bucket remediation, key
// "brake"; command 26 put_remediation): Failures are the machines declared
// unhealthy within the window (oldest first, pruned by the lifecycle);
// Engaged halts automatic repair until a person resumes it. Scope is
// site, rack or claim and Key the rack ID or claim role that tripped it.
type RepairBrake struct {
	Meta
	Engaged   bool            `json:"engaged"`
	Scope     string          `json:"scope,omitempty"`
	Key       string          `json:"key,omitempty"`
	EngagedAt time.Time       `json:"engaged_at,omitempty"`
	Reason    string          `json:"reason,omitempty"`
	Message   string          `json:"message,omitempty"`
	ResumedAt time.Time       `json:"resumed_at,omitempty"`
	ResumedBy string          `json:"resumed_by,omitempty"`
	Failures  []RepairFailure `json:"failures,omitempty"`
}

// RepairFailure is one failure counted by the brake.
type RepairFailure struct {
	Machine string    `json:"machine"`
	Rack    string    `json:"rack,omitempty"`
	Claim   string    `json:"claim,omitempty"` // the claim's role
	At      time.Time `json:"at"`
	Why     string    `json:"why,omitempty"`
}

// StepStatus is the latest state of a gated-build step.
type StepStatus struct {
	Step     string    `json:"step"`
	State    string    `json:"state"`
	Reason   string    `json:"reason,omitempty"`
	Message  string    `json:"message,omitempty"`
	Progress float64   `json:"progress,omitempty"` // 0..1
	At       time.Time `json:"at"`
	Deadline time.Time `json:"deadline,omitempty"`
	// Attempt numbers the build (agentapi.Task.Attempt) this step belongs to: 1 for a
	// claim's first build, one more each time the build is served again; 0 outside builds
	// and in records written before builds were counted.
	Attempt int `json:"attempt,omitempty"`
	// Rewrite: this attempt's disk holds an earlier attempt's partial write (that attempt
	// passed check), so its task wipes the disk's signatures first.
	Rewrite bool `json:"rewrite,omitempty"`
}

// BMC is a baseboard management controller enrolled for a machine.
// CredentialRef names a secret held encrypted; the secret never appears here.
type BMC struct {
	Meta
	Address       string `json:"address"`            // host[:port]
	Driver        string `json:"driver"`             // redfish | ipmi | auto
	CredentialRef string `json:"credential_ref"`     // key of the encrypted credential
	Username      string `json:"username,omitempty"` // not secret
	InsecureTLS   bool   `json:"insecure_tls,omitempty"`
	CACertPEM     string `json:"ca_cert_pem,omitempty"`
}

// MaxImageSize bounds Image.Size: 16 TiB (2^44 bytes), more than any OS
// image and within int64, so a declared size can never wrap to "unknown".
const MaxImageSize = 1 << 44

// Image is a pinned OS image in the catalog. SizeBytes in bytes; SHA256 hex.
type Image struct {
	Meta
	Name    string `json:"name"`
	Version string `json:"version"`
	SHA256  string `json:"sha256"`
	Size    uint64 `json:"size_bytes"`
	Format  string `json:"format"` // raw | gzip | zstd
	Source  string `json:"source"` // URL or path it came from

	// Issue 15 (written only by put_image_v2, command 32; store/release.go):
	// the release manifest. Layers, when set, start with the base layer
	// (this image's own file); KubeadmVersion is the kubeadm the release
	// carries ("v1.31.2"), which a claim's cluster.kubernetesVersion must equal.
	Layers         []Layer `json:"layers,omitempty"`
	KubeadmVersion string  `json:"kubeadm_version,omitempty"`
}

// ImageTombstone is the record of a deleted image (CmdDeleteImageV3) as it
// was at the delete, and the leader's time of the delete. Every node
// removes its catalog file of that name when the file is that content and
// no newer record names the file (appliance/imagesync.go).
type ImageTombstone struct {
	Image     Image     `json:"image"`
	DeletedAt time.Time `json:"deleted_at"`
}

// Lease is a DHCPv4 lease (RFC 2131). Expiry is fixed by the leader.
type Lease struct {
	MAC      string    `json:"mac"`
	IP       string    `json:"ip"`
	Hostname string    `json:"hostname,omitempty"`
	Expiry   time.Time `json:"expiry"`
	State    string    `json:"state"` // LeaseBound | LeaseDeclined | LeaseReleased
}

// Job is one BMC or lifecycle action with its state.
type Job struct {
	Meta
	Machine string `json:"machine"`
	Kind    string `json:"kind"`  // e.g. power_on, power_cycle, boot_pxe
	State   string `json:"state"` // pending | running | succeeded | failed
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
}

// Event is one entry of the audit log / central feed. Index is the raft log
// index of the command that produced it (strictly increasing, the cursor).
// Seq orders events produced by the same command.
type Event struct {
	Index   uint64    `json:"index"`
	Seq     int       `json:"seq"`
	Time    time.Time `json:"time"`
	Subject string    `json:"subject"` // e.g. "machine/m-123"
	Kind    string    `json:"kind"`    // e.g. "transition", "step", "job", "created"
	From    string    `json:"from,omitempty"`
	To      string    `json:"to,omitempty"`
	Actor   string    `json:"actor,omitempty"`
	Reason  string    `json:"reason,omitempty"`
	Message string    `json:"message,omitempty"`
}
