package agent

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"kiln/api/agentapi"
)

// Erase of every disk of the machine (cmd/kiln-agent/DESIGN.md "Erase"). Per disk the
// strongest method the device offers, in this order:
//
//	NVMe  Sanitize crypto erase → Sanitize block erase → Format NVM crypto erase →
//	      Format NVM user data erase (Identify Controller SANICAP, OACS, FNA)
//	ATA   SECURITY ERASE UNIT, enhanced when supported (IDENTIFY word 128); a frozen,
//	      locked or expired drive is reported as such and then overwritten (or fails,
//	      ErasePolicy.OnFrozen)
//	any   overwrite: one pass of a keyed pseudo-random pattern, then a read-back
//
// A firmware method is verified with canaries: 4 KiB blocks of random data written at the
// first and last block and at K random blocks before the erase must all be gone after it.
// A firmware method that fails, or whose canaries survive, is followed by the overwrite.
// Every disk ends with its first and last MiB zeroed (no stale signature for the next
// build's foreign-data check). Each disk's result is an agentapi.DiskErase.

// eraseHooks are test knobs: fault injection into the erase.
type eraseHooks struct {
	// skipWrite: byte ranges the overwrite's writer leaves unwritten (a faulty writer).
	skipWrite []byteRange
	// noFirmware: do not probe NVMe/ATA methods (the overwrite only).
	noFirmware bool
}

type byteRange struct{ off, n int64 }

const (
	eraseBlock          = 4096 // verification and canary granularity, bytes
	defaultSampleBlocks = 1024
	// ataErasePassword is the user password set for SECURITY ERASE UNIT: fixed and
	// documented so an operator can unlock a drive whose erase was interrupted
	// (hdparm --security-disable kiln-erase /dev/sdX).
	ataErasePassword = "kiln-erase"
)

// erasePolicy fills the defaults of p.
func erasePolicy(p *agentapi.ErasePolicy) agentapi.ErasePolicy {
	var out agentapi.ErasePolicy
	if p != nil {
		out = *p
	}
	if out.OnFrozen != agentapi.OnFrozenFail {
		out.OnFrozen = agentapi.OnFrozenOverwrite
	}
	if out.Verify != agentapi.VerifyFull {
		out.Verify = agentapi.VerifySample
	}
	if out.SampleBlocks <= 0 {
		out.SampleBlocks = defaultSampleBlocks
	}
	return out
}

// eraseTarget is one disk to erase, or to report as skipped (skip != "").
type eraseTarget struct {
	disk agentapi.Disk
	skip string
}

// eraseTargets returns every disk of ListDisks, each marked skipped when it is read-only
// (sysfs ro), removable (sysfs removable: USB sticks and virtual media, where the
// environment may have booted from) or mounted (in use), plus the removable
// media devices ListDisks leaves out (optical, floppy: a virtual-media boot ISO) that hold
// a medium, reported as skipped. Sorted by name.
func eraseTargets(root string, disks []agentapi.Disk) []eraseTarget {
	mounts := mountedDevices(filepath.Join(root, "proc/self/mounts"))
	seen := map[string]bool{}
	var out []eraseTarget
	for _, d := range disks {
		seen[d.Name] = true
		t := eraseTarget{disk: d}
		sys := filepath.Join(root, "sys/block", d.Name)
		if readTrimFile(filepath.Join(sys, "ro")) == "1" {
			t.skip = "read-only device (sysfs ro=1)"
		} else if d.Removable {
			t.skip = "removable medium (sysfs removable=1: USB stick, card reader, BMC virtual media; the boot medium when booted from one); not a disk of the machine"
		} else if m := mountedAt(mounts, d.Path); m != "" {
			t.skip = "mounted (" + m + "): the environment's boot medium or in use"
		}
		out = append(out, t)
	}
	entries, _ := os.ReadDir(filepath.Join(root, "sys/block"))
	for _, e := range entries {
		name := e.Name()
		if seen[name] || !(strings.HasPrefix(name, "sr") || strings.HasPrefix(name, "fd")) {
			continue
		}
		sys := filepath.Join(root, "sys/block", name)
		var sectors uint64
		fmt.Sscan(readTrimFile(filepath.Join(sys, "size")), &sectors)
		if sectors == 0 {
			continue // no medium
		}
		d := agentapi.Disk{Name: name, Path: "/dev/" + name, SizeBytes: sectors * 512,
			Model: readTrimFile(filepath.Join(sys, "device/model")), Removable: true}
		out = append(out, eraseTarget{disk: d, skip: "removable medium (optical/floppy/virtual media, the boot medium when booted from one); not a disk of the machine"})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].disk.Name < out[j].disk.Name })
	return out
}

