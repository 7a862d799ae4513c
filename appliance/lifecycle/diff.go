// The intended-vs-discovered hardware difference (DESIGN.md "The hardware
// difference"): computeDiff under the per-field policy. Pure functions.

package lifecycle

import (
	"fmt"
	"sort"
	"strconv"
	"strings"

	"kiln/api/agentapi"
	"kiln/store"
)

// hardwareFrom maps the agent's inventory to store.Hardware (MACs lower-case).
func hardwareFrom(inv agentapi.Inventory) store.Hardware {
	h := store.Hardware{
		Serial: strings.TrimSpace(inv.Serial), Vendor: strings.TrimSpace(inv.Vendor),
		Model: strings.TrimSpace(inv.Product), UUID: strings.TrimSpace(inv.UUID),
		CPUs: inv.CPUs, MemoryBytes: inv.MemoryBytes, BMCAddress: inv.BMCAddress,
	}
	for _, d := range inv.Disks {
		h.Disks = append(h.Disks, store.Disk{Name: d.Name, Serial: d.Serial, WWN: d.WWN, Model: d.Model,
			SizeBytes: d.SizeBytes, Rotational: d.Rotational, Removable: d.Removable})
	}
	for _, n := range inv.NICs {
		h.NICs = append(h.NICs, store.NIC{Name: n.Name, MAC: strings.ToLower(strings.TrimSpace(n.MAC)), LinkUp: n.LinkUp})
	}
	inspectionFrom(&h, inv) // issue 15: PCI, CPU flags, TPM (layers.go)
	return h
}

// computeDiff compares intended with discovered hardware under policy. A
// field with nothing intended is not compared. Fields:
// serial (case-insensitive), nics (every intended MAC must be present),
// disks (count of non-removable disks), memory (discovered may be up to tol
// below intended: firmware reserves some), cpus, vendor, model
// (case-insensitive), root_disk (RootDisk serial/WWN present).
func computeDiff(m store.Machine, d store.Hardware, policy map[string]Policy, tol float64) []store.FieldDiff {
	var out []store.FieldDiff
	add := func(field, intended, discovered string) {
		p := policy[field]
		if p == PolicyIgnore {
			return
		}
		out = append(out, store.FieldDiff{Field: field, Intended: intended, Discovered: discovered, Blocking: p == PolicyBlock})
	}
	in := m.Intended
	if in.Serial != "" && !strings.EqualFold(in.Serial, d.Serial) {
		add(FieldSerial, in.Serial, d.Serial)
	}
	if len(in.NICs) > 0 {
		have := map[string]bool{}
		var disc []string
		for _, n := range d.NICs {
			have[strings.ToLower(n.MAC)] = true
			disc = append(disc, strings.ToLower(n.MAC))
		}
		var want []string
		missing := false
		for _, n := range in.NICs {
			mac := strings.ToLower(n.MAC)
			want = append(want, mac)
			if !have[mac] {
				missing = true
			}
		}
		if missing {
			sort.Strings(want)
			sort.Strings(disc)
			add(FieldNICs, strings.Join(want, ","), strings.Join(disc, ","))
		}
	}
	if len(in.Disks) > 0 {
		n := 0
		for _, x := range d.Disks {
			if !x.Removable {
				n++
			}
		}
		if n != len(in.Disks) {
			add(FieldDisks, strconv.Itoa(len(in.Disks)), strconv.Itoa(n))
		}
	}
	if in.MemoryBytes > 0 {
		low := float64(in.MemoryBytes) * (1 - tol)
		if float64(d.MemoryBytes) < low || d.MemoryBytes > in.MemoryBytes+in.MemoryBytes/10 {
			add(FieldMemory, strconv.FormatUint(in.MemoryBytes, 10), strconv.FormatUint(d.MemoryBytes, 10))
		}
	}
	if in.CPUs > 0 && in.CPUs != d.CPUs {
		add(FieldCPUs, strconv.Itoa(in.CPUs), strconv.Itoa(d.CPUs))
	}
	if in.Vendor != "" && !strings.EqualFold(in.Vendor, d.Vendor) {
		add(FieldVendor, in.Vendor, d.Vendor)
	}
	if in.Model != "" && !strings.EqualFold(in.Model, d.Model) {
		add(FieldModel, in.Model, d.Model)
	}
	if m.RootDisk.Serial != "" || m.RootDisk.WWN != "" {
		found := false
		for _, x := range d.Disks {
			if (m.RootDisk.Serial != "" && strings.EqualFold(x.Serial, m.RootDisk.Serial)) ||
				(m.RootDisk.WWN != "" && strings.EqualFold(x.WWN, m.RootDisk.WWN)) {
				found = true
			}
		}
		if !found {
			add(FieldRootDisk, fmt.Sprintf("serial=%s wwn=%s", m.RootDisk.Serial, m.RootDisk.WWN), "absent")
		}
	}
	return out
}

func blocking(diff []store.FieldDiff) []string {
	var f []string
	for _, d := range diff {
		if d.Blocking {
			f = append(f, d.Field)
		}
	}
	return f
}
