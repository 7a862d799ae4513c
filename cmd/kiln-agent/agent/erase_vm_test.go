package agent

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"kiln/api/agentapi"
	"kiln/deploy/lab/testreq"
)

// TestVMErase boots the in-RAM environment under TCG with four disks full of random
// data — virtio (KILNVM01), two namespaces of one NVMe controller (NVME0001, QEMU's
// emulated controller) and SATA on AHCI (SATA0001) — and gives the agent an erase task. Each disk gets the method its device
// offers and a certificate in the erase report: NVMe an NVMe method (QEMU's controller
// decides which, the test logs the Identify capabilities and every attempt); SATA the
// ATA IDENTIFY through SG_IO and, QEMU's IDE emulating no security feature set, the
// overwrite; virtio the overwrite. From the host afterwards: no 4 KiB block of the old
// data is left on any disk, and the NVMe disk reads zeros throughout (the device erased
// it: the overwrite would leave the pattern).
// The VM is QEMU's default i440FX machine; the NVMe controller sits on its PCI bus.
func TestVMErase(t *testing.T) {
	if testing.Short() {
		t.Skip("VM test skipped in -short mode")
	}
	testreq.Commands(t, "qemu-system-x86_64")
	kernel, initrd := envFiles(t)
	fa := newFakeAppliance(t)
	fa.tasks = []agentapi.Task{{Action: agentapi.ActionInspect, PollAfter: 300 * time.Millisecond},
		{Action: agentapi.ActionErase, PollAfter: 300 * time.Millisecond, Heartbeat: 2 * time.Second,
			ErasePolicy: &agentapi.ErasePolicy{Verify: agentapi.VerifySample, SampleBlocks: 256}}}
	u, _ := url.Parse(fa.srv.URL)
	guestURL := "http://10.0.2.2:" + u.Port()
	dir := t.TempDir()
	const size = 64 << 20
	files := map[string]string{}
	old := map[string][]byte{}
	for _, s := range []string{"KILNVM01", "NVME0001", "NVME0001-ns2", "SATA0001"} {
		b := make([]byte, size)
		if _, err := rand.Read(b); err != nil {
			t.Fatal(err)
		}
		files[s] = filepath.Join(dir, s+".raw")
		old[s] = b
		if err := os.WriteFile(files[s], b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	serial := filepath.Join(dir, "serial.log")
	args := []string{"-accel", "tcg", "-cpu", "max", "-m", "512", "-smp", "2", "-nodefaults", "-nographic", "-monitor", "none",
		"-serial", "file:" + serial, "-no-reboot", "-kernel", kernel, "-initrd", initrd,
		"-drive", "file=" + files["KILNVM01"] + ",format=raw,if=none,id=d0,cache=unsafe",
		"-device", "virtio-blk-pci,drive=d0,serial=KILNVM01",
		"-drive", "file=" + files["NVME0001"] + ",format=raw,if=none,id=d1,cache=unsafe",
		// One controller with two namespaces: each namespace is a disk, erased in turn.
		"-drive", "file=" + files["NVME0001-ns2"] + ",format=raw,if=none,id=d3,cache=unsafe",
		"-device", "nvme,id=nvme0,serial=NVME0001",
		"-device", "nvme-ns,drive=d1,bus=nvme0,nsid=1",
		"-device", "nvme-ns,drive=d3,bus=nvme0,nsid=2",
		"-device", "ahci,id=ahci0",
		"-drive", "file=" + files["SATA0001"] + ",format=raw,if=none,id=d2,cache=unsafe",
		"-device", "ide-hd,drive=d2,bus=ahci0.0,serial=SATA0001",
		"-netdev", "user,id=n0", "-device", "virtio-net-pci,netdev=n0",
		"-append", fmt.Sprintf("console=ttyS0,115200 quiet %s=%s %s=vm-1 %s=%s", agentapi.ArgURL, guestURL, agentapi.ArgMachine, agentapi.ArgToken, testToken)}
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Second)
	defer cancel()
	start := time.Now()
	out, err := exec.CommandContext(ctx, "qemu-system-x86_64", args...).CombinedOutput()
	elapsed := time.Since(start)
	log, _ := os.ReadFile(serial)
	t.Logf("qemu exited after %s (err %v) %s\nserial log:\n%s", elapsed.Round(time.Second), err, out, tail(string(log), 40))
	if ctx.Err() != nil {
		t.Fatal("VM timed out")
	}
	r, ok := fa.final(agentapi.StepErase)
	if !ok {
		t.Fatalf("no erase report; reports %+v", fa.Reports())
	}
	if r.State != agentapi.StateSucceeded {
		t.Errorf("erase step: %s %s: %s", r.State, r.Reason, r.Message)
	}
	certs := map[string]agentapi.DiskErase{}
	for _, c := range r.Erase {
		key := c.Serial
		if c.Name == "nvme0n2" {
			key += "-ns2"
		}
		certs[key] = c
		fmt.Printf("erase-vm: %s\n", certLine(c))
		for _, a := range c.Attempts {
			fmt.Printf("erase-vm:   attempt %s %s: %s\n", a.Method, a.Outcome, a.Message)
		}
	}
	for s := range files {
		c, ok := certs[s]
		if !ok {
			t.Errorf("no certificate for %s (got %+v)", s, r.Erase)
			continue
		}
		if c.Outcome != agentapi.EraseErased || !c.Verified || c.Coverage <= 0 || c.SizeBytes != size || c.Ended.Before(c.Started) {
			t.Errorf("%s: certificate %+v", s, c)
		}
	}
	if c := certs["KILNVM01"]; c.Method != agentapi.EraseOverwrite || c.Transport != "other" {
		t.Errorf("virtio: %s over %s", c.Method, c.Transport)
	}
	sata := certs["SATA0001"]
	if sata.Transport != "ata" || sata.Method != agentapi.EraseOverwrite || len(sata.Attempts) < 2 ||
		sata.Attempts[0].Outcome != agentapi.EraseUnsupported || !strings.Contains(sata.Attempts[0].Message, "IDENTIFY word 82=") {
		t.Errorf("sata: the ATA IDENTIFY path was not taken as expected: %+v", sata)
	}
	for ns, key := range []string{"NVME0001", "NVME0001-ns2"} {
		nvme := certs[key]
		if nvme.Transport != "nvme" || !strings.HasPrefix(nvme.Method, "nvme-") || !strings.Contains(nvme.Verification, "canary check") ||
			!strings.Contains(nvme.Reason, fmt.Sprintf("SANICAP=0x00000000; namespace %d ", ns+1)) {
			t.Errorf("nvme namespace %d: no NVMe method: %+v", ns+1, nvme)
		}
	}
	for s, f := range files {
		after, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if n, first := survivors(old[s], after); n != 0 {
			t.Errorf("%s: %d old 4 KiB blocks left, first at %d", s, n, first)
		}
		if !allZero(after[:1<<20]) || !allZero(after[size-1<<20:]) {
			t.Errorf("%s: first/last MiB not zeros", s)
		}
		if strings.HasPrefix(s, "NVME0001") && !bytes.Equal(after, make([]byte, size)) {
			t.Errorf("NVMe disk not all zeros after the device's erase")
		}
	}
	fmt.Printf("erase-vm: %d disks certified in one VM boot of %s\n", len(r.Erase), elapsed.Round(time.Second))
}
