package agent

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"kiln/api/agentapi"
	"kiln/deploy/lab/testreq"
)

// TestDiskRegions: regions are aligned, inside the disk, first at 0 and
// last ending at the disk's end.
func TestDiskRegions(t *testing.T) {
	offs := diskRegions(64<<20, 2<<20, 4)
	if fmt.Sprint(offs) != fmt.Sprint([]int64{0, 20 << 20, 41 << 20, 62 << 20}) {
		t.Fatalf("regions %v", offs)
	}
	if got := diskRegions(1<<20, 4<<20, 8); fmt.Sprint(got) != "[0]" {
		t.Fatalf("a disk smaller than a region: %v", got)
	}
}

// TestDiskBurnInLoop (root, loop devices): a healthy loop device passes
// the write/read-back; 4 KiB of the backing file changed between the
// write and the read-back (a medium that does not keep what it was given)
// is a mismatch at that offset.
func TestDiskBurnInLoop(t *testing.T) {
	testreq.Root(t, "loop devices", "losetup")
	dev, file := newLoop(t, 64<<20, nil)
	r := DiskBurnIn(context.Background(), dev, 2<<20, 4, time.Minute, 7, nil, nil)
	if r.Err != nil || r.Bytes != 8<<20 || r.Regions != 4 {
		t.Fatalf("healthy loop: %+v", r)
	}
	if b, err := os.ReadFile(file); err != nil || strings.Trim(string(b), "\x00") != "" {
		t.Fatalf("after a passing test the disk is not zeroed again (%v)", err)
	}
	var corrupted int64
	r = DiskBurnIn(context.Background(), dev, 2<<20, 4, time.Minute, 8, func(offs []int64) {
		corrupted = offs[2] + 5*4096
		f, err := os.OpenFile(file, os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if _, err := f.WriteAt(make([]byte, 4096), corrupted); err != nil {
			t.Fatal(err)
		}
	}, nil)
	if r.Err == nil || !strings.Contains(r.Err.Error(), fmt.Sprintf("mismatch on %s at offset %d:", dev, corrupted)) || r.Regions != 2 {
		t.Fatalf("corrupted block at %d: %+v", corrupted, r)
	}
	t.Logf("corruption: %v", r.Err)
}

// faultyLoop is a loop device of size bytes whose backing file lies in a
// tmpfs of room bytes (room < size): writes past what the tmpfs can hold
// fail in the kernel (ENOSPC from the backing file, an I/O error of the
// block device), a disk that fails over part of itself.
func faultyLoop(t *testing.T, size, room int64) string {
	t.Helper()
	testreq.Root(t, "loop devices and a tmpfs mount", "losetup", "mount", "umount")
	dir := t.TempDir()
	run(t, "mount", "-t", "tmpfs", "-o", fmt.Sprintf("size=%d", room), "kiln-burnin-test", dir)
	t.Cleanup(func() { _ = exec.Command("umount", dir).Run() })
	file := filepath.Join(dir, "disk.img")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(file, size); err != nil {
		t.Fatal(err)
	}
	dev := strings.TrimSpace(run(t, "losetup", "-f", "--show", file))
	t.Cleanup(func() { detachLoop(dev, file) }) // before the umount (cleanups run last-in first-out)
	return dev
}

// TestDiskBurnInWriteFault (root): the write test on a loop device that
// stops taking writes after 8 of its 64 MiB fails with the kernel's error
// and the offset it happened at.
func TestDiskBurnInWriteFault(t *testing.T) {
	dev := faultyLoop(t, 64<<20, 8<<20)
	r := DiskBurnIn(context.Background(), dev, 4<<20, 8, time.Minute, 9, nil, nil)
	if r.Err == nil || !strings.Contains(r.Err.Error(), "write "+dev+" at offset ") {
		t.Fatalf("faulty loop: %+v, want a write error", r)
	}
	t.Logf("write fault: %v", r.Err)
}

// TestDiskBurnInDeviceMapper (root, device-mapper): dm-error over 8 MiB in
// the middle of a loop device: the write test fails at an offset inside
// that range. The kernel must have device-mapper (dm-mod): a kernel without
// it (some CI VMs' kernels, which install-deps cannot change) skips.
func TestDiskBurnInDeviceMapper(t *testing.T) {
	testreq.Root(t, "loop devices and device-mapper", "losetup", "dmsetup")
	if out, err := exec.Command("dmsetup", "version").CombinedOutput(); err != nil || !strings.Contains(string(out), "Driver version") {
		t.Skipf("the running kernel has no device-mapper driver (dmsetup version: %v: %s); the dm-free fault tests TestDiskBurnInWriteFault and TestServeBurnInDiskFault cover the failure path", err, strings.TrimSpace(string(out)))
	}
	loop, _ := newLoop(t, 64<<20, nil)
	name := fmt.Sprintf("kiln-burnin-%d", os.Getpid())
	// Sectors of 512 bytes: linear 0-24 MiB, error 24-32 MiB, linear 32-64 MiB.
	table := fmt.Sprintf("0 49152 linear %s 0\n49152 16384 error\n65536 65536 linear %s 65536\n", loop, loop)
	cmd := exec.Command("dmsetup", "create", name)
	cmd.Stdin = strings.NewReader(table)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("dmsetup create: %v\n%s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("dmsetup", "remove", "--retry", name).Run() })
	dev := "/dev/mapper/" + name
	r := DiskBurnIn(context.Background(), dev, 2<<20, 4, time.Minute, 10, nil, nil) // regions at 0, 20, 41, 62 MiB
	if r.Err == nil || !strings.Contains(r.Err.Error(), "write "+dev+" at offset ") {
		t.Fatalf("dm-error: %+v, want a write error", r)
	}
	t.Logf("dm-error: %v", r.Err)
}

// TestBurnInDiskStep (root): through step burn_in, the disk test writes
// the target disk only before it holds anything: a disk holding a
// partition table is skipped (the check step's foreign-OS rule) unless the
// machine is marked for wipe, and the faulty disk fails the step with
// burnin_disk_failed.
func TestBurnInDiskStep(t *testing.T) {
	testreq.Root(t, "loop devices", "losetup", "sfdisk", "mkfs.ext4")
	task := func(wipe bool) agentapi.Task {
		return agentapi.Task{Action: agentapi.ActionInspect, PollAfter: 1e7, Wipe: wipe,
			BurnIn: &agentapi.BurnInPolicy{Policy: "t", Tests: []string{agentapi.BurnInDisk}, DiskBytes: 8 << 20, DiskRegions: 4, DiskTime: time.Minute}}
	}
	state := func(t *testing.T, dev string, tk agentapi.Task) (agentapi.Report, agentapi.BurnInTest) {
		fa := newFakeAppliance(t)
		fa.tasks = []agentapi.Task{tk}
		runAgentCfg(t, fa, dev, "", func(c *Config) { c.IPMIDevice = filepath.Join(t.TempDir(), "no-ipmi") })
		r, ok := fa.final(agentapi.StepBurnIn)
		if !ok || r.BurnIn == nil || len(r.BurnIn.Tests) != 1 {
			t.Fatalf("final report %+v", r)
		}
		return r, r.BurnIn.Tests[0]
	}
	t.Run("foreign", func(t *testing.T) {
		dev, _ := newLoop(t, 64<<20, buildImage(t, "gpt", 16, "keep me"))
		r, d := state(t, dev, task(false))
		if r.State != agentapi.StateSucceeded || !d.Skipped || !strings.Contains(d.Error, "not marked for wipe") {
			t.Fatalf("foreign disk: %s, %+v; want skipped", r.State, d)
		}
		r, d = state(t, dev, task(true))
		if r.State != agentapi.StateSucceeded || !d.Passed || d.Bytes != 8<<20 {
			t.Fatalf("foreign disk marked for wipe: %s, %+v; want written and passed", r.State, d)
		}
	})
	t.Run("faulty", func(t *testing.T) {
		dev := faultyLoop(t, 64<<20, 4<<20)
		r, d := state(t, dev, task(false))
		if r.State != agentapi.StateFailed || r.Reason != agentapi.ReasonBurnInDisk || d.Passed || !strings.Contains(d.Error, "write "+dev) {
			t.Fatalf("faulty disk: %s %s, %+v", r.State, r.Reason, d)
		}
		t.Logf("faulty: %s", r.Message)
	})
}
