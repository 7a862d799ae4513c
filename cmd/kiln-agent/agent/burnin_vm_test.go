package agent

import (
	"context"
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

// TestVMBurnIn (qemu): the built environment runs step burn_in in a VM
// (TCG, 2 vCPUs, 512 MiB), twice in one boot: the CPU test on both vCPUs,
// the memory test over 64 MiB and the NIC test on the provisioning NIC
// (qemu's default MAC) pass; then the disk test on a qemu blkdebug disk
// whose writes at 20 MiB fail with EIO (a VM disk with errors injected)
// fails the step with burnin_disk_failed. The poweroff task ends the VM.
// About 40 s under TCG (37 s measured), most of it the boot.
func TestVMBurnIn(t *testing.T) {
	if testing.Short() {
		t.Skip("VM test skipped in -short mode")
	}
	testreq.Commands(t, "qemu-system-x86_64")
	kernel, initrd := envFiles(t)
	fa := newFakeAppliance(t)
	u, _ := url.Parse(fa.srv.URL)
	guestURL := "http://10.0.2.2:" + u.Port()
	pol := agentapi.BurnInPolicy{Policy: "qemu", CPUTime: time.Second,
		MemoryFraction: 0.5, MemoryMaxBytes: 64 << 20, MemoryTime: time.Second,
		DiskBytes: 16 << 20, DiskRegions: 4, DiskTime: 30 * time.Second,
		NICs: agentapi.NICsProvisioning, NICWait: 10 * time.Second, ProvisioningMACs: []string{"52:54:00:12:34:56"}}
	healthy, faulty := pol, pol
	healthy.Tests, faulty.Tests = []string{"cpu", "memory", "nic"}, []string{"disk"}
	task := func(p *agentapi.BurnInPolicy) agentapi.Task {
		return agentapi.Task{Action: agentapi.ActionInspect, PollAfter: 300 * time.Millisecond, Heartbeat: time.Second,
			Disk: agentapi.DiskRule{Serial: "BADDISK1"}, BurnIn: p}
	}
	// Two burn-ins in one boot (the first answers the registration, the second a poll), then poweroff.
	fa.tasks = []agentapi.Task{task(&healthy), task(&faulty)}
	dir := t.TempDir()
	disk := filepath.Join(dir, "disk.raw")
	if err := os.WriteFile(disk, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(disk, 64<<20); err != nil {
		t.Fatal(err)
	}
	// Regions of 4 MiB at 0, 20, 40 and 60 MiB: the second covers sector 40960 (20 MiB).
	rules := filepath.Join(dir, "blkdebug.conf")
	if err := os.WriteFile(rules, []byte("[inject-error]\nevent = \"write_aio\"\niotype = \"write\"\nerrno = \"5\"\nsector = \"40960\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	serial := filepath.Join(dir, "serial.log")
	appendArgs := fmt.Sprintf("console=ttyS0,115200 quiet %s=%s %s=vm-1 %s=%s", agentapi.ArgURL, guestURL, agentapi.ArgMachine, agentapi.ArgToken, testToken)
	args := []string{"-accel", "tcg", "-cpu", "max", "-m", "512", "-smp", "2", "-nodefaults", "-nographic", "-monitor", "none",
		"-serial", "file:" + serial, "-no-reboot", "-kernel", kernel, "-initrd", initrd,
		"-drive", "file=blkdebug:" + rules + ":" + disk + ",format=raw,if=none,id=d0,cache=none",
		"-device", "virtio-blk-pci,drive=d0,serial=BADDISK1",
		"-netdev", "user,id=n0", "-device", "virtio-net-pci,netdev=n0",
		"-append", appendArgs}
	ctx, cancel := context.WithTimeout(context.Background(), 240*time.Second)
	defer cancel()
	start := time.Now()
	out, err := exec.CommandContext(ctx, "qemu-system-x86_64", args...).CombinedOutput()
	b, _ := os.ReadFile(serial)
	t.Logf("qemu exited after %s (err %v) %s\nserial log:\n%s", time.Since(start).Round(time.Second), err, out, tail(string(b), 40))
	if ctx.Err() != nil {
		t.Fatal("VM timed out")
	}
	var finals []agentapi.Report
	got := map[string]agentapi.BurnInTest{}
	for _, r := range fa.Reports() {
		if r.Step != agentapi.StepBurnIn || (r.State != agentapi.StateSucceeded && r.State != agentapi.StateFailed) || r.BurnIn == nil {
			continue
		}
		finals = append(finals, r)
		for _, x := range r.BurnIn.Tests {
			got[x.Name] = x
			t.Logf("%s: passed=%v skipped=%v %s bytes=%d iterations=%d %s", x.Name, x.Passed, x.Skipped, x.Duration.Round(time.Millisecond), x.Bytes, x.Iterations, x.Error)
		}
	}
	if len(finals) != 2 || finals[0].State != agentapi.StateSucceeded || finals[1].State != agentapi.StateFailed ||
		finals[1].Reason != agentapi.ReasonBurnInDisk {
		t.Fatalf("burn_in finals %+v, want succeeded (cpu, memory, nic) then failed burnin_disk_failed", finals)
	}
	if c := got["cpu"]; !c.Passed || c.Iterations < 2 {
		t.Errorf("cpu in the VM: %+v", c)
	}
	if m := got["memory"]; !m.Passed || m.Bytes != 64<<20 {
		t.Errorf("memory in the VM: %+v", m)
	}
	if d := got["disk"]; d.Passed || !strings.Contains(d.Error, "write /dev/vda at offset 20971520") {
		t.Errorf("disk in the VM: %+v, want the write at 20 MiB failing", d)
	}
	if n := got["nic"]; !n.Passed || n.Iterations != 1 {
		t.Errorf("nic in the VM: %+v", n)
	}
	beats := 0
	for _, x := range fa.Reports() {
		if x.Step == agentapi.StepBurnIn && x.State == agentapi.StateRunning {
			beats++
		}
	}
	if beats == 0 {
		t.Error("no burn_in heartbeat from the VM")
	}
}
