package agent

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"kiln/api/agentapi"
	"kiln/cmd/kiln-agent/inventory"
)

// Burn-in (cmd/kiln-agent/DESIGN.md "Burn-in"): step burn_in runs the
// tests of an inspect task's agentapi.BurnInPolicy in the order of
// agentapi.BurnInTests — CPU (burnin_cpu.go), memory (burnin_mem.go), disk
// (burnin_disk.go), NIC link (this file) — and stops at the first failure.

// Bounds the agent applies when the policy leaves a value out (the
// appliance sends its own: appliance/lifecycle/burnin.go).
const (
	burnInMinTime     = time.Second
	burnInNICPoll     = 250 * time.Millisecond
	burnInMinMemBytes = memChunk
)

// burnInHooks inject faults into the burn-in (tests).
type burnInHooks struct {
	cpu  cpuFault
	mem  memFault
	disk func(offs []int64) // between the disk test's write and its read-back
}

// burnInReason is the failure reason of each test.
var burnInReason = map[string]agentapi.Reason{
	agentapi.BurnInCPU: agentapi.ReasonBurnInCPU, agentapi.BurnInMemory: agentapi.ReasonBurnInMemory,
	agentapi.BurnInDisk: agentapi.ReasonBurnInDisk, agentapi.BurnInNIC: agentapi.ReasonBurnInNIC,
}

// BurnIn runs step burn_in for task (an inspect task with BurnIn set):
// started, a running heartbeat every task.Heartbeat naming the test and the
// step's progress, then succeeded or failed with every test's result in
// Report.BurnIn. A failed test's reason (burnin_*_failed) is the step's;
// the tests after it are recorded as skipped. It returns the *StepError of
// a failure.
func (a *Agent) BurnIn(ctx context.Context, task *agentapi.Task) error {
	pol := task.BurnIn
	var tests []string
	for _, name := range agentapi.BurnInTests {
		for _, t := range pol.Tests {
			if t == name {
				tests = append(tests, name)
				break
			}
		}
	}
	_ = a.report(ctx, agentapi.Report{Step: agentapi.StepBurnIn, State: agentapi.StateStarted,
		Message: fmt.Sprintf("policy %s: %s", pol.Policy, strings.Join(tests, ", "))})
	p := a.startProgress(ctx, agentapi.StepBurnIn, task.Heartbeat)
	rep := &agentapi.BurnInReport{Policy: pol.Policy, Tests: []agentapi.BurnInTest{}}
	var se *StepError
	for i, name := range tests {
		if se != nil {
			rep.Tests = append(rep.Tests, agentapi.BurnInTest{Name: name, Skipped: true, Error: "not run: an earlier test failed"})
			continue
		}
		p.setLabel(name)
		sub := func(f float64) { p.set((float64(i) + min(max(f, 0), 1)) / float64(len(tests))) }
		start := time.Now()
		t := a.burnInTest(ctx, name, task, sub)
		t.Name, t.Duration = name, time.Since(start)
		rep.Tests = append(rep.Tests, t)
		a.say("burn-in %s: passed=%v skipped=%v %s bytes=%d iterations=%d %s", name, t.Passed, t.Skipped,
			t.Duration.Round(time.Millisecond), t.Bytes, t.Iterations, t.Error)
		if !t.Passed && !t.Skipped {
			se = &StepError{Step: agentapi.StepBurnIn, Reason: burnInReason[name], Err: fmt.Errorf("%s test: %s", name, t.Error)}
			if ctx.Err() != nil {
				se.Reason = agentapi.ReasonTimeout
			}
		}
	}
	p.end()
	if se != nil {
		_ = a.report(ctx, agentapi.Report{Step: agentapi.StepBurnIn, State: agentapi.StateFailed, Reason: se.Reason,
			Message: se.Err.Error(), BurnIn: rep})
		return se
	}
	var sum []string
	for _, t := range rep.Tests {
		s := "passed"
		if t.Skipped {
			s = "skipped"
		}
		sum = append(sum, fmt.Sprintf("%s %s in %s", t.Name, s, t.Duration.Round(time.Millisecond)))
	}
	_ = a.report(ctx, agentapi.Report{Step: agentapi.StepBurnIn, State: agentapi.StateSucceeded, Progress: 1,
		Message: strings.Join(sum, "; "), BurnIn: rep})
	return nil
}

