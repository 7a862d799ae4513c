package api

import (
	"time"

	"kiln/store"
)

// View types: the REST API's wire form of each resource, built from the
// store's records by the functions below and nowhere else. A record field
// reaches the wire only when a view names it, so a new store field (a
// token digest, a raft bookkeeping value) is private until someone decides
// otherwise here. The OpenAPI document (openapi.go) is reflected from these
// types; the Go client (kiln/api/client) decodes into them.
//
// Nested hardware values (store.Hardware, store.Disk, store.NIC,
// store.DiskRule, store.FieldDiff, store.StepStatus) hold nothing secret
// and are shown as the store keeps them.

// Meta is carried by every resource view: ID, ResourceVersion (the raft
// index of the command that last wrote the record; send it back to update
// with compare-and-set, else 409 conflict) and the leader's UTC times.
type Meta struct {
	ID              string    `json:"id"`
	ResourceVersion uint64    `json:"resource_version"`
	CreatedAt       time.Time `json:"created_at"`
	UpdatedAt       time.Time `json:"updated_at"`
}

// Machine is one server of the site as the API shows it. It has no
// boot-token field: the per-boot token's digest is a credential and never
// leaves the appliance. Claim's bootstrap data (user_data, join_data) is
// shown only to operators and admins.
type Machine struct {
	Meta
	Name       string            `json:"name,omitempty"`
	Site       string            `json:"site,omitempty"`
	Rack       string            `json:"rack,omitempty"`
	RackUnit   int               `json:"rack_unit,omitempty"`
	Labels     map[string]string `json:"labels,omitempty"`
	Intended   store.Hardware    `json:"intended"`
	Discovered *store.Hardware   `json:"discovered,omitempty"`
	Diff       []store.FieldDiff `json:"diff,omitempty"`

	State   store.MachineState `json:"state"`
	Reason  string             `json:"reason,omitempty"`  // closed enum of the step or controller that set State
	Message string             `json:"message,omitempty"` // free text, sanitised

	BootMode     store.BootMode `json:"boot_mode,omitempty"`
	IPv4         string         `json:"ipv4,omitempty"`          // DHCP reservation on the provisioning network
	BootOverride string         `json:"boot_override,omitempty"` // first-stage override, e.g. "snp.efi"
	Netboot      *bool          `json:"netboot,omitempty"`       // nil = policy default (true)
	RootDisk     store.DiskRule `json:"root_disk"`
	Wipe         bool           `json:"wipe,omitempty"` // may overwrite a disk holding a foreign OS
	BMC          string         `json:"bmc,omitempty"`  // BMC record ID
	Claim        *Claim         `json:"claim,omitempty"`
	// Step is the last step report received from the agent.
	Step *store.StepStatus `json:"step,omitempty"`

	// Day 2 (issue 14; appliance/lifecycle/DESIGN.md "Remediation"):
	// the maintenance flag, health conditions, the repair ladder's record
	// and the drain request to the claim's owner.
	Maintenance *store.Maintenance      `json:"maintenance,omitempty"`
	Health      []store.HealthCondition `json:"health,omitempty"`
	Remediation *Remediation            `json:"remediation,omitempty"`
	Drain       *store.Drain            `json:"drain,omitempty"`

	// Build is the release build's record (issue 15).
	Build *Build `json:"build,omitempty"`
	// Firmware is the firmware inventory, BIOS attributes, baseline drift
	// and last apply run as read from the BMC (issue 17; api/firmware.go).
	Firmware *store.FirmwareRecord `json:"firmware,omitempty"`

	// Attestation is the last TPM attestation (issue 16, attest.go).
	Attestation *Attestation `json:"attestation,omitempty"`
	// BurnIn is the last burn-in's result (issue 17; appliance/lifecycle/DESIGN.md "Burn-in").
	BurnIn *store.BurnInRecord `json:"burn_in,omitempty"`
}

// Remediation is the wire form of the ladder's record: the store's,
// with the waiting claim shown as a view (no bootstrap data for viewers).
type Remediation struct {
	Step        string                  `json:"step"`
	Attempt     int                     `json:"attempt"`
	Started     time.Time               `json:"started"`
	StepStarted time.Time               `json:"step_started"`
	Deadline    time.Time               `json:"deadline,omitempty"`
	ActionDone  time.Time               `json:"action_done,omitempty"`
	Why         string                  `json:"why"`
	Outcome     string                  `json:"outcome,omitempty"`
	History     []store.RemediationStep `json:"history,omitempty"`
	Baseline    *store.Hardware         `json:"baseline,omitempty"`
	Report      *store.RMAReport        `json:"report,omitempty"`
	Claim       *Claim                  `json:"claim,omitempty"`
	Spare       string                  `json:"spare,omitempty"`
}

