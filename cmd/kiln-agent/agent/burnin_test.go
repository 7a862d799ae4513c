package agent

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"kiln/api/agentapi"
)

// TestCPUBurnIn: every CPU computes the known-answer units for the time
// given and all are right; a bit flipped midway through one unit's SHA-256
// chain on one CPU (as a miscomputing ALU would) fails the test, naming
// that CPU and unit, and stops every CPU.
func TestCPUBurnIn(t *testing.T) {
	if msg := cpuUnit(false, make([]bool, cpuSieveN)); msg != "" {
		t.Fatalf("a healthy unit: %s", msg)
	}
	var ticks []float64
	r := CPUBurnIn(context.Background(), 600*time.Millisecond, nil, func(f float64) { ticks = append(ticks, f) })
	if r.Err != nil || r.CPUs < 1 || r.Units < uint64(r.CPUs) {
		t.Fatalf("healthy run: %+v", r)
	}
	if len(ticks) == 0 || ticks[len(ticks)-1] <= 0 {
		t.Fatalf("no progress: %v", ticks)
	}
	t.Logf("healthy: %d CPUs, %d units in 600ms", r.CPUs, r.Units)

	start := time.Now()
	bad := CPUBurnIn(context.Background(), time.Minute, func(cpu int, unit uint64) bool { return unit == 3 }, nil)
	if bad.Err == nil || !strings.Contains(bad.Err.Error(), "unit 3: sha256 chain gave") || !strings.Contains(bad.Err.Error(), cpuSHAWant) {
		t.Fatalf("flipped bit: %+v, want the unit 3 sha256 mismatch", bad)
	}
	if took := time.Since(start); took > 20*time.Second {
		t.Fatalf("a failure took %s to stop a one-minute run", took)
	}
	t.Logf("fault: %v", bad.Err)
}

// TestMemoryBurnIn: three chunks pass every pattern; then one bit flipped
// in one chunk between a pattern's write and its verification (for each
// pattern in turn) is caught, naming the pattern, chunk, offset and bit.
func TestMemoryBurnIn(t *testing.T) {
	ok := MemoryBurnIn(context.Background(), 3*memChunk, 0, 42, nil, nil)
	if ok.Err != nil || ok.Bytes != 3*memChunk || ok.Passes != 1 {
		t.Fatalf("healthy: %+v, want 3 chunks, one pass, no error", ok)
	}
	for _, pat := range []string{memAddress, memWalking, memRandom} {
		flip := func(chunk int, p string, words []uint64) {
			if chunk == 1 && p == pat {
				words[12345] ^= 1 << 17
			}
		}
		r := MemoryBurnIn(context.Background(), 3*memChunk, time.Minute, 42, flip, nil)
		want := "pattern " + pat + ", pass 1: chunk 1 offset 0x181c8 "
		if r.Err == nil || !strings.Contains(r.Err.Error(), want) || !strings.Contains(r.Err.Error(), "bits 0x0000000000020000 differ") {
			t.Fatalf("%s: %+v, want %q and bit 17", pat, r, want)
		}
		t.Logf("%s fault: %v", pat, r.Err)
	}
}

