package vbmc_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"kiln/bmc"
	"kiln/deploy/lab/vbmc/vbmc"
)

// guestMemory reads size bytes of the running VM's physical memory at addr
// (QMP pmemsave into a file).
func guestMemory(ctx context.Context, t *testing.T, srv *vbmc.Server, addr uint64, size int) []byte {
	t.Helper()
	f := filepath.Join(t.TempDir(), fmt.Sprintf("mem-%x", addr))
	if _, err := vbmc.QMP(ctx, srv.QMPSocket(), "pmemsave", map[string]any{"val": addr, "size": size, "filename": f}); err != nil {
		t.Fatalf("pmemsave %#x: %v", addr, err)
	}
	b, err := os.ReadFile(f)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// smbiosBIOSVersion finds the SMBIOS entry point the guest firmware
// published in the F segment (DSP0134: "_SM_" 2.x, table address at 0x18,
// length at 0x16; "_SM3_" 3.x, address at 0x10, maximum size at 0x0C) and
// returns the Version string of the type 0 (BIOS Information) structure
// (string number at offset 0x05), or "" if none is published yet.
func smbiosBIOSVersion(ctx context.Context, t *testing.T, srv *vbmc.Server) string {
	t.Helper()
	fseg := guestMemory(ctx, t, srv, 0xF0000, 0x10000)
	var addr uint64
	var size int
	for off := 0; off+0x20 <= len(fseg); off += 16 {
		switch {
		case bytes.HasPrefix(fseg[off:], []byte("_SM3_")):
			addr, size = binary.LittleEndian.Uint64(fseg[off+0x10:]), int(binary.LittleEndian.Uint32(fseg[off+0x0C:]))
		case bytes.HasPrefix(fseg[off:], []byte("_SM_")):
			addr, size = uint64(binary.LittleEndian.Uint32(fseg[off+0x18:])), int(binary.LittleEndian.Uint16(fseg[off+0x16:]))
		default:
			continue
		}
		break
	}
	if addr == 0 || size <= 0 || size > 1<<20 {
		return ""
	}
	tab := guestMemory(ctx, t, srv, addr, size)
	for p := 0; p+4 <= len(tab); {
		typ, l := tab[p], int(tab[p+1])
		if l < 4 || p+l > len(tab) {
			return ""
		}
		strs := tab[p+l:]
		end := bytes.Index(strs, []byte{0, 0})
		if end < 0 {
			return ""
		}
		if typ == 0 && l > 5 {
			n := int(tab[p+5])
			for i, s := range strings.Split(string(strs[:end]), "\x00") {
				if i+1 == n {
					return s
				}
			}
			return ""
		}
		if typ == 127 {
			return ""
		}
		p += l + end + 2
	}
	return ""
}

// The must-show lab item with a real qemu VM behind the vbmc: the BIOS
// version changes through the vbmc's UpdateService (an image Kiln's HTTP
// server serves, SimpleUpdate, the task followed by Kiln's bmc.Controller)
// only after the reset, read back over Redfish AND from the guest firmware's
// SMBIOS table in the VM's memory; a BIOS attribute staged in the settings
// object is not applied while the VM runs and is applied by the reset (a
// new qemu process), read back changed only then. Runtime ≈ 10 s (TCG).
func TestFirmwareAndBIOSOnQEMU(t *testing.T) {
	args := qemuArgs(t)
	base := kilnHTTP(t, map[string][]byte{"bios-2.1.0.fw": vbmc.FirmwareImage("BIOS", "2.1.0", bytes.Repeat([]byte{0xEA}, 64<<10))})
	srv, tg := startVBMC(t, vbmc.Config{QEMUArgs: args, Serial: "KILN-FW-1", Model: "vbmc-fw", Manufacturer: "QEMU",
		FirmwareUpdateDuration: 500 * time.Millisecond}, nil)
	c := newController(t, bmc.Config{}, prometheus.NewRegistry())
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	start := time.Now()

	if err := c.Power(ctx, tg, bmc.ActionOn); err != nil {
		t.Fatal(err)
	}
	boots := srv.Boots()
	waitFor(t, "SeaBIOS on the first start", 30*time.Second, func() bool { return countIn(boots[0].Serial, "SeaBIOS (version") > 0 })
	var v string
	waitFor(t, "the guest's SMBIOS BIOS version", 30*time.Second, func() bool { v = smbiosBIOSVersion(ctx, t, srv); return v != "" })
	if v != "1.0.0" {
		t.Fatalf("guest SMBIOS BIOS version %q at the first start, want 1.0.0", v)
	}

	// the update: staged while the VM runs
	st, err := c.UpdateFirmware(ctx, tg, bmc.FirmwareUpdate{ImageURI: base + "/images/bios-2.1.0.fw",
		Target: "/redfish/v1/UpdateService/FirmwareInventory/BIOS", PollInterval: 100 * time.Millisecond})
	if err != nil || !st.NeedsReset() {
		t.Fatalf("UpdateFirmware: %+v, %v", st, err)
	}
	fc, err := c.FirmwareInventory(ctx, tg)
	if err != nil || component(t, fc, "BIOS").Version != "1.0.0" {
		t.Fatalf("before the reset: %+v, %v", fc, err)
	}
	if v := smbiosBIOSVersion(ctx, t, srv); v != "1.0.0" {
		t.Fatalf("guest sees %q before the reset", v)
	}
	// a BIOS attribute staged too: not applied while running
	if _, err := c.SetBIOSAttributes(ctx, tg, map[string]any{"ProcVirtualization": "Disabled"}); err != nil {
		t.Fatal(err)
	}
	if b, _ := c.BIOSAttributes(ctx, tg); b.Attributes["ProcVirtualization"] != "Enabled" || b.Pending["ProcVirtualization"] != "Disabled" {
		t.Fatalf("BIOS before the reset: %+v", b)
	}

	// the reset: ForceRestart with firmware staged restarts the qemu process
	if err := c.ResetSystem(ctx, tg); err != nil {
		t.Fatal(err)
	}
	boots = srv.Boots()
	if len(boots) != 2 || boots[1].PID == boots[0].PID || !strings.Contains(strings.Join(boots[1].Args, " "), "type=0,vendor=Kiln vbmc,version=2.1.0") {
		t.Fatalf("boots after the reset: %+v", boots)
	}
	waitFor(t, "SeaBIOS after the reset", 30*time.Second, func() bool { return countIn(boots[1].Serial, "SeaBIOS (version") > 0 })
	waitFor(t, "the guest's SMBIOS after the reset", 30*time.Second, func() bool { v = smbiosBIOSVersion(ctx, t, srv); return v != "" })
	if v != "2.1.0" {
		t.Fatalf("guest SMBIOS BIOS version %q after the reset, want 2.1.0", v)
	}
	fc, err = c.FirmwareInventory(ctx, tg)
	if err != nil || component(t, fc, "BIOS").Version != "2.1.0" {
		t.Fatalf("after the reset: %+v, %v", fc, err)
	}
	if b, err := c.BIOSAttributes(ctx, tg); err != nil || b.Attributes["ProcVirtualization"] != "Disabled" || len(b.Pending) != 0 {
		t.Fatalf("BIOS after the reset: %+v, %v", b, err)
	}
	// nothing staged: a reset is QMP system_reset in the same process, and changes nothing
	if err := c.ResetSystem(ctx, tg); err != nil {
		t.Fatal(err)
	}
	if b := srv.Boots(); len(b) != 2 {
		t.Fatalf("reset with nothing staged started a new process: %d boots", len(b))
	}
	if err := c.Power(ctx, tg, bmc.ActionOff); err != nil {
		t.Fatal(err)
	}
	t.Logf("BIOS 1.0.0 -> 2.1.0 and ProcVirtualization Enabled -> Disabled through the vbmc on qemu in %v", time.Since(start).Round(100*time.Millisecond))
}
