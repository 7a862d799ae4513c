package inventory

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"kiln/api/agentapi"
)

// The inventory fields of issue 15's layer choice: PCI functions, CPU flags and the TPM.
// Formats (kernel Documentation/ABI/testing/sysfs-bus-pci, sysfs-class-tpm; fs/proc
// cpuinfo of arch/x86/kernel/cpu/proc.c):
//   - /sys/bus/pci/devices/DDDD:BB:DD.F/{vendor,device} "0x10de\n", class "0x030200\n";
//   - /proc/cpuinfo: one block per logical CPU, the line "flags\t\t: fpu vme ...";
//   - /sys/class/tpm/tpmN/tpm_version_major "2\n" (kernel ≥ 5.6); a TPM 1.2 driver also
//     has device/caps with "Manufacturer: 0x49424d00" and "TCG version: 1.2".

// PCI lists root/sys/bus/pci/devices sorted by address. A missing tree (no PCI bus, a
// test root) is an empty list; an entry whose IDs do not parse is skipped.
func PCI(root string) ([]agentapi.PCIDevice, error) {
	dir := filepath.Join(root, "sys/bus/pci/devices")
	entries, err := os.ReadDir(dir)
	if err != nil {
		if os.IsNotExist(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("%w: %v", ErrNoSysfs, err)
	}
	var out []agentapi.PCIDevice
	for _, e := range entries {
		d, err := PCIDeviceAt(filepath.Join(dir, e.Name()), e.Name())
		if err != nil {
			continue
		}
		out = append(out, d)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Address < out[j].Address })
	return out, nil
}

// PCIDeviceAt reads one function's directory (named by its address).
func PCIDeviceAt(dir, address string) (agentapi.PCIDevice, error) {
	v, err := ParseHexID(readTrim(filepath.Join(dir, "vendor")), 16)
	if err != nil {
		return agentapi.PCIDevice{}, fmt.Errorf("%s vendor: %w", address, err)
	}
	d, err := ParseHexID(readTrim(filepath.Join(dir, "device")), 16)
	if err != nil {
		return agentapi.PCIDevice{}, fmt.Errorf("%s device: %w", address, err)
	}
	c, err := ParseHexID(readTrim(filepath.Join(dir, "class")), 24)
	if err != nil {
		return agentapi.PCIDevice{}, fmt.Errorf("%s class: %w", address, err)
	}
	return agentapi.PCIDevice{Address: address, VendorID: uint16(v), DeviceID: uint16(d), Class: uint32(c)}, nil
}

// ParseHexID parses a sysfs hex ID ("0x10de", surrounding space allowed) of at most bits bits.
func ParseHexID(s string, bits int) (uint64, error) {
	s = strings.TrimSpace(s)
	h, ok := strings.CutPrefix(s, "0x")
	if !ok || h == "" || len(h) > bits/4 {
		return 0, fmt.Errorf("not a %d-bit 0x hex ID: %q", bits, s)
	}
	return strconv.ParseUint(h, 16, bits)
}

// CPUFlags returns the flags of the first CPU in root/proc/cpuinfo (every logical CPU of
// an x86 machine lists the same), sorted and de-duplicated; none when unreadable.
func CPUFlags(root string) []string {
	f, err := os.Open(filepath.Join(root, "proc/cpuinfo"))
	if err != nil {
		return nil
	}
	defer f.Close()
	return ParseCPUFlags(f)
}

// ParseCPUFlags reads a /proc/cpuinfo text and returns the first "flags" line's words
// (x86; "Features" on arm64), sorted and de-duplicated.
func ParseCPUFlags(r io.Reader) []string {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		k = strings.TrimSpace(k)
		if k != "flags" && k != "Features" {
			continue
		}
		words := strings.Fields(v)
		if len(words) == 0 {
			return nil
		}
		sort.Strings(words)
		out := words[:1]
		for _, w := range words[1:] {
			if w != out[len(out)-1] {
				out = append(out, w)
			}
		}
		return out
	}
	return nil
}

// TPM describes the first TPM of root/sys/class/tpm (tpm0, else the lowest-numbered);
// nil when there is none.
func TPM(root string) *agentapi.TPMInfo {
	dir := filepath.Join(root, "sys/class/tpm")
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	var names []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), "tpm") && !strings.HasPrefix(e.Name(), "tpmrm") {
			names = append(names, e.Name())
		}
	}
	if len(names) == 0 {
		return nil
	}
	sort.Strings(names)
	d := filepath.Join(dir, names[0])
	info := &agentapi.TPMInfo{}
	if m := readTrim(filepath.Join(d, "tpm_version_major")); m != "" {
		switch m {
		case "2":
			info.Version = "2.0"
		case "1":
			info.Version = "1.2"
		default:
			info.Version = m
		}
	}
	if caps, err := os.ReadFile(filepath.Join(d, "device/caps")); err == nil {
		man, ver := ParseTPMCaps(caps)
		info.Manufacturer = man
		if info.Version == "" {
			info.Version = ver
		}
	}
	if info.Version == "" {
		// A TPM 2.0 driver of a kernel before 5.6 has neither file; TPM 1.2 drivers always
		// have caps.
		info.Version = "2.0"
	}
	return info
}

// ParseTPMCaps reads a TPM 1.2 driver's device/caps ("Manufacturer: 0x49424d00",
// "TCG version: 1.2") and returns the manufacturer as its four-character vendor string
// (trailing NULs and spaces dropped; the hex itself when not printable) and the version.
func ParseTPMCaps(b []byte) (manufacturer, version string) {
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		v = strings.TrimSpace(v)
		switch strings.TrimSpace(k) {
		case "Manufacturer":
			n, err := ParseHexID(v, 32)
			if err != nil {
				continue
			}
			manufacturer = VendorString(uint32(n))
			if manufacturer == "" {
				manufacturer = v
			}
		case "TCG version":
			version = v
		}
	}
	return manufacturer, version
}

// VendorString turns a TPM manufacturer ID (four ASCII bytes, big-endian, e.g.
// 0x49424d00 "IBM") into text; "" when a byte is not printable ASCII.
func VendorString(id uint32) string {
	b := []byte{byte(id >> 24), byte(id >> 16), byte(id >> 8), byte(id)}
	b = bytes.TrimRight(b, "\x00 ")
	for _, c := range b {
		if c < 0x20 || c > 0x7e {
			return ""
		}
	}
	return string(b)
}
