package agentapi

// Issue 15 (build before boot): the wire types of releases, the per-node
// layer, the cluster check, the gated credentials and the first-boot
// report. Task, Report and Inventory carry them in their last fields
// (agentapi.go).
//
//	GET  {url}/v1/agent/credentials   (stage; per-boot token)      → Credentials
//	POST {url}/v1/agent/firstboot     FirstBootReport (bearer = the
//	                                  first-boot token of firstboot.json) → 204
//
// The first-boot token is not the per-boot token: the installed OS reads it
// from /etc/kiln/firstboot.json on its kiln-node partition; every node of
// the site accepts it (only its SHA-256 is stored, in Machine.Build).

// Layer is one layer the agent writes (Task.Layers, base first). The base
// layer (PartName "") is a whole GPT disk image written from the start of
// the disk; every other layer is a raw blob written into its own appended
// GPT partition named PartName ("kiln-layer-<name>"). SHA256 (hex) and
// Size (bytes) are the layer's raw content; URL is served by the appliance;
// Format is raw|gzip|zstd (only the base may be compressed). When is the
// manifest's selection rule and Reason why this machine got the layer.
// VerityRootHash (hex) and VerityHashOffset (bytes) locate the dm-verity
// tree the verify step checks with veritysetup.
type Layer struct {
	Name             string `json:"name"`
	URL              string `json:"url"`
	SHA256           string `json:"sha256"`
	Size             uint64 `json:"size_bytes"`
	Format           string `json:"format,omitempty"`
	When             string `json:"when"`
	Reason           string `json:"reason"`
	PartName         string `json:"part_name,omitempty"`
	VerityRootHash   string `json:"verity_root_hash,omitempty"`
	VerityHashOffset uint64 `json:"verity_hash_offset,omitempty"`
}

// NodeFile is one file of the per-node layer (the kiln-node ext4
// partition): absolute Path, Mode (permission bits, e.g. 0644; private
// keys 0600), Data (JSON: base64).
type NodeFile struct {
	Path string `json:"path"`
	Mode uint32 `json:"mode"`
	Data []byte `json:"data"`
}

// NodeLayer is the non-secret part of the per-node layer (Task.NodeLayer):
// /etc/hostname, /etc/kiln/machine-id, /etc/kiln/node.json. The agent adds
// the SSH host key it generates and the secret files of Credentials.
type NodeLayer struct {
	Files []NodeFile `json:"files"`
}

// ClusterCheck is what the check step compares before anything is written
// (Task.Cluster): the claim's pinned KubernetesVersion and the release's
// ImageKubeadmVersion. Unequal → the step fails with ReasonVersionMismatch.
type ClusterCheck struct {
	KubernetesVersion   string `json:"kubernetes_version"`
	ImageKubeadmVersion string `json:"image_kubeadm_version"`
}

// Credentials is GET /v1/agent/credentials: the secret files of the
// per-node layer (the first-boot token file, the kubeadm join or init
// configuration with the cluster token, the cluster CA), each 0600 unless
// public. Answered only while the machine's build is in a step and the
// credential gate passes (403 otherwise).
type Credentials struct {
	Files []NodeFile `json:"files"`
}

// LayerWritten is one layer as the agent read it back after writing:
// SHA256 (hex), Start and Size in bytes on the disk.
type LayerWritten struct {
	Name   string `json:"name"`
	SHA256 string `json:"sha256"`
	Start  uint64 `json:"start"`
	Size   uint64 `json:"size_bytes"`
}

// BuildReport is what the finalize report carries about the written disk
// (Report.Build): every layer as read back, the SHA-256 of the whole
// kiln-node partition as written, and the SSH host key fingerprint
// ("SHA256:…", as ssh-keygen -l prints it).
type BuildReport struct {
	Layers                []LayerWritten `json:"layers"`
	NodeLayerSHA256       string         `json:"node_layer_sha256"`
	SSHHostKeyFingerprint string         `json:"ssh_host_key_fingerprint"`
}

// First-boot phases and outcomes (FirstBootReport).
const (
	PhaseNodeLayer   = "node_layer" // the OS read its per-node layer
	PhaseJoin        = "join"       // the node joined (or made) its cluster
	OutcomeSucceeded = "succeeded"
	OutcomeFailed    = "failed"
)

// MaxFirstBootMessageLen bounds FirstBootReport.Message (bytes); longer is truncated by the receiver.
const MaxFirstBootMessageLen = 256

// FirstBootReport is the installed OS's one report (POST
// /v1/agent/firstboot): Phase and Outcome (the constants above), Reason
// (one of Reasons, empty on success), Message (sanitised and truncated to
// MaxFirstBootMessageLen by the receiver), and what the OS read from its
// per-node layer: Hostname, the SSH host key fingerprint of
// /etc/ssh/ssh_host_ed25519_key.pub, the kiln-node partition's SHA-256
// when it computed it, and BootID (/proc/sys/kernel/random/boot_id).
type FirstBootReport struct {
	MachineID             string `json:"machine_id"`
	Phase                 string `json:"phase"`
	Outcome               string `json:"outcome"`
	Reason                Reason `json:"reason,omitempty"`
	Message               string `json:"message,omitempty"`
	Hostname              string `json:"hostname"`
	SSHHostKeyFingerprint string `json:"ssh_host_key_fingerprint"`
	NodeLayerSHA256       string `json:"node_layer_sha256,omitempty"`
	BootID                string `json:"boot_id,omitempty"`
}