// burnInRoot is a file system root with /proc/meminfo and two NICs
// (eth0 up, eth1 down), for the agent's memory and NIC tests.
func burnInRoot(t *testing.T) string {
	root := t.TempDir()
	files := map[string]string{
		"proc/meminfo":               "MemTotal: 4194304 kB\nMemFree: 1000000 kB\nMemAvailable: 2097152 kB\n",
		"sys/class/net/eth0/type":    "1\n",
		"sys/class/net/eth0/address": "02:00:00:00:b1:01\n", "sys/class/net/eth0/operstate": "up\n",
		"sys/class/net/eth1/type":    "1\n",
		"sys/class/net/eth1/address": "02:00:00:00:b1:02\n", "sys/class/net/eth1/operstate": "down\n",
	}
	for name, body := range files {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// TestBurnInStep: an inspect task with a burn-in policy (answering the
// registration) runs step burn_in: started, heartbeats naming the test,
// then one final report with every test's result. A healthy run with the
// provisioning NIC up passes; a flipped memory bit fails with
// burnin_memory_failed and the NIC test is skipped; the policy "all" fails
// on eth1's link with burnin_nic_failed.
func TestBurnInStep(t *testing.T) {
	pol := func(nics string, tests ...string) *agentapi.BurnInPolicy {
		return &agentapi.BurnInPolicy{Policy: "default", Tests: tests, CPUTime: 300 * time.Millisecond,
			MemoryFraction: 0.5, MemoryMaxBytes: 2 * memChunk, MemoryTime: time.Millisecond,
			NICs: nics, NICWait: 300 * time.Millisecond, ProvisioningMACs: []string{"02:00:00:00:b1:01"}}
	}
	cases := []struct {
		name   string
		policy *agentapi.BurnInPolicy
		fault  memFault
		reason agentapi.Reason
		states string // each test: p(assed), f(ailed), s(kipped)
	}{
		{"healthy", pol(agentapi.NICsProvisioning, "nic", "memory", "cpu"), nil, "", "ppp"},
		{"memory fault", pol(agentapi.NICsProvisioning, "cpu", "memory", "nic"),
			func(chunk int, p string, w []uint64) {
				if p == memRandom {
					w[len(w)-1] ^= 1
				}
			}, agentapi.ReasonBurnInMemory, "pfs"},
		{"nic down", pol(agentapi.NICsAll, "nic"), nil, agentapi.ReasonBurnInNIC, "f"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fa := newFakeAppliance(t)
			fa.tasks = []agentapi.Task{{Action: agentapi.ActionInspect, PollAfter: 1e7, Heartbeat: 50 * time.Millisecond, BurnIn: tc.policy}}
			root := burnInRoot(t)
			runAgentCfg(t, fa, "/dev/null", "", func(c *Config) {
				c.Root, c.IPMIDevice = root, filepath.Join(root, "no-ipmi")
				c.burnIn.mem = tc.fault
			})
			r, ok := fa.final(agentapi.StepBurnIn)
			if !ok || r.BurnIn == nil {
				t.Fatalf("no final burn_in report with results: %+v", fa.Reports())
			}
			b, _ := json.Marshal(r.BurnIn)
			t.Logf("%s %s: %s", r.State, r.Reason, b)
			var states string
			for _, x := range r.BurnIn.Tests {
				switch {
				case x.Skipped:
					states += "s"
				case x.Passed:
					states += "p"
				default:
					states += "f"
				}
			}
			wantState := agentapi.StateSucceeded
			if tc.reason != "" {
				wantState = agentapi.StateFailed
			}
			if r.State != wantState || r.Reason != tc.reason || states != tc.states || r.BurnIn.Policy != "default" {
				t.Fatalf("final %s %s, tests %s (policy %q); want %s %q, %s", r.State, r.Reason, states, r.BurnIn.Policy, wantState, tc.reason, tc.states)
			}
			// Tests run in agentapi.BurnInTests order, whatever the policy's order.
			if tc.name == "healthy" && (r.BurnIn.Tests[0].Name != "cpu" || r.BurnIn.Tests[2].Name != "nic" ||
				r.BurnIn.Tests[1].Bytes != 2*memChunk || r.BurnIn.Tests[0].Iterations == 0) {
				t.Fatalf("healthy results %s", b)
			}
			var beats int
			for _, x := range fa.Reports() {
				if x.Step == agentapi.StepBurnIn && x.State == agentapi.StateRunning && x.Progress >= 0 &&
					(strings.HasPrefix(x.Message, "cpu ") || strings.HasPrefix(x.Message, "memory ") || strings.HasPrefix(x.Message, "nic ")) {
					beats++
				}
			}
			if beats == 0 {
				t.Fatalf("no heartbeat naming a test: %+v", fa.Reports())
			}
		})
	}
}
