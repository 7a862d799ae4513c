package store

import (
	"encoding/json"
	"fmt"
)

// Release manifests (issue 15): an image record that carries Layers is a
// release. Its base layer is the image's own file (a whole GPT disk image);
// every other layer is a raw blob (a filesystem image) that the agent
// writes into its own appended GPT partition. Each layer other than the
// base is itself an image record of the catalog (Layer.Image), so its file
// is served and replicated to every node like any image
// (appliance/imagesync.go). The manifest is written only by put_image_v2
// (command 32); put_image (7) keeps the stored manifest (keepManifest), as
// a node that predates it does.

// Layer selection rules (Layer.When; appliance/lifecycle/layers.go applies them).
const (
	LayerAlways       = "always"             // every machine (the base layer)
	LayerControlPlane = "role:control-plane" // claims whose cluster role is init or control-plane
	LayerNvidiaGPU    = "pci:10de/03"        // inspection found PCI vendor 0x10de of class 0x03xxxx (display/3D)
	LayerVirt         = "cpu:vmx|svm"        // the CPU flags include vmx or svm (hardware virtualization)
)

// LayerWhens lists every Layer.When value.
var LayerWhens = []string{LayerAlways, LayerControlPlane, LayerNvidiaGPU, LayerVirt}

// BaseLayer is the name of a release's base layer (its first).
const BaseLayer = "base"

// LayerPartPrefix prefixes the GPT partition name of a non-base layer.
const LayerPartPrefix = "kiln-layer-"

// Layer is one layer of a release manifest. Name is 1..32 of [a-z0-9-];
// Image is the catalog image whose file is the layer (the release's own ID
// for the base layer); SHA256 (hex) and Size (bytes) pin that content and
// are copied from the layer's image record when the manifest is
// registered. PartName is the GPT partition the agent writes it to
// (LayerPartPrefix + Name; empty for the base layer, which is the whole
// disk image). VerityRootHash (hex) and VerityHashOffset (bytes into the
// layer's data partition where the dm-verity hash tree starts; 0 = a
// separate hash partition, see the OS image's documentation) let the agent
// check the read-only root with veritysetup before the reboot.
type Layer struct {
	Name             string `json:"name"`
	Image            string `json:"image"`
	SHA256           string `json:"sha256"`
	Size             uint64 `json:"size_bytes"`
	When             string `json:"when"`
	PartName         string `json:"part_name,omitempty"`
	VerityRootHash   string `json:"verity_root_hash,omitempty"`
	VerityHashOffset uint64 `json:"verity_hash_offset,omitempty"`
}

// IsRelease reports whether im carries a release manifest.
func (im *Image) IsRelease() bool { return len(im.Layers) > 0 }

// keepManifest is put_image's (command 7) rule on a node that knows
// put_image_v2: the manifest is what the stored record holds (none on
// create), whatever the command carries.
func keepManifest(a *applyCtx, im *Image) error {
	im.Layers, im.KubeadmVersion = nil, ""
	if im.ID == "" {
		return nil
	}
	cur := a.tx.Bucket(bImages).Get([]byte(im.ID))
	if cur == nil {
		return nil
	}
	var old Image
	if err := json.Unmarshal(cur, &old); err != nil {
		return fmt.Errorf("%w: stored image %s: %v", ErrCorrupt, im.ID, err)
	}
	im.Layers, im.KubeadmVersion = old.Layers, old.KubeadmVersion
	return nil
}

// ClusterSpec is a claim's cluster block (issue 15; the Kairos
// provider-kubernetes fields): Role init, control-plane or worker;
// ControlPlaneHost the API server's host:port (a bare host gets :6443);
// KubernetesVersion pinned, which must equal the release's kubeadm version
// (the build's check step fails with version_mismatch otherwise). The
// cluster token is never in the record: it is sealed with the site key and
// stored as a secret under TokenRef (lifecycle); Token carries it from the
// request to the lifecycle in memory only (it is never encoded: no log
// entry, record or view holds it). TokenWeak records that its estimated
// entropy was below 128 bits when it was set.
//
// Kept only by put_machines_v4 (30): an older machine command keeps the
// stored claim's block (keepV4Fields).
type ClusterSpec struct {
	Role              string `json:"role"`
	ControlPlaneHost  string `json:"control_plane_host,omitempty"`
	KubernetesVersion string `json:"kubernetesVersion"`
	TokenRef          string `json:"token_ref,omitempty"`
	TokenWeak         bool   `json:"token_weak,omitempty"`
	Token             string `json:"-"`
}

// PCIDevice is one PCI function found by inspection: Address
// ("0000:01:00.0"), VendorID and DeviceID, Class the 24-bit class code
// (0x030000: VGA display controller).
type PCIDevice struct {
	Address  string `json:"address"`
	VendorID uint16 `json:"vendor_id"`
	DeviceID uint16 `json:"device_id"`
	Class    uint32 `json:"class"`
}

// TPMInfo is the TPM found by inspection: Version ("2.0") and Manufacturer.
type TPMInfo struct {
	Version      string `json:"version"`
	Manufacturer string `json:"manufacturer,omitempty"`
}
