// Layer choice (issue 15): which layers of a release a machine gets, and
// why. The one home of the rules: chooseLayers applies each layer's When
// (store.LayerWhens) to the claim and the discovered hardware, and every
// choice and skip carries its reason, recorded in Machine.Build. The
// inspection fields the rules read (PCI devices, CPU flags, TPM) come from
// the agent's inventory (inspectionFrom).

package lifecycle

import (
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strings"

	"kiln/api/agentapi"
	"kiln/appliance/lifecycle/rules"
	"kiln/store"
)

// PCI identifiers the layer rules read.
const (
	pciVendorNVIDIA = 0x10de
	pciClassDisplay = 0x03 // base class: display controller (VGA, XGA, 3D)
)

// Inventory bounds: what inspectionFrom keeps of an agent's report.
const (
	maxPCIDevices = 1024
	maxCPUFlags   = 1024
)

var cpuFlagRe = regexp.MustCompile(`^[a-z0-9_.]{1,64}$`)

// inspectionFrom copies the inventory's issue-15 fields into h, bounded
// and sanitised: PCI devices (at most maxPCIDevices; the address as text
// of at most 32 bytes), CPU flags (lower-cased, deduplicated, sorted; only
// [a-z0-9_.]), the TPM (version and manufacturer sanitised).
func inspectionFrom(h *store.Hardware, inv agentapi.Inventory) {
	for i, d := range inv.PCI {
		if i == maxPCIDevices {
			break
		}
		h.PCI = append(h.PCI, store.PCIDevice{Address: truncate(sanitize(d.Address), 32), VendorID: d.VendorID,
			DeviceID: d.DeviceID, Class: d.Class & 0xffffff})
	}
	seen := map[string]bool{}
	for _, f := range inv.CPUFlags {
		f = strings.ToLower(strings.TrimSpace(f))
		if cpuFlagRe.MatchString(f) && !seen[f] && len(seen) < maxCPUFlags {
			seen[f] = true
			h.CPUFlags = append(h.CPUFlags, f)
		}
	}
	sort.Strings(h.CPUFlags)
	if inv.TPM != nil {
		h.TPM = &store.TPMInfo{Version: truncate(sanitize(inv.TPM.Version), 16),
			Manufacturer: truncate(sanitize(inv.TPM.Manufacturer), 64)}
	}
}

// chooseLayers applies the release's layers to machine m (its claim and
// discovered hardware): chosen (base first, in manifest order) and
// skipped, each with its reason.
//
//   - always: chosen ("always").
//   - role:control-plane: chosen when the claim's cluster block has role
//     init or control-plane, or (no cluster block) the claim's role is
//     control-plane.
//   - pci:10de/03: chosen when a discovered PCI device has vendor 0x10de
//     and base class 0x03 (display/3D); the reason names the device.
//   - cpu:vmx|svm: chosen when the discovered CPU flags include vmx
//     (Intel VT-x) or svm (AMD-V).
//
// A machine not inspected for a field (no PCI list, no CPU flags) gets the
// layer skipped with a reason that says so.
func chooseLayers(img store.Image, m store.Machine) (chosen, skipped []store.BuildLayer) {
	for _, l := range img.Layers {
		ok, why := layerApplies(l.When, m)
		bl := store.BuildLayer{Name: l.Name, Image: l.Image, SHA256: l.SHA256, Size: l.Size, PartName: l.PartName, Reason: why}
		if ok {
			chosen = append(chosen, bl)
		} else {
			skipped = append(skipped, bl)
		}
	}
	return chosen, skipped
}

// layerApplies is one rule of chooseLayers.
func layerApplies(when string, m store.Machine) (bool, string) {
	hw := m.Discovered
	switch when {
	case store.LayerAlways:
		return true, "always"
	case store.LayerControlPlane:
		if m.Claim == nil {
			return false, "no claim"
		}
		if cl := m.Claim.Cluster; cl != nil {
			if cl.Role == rules.ClusterInit || cl.Role == rules.ClusterControlPlane {
				return true, "claim cluster role " + cl.Role
			}
			return false, "claim cluster role " + cl.Role
		}
		if m.Claim.Role == rules.ClusterControlPlane {
			return true, "claim role control-plane"
		}
		return false, fmt.Sprintf("claim role %q is not control-plane", m.Claim.Role)
	case store.LayerNvidiaGPU:
		if hw == nil || len(hw.PCI) == 0 {
			return false, "no PCI devices in the inspection"
		}
		for _, d := range hw.PCI {
			if d.VendorID == pciVendorNVIDIA && d.Class>>16 == pciClassDisplay {
				return true, fmt.Sprintf("pci %s %04x:%04x class 0x%06x (NVIDIA display/3D)", d.Address, d.VendorID, d.DeviceID, d.Class)
			}
		}
		return false, fmt.Sprintf("no PCI device of vendor 10de with class 03xxxx among %d", len(hw.PCI))
	case store.LayerVirt:
		if hw == nil || len(hw.CPUFlags) == 0 {
			return false, "no CPU flags in the inspection"
		}
		for _, f := range []string{"vmx", "svm"} {
			if slices.Contains(hw.CPUFlags, f) {
				return true, "cpu flag " + f
			}
		}
		return false, "cpu flags include neither vmx nor svm"
	}
	return false, fmt.Sprintf("unknown rule %q", when)
}