// FirstBootFile is the per-node layer's first-boot file
// (/etc/kiln/firstboot.json, 0600): where to report (URLs: the agent API
// base URLs of the site's nodes), the machine and the first-boot token.
type FirstBootFile struct {
	URLs      []string `json:"urls"`
	MachineID string   `json:"machine_id"`
	Token     string   `json:"token"`
}

// Paths of the per-node layer that the appliance and the OS agree on.
const (
	PathHostname   = "/etc/hostname"
	PathMachineID  = "/etc/kiln/machine-id"
	PathNodeJSON   = "/etc/kiln/node.json"
	PathFirstBoot  = "/etc/kiln/firstboot.json"
	PathSSHHostKey = "/etc/ssh/ssh_host_ed25519_key"
	PathKubeadm    = "/etc/kubernetes/kubeadm.yaml"
	PathClusterCA  = "/etc/kubernetes/pki/ca.crt"
)

// PCIDevice is one PCI function (Inventory.PCI, from /sys/bus/pci/devices):
// Address "0000:01:00.0", VendorID, DeviceID, Class the 24-bit class code
// (0x030000: VGA display controller).
type PCIDevice struct {
	Address  string `json:"address"`
	VendorID uint16 `json:"vendor_id"`
	DeviceID uint16 `json:"device_id"`
	Class    uint32 `json:"class"`
}

// TPMInfo is the TPM found (Inventory.TPM, from /sys/class/tpm): Version
// "2.0" or "1.2", Manufacturer.
type TPMInfo struct {
	Version      string `json:"version"`
	Manufacturer string `json:"manufacturer,omitempty"`
}

// Layer selection rule that always applies (Layer.When); the others are "role:NAME",
// "pci:VVVV/CC" and "cpu:FLAG|FLAG" (appliance/lifecycle layers.go).
const WhenAlways = "always"

// LayerPartPrefix prefixes the GPT partition name of every non-base layer.
const LayerPartPrefix = "kiln-layer-"

// Partition names of a built disk (the agent, cmd/kiln-agent/DESIGN.md "Layered build (issue 15)").
const (
	PartRoot       = "kiln-root"        // the base image's read-only root (the dm-verity data)
	PartRootVerity = "kiln-root-verity" // its hash tree, when not appended to kiln-root
	PartNode       = "kiln-node"        // the per-node ext4 file system (label kiln-node)
)

// EndpointFirstBoot is the appliance path of the first-boot report.
const EndpointFirstBoot = "/v1/agent/firstboot"

// firstBootReasons are the Reasons a failed first boot may carry.
var firstBootReasons = map[Reason]bool{ReasonFirstBootNodeLayer: true, ReasonFirstBootJoin: true}

// Validate is the sender's rule for a well-formed report (cmd/kiln-firstboot
// checks its own before it posts): a known phase and outcome, no reason on
// success and a first_boot_* reason on failure, a sanitized message of at
// most MaxFirstBootMessageLen bytes. The appliance is more tolerant: it
// sanitises and truncates what it receives (appliance/lifecycle
// firstboot.go checkFirstBoot).
func (r FirstBootReport) Validate() error {
	switch {
	case r.MachineID == "":
		return errFirstBoot("machine_id missing")
	case r.Phase != PhaseNodeLayer && r.Phase != PhaseJoin:
		return errFirstBoot("unknown phase " + SanitizeMessage(r.Phase, 32))
	case r.Outcome != OutcomeSucceeded && r.Outcome != OutcomeFailed:
		return errFirstBoot("unknown outcome " + SanitizeMessage(r.Outcome, 32))
	case r.Outcome == OutcomeSucceeded && r.Reason != ReasonNone:
		return errFirstBoot("a succeeded report carries no reason")
	case r.Outcome == OutcomeFailed && !firstBootReasons[r.Reason]:
		return errFirstBoot("a failed report needs a first_boot_* reason, not " + SanitizeMessage(string(r.Reason), 32))
	case r.Message != SanitizeMessage(r.Message, MaxFirstBootMessageLen):
		return errFirstBoot("message not sanitized or longer than 256 bytes")
	}
	return nil
}

type errFirstBoot string

func (e errFirstBoot) Error() string { return "firstboot report: " + string(e) }

// SanitizeMessage keeps printable ASCII (space to '~'), turns every other
// byte (newlines, control characters, non-ASCII) into '?', and cuts the
// result to max bytes.
func SanitizeMessage(s string, max int) string {
	b := []byte(s)
	if len(b) > max {
		b = b[:max]
	}
	for i, c := range b {
		if c < ' ' || c > '~' {
			b[i] = '?'
		}
	}
	return string(b)
}
