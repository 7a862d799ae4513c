package fleetsim_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"kiln/deploy/lab/benchline"
	"kiln/deploy/lab/fleetsim"
	"kiln/deploy/lab/testreq"
)

// TestMain runs the simulation half when Run re-executes the test binary
// inside the machines' namespace.
func TestMain(m *testing.M) {
	if fleetsim.IsChild() {
		fleetsim.ChildMain()
	}
	os.Exit(m.Run())
}

// buildKiln builds cmd/kiln into dir (go's build cache makes this quick).
func buildKiln(t *testing.T, dir string) string {
	t.Helper()
	bin := filepath.Join(dir, "kiln")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/kiln")
	cmd.Dir = testreq.RepoRoot()
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/kiln: %v\n%s", err, out)
	}
	return bin
}

// standInEnv writes a vmlinuz and an initramfs of 2 MiB of random bytes: the
// simulated firmware fetches a Range of each and never runs them, so the
// quick test does not need the built environment.
func standInEnv(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "env")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"vmlinuz", "initramfs"} {
		b := make([]byte, 2<<20)
		_, _ = rand.Read(b)
		if err := os.WriteFile(filepath.Join(dir, n), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// TestFleetSmall runs three simulated machines through the whole flow
// against a real kiln serve: rack plan import, BMC enrolment through the
// many-system vbmc, Kiln's power-on, DHCP (PXE then iPXE), TFTP, the iPXE
// script and a Range of the environment, agent registration and inspection,
// a claim, the build's reports and image download, the reboot's local boot,
// and provisioned. Every machine must end provisioned with no simulator error.
func TestFleetSmall(t *testing.T) {
	testreq.Root(t, "network namespaces and AF_PACKET", "ip", "sysctl")
	work := t.TempDir()
	var out strings.Builder
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := fleetsim.Run(ctx, fleetsim.Options{N: 3, Work: work, Prefix: "kfst" + strconv.Itoa(os.Getpid()%1000),
		KilnBin: buildKiln(t, work), EnvDir: standInEnv(t), AgentPoll: 500 * time.Millisecond, ImageMiB: 2,
		Timeout: time.Minute, Out: &out})
	t.Log(out.String())
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	if res.Provisioned != 3 || res.Failed != 0 || res.SimErrors != 0 || res.PowerOns != 3 || res.Repowered != 0 {
		t.Fatalf("result: %d provisioned, %d failed, %d simulator errors, %d power-ons (%d machines twice), want 3, 0, 0, 3 (0):\n%s",
			res.Provisioned, res.Failed, res.SimErrors, res.PowerOns, res.Repowered, strings.Join(res.Lines(), "\n"))
	}
	for _, p := range res.Phases {
		if p.N == 0 {
			t.Errorf("phase %s: no machine went through it", p.Name)
		}
	}
	if res.KilnCPUSeconds <= 0 || res.PeakRSS <= 0 || res.StoreBytes <= 0 || res.MachineEvents < 3*10 {
		t.Errorf("kiln figures not measured: cpu %v s, rss %d, store %d, machine events %d", res.KilnCPUSeconds, res.PeakRSS,
			res.StoreBytes, res.MachineEvents)
	}
	if !strings.HasPrefix(res.Lines()[0], "fleet: 3 provisioned, 0 failed in ") {
		t.Errorf("headline %q", res.Lines()[0])
	}
}

// TestFleetAttest runs the simulator with attestation required for the
// model (Options.Attest): two machines with a TPM each (swtpm), two
// without (allowed by the policy). The first TPM machine is the
// reference: its first build must be refused (no approved state), its
// measured boot learned and approved, and its next build pass; the other
// TPM machine passes on the approved state; the two without a TPM pass
// on the policy. Kiln's latency of the two calls must be read from its
// /metrics.
func TestFleetAttest(t *testing.T) {
	testreq.Root(t, "network namespaces and AF_PACKET", "ip", "sysctl")
	testreq.Commands(t, "swtpm", "swtpm_setup")
	work := t.TempDir()
	var out strings.Builder
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := fleetsim.Run(ctx, fleetsim.Options{N: 4, Attest: 2, Work: work, Prefix: "kfsa" + strconv.Itoa(os.Getpid()%1000),
		KilnBin: buildKiln(t, work), EnvDir: standInEnv(t), AgentPoll: 500 * time.Millisecond, ImageMiB: 2,
		Timeout: time.Minute, Out: &out})
	t.Log(out.String())
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	a := res.Attest
	if res.Provisioned != 4 || res.Failed != 0 || res.SimErrors != 0 || a == nil {
		t.Fatalf("result: %d provisioned, %d failed, %d simulator errors, attest %+v; want 4, 0, 0:\n%s",
			res.Provisioned, res.Failed, res.SimErrors, a, strings.Join(res.Lines(), "\n"))
	}
	if a.TPMs != 2 || a.Passed != 2 || a.Refused != 1 || a.NoTPM != 2 || a.State == "" ||
		!strings.Contains(a.Reference, "no_approved_state") {
		t.Errorf("attest: %+v; want 2 TPMs, 2 passed, 1 refused (the reference: no_approved_state), 2 without a TPM, a state", a)
	}
	// Kiln's side: 5 starts (the reference twice, the other TPM machine,
	// two without) and 3 quotes (the TPM machines' builds).
	if a.Starts != 5 || a.Quotes != 3 || a.StartMS <= 0 || a.QuoteMS <= 0 || a.StepTPM.N != 2 || a.StepNoTPM.N != 2 {
		t.Errorf("attest costs: %d starts (%.2f ms), %d quotes (%.2f ms), steps %d/%d; want 5, 3, 2/2",
			a.Starts, a.StartMS, a.Quotes, a.QuoteMS, a.StepTPM.N, a.StepNoTPM.N)
	}
	if line := a.Line(); !strings.HasPrefix(line, "fleet: attest: 2 machines with a TPM") {
		t.Errorf("line %q", line)
	}
}

// benchSizes are the fleet sizes of the scaling curve: KILN_FLEET_SIZES
// (comma-separated), default the curve 250,500,1000,2000.
func benchSizes(t *testing.T) []int {
	v := os.Getenv("KILN_FLEET_SIZES")
	if v == "" {
		v = "250,500,1000,2000"
	}
	var out []int
	for _, f := range strings.Split(v, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 || n > fleetsim.MaxMachines {
			t.Fatalf("KILN_FLEET_SIZES %q: want sizes 1..%d separated by commas", v, fleetsim.MaxMachines)
		}
		out = append(out, n)
	}
	return out
}

// TestBenchFleetScaling (KILN_BENCH=1, root; bin/kiln and the environment
// from make build env) runs the simulator once per size of benchSizes and
// prints Kiln's CPU per machine at each size and the scaling ratio: CPU per
// machine at the largest size over the smallest (goal ≤ 1.2, a flat cost per
// machine). No peer provisioner runs here (Metal3 and Ironic need a
// Kubernetes cluster or their own database and conductor): "(no peer)".
func TestBenchFleetScaling(t *testing.T) {
	benchline.Need(t, true, "ip", "sysctl")
	kilnBin := filepath.Join(testreq.RepoRoot(), "bin", "kiln")
	if _, err := os.Stat(kilnBin); err != nil {
		t.Fatalf("%s: run make build (make bench does)", kilnBin)
	}
	kernel, _ := testreq.Env(t)
	env := filepath.Dir(kernel)
	sizes := benchSizes(t)
	per := map[int]float64{}
	for _, n := range sizes {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
		res, err := fleetsim.Run(ctx, fleetsim.Options{N: n, Work: t.TempDir(), KilnBin: kilnBin, EnvDir: env, Out: os.Stdout})
		cancel()
		if err != nil {
			t.Fatalf("N=%d: %v", n, err)
		}
		if res.Provisioned != n {
			t.Errorf("N=%d: %d provisioned, %d failed, %d unfinished", n, res.Provisioned, res.Failed, res.Unfinished)
		}
		per[n] = res.CPUPerMachineMS
		var total fleetsim.Phase
		for _, p := range res.Phases {
			if p.Name == "total" {
				total = p
			}
		}
		benchline.Print(t, benchline.Line{Name: fmt.Sprintf("fleet_cpu_per_machine_n%d", n), Unit: "ms/machine", Kiln: res.CPUPerMachineMS,
			Fields: []benchline.Field{{Key: "seconds", Value: benchline.Num(res.Seconds)}, {Key: "rss_mb", Value: benchline.Num(float64(res.PeakRSS) / (1 << 20))},
				{Key: "store_mb", Value: benchline.Num(float64(res.StoreBytes) / (1 << 20))}, {Key: "provisioned", Value: strconv.Itoa(res.Provisioned)}, {Key: "repowered", Value: strconv.Itoa(res.Repowered)},
				{Key: "total_p99_s", Value: benchline.Num(total.P99)}}})
	}
	lo, hi := sizes[0], sizes[len(sizes)-1]
	for _, n := range sizes {
		lo, hi = min(lo, n), max(hi, n)
	}
	if lo == hi {
		return
	}
	benchline.Print(t, benchline.Line{Name: "fleet_cpu_scaling", Unit: "ratio", Kiln: per[hi] / per[lo],
		Fields: []benchline.Field{{Key: "largest", Value: strconv.Itoa(hi)}, {Key: "smallest", Value: strconv.Itoa(lo)}, {Key: "goal", Value: "<=1.2"}}})
}

// TestBenchFleetAttest (KILN_BENCH=1, root, swtpm) is the attestation's
// cost to Kiln per machine in the fleet simulator (issue 16): the same
// storm of KILN_FLEET_ATTEST_N machines (default 100) twice, once with
// every machine holding a TPM (a swtpm each) and its model requiring
// attestation (the reference refused, learned, approved and built again,
// as an operator's first machine of a model), once without attestation.
// The figure is Kiln's CPU per machine with it less without it; the
// handler time of the two attestation calls is Kiln's kiln_api_request_seconds.
// No peer: Tinkerbell, Metal3 and MAAS have no attestation gate.
func TestBenchFleetAttest(t *testing.T) {
	benchline.Need(t, true, "ip", "sysctl", "swtpm", "swtpm_setup")
	kilnBin := filepath.Join(testreq.RepoRoot(), "bin", "kiln")
	if _, err := os.Stat(kilnBin); err != nil {
		t.Fatalf("%s: run make build (make bench does)", kilnBin)
	}
	kernel, _ := testreq.Env(t)
	n := 100
	if v := os.Getenv("KILN_FLEET_ATTEST_N"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 2 || n > fleetsim.MaxMachines {
			t.Fatalf("KILN_FLEET_ATTEST_N %q: want 2..%d", v, fleetsim.MaxMachines)
		}
	}
	run := func(attest int) *fleetsim.Result {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
		defer cancel()
		res, err := fleetsim.Run(ctx, fleetsim.Options{N: n, Attest: attest, Work: t.TempDir(), KilnBin: kilnBin,
			EnvDir: filepath.Dir(kernel), Out: os.Stdout})
		if err != nil {
			t.Fatalf("N=%d attest=%d: %v", n, attest, err)
		}
		if res.Provisioned != n {
			t.Fatalf("N=%d attest=%d: %d provisioned, %d failed, %d unfinished", n, attest, res.Provisioned, res.Failed, res.Unfinished)
		}
		return res
	}
	with, without := run(n), run(0)
	a := with.Attest
	if a == nil || a.Passed != n || a.Quotes != n+1 {
		t.Fatalf("attested run: %+v; want %d passed, %d quotes (the reference twice)", a, n, n+1)
	}
	benchline.Print(t, benchline.Line{Name: "fleet_attest_kiln_cpu_per_machine_ms", Unit: "ms", Kiln: with.CPUPerMachineMS - without.CPUPerMachineMS,
		Fields: []benchline.Field{{Key: "with", Value: benchline.Num(with.CPUPerMachineMS)}, {Key: "without", Value: benchline.Num(without.CPUPerMachineMS)},
			{Key: "machines", Value: strconv.Itoa(n)}, {Key: "start_ms", Value: benchline.Num(a.StartMS)}, {Key: "quote_ms", Value: benchline.Num(a.QuoteMS)},
			{Key: "step_p50_s", Value: benchline.Num(a.StepTPM.P50)},
			{Key: "raft_entries_per_machine_with", Value: benchline.Num(with.Metrics["kiln_store_last_index"] / float64(n))},
			{Key: "raft_entries_per_machine_without", Value: benchline.Num(without.Metrics["kiln_store_last_index"] / float64(n))}}})
}

// TestFleetDay2 (root) is issue 14's day 2 at a small scale against a real
// kiln serve: 54 machines storm-provisioned through inspection, 50 claimed
// with POST /v1/machines/claim (4 spares of the same class and labels); then
// mode A: 2 machines' BMCs report Critical, one after the other over a
// 20 s compressed hour, and stay Critical — each must climb Kiln's ladder
// (power cycle, reinspect, reprovision, erase with a certificate) to rma
// with its claim built on a spare, the brake released; then mode B: 10 of the
// 50 (20 %) Critical at once — the brake must engage, and after it the vbmc
// must serve no Reset or boot PATCH and the failed machines must not move.
func TestFleetDay2(t *testing.T) {
	testreq.Root(t, "network namespaces and AF_PACKET", "ip", "sysctl")
	work := t.TempDir()
	var out strings.Builder
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	res, err := fleetsim.Run(ctx, fleetsim.Options{N: 54, Work: work, Prefix: "kfsd" + strconv.Itoa(os.Getpid()%1000),
		KilnBin: buildKiln(t, work), EnvDir: standInEnv(t), AgentPoll: 500 * time.Millisecond, ImageMiB: 1,
		Timeout: 90 * time.Second, Out: &out,
		Day2: &fleetsim.Day2Options{Spares: 4, FailA: 2, FailB: 10, Hour: 20 * time.Second, Settle: time.Second,
			HealthPoll: time.Second, Timeout: 90 * time.Second}})
	t.Log(out.String())
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	d := res.Day2
	if d == nil {
		t.Fatal("no day-2 result")
	}
	if d.Claimed != 50 || d.AFailed != 2 || d.ARMA != 2 || d.ASparesProvisioned != 2 || d.ABrakeEngaged {
		t.Errorf("mode A: %+v\nwant 50 claimed, 2 failed, 2 rma, 2 spares provisioned, brake released", d)
	}
	if !d.BBrakeEngaged || d.BFailed != 10 || d.BActionsAfterBrake != 0 || d.BTransitionsAfter != 0 {
		t.Errorf("mode B: %+v\nwant 10 failed, brake engaged, 0 BMC actions and 0 transitions after it", d)
	}
	if d.AEraseCertificates < 2 || !strings.HasSuffix(d.ALadder, "rma") {
		t.Errorf("mode A: %d erase certificates, ladder %q: want 2 certificates and a ladder ending rma", d.AEraseCertificates, d.ALadder)
	}
	if d.ABMCActions < 2*3 {
		t.Errorf("mode A: %d BMC actions counted on the vbmc for 2 ladders and 2 spare builds: the count does not see them", d.ABMCActions)
	}
}

// TestFleetLeaderKill is issue 13's storm with a fault, small: 30 simulated
// machines against three kiln serve nodes (one site cluster: raft over
// mutual TLS, join tokens, each node serving DHCP, TFTP and HTTP on one
// bridge), the raft leader SIGKILLed mid-storm and restarted 5 s later.
// The machines' agents fail over across Task.Endpoints as the real agent
// does. Every machine must end provisioned in every node's store, none
// provisioned twice (transitions in each node's event log), no address bound
// to two MACs (each node's GET /v1/leases, across nodes, and the ACKs the
// machines received), and a new leader elected.
func TestFleetLeaderKill(t *testing.T) {
	testreq.Root(t, "network namespaces and AF_PACKET", "ip", "sysctl")
	const n = 30
	work := t.TempDir()
	var out strings.Builder
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	res, err := fleetsim.Run(ctx, fleetsim.Options{N: n, Work: work, Prefix: "kfsh" + strconv.Itoa(os.Getpid()%1000),
		KilnBin: buildKiln(t, work), EnvDir: standInEnv(t), AgentPoll: 500 * time.Millisecond, ImageMiB: 2,
		WriteTime: 8 * time.Second, Nodes: 3, KillLeaderAt: 5 * time.Second, Timeout: 150 * time.Second, Out: &out})
	t.Log(out.String())
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	lines := strings.Join(res.Lines(), "\n")
	// The kill falls while machines are writing (power-on ~2-3 s after the
	// import, then an 8 s write): a kill after the storm tests nothing.
	if res.KilledMidBuild == 0 {
		t.Errorf("the leader was killed with no machine mid-build:\n%s", lines)
	}
	if res.KilledNode == "" || res.NewLeader == "" || res.NewLeader == res.KilledNode || res.RestartedAt <= res.KilledAt {
		t.Errorf("leader kill: killed %q, new leader %q, restarted at %.1f s (killed at %.1f s)", res.KilledNode, res.NewLeader,
			res.RestartedAt, res.KilledAt)
	}
	if res.Provisioned != n || res.Failed != 0 || res.SimErrors != 0 {
		t.Errorf("%d provisioned, %d failed, %d simulator errors; want %d, 0, 0", res.Provisioned, res.Failed, res.SimErrors, n)
	}
	if len(res.NodeProvisioned) != 3 {
		t.Errorf("provisioned per node %v: want three nodes checked", res.NodeProvisioned)
	}
	for i, p := range res.NodeProvisioned {
		if p != n {
			t.Errorf("node %d: %d of %d machines provisioned in its store", i+1, p, n)
		}
	}
	if res.ProvisionedTwice != 0 || res.DupAddrs != 0 || len(res.Problems) != 0 {
		t.Errorf("provisioned twice %d, duplicate addresses %d, failed checks %v", res.ProvisionedTwice, res.DupAddrs, res.Problems)
	}
	if res.ACKs < 2*n {
		t.Errorf("%d DHCPACKs recorded, want at least %d (PXE and iPXE per machine)", res.ACKs, 2*n)
	}
	if t.Failed() {
		t.Log(lines)
	}
	if !strings.Contains(lines, fmt.Sprintf("fleet: %d provisioned, 0 failed in ", n)) || !strings.Contains(lines, " on 3 nodes; leader killed at ") {
		t.Errorf("result lines:\n%s", lines)
	}
}
