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
)

// AllStates lists every MachineState, in lifecycle order.
var AllStates = []MachineState{
	StateDiscovered, StateRegistered, StateInspecting, StateAvailable, StateProvisioning,
	StateProvisioned, StateFailed, StateQuarantined, StateErasing, StateRetired,
}

// transitions is the legal-transition table: from → allowed destinations.
var transitions = map[MachineState][]MachineState{
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

// Valid reports whether s is one of AllStates.
func (s MachineState) Valid() bool { _, ok := transitions[s]; return ok }

// CanTransition reports whether from → to is a legal lifecycle transition.
func CanTransition(from, to MachineState) bool {
	for _, s := range transitions[from] {
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