// Claim is a provisioning request placed on a machine: the body's claim in
// provision and claim requests, and Machine.Claim in answers. UserData
// (cloud-init user-data) and JoinData (cluster bootstrap data) may hold
// secrets: answers carry them only for operators and admins (a viewer sees
// the claim without them).
type Claim struct {
	Image         string            `json:"image"` // Image ID
	Role          string            `json:"role,omitempty"`
	Hostname      string            `json:"hostname,omitempty"`
	UserData      string            `json:"user_data,omitempty"`      // cloud-init user-data
	NetworkConfig string            `json:"network_config,omitempty"` // cloud-init network-config v2
	SSHKeys       []string          `json:"ssh_keys,omitempty"`
	CABundle      string            `json:"ca_bundle,omitempty"`
	JoinData      string            `json:"join_data,omitempty"`
	Labels        map[string]string `json:"labels,omitempty"`
	// DrainWebhook (http or https URL) is POSTed a drain request before a
	// disruptive repair step (appliance/lifecycle.DrainRequest).
	DrainWebhook string `json:"drain_webhook,omitempty"`
	// Selector (answers only) is the labels the claim was placed by; a
	// spare replacing the machine matches them. Replaces (answers only) is
	// the failed machine whose claim this spare took.
	Selector map[string]string `json:"selector,omitempty"`
	Replaces string            `json:"replaces,omitempty"`
	// Cluster is the cluster block (issue 15): its token is write-only.
	Cluster *ClusterBlock `json:"cluster,omitempty"`
}

// ClusterBlock is a claim's cluster block (the Kairos provider-kubernetes
// fields): role init | control-plane | worker; control_plane_host (a bare
// host gets :6443); kubernetesVersion pinned (it must equal the release's
// kubeadm version, else the build fails at check: version_mismatch);
// cluster_token (requests only, at least 16 characters: sealed with the
// site key and never returned, logged or put in an event). Answers say
// token_set and token_weak (accepted below ~128 bits of estimated entropy).
type ClusterBlock struct {
	Role              string `json:"role"`
	ControlPlaneHost  string `json:"control_plane_host,omitempty"`
	KubernetesVersion string `json:"kubernetesVersion"`
	ClusterToken      string `json:"cluster_token,omitempty"`
	TokenSet          bool   `json:"token_set,omitempty"`
	TokenWeak         bool   `json:"token_weak,omitempty"`
}

// Build is the wire form of a machine's build record (issue 15): the
// release, the layers chosen and skipped with their reasons and written
// digests, the per-node layer hash, the SSH host key fingerprint and the
// first-boot report. The first-boot token's digest is not shown.
type Build struct {
	Release               string                 `json:"release"`
	KubeadmVersion        string                 `json:"kubeadm_version,omitempty"`
	Attempt               int                    `json:"attempt,omitempty"`
	Started               time.Time              `json:"started"`
	Layers                []store.BuildLayer     `json:"layers"`
	Skipped               []store.BuildLayer     `json:"skipped,omitempty"`
	NodeLayerSHA256       string                 `json:"node_layer_sha256,omitempty"`
	SSHHostKeyFingerprint string                 `json:"ssh_host_key_fingerprint,omitempty"`
	Hostname              string                 `json:"hostname,omitempty"`
	Built                 time.Time              `json:"built,omitempty"`
	FirstBootDeadline     time.Time              `json:"first_boot_deadline,omitempty"`
	FirstBoot             *store.FirstBootRecord `json:"first_boot,omitempty"`
}

