package inventory

import (
	"os"
	"path/filepath"
	"testing"
)

func write(t *testing.T, root, rel, content string) {
	t.Helper()
	p := filepath.Join(root, rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestCollectSynthetic(t *testing.T) {
	r := t.TempDir()
	write(t, r, "sys/class/dmi/id/sys_vendor", "QEMU")
	write(t, r, "sys/class/dmi/id/product_name", "Standard PC")
	write(t, r, "sys/class/dmi/id/product_serial", "SN123")
	write(t, r, "sys/class/dmi/id/product_uuid", "5E1F0000-0000-4000-8000-525400990001")
	write(t, r, "sys/devices/system/cpu/online", "0-3,6")
	write(t, r, "proc/meminfo", "MemTotal:        2048 kB\nMemFree: 1 kB")
	write(t, r, "sys/block/vda/size", "2097152")
	write(t, r, "sys/block/vda/serial", "KILN0001")
	write(t, r, "sys/block/vda/queue/rotational", "0")
	write(t, r, "sys/block/vda/removable", "0")
	write(t, r, "sys/block/sda/size", "4194304")
	write(t, r, "sys/block/sda/device/model", "HDD")
	write(t, r, "sys/block/sda/device/wwid", "naa.5000c500a1b2c3d4")
	write(t, r, "sys/block/sda/queue/rotational", "1")
	write(t, r, "sys/block/sdb/size", "100")
	write(t, r, "sys/block/sdb/device/model", "QEMU HARDDISK")
	if err := os.WriteFile(filepath.Join(r, "sys/block/sdb/device/vpd_pg80"), append([]byte{0, 0x80, 0, 8}, "SATA0001"...), 0o644); err != nil {
		t.Fatal(err)
	}
	write(t, r, "sys/block/loop0/size", "100")
	write(t, r, "sys/block/sr0/size", "100")
	write(t, r, "sys/class/net/eth0/type", "1")
	write(t, r, "sys/class/net/eth0/address", "52:54:00:AA:BB:CC")
	write(t, r, "sys/class/net/eth0/operstate", "up")
	write(t, r, "sys/class/net/lo/type", "772")
	write(t, r, "sys/class/net/lo/address", "00:00:00:00:00:00")

	inv, err := Collect(r)
	if err != nil {
		t.Fatal(err)
	}
	if inv.Vendor != "QEMU" || inv.Serial != "SN123" || inv.UUID != "5e1f0000-0000-4000-8000-525400990001" {
		t.Errorf("dmi: %+v", inv)
	}
	if inv.CPUs != 5 || inv.MemoryBytes != 2048*1024 {
		t.Errorf("cpus %d mem %d", inv.CPUs, inv.MemoryBytes)
	}
	if len(inv.Disks) != 3 || inv.Disks[0].Name != "sda" || inv.Disks[2].Name != "vda" {
		t.Fatalf("disks: %+v", inv.Disks)
	}
	sda, vda := inv.Disks[0], inv.Disks[2]
	if inv.Disks[1].Serial != "SATA0001" {
		t.Errorf("sdb serial from VPD 80h: %q", inv.Disks[1].Serial)
	}
	if !sda.Rotational || sda.WWN != "naa.5000c500a1b2c3d4" || sda.SizeBytes != 4194304*512 || sda.Model != "HDD" {
		t.Errorf("sda: %+v", sda)
	}
	if vda.Serial != "KILN0001" || vda.Rotational || vda.Path != "/dev/vda" || vda.Health != HealthNotReported {
		t.Errorf("vda: %+v", vda)
	}
	if len(inv.NICs) != 1 || inv.NICs[0].MAC != "52:54:00:aa:bb:cc" || !inv.NICs[0].LinkUp {
		t.Errorf("nics: %+v", inv.NICs)
	}
}

func TestCountCPUList(t *testing.T) {
	for in, want := range map[string]int{"0": 1, "0-1": 2, "0-3,8-9": 6, "": 0, "x": 0, "3-1": 0} {
		if got := countCPUList(in); got != want {
			t.Errorf("%q: got %d want %d", in, got, want)
		}
	}
}

// TestCollectLive runs against this machine's own /sys and /proc.
func TestCollectLive(t *testing.T) {
	inv, err := Collect("/")
	if err != nil {
		t.Fatal(err)
	}
	if inv.CPUs < 1 || inv.MemoryBytes == 0 {
		t.Errorf("live inventory: cpus %d mem %d", inv.CPUs, inv.MemoryBytes)
	}
}
