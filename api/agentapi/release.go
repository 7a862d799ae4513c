package agentapi

// Issue 15 (build before boot): the release manifest's layers as a task carries them,
// the per-node layer, the cluster version check, the gated credentials, the build
// report and the first-boot report, and the inventory fields the layer choice needs.
//
//	GET  {url}/v1/agent/credentials  → Credentials  (stage step; answered only after the
//	                                                  attestation gate, lifecycle.CredentialGate)
//	POST {url}/v1/agent/firstboot    FirstBootReport (bearer = the first-boot token, from
//	                                                  /etc/kiln/firstboot.json on kiln-node)

// PCIDevice is one function of /sys/bus/pci/devices: Address "0000:01:00.0", the
// vendor and device IDs, and Class, the 24-bit class code (base class, subclass,
// programming interface; e.g. 0x030000 VGA controller, 0x030200 3D controller).
type PCIDevice struct {
	Address  string `json:"address"`
	VendorID uint16 `json:"vendor_id"`
	DeviceID uint16 `json:"device_id"`
	Class    uint32 `json:"class"`
}

// TPMInfo is the TPM the agent found under /sys/class/tpm: Version "2.0" or "1.2",
// Manufacturer the TPM_PT_MANUFACTURER vendor string (e.g. "IBM", "INTC") when known.
type TPMInfo struct {
	Version      string `json:"version"`
	Manufacturer string `json:"manufacturer,omitempty"`
}

// Layer selection rules (Layer.When).
const (
	WhenAlways = "always"
	// "role:NAME" (the claim's cluster role), "pci:VVVV/CC" (a PCI function of vendor
	// VVVV whose base class is CC, hex), "cpu:FLAG|FLAG" (any of the CPU flags).
)

// LayerPartPrefix prefixes the GPT partition name of every non-base layer.
const LayerPartPrefix = "kiln-layer-"

// Partition names of the built disk.
const (
	PartRoot       = "kiln-root"        // the base image's read-only root (dm-verity data)
	PartRootVerity = "kiln-root-verity" // its hash tree, when not appended to kiln-root
	PartNode       = "kiln-node"        // the per-node ext4 file system (label kiln-node)
)

// Layer is one layer of a release. The base layer (Layers[0] of a task) is a whole GPT
// disk image written at offset 0; every other layer is a raw blob (a file-system image)
// written into its own appended GPT partition PartName ("kiln-layer-<name>"). SHA256 is
// the hex digest of the Size raw bytes; Format as ImageRef.Format. When is the rule that
// selects it; Reason, in a task, says why the appliance chose it for this machine.
// VerityRootHash (base only) is the dm-verity root hash of the kiln-root partition;
// VerityHashOffset is veritysetup's --hash-offset in bytes on the hash device
// (kiln-root-verity when the image has it, else kiln-root itself).
type Layer struct {
	Name             string `json:"name"`
	URL              string `json:"url"`
	SHA256           string `json:"sha256"`
	Size             uint64 `json:"size_bytes"`
	Format           string `json:"format,omitempty"`
	When             string `json:"when,omitempty"`
	PartName         string `json:"part_name,omitempty"`
	VerityRootHash   string `json:"verity_root_hash,omitempty"`
	VerityHashOffset uint64 `json:"verity_hash_offset,omitempty"`
	Reason           string `json:"reason,omitempty"`
}

// NodeFile is one file of the per-node layer: an absolute Path inside the kiln-node file
// system, its permission bits (0644 when 0; private keys 0600), its contents.
type NodeFile struct {
	Path string `json:"path"`
	Mode uint32 `json:"mode,omitempty"`
	Data []byte `json:"data"`
}

// NodeLayer holds the non-secret per-node files (hostname, machine id, node.json). The
// agent adds the SSH host key it generates and the Credentials files.
type NodeLayer struct {
	Files []NodeFile `json:"files"`
}

// ClusterCheck is checked in the check step before anything is written: the claim's
// pinned KubernetesVersion must equal the kubeadm version the image's manifest declares
// (ReasonVersionMismatch).
type ClusterCheck struct {
	KubernetesVersion   string `json:"kubernetes_version"`
	ImageKubeadmVersion string `json:"image_kubeadm_version"`
}

// Credentials answers GET /v1/agent/credentials: the secret files of the per-node layer
// (join configuration with the cluster token, keys, the first-boot token file).
type Credentials struct {
	Files []NodeFile `json:"files"`
}

// LayerWritten is one layer as the verify step read it back: SHA256 of the Size bytes at
// Start (bytes from the disk's start).
type LayerWritten struct {
	Name   string `json:"name"`
	SHA256 string `json:"sha256"`
	Start  uint64 `json:"start"`
	Size   uint64 `json:"size_bytes"`
}

// BuildReport is the finalize report of a layered build: every layer written, the
// SHA-256 of the whole kiln-node partition as written, and the SSH host key fingerprint
// ("SHA256:…", as ssh-keygen -l prints it).
type BuildReport struct {
	Layers                []LayerWritten `json:"layers"`
	NodeLayerSHA256       string         `json:"node_layer_sha256"`
	SSHHostKeyFingerprint string         `json:"ssh_host_key_fingerprint"`
}

// First-boot phases and outcomes (FirstBootReport).
const (
	PhaseNodeLayer   = "node_layer"
	PhaseJoin        = "join"
	OutcomeSucceeded = "succeeded"
	OutcomeFailed    = "failed"
)

// MaxFirstBootMessageLen bounds FirstBootReport.Message (bytes).
const MaxFirstBootMessageLen = 256

// FirstBootReport is what the installed OS posts once at first boot.
type FirstBootReport struct {
	MachineID             string `json:"machine_id"`
	Phase                 string `json:"phase"`
	Outcome               string `json:"outcome"`
	Reason                Reason `json:"reason,omitempty"`
	Message               string `json:"message,omitempty"`
	Hostname              string `json:"hostname"`
	SSHHostKeyFingerprint string `json:"ssh_host_key_fingerprint"`
	NodeLayerSHA256       string `json:"node_layer_sha256"`
	BootID                string `json:"boot_id"`
}