func buildView(b *store.BuildRecord) *Build {
	if b == nil {
		return nil
	}
	return &Build{Release: b.Release, KubeadmVersion: b.KubeadmVersion, Attempt: b.Attempt, Started: b.Started,
		Layers: b.Layers, Skipped: b.Skipped, NodeLayerSHA256: b.NodeLayerSHA256, SSHHostKeyFingerprint: b.SSHHostKeyFingerprint,
		Hostname: b.Hostname, Built: b.Built, FirstBootDeadline: b.FirstBootDeadline, FirstBoot: b.FirstBoot}
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

// Image is a pinned OS image of the catalog. Size is the raw (decompressed)
// content in bytes; SHA256 is hex of that content.
type Image struct {
	Meta
	Name    string `json:"name"`
	Version string `json:"version"`
	SHA256  string `json:"sha256"`
	Size    uint64 `json:"size_bytes"`
	Format  string `json:"format"` // raw | gzip | zstd
	Source  string `json:"source"` // URL or path it came from
	// Layers and KubeadmVersion are the release manifest (issue 15;
	// PUT /v1/images/{id}/manifest): absent for a plain image.
	Layers         []Layer `json:"layers,omitempty"`
	KubeadmVersion string  `json:"kubeadm_version,omitempty"`
}

// Layer is one layer of a release manifest. Name is 1..32 of [a-z0-9-];
// the first layer is "base" (the image's own file, when "always"). Image
// is the catalog image holding the layer (its file is served at
// /images/{name} on every node); SHA256 (hex) and Size (bytes) pin it.
// When is the selection rule: always | role:control-plane | pci:10de/03
// (an NVIDIA display/3D device) | cpu:vmx|svm (hardware virtualization).
// PartName (answers only) is the GPT partition the agent writes it to.
// VerityRootHash (hex) and VerityHashOffset (bytes) locate the layer's
// dm-verity tree.
type Layer struct {
	Name             string `json:"name"`
	Image            string `json:"image,omitempty"`
	SHA256           string `json:"sha256,omitempty"`
	Size             uint64 `json:"size_bytes,omitempty"`
	When             string `json:"when"`
	PartName         string `json:"part_name,omitempty"`
	VerityRootHash   string `json:"verity_root_hash,omitempty"`
	VerityHashOffset uint64 `json:"verity_hash_offset,omitempty"`
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
// index of the command that produced it (strictly increasing: the cursor of
// GET /v1/events); Seq orders the events of one command.
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

// BMC is an enrolled baseboard management controller. The password is
// write-only (BMCEnrollRequest): CredentialRef names the encrypted secret,
// which no route returns.
type BMC struct {
	Meta
	Address       string `json:"address"` // host[:port]
	Driver        string `json:"driver"`  // redfish | ipmi | auto
	CredentialRef string `json:"credential_ref"`
	Username      string `json:"username,omitempty"`
	InsecureTLS   bool   `json:"insecure_tls,omitempty"`
	CACertPEM     string `json:"ca_cert_pem,omitempty"`
}

// ---- builders: store record → view

func metaView(m store.Meta) Meta {
	return Meta{ID: m.ID, ResourceVersion: m.ResourceVersion, CreatedAt: m.CreatedAt, UpdatedAt: m.UpdatedAt}
}

// seesBootstrap reports whether role may see a claim's user-data and join data.
func seesBootstrap(r Role) bool { return r.allows(RoleOperator) }

// machineView is the wire form of m for a caller of role r.
func machineView(m store.Machine, r Role) Machine {
	return Machine{
		Meta: metaView(m.Meta), Name: m.Name, Site: m.Site, Rack: m.Rack, RackUnit: m.RackUnit, Labels: m.Labels,
		Intended: m.Intended, Discovered: m.Discovered, Diff: m.Diff,
		State: m.State, Reason: m.Reason, Message: m.Message,
		BootMode: m.BootMode, IPv4: m.IPv4, BootOverride: m.BootOverride, Netboot: m.Netboot,
		RootDisk: m.RootDisk, Wipe: m.Wipe, BMC: m.BMC, Claim: claimView(m.Claim, r), Step: m.Step,
		Maintenance: m.Maintenance, Health: m.Health, Remediation: remediationView(m.Remediation, r), Drain: m.Drain,
		Build: buildView(m.Build), Firmware: m.Firmware,
		Attestation: attestationView(m.Attestation),
		BurnIn:      m.BurnIn,
	}
}

func remediationView(x *store.Remediation, r Role) *Remediation {
	if x == nil {
		return nil
	}
	return &Remediation{Step: x.Step, Attempt: x.Attempt, Started: x.Started, StepStarted: x.StepStarted, Deadline: x.Deadline,
		ActionDone: x.ActionDone, Why: x.Why, Outcome: x.Outcome, History: x.History, Baseline: x.Baseline, Report: x.Report,
		Claim: claimView(x.Claim, r), Spare: x.Spare}
}

func machineViews(ms []store.Machine, r Role) []Machine {
	out := make([]Machine, len(ms))
	for i, m := range ms {
		out[i] = machineView(m, r)
	}
	return out
}

// claimView is the wire form of a stored claim for role r (nil for nil).
func claimView(c *store.Claim, r Role) *Claim {
	if c == nil {
		return nil
	}
	out := &Claim{Image: c.Image, Role: c.Role, Hostname: c.Hostname, NetworkConfig: c.NetworkConfig,
		SSHKeys: c.SSHKeys, CABundle: c.CABundle, Labels: c.Labels, Selector: c.Selector, DrainWebhook: c.DrainWebhook,
		Replaces: c.Replaces}
	if seesBootstrap(r) {
		out.UserData, out.JoinData = c.UserData, c.JoinData
	}
	if cc := c.Cluster; cc != nil {
		// The token is never in a view, whatever the role (it is not in the record either).
		out.Cluster = &ClusterBlock{Role: cc.Role, ControlPlaneHost: cc.ControlPlaneHost, KubernetesVersion: cc.KubernetesVersion,
			TokenSet: cc.TokenRef != "", TokenWeak: cc.TokenWeak}
	}
	return out
}

// storeClaim is the claim of a request as the domain takes it.
func storeClaim(c Claim) store.Claim {
	return store.Claim{Image: c.Image, Role: c.Role, Hostname: c.Hostname, UserData: c.UserData,
		NetworkConfig: c.NetworkConfig, SSHKeys: c.SSHKeys, CABundle: c.CABundle, JoinData: c.JoinData, Labels: c.Labels,
		DrainWebhook: c.DrainWebhook, Cluster: storeCluster(c.Cluster)}
}

// storeCluster is a request's cluster block as the domain takes it: the
// token travels in memory only (store.ClusterSpec.Token is never encoded).
func storeCluster(b *ClusterBlock) *store.ClusterSpec {
	if b == nil {
		return nil
	}
	return &store.ClusterSpec{Role: b.Role, ControlPlaneHost: b.ControlPlaneHost, KubernetesVersion: b.KubernetesVersion,
		Token: b.ClusterToken}
}

func siteView(s store.Site) Site {
	return Site{Meta: metaView(s.Meta), Name: s.Name, Description: s.Description}
}

func rackView(r store.Rack) Rack {
	return Rack{Meta: metaView(r.Meta), Site: r.Site, Name: r.Name, Row: r.Row, Units: r.Units}
}

func imageView(im store.Image) Image {
	out := Image{Meta: metaView(im.Meta), Name: im.Name, Version: im.Version, SHA256: im.SHA256, Size: im.Size,
		Format: im.Format, Source: im.Source, KubeadmVersion: im.KubeadmVersion}
	for _, l := range im.Layers {
		out.Layers = append(out.Layers, Layer(l))
	}
	return out
}

// storeLayers is the manifest of a request as the domain takes it.
func storeLayers(ls []Layer) []store.Layer {
	out := make([]store.Layer, len(ls))
	for i, l := range ls {
		out[i] = store.Layer(l)
	}
	return out
}

func jobView(j store.Job) Job {
	return Job{Meta: metaView(j.Meta), Machine: j.Machine, Kind: j.Kind, State: j.State, Reason: j.Reason, Message: j.Message}
}

func eventView(e store.Event) Event {
	return Event{Index: e.Index, Seq: e.Seq, Time: e.Time, Subject: e.Subject, Kind: e.Kind, From: e.From, To: e.To,
		Actor: e.Actor, Reason: e.Reason, Message: e.Message}
}

func bmcView(b store.BMC) BMC {
	return BMC{Meta: metaView(b.Meta), Address: b.Address, Driver: b.Driver, CredentialRef: b.CredentialRef,
		Username: b.Username, InsecureTLS: b.InsecureTLS, CACertPEM: b.CACertPEM}
}

// views maps f over a list; never nil, so a list encodes as [] not null.
func views[T, V any](in []T, f func(T) V) []V {
	out := make([]V, len(in))
	for i, x := range in {
		out[i] = f(x)
	}
	return out
}