func readTrimFile(p string) string {
	b, err := os.ReadFile(p)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// mountedDevices maps each /dev/... source of a mount table to its mount point.
func mountedDevices(path string) map[string]string {
	out := map[string]string{}
	f, err := os.Open(path)
	if err != nil {
		return out
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 2 && strings.HasPrefix(fields[0], "/dev/") {
			out[fields[0]] = fields[1]
		}
	}
	return out
}

// mountedAt returns "SOURCE on MOUNTPOINT" when dev or one of its partitions (devN,
// devpN) is mounted, else "".
func mountedAt(mounts map[string]string, dev string) string {
	for src, mp := range mounts {
		rest, ok := strings.CutPrefix(src, dev)
		if !ok {
			continue
		}
		rest = strings.TrimPrefix(rest, "p")
		if rest == "" || strings.Trim(rest, "0123456789") == "" {
			return src + " on " + mp
		}
	}
	return ""
}

// Erase erases every disk of the machine (see the comment at the top of this file):
// step erase started, a running heartbeat every Task.Heartbeat, then succeeded — every
// disk erased or skipped with a reason — or failed (erase_failed) with the disks that
// were not, both carrying one certificate per disk in Report.Erase. Task.Disk is not
// used: an erase never leaves a disk of the machine out silently.
func (a *Agent) Erase(ctx context.Context, task *agentapi.Task) error {
	pol := erasePolicy(task.ErasePolicy)
	_ = a.report(ctx, agentapi.Report{Step: agentapi.StepErase, State: agentapi.StateStarted})
	disks, err := a.cfg.ListDisks()
	if err != nil {
		se := fail(agentapi.StepErase, agentapi.ReasonDiskNotFound, "list disks: %v", err)
		_ = a.report(ctx, agentapi.Report{Step: agentapi.StepErase, State: agentapi.StateFailed, Reason: se.Reason, Message: se.Err.Error()})
		return se
	}
	targets := eraseTargets(a.cfg.Root, disks)
	p := a.startProgress(ctx, agentapi.StepErase, task.Heartbeat)
	certs := make([]agentapi.DiskErase, len(targets))
	// Disks are erased in parallel (the time is the slowest disk's, not the sum), except
	// the namespaces of one NVMe controller: a Sanitize covers the whole controller.
	var mu sync.Mutex
	fracs := make([]float64, len(targets))
	groups := map[string][]int{}
	var order []string
	for i, t := range targets {
		k := eraseGroup(t.disk.Name)
		if _, ok := groups[k]; !ok {
			order = append(order, k)
		}
		groups[k] = append(groups[k], i)
	}
	sem := make(chan struct{}, maxParallelErase)
	var wg sync.WaitGroup
	for _, k := range order {
		wg.Add(1)
		go func(idx []int) {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			for _, i := range idx {
				frac := func(f float64) {
					mu.Lock()
					defer mu.Unlock()
					fracs[i] = f
					var sum float64
					for _, x := range fracs {
						sum += x
					}
					p.set(sum / float64(len(fracs)))
				}
				c := a.eraseDisk(ctx, targets[i], pol, frac)
				a.say("erase %s", certLine(c))
				certs[i] = c
			}
		}(groups[k])
	}
	wg.Wait()
	p.end()
	var bad, erased, skipped []string
	for _, c := range certs {
		switch c.Outcome {
		case agentapi.EraseErased:
			erased = append(erased, c.Name)
		case agentapi.EraseSkipped:
			skipped = append(skipped, c.Name)
		default:
			bad = append(bad, c.Name+" "+c.Outcome)
		}
	}
	summary := fmt.Sprintf("%d disks erased [%s], %d skipped [%s]", len(erased), strings.Join(erased, " "), len(skipped), strings.Join(skipped, " "))
	if len(bad) > 0 || ctx.Err() != nil {
		reason := agentapi.ReasonEraseFailed
		if ctx.Err() != nil {
			reason = agentapi.ReasonTimeout
		}
		se := fail(agentapi.StepErase, reason, "%d disks not erased [%s]; %s", len(bad), strings.Join(bad, ", "), summary)
		_ = a.report(ctx, agentapi.Report{Step: agentapi.StepErase, State: agentapi.StateFailed, Reason: se.Reason, Message: se.Err.Error(), Erase: certs})
		return se
	}
	return a.report(ctx, agentapi.Report{Step: agentapi.StepErase, State: agentapi.StateSucceeded, Progress: 1, Message: summary, Erase: certs})
}

// maxParallelErase bounds the disks erased at once.
const maxParallelErase = 16

// eraseGroup is the unit of sequential erasure: the NVMe controller of a namespace
// (nvme0n1 → nvme0), else the disk itself.
func eraseGroup(name string) string {
	if rest, ok := strings.CutPrefix(name, "nvme"); ok {
		if i := strings.IndexByte(rest, 'n'); i > 0 {
			return "nvme" + rest[:i]
		}
	}
	return name
}

// certLine is the one-line console form of a certificate.
func certLine(c agentapi.DiskErase) string {
	s := fmt.Sprintf("%s serial=%q model=%q %d bytes: %s %s", c.Path, c.Serial, c.Model, c.SizeBytes, c.Method, c.Outcome)
	if c.Reason != "" {
		s += " (" + c.Reason + ")"
	}
	if c.Verification != "" {
		s += fmt.Sprintf("; %s; coverage %.4f%%", c.Verification, 100*c.Coverage)
	}
	if c.NextStep != "" {
		s += "; next: " + c.NextStep
	}
	return s
}

// transport classifies a disk: "nvme" (namespace block device nvmeXnY), "ata" (sd* whose
// SCSI vendor is "ATA": a drive behind libata, reachable with SAT ATA PASS-THROUGH), or
// "other".
func transport(root string, d agentapi.Disk) string {
	switch {
	case strings.HasPrefix(d.Name, "nvme"):
		return "nvme"
	case strings.HasPrefix(d.Name, "sd") && readTrimFile(filepath.Join(root, "sys/block", d.Name, "device/vendor")) == "ATA":
		return "ata"
	}
	return "other"
}

// eraseDisk erases one disk and returns its certificate.
func (a *Agent) eraseDisk(ctx context.Context, t eraseTarget, pol agentapi.ErasePolicy, frac func(float64)) (c agentapi.DiskErase) {
	d := t.disk
	c = agentapi.DiskErase{Name: d.Name, Path: d.Path, Serial: d.Serial, Model: d.Model, WWN: d.WWN,
		SizeBytes: d.SizeBytes, Started: time.Now().UTC()}
	defer func() { c.Ended = time.Now().UTC() }()
	if t.skip != "" {
		c.Method, c.Outcome, c.Reason = agentapi.EraseNone, agentapi.EraseSkipped, t.skip
		return c
	}
	c.Transport = transport(a.cfg.Root, d)
	dev, err := OpenDevice(d.Path)
	if err != nil {
		c.Method, c.Outcome, c.Reason = agentapi.EraseNone, agentapi.EraseFailed, fmt.Sprintf("open: %v", err)
		return c
	}
	defer dev.Close()
	c.SizeBytes = uint64(dev.Size)
	if dev.Size < eraseBlock {
		c.Method, c.Outcome, c.Reason = agentapi.EraseNone, agentapi.EraseFailed, fmt.Sprintf("device of %d bytes", dev.Size)
		return c
	}
	done := false
	if !a.cfg.erase.noFirmware {
		switch c.Transport {
		case "nvme":
			done = a.eraseNVMe(ctx, dev, &c, pol)
		case "ata":
			done = a.eraseATA(ctx, dev, &c, pol)
		}
	}
	if !done && c.Outcome == "" && ctx.Err() == nil {
		a.overwrite(ctx, dev, &c, pol, frac)
	}
	if ctx.Err() != nil && c.Outcome == "" {
		c.Method, c.Outcome, c.Reason = agentapi.EraseNone, agentapi.EraseFailed, ctx.Err().Error()
	}
	if c.Outcome == agentapi.EraseErased {
		if err := a.wipeSignatures(dev); err != nil {
			c.Outcome, c.Verified = agentapi.EraseFailed, false
			c.Verification += fmt.Sprintf("; zeroing the first and last MiB failed: %v", err)
			return c
		}
		n := min(int64(eraseCheckBytes), dev.Size)
		for _, off := range []int64{0, dev.Size - n} {
			if ok, err := isZero(dev.Path, off, n); err != nil || !ok {
				c.Outcome, c.Verified = agentapi.EraseVerifyFailed, false
				c.Verification += fmt.Sprintf("; the MiB at %d does not read back as zeros after zeroing (err %v)", off, err)
				return c
			}
		}
		c.Verification += "; first and last MiB then zeroed and read back as zeros"
	}
	frac(1)
	return c
}

// attempt appends one method attempt to c.
func attempt(c *agentapi.DiskErase, method, outcome, format string, args ...any) {
	c.Attempts = append(c.Attempts, agentapi.EraseAttempt{Method: method, Outcome: outcome, Message: fmt.Sprintf(format, args...)})
}

// canaries are 4 KiB blocks of random data written before a firmware erase; after it none
// may read back unchanged.
type canaries struct {
	offs []int64
	data [][]byte
}

// plantCanaries writes random blocks at the first and last 4 KiB and at k random
// 4 KiB-aligned offsets of dev (distinct), and syncs.
func plantCanaries(dev *Device, k int) (*canaries, error) {
	offs := sampleOffsets(dev.Size, k)
	cn := &canaries{}
	for _, off := range offs {
		n := min(int64(eraseBlock), dev.Size-off)
		b := make([]byte, n)
		if _, err := rand.Read(b); err != nil {
			return nil, err
		}
		if _, err := dev.WriteAt(b, off); err != nil {
			return nil, fmt.Errorf("write canary at %d: %w", off, err)
		}
		cn.offs = append(cn.offs, off)
		cn.data = append(cn.data, b)
	}
	return cn, dev.Sync()
}

// check reads every canary back with O_DIRECT and returns how many survived (still hold
// their random data), the first survivor's offset, and how many read as zeros.
func (cn *canaries) check(dev *Device) (survived int64, first int64, zeros int, err error) {
	f, err := openDirect(dev.Path)
	if err != nil {
		return 0, 0, 0, err
	}
	defer f.Close()
	buf := alignedBuf(eraseBlock)
	first = -1
	for i, off := range cn.offs {
		want := cn.data[i]
		b := buf[:len(want)]
		if _, err := f.ReadAt(b, off); err != nil {
			return survived, first, zeros, fmt.Errorf("read canary at %d: %w", off, err)
		}
		if string(b) == string(want) {
			survived++
			if first < 0 {
				first = off
			}
		}
		if allZero(b) {
			zeros++
		}
	}
	return survived, first, zeros, nil
}

func allZero(b []byte) bool {
	for _, x := range b {
		if x != 0 {
			return false
		}
	}
	return true
}

// sampleOffsets returns the offsets of the first and the last 4 KiB block of a device of
// size bytes and of up to k further distinct random 4 KiB-aligned blocks (crypto/rand:
// a device cannot know in advance which blocks are read), sorted.
func sampleOffsets(size int64, k int) []int64 {
	nblocks := (size + eraseBlock - 1) / eraseBlock
	set := map[int64]bool{0: true, (nblocks - 1) * eraseBlock: true}
	want := min(int64(k)+2, nblocks)
	var rb [8]byte
	for int64(len(set)) < want {
		_, _ = rand.Read(rb[:])
		set[int64(binary.LittleEndian.Uint64(rb[:])%uint64(nblocks))*eraseBlock] = true
	}
	out := make([]int64, 0, len(set))
	for o := range set {
		out = append(out, o)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

// blockBytes sums the bytes of the 4 KiB blocks at offs (the last may be short).
func blockBytes(size int64, offs []int64) int64 {
	var n int64
	for _, o := range offs {
		n += min(int64(eraseBlock), size-o)
	}
	return n
}

// verifyFirmware plants canaries before fn (a firmware erase) and checks them after it.
// It fills c's verification fields and returns whether the erase is verified; an error
// from fn is returned as is (canaries unchecked).
func verifyFirmware(dev *Device, c *agentapi.DiskErase, k int, fn func() error) (bool, error) {
	cn, err := plantCanaries(dev, k)
	if err != nil {
		return false, fmt.Errorf("canaries: %w", err)
	}
	if err := fn(); err != nil {
		return false, err
	}
	_ = dev.Sync() // drop cached pages of the pre-erase contents
	survived, first, zeros, err := cn.check(dev)
	c.Coverage = float64(blockBytes(dev.Size, cn.offs)) / float64(dev.Size)
	if err != nil {
		c.Verification = fmt.Sprintf("canary check failed: %v", err)
		return false, nil
	}
	c.Mismatches, c.FirstMismatch = survived, max(first, 0)
	c.Verification = fmt.Sprintf("canary check: %d random 4 KiB blocks (first, last and %d sampled) written before the erase, %d survived, %d read zeros after it",
		len(cn.offs), len(cn.offs)-2, survived, zeros)
	c.Verified = survived == 0
	return c.Verified, nil
}
