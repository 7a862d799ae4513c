package lifecycle

import (
	"sort"
	"strconv"
	"syscall"
	"testing"
	"time"

	"kiln/deploy/lab/benchline"
	"kiln/store"
)

// TestBenchAttest (make bench) is the attestation's cost to Kiln per
// machine (issue 16): benchAttestMachines machines of one model, each with
// its own TPM 2.0 (swtpm, EK certificate), attest against the approved
// state learned from a reference; only Kiln's side is timed, the
// challenge (AttestStart: EK and AK checks, credential activation blob,
// the challenge written through raft) and the verdict (AttestQuote: quote
// signature, nonce, event log replay, comparison with the approved states,
// the record and the credentials written through raft), on a real
// raft-backed store. The TPM's work (AK creation, activation, quote)
// happens outside the timed calls. No peer: Tinkerbell, Metal3 and MAAS
// have no attestation gate.
func TestBenchAttest(t *testing.T) {
	benchline.Need(t, false, "swtpm", "swtpm_setup")
	const benchAttestMachines = 20
	h := newHarness(t, openRealStore(t), func(c *Config) {
		c.Attest.Models = map[string]AttestPolicy{attestModel: {Require: true}}
	})
	const cmdline = "console=ttyS0 kiln.url=http://10.99.0.1:8080"
	ref, _ := buildingMachine(t, h, 1, "QEMU", "Standard PC (Q35 + ICH9, 2009)")
	if res := h.attest(ref, newTPMMachine(t, cmdline)); res.Reason != store.AttestReasonNoApprovedState {
		t.Fatalf("reference: %+v", res)
	}
	st, err := h.c.LearnAttestState(bg, ref.ID, "bench", true, "token:bench")
	must(t, err)

	var wall []time.Duration
	var cpu time.Duration
	for i := 0; i < benchAttestMachines; i++ {
		m, _ := buildingMachine(t, h, 2+i, "QEMU", "Standard PC (Q35 + ICH9, 2009)")
		tm := newTPMMachine(t, cmdline)
		start := tm.start(m.ID)
		c0, t0 := cpuTime(t), time.Now()
		ch, err := h.c.AttestStart(bg, m.ID, start)
		d, c := time.Since(t0), cpuTime(t)-c0
		must(t, err)
		q := tm.answer(m.ID, ch)
		c0, t0 = cpuTime(t), time.Now()
		res, err := h.c.AttestQuote(bg, m.ID, q)
		d, c = d+time.Since(t0), c+cpuTime(t)-c0
		must(t, err)
		if res.Result != store.AttestResultPassed || res.State != st.ID || res.Credentials == nil {
			t.Fatalf("machine %d: %+v", i, res)
		}
		wall = append(wall, d)
		cpu += c
	}
	sort.Slice(wall, func(i, j int) bool { return wall[i] < wall[j] })
	p99 := wall[len(wall)-1]
	benchline.Print(t, benchline.Line{Name: "attest_kiln_per_machine_ms", Unit: "ms", Kiln: float64(median(wall).Microseconds()) / 1000,
		Fields: []benchline.Field{{Key: "cpu", Value: formatMS(cpu / benchAttestMachines)}, {Key: "max", Value: formatMS(p99)},
			{Key: "machines", Value: strconv.Itoa(benchAttestMachines)}, {Key: "what", Value: "challenge+verdict,2_raft_writes"}}})
}

// cpuTime is this process's user+system CPU time (getrusage RUSAGE_SELF).
func cpuTime(t *testing.T) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func formatMS(d time.Duration) string {
	return time.Duration(d.Microseconds() * 1000).String()
}