// burnInTest runs one test; Name and Duration are the caller's.
func (a *Agent) burnInTest(ctx context.Context, name string, task *agentapi.Task, progress func(float64)) agentapi.BurnInTest {
	pol := task.BurnIn
	failed := func(format string, args ...any) agentapi.BurnInTest {
		return agentapi.BurnInTest{Error: fmt.Sprintf(format, args...)}
	}
	switch name {
	case agentapi.BurnInCPU:
		r := CPUBurnIn(ctx, max(pol.CPUTime, burnInMinTime), a.cfg.burnIn.cpu, progress)
		t := agentapi.BurnInTest{Passed: r.Err == nil, Iterations: r.Units}
		if r.Err != nil {
			t.Error = r.Err.Error()
		}
		return t
	case agentapi.BurnInMemory:
		avail, err := memAvailable(a.cfg.Root)
		if err != nil {
			return failed("%v", err)
		}
		size := uint64(float64(avail) * pol.MemoryFraction)
		if pol.MemoryMaxBytes > 0 {
			size = min(size, pol.MemoryMaxBytes)
		}
		size = max(size, burnInMinMemBytes)
		r := MemoryBurnIn(ctx, size, max(pol.MemoryTime, burnInMinTime), randomKey(), a.cfg.burnIn.mem, progress)
		t := agentapi.BurnInTest{Passed: r.Err == nil, Bytes: r.Bytes, Iterations: r.Passes}
		if r.Err != nil {
			t.Error = r.Err.Error()
		}
		return t
	case agentapi.BurnInDisk:
		disks, err := a.cfg.ListDisks()
		if err != nil {
			return failed("list disks: %v", err)
		}
		disk, err := SelectDisk(disks, task.Disk)
		if err != nil {
			return failed("target disk: %v", err)
		}
		if disk.Health == "failing" {
			return failed("%s reports failing health", disk.Path)
		}
		dev, err := OpenDevice(disk.Path)
		if err != nil {
			return failed("open %s: %v", disk.Path, err)
		}
		what, err := Foreign(dev, dev.SectorSize)
		dev.Close()
		if err != nil {
			return failed("read %s: %v", disk.Path, err)
		}
		if what != "" && !task.Wipe {
			// The check step's rule: a foreign OS is never written over unless the machine is marked for wipe.
			return agentapi.BurnInTest{Skipped: true, Error: fmt.Sprintf("not written: %s holds a %s and the machine is not marked for wipe", disk.Path, what)}
		}
		regions := max(pol.DiskRegions, 1)
		r := DiskBurnIn(ctx, disk.Path, int64(pol.DiskBytes)/int64(regions), regions, max(pol.DiskTime, burnInMinTime), randomKey(), a.cfg.burnIn.disk, progress)
		t := agentapi.BurnInTest{Passed: r.Err == nil, Bytes: r.Bytes, Iterations: uint64(r.Regions)}
		if r.Err != nil {
			t.Error = r.Err.Error()
		}
		return t
	case agentapi.BurnInNIC:
		n, err := a.nicBurnIn(ctx, pol, progress)
		t := agentapi.BurnInTest{Passed: err == nil, Iterations: uint64(n)}
		if err != nil {
			t.Error = err.Error()
		}
		return t
	}
	return failed("unknown test %q", name)
}

// nicBurnIn waits up to pol.NICWait for the links pol.NICs requires to be
// up (inventory.NICs: operstate or carrier) and returns the NICs up.
func (a *Agent) nicBurnIn(ctx context.Context, pol *agentapi.BurnInPolicy, progress func(float64)) (int, error) {
	start := time.Now()
	for {
		nics, err := inventory.NICs(a.cfg.Root)
		up, missing := 0, []string{}
		prov := map[string]bool{}
		for _, m := range pol.ProvisioningMACs {
			prov[strings.ToLower(m)] = true
		}
		provUp, provSeen := false, false
		for _, n := range nics {
			if n.LinkUp {
				up++
			} else {
				missing = append(missing, n.Name+" ("+n.MAC+")")
			}
			if prov[n.MAC] {
				provSeen = true
				provUp = provUp || n.LinkUp
			}
		}
		var why string
		switch {
		case err != nil:
			why = err.Error()
		case len(nics) == 0:
			why = "no Ethernet NIC found"
		case pol.NICs == agentapi.NICsAll && len(missing) > 0:
			why = "link down: " + strings.Join(missing, ", ")
		case pol.NICs != agentapi.NICsAll && len(prov) > 0 && !provSeen:
			why = fmt.Sprintf("no NIC has a provisioning MAC (%s)", strings.Join(pol.ProvisioningMACs, ", "))
		case pol.NICs != agentapi.NICsAll && len(prov) > 0 && !provUp:
			why = "the provisioning NIC's link is down"
		case pol.NICs != agentapi.NICsAll && up == 0:
			why = "every link is down"
		default:
			return up, nil
		}
		waited := time.Since(start)
		if waited >= pol.NICWait || ctx.Err() != nil {
			return up, fmt.Errorf("%s (after %s)", why, waited.Round(time.Millisecond))
		}
		if pol.NICWait > 0 {
			progress(float64(waited) / float64(pol.NICWait))
		}
		if !sleepCtx(ctx, burnInNICPoll) {
			return up, fmt.Errorf("%s: %v", why, ctx.Err())
		}
	}
}

// memAvailable reads MemAvailable (else MemFree) from root/proc/meminfo, in bytes.
func memAvailable(root string) (uint64, error) {
	f, err := os.Open(filepath.Join(root, "proc/meminfo"))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	vals := map[string]uint64{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		fs := strings.Fields(v)
		if len(fs) == 0 {
			continue
		}
		if n, err := strconv.ParseUint(fs[0], 10, 64); err == nil {
			vals[k] = n << 10 // kB
		}
	}
	if v, ok := vals["MemAvailable"]; ok {
		return v, nil
	}
	if v, ok := vals["MemFree"]; ok {
		return v, nil
	}
	return 0, fmt.Errorf("%s has neither MemAvailable nor MemFree", filepath.Join(root, "proc/meminfo"))
}

// randomKey is a fresh pattern key, so a run's pattern is not what the
// device or memory held before.
func randomKey() uint64 {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return uint64(time.Now().UnixNano())
	}
	return binary.LittleEndian.Uint64(b[:])
}
