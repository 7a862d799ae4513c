package inventory

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"kiln/api/agentapi"
)

// Sentinel errors of this package.
var (
	// ErrNoSysfs is returned when the sysfs tree (root/sys) cannot be read.
	ErrNoSysfs = errors.New("inventory: sysfs not readable")
	// ErrMeminfo is returned when /proc/meminfo has no MemTotal line.
	ErrMeminfo = errors.New("inventory: no MemTotal in meminfo")
)

// HealthNotReported is Disk.Health for a disk that offers no health data (e.g. virtio).
const HealthNotReported = "not_reported"

// Collect returns the whole inventory below root ("/" on a live system). A missing DMI
// tree is not an error (virtual machines without SMBIOS); a missing /sys/block is.
func Collect(root string) (agentapi.Inventory, error) {
	var inv agentapi.Inventory
	dmi := filepath.Join(root, "sys/class/dmi/id")
	inv.Vendor = readTrim(filepath.Join(dmi, "sys_vendor"))
	inv.Product = readTrim(filepath.Join(dmi, "product_name"))
	inv.Serial = readTrim(filepath.Join(dmi, "product_serial"))
	inv.UUID = strings.ToLower(readTrim(filepath.Join(dmi, "product_uuid")))
	inv.CPUs = CPUs(root)
	mem, err := MemoryBytes(root)
	if err != nil {
		return inv, err
	}
	inv.MemoryBytes = mem
	if inv.Disks, err = Disks(root); err != nil {
		return inv, err
	}
	if inv.NICs, err = NICs(root); err != nil {
		return inv, err
	}
	inv.CPUFlags = CPUFlags(root)
	inv.TPM = TPM(root)
	if inv.PCI, err = PCI(root); err != nil {
		return inv, err
	}
	return inv, nil
}

// CPUs counts the online logical CPUs from root/sys/devices/system/cpu/online
// (a list such as "0-3,6"); 0 when unreadable.
func CPUs(root string) int {
	return countCPUList(readTrim(filepath.Join(root, "sys/devices/system/cpu/online")))
}

func countCPUList(s string) int {
	n := 0
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		if err != nil {
			return 0
		}
		if !isRange {
			n++
			continue
		}
		b, err := strconv.Atoi(hi)
		if err != nil || b < a {
			return 0
		}
		n += b - a + 1
	}
	return n
}

// MemoryBytes returns MemTotal of root/proc/meminfo in bytes.
func MemoryBytes(root string) (uint64, error) {
	f, err := os.Open(filepath.Join(root, "proc/meminfo"))
	if err != nil {
		return 0, fmt.Errorf("%w: %v", ErrMeminfo, err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 2 && fields[0] == "MemTotal:" {
			kb, err := strconv.ParseUint(fields[1], 10, 64)
			if err != nil {
				return 0, fmt.Errorf("%w: %v", ErrMeminfo, err)
			}
			return kb * 1024, nil
		}
	}
	return 0, ErrMeminfo
}

// skipDisk reports block devices that are never install targets: loop, ram, zram,
// device-mapper, md, optical and floppy devices.
func skipDisk(name string) bool {
	for _, p := range []string{"loop", "ram", "zram", "dm-", "md", "sr", "fd", "nbd"} {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

// Disks lists whole disks under root/sys/block with Path under /dev, sorted by name.
// Health is HealthNotReported: SMART/NVMe health needs device ioctls and is filled in
// by the caller where available.
func Disks(root string) ([]agentapi.Disk, error) {
	entries, err := os.ReadDir(filepath.Join(root, "sys/block"))
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNoSysfs, err)
	}
	disks := []agentapi.Disk{}
	for _, e := range entries {
		if skipDisk(e.Name()) {
			continue
		}
		d := DiskAt(root, e.Name())
		if d.SizeBytes == 0 {
			continue // empty card reader, ejected media
		}
		disks = append(disks, d)
	}
	sort.Slice(disks, func(i, j int) bool { return disks[i].Name < disks[j].Name })
	return disks, nil
}

// DiskAt describes one block device root/sys/block/NAME (any kind, loop devices included).
func DiskAt(root, name string) agentapi.Disk {
	dir := filepath.Join(root, "sys/block", name)
	d := agentapi.Disk{Name: name, Path: "/dev/" + name, Health: HealthNotReported}
	if sectors, err := strconv.ParseUint(readTrim(filepath.Join(dir, "size")), 10, 64); err == nil {
		d.SizeBytes = sectors * 512 // the block layer's size file is in 512-byte units
	}
	d.Model = readTrim(filepath.Join(dir, "device/model"))
	d.Serial = firstNonEmpty(readTrim(filepath.Join(dir, "device/serial")), readTrim(filepath.Join(dir, "serial")),
		vpdSerial(filepath.Join(dir, "device/vpd_pg80")))
	d.WWN = firstNonEmpty(readTrim(filepath.Join(dir, "wwid")), readTrim(filepath.Join(dir, "device/wwid")))
	d.Rotational = readTrim(filepath.Join(dir, "queue/rotational")) == "1"
	d.Removable = readTrim(filepath.Join(dir, "removable")) == "1"
	return d
}

// NICs lists Ethernet interfaces (type 1) under root/sys/class/net with lower-case MACs.
func NICs(root string) ([]agentapi.NIC, error) {
	base := filepath.Join(root, "sys/class/net")
	entries, err := os.ReadDir(base)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNoSysfs, err)
	}
	nics := []agentapi.NIC{}
	for _, e := range entries {
		dir := filepath.Join(base, e.Name())
		if readTrim(filepath.Join(dir, "type")) != "1" || e.Name() == "lo" {
			continue
		}
		mac := strings.ToLower(readTrim(filepath.Join(dir, "address")))
		if mac == "" || mac == "00:00:00:00:00:00" {
			continue
		}
		nics = append(nics, agentapi.NIC{
			Name:   e.Name(),
			MAC:    mac,
			LinkUp: readTrim(filepath.Join(dir, "operstate")) == "up" || readTrim(filepath.Join(dir, "carrier")) == "1",
		})
	}
	sort.Slice(nics, func(i, j int) bool { return nics[i].Name < nics[j].Name })
	return nics, nil
}

// vpdSerial reads a SCSI Unit Serial Number VPD page (80h, SPC-5 §7.7.18): a 4-byte header
// (byte 3 = page length) followed by the ASCII serial number.
func vpdSerial(path string) string {
	b, err := os.ReadFile(path)
	if err != nil || len(b) < 4 || b[1] != 0x80 {
		return ""
	}
	n := int(b[3])
	if 4+n > len(b) {
		n = len(b) - 4
	}
	return strings.TrimSpace(strings.Trim(string(b[4:4+n]), "\x00"))
}

func readTrim(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

func firstNonEmpty(s ...string) string {
	for _, v := range s {
		if v != "" {
			return v
		}
	}
	return ""
}
