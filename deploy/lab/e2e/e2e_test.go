package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"kiln/api/client"
	"kiln/deploy/lab/testreq"
)

func TestMain(m *testing.M) {
	code := m.Run()
	CleanupRelease()
	os.Exit(code)
}

// repoRoot is the module root (this file lives in deploy/lab/e2e).
func repoRoot(t *testing.T) string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "../../.."))
}

func gate(t *testing.T) {
	t.Helper()
	if os.Getenv("KILN_E2E") == "" {
		t.Skip("end-to-end VM test: run it with `make e2e` (sets KILN_E2E=1; needs root, qemu, the built env)")
	}
	testreq.Root(t, "end-to-end VM test: network namespaces, tap devices")
}

type logWriter struct{ t *testing.T }

func (w logWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func run(t *testing.T, o Options) *Result {
	t.Helper()
	o.Root = repoRoot(t)
	o.Work = filepath.Join(t.TempDir(), "lab")
	o.Prefix = "kln"
	if p := os.Getenv("KILN_LAB_PREFIX"); p != "" {
		o.Prefix = p // lets two labs run side by side (names are the only shared thing)
	}
	o.Out = logWriter{t}
	if o.Timeout == 0 {
		o.Timeout = 6 * time.Minute
	}
	r, err := Run(context.Background(), o)
	if err != nil {
		for _, f := range []string{"kiln.log", "bmc/serial-1.log", "bmc/serial-2.log", "bmc/vbmc.log", "bmc/ipmi_sim.log", "bmc/chassis.log"} {
			if b, rerr := os.ReadFile(filepath.Join(o.Work, f)); rerr == nil {
				if len(b) > 6000 {
					b = b[len(b)-6000:]
				}
				t.Logf("---- %s (tail)\n%s", f, b)
			}
		}
		t.Fatal(err)
	}
	return r
}

// e2eBurnIn is the `burn_in:` section of the BIOS run: required, every
// test, about 3 s in the VM (issue 17).
const e2eBurnIn = `burn_in:
  mode: required
  default:
    cpu_time: 1s
    memory_fraction: 0.5
    memory_max_bytes: 67108864
    memory_time: 1s
    disk_bytes: 8388608
    disk_regions: 4
    disk_time: 10s
    nics: provisioning
    nic_wait: 10s
`

// TestE2EBIOS: SeaBIOS + iPXE ROM, an IPMI BMC (ipmi_sim), the lab OS
// release (issue 15) to provisioned, with burn-in required (issue 17): the
// machine is available only after its burn-in passed in the VM. The first
// build is served a control-plane layer whose bytes rotted on the
// appliance: it fails in verify with the disk left unbootable, and a power
// cycle netboots the agent again; reprovisioned with the bytes restored,
// the VM boots the written OS, whose first-boot report makes it
// provisioned; the host checks every layer and the per-node layer.
func TestE2EBIOS(t *testing.T) {
	gate(t)
	testreq.Commands(t, "veritysetup", "mksquashfs", "mkfs.ext4", "sgdisk", "syslinux", "mcopy")
	r := run(t, Options{Firmware: "bios", BMC: "ipmi", DiskMiB: 80, Release: true, VerifyFault: true, ExtraConfig: e2eBurnIn, Timeout: 10 * time.Minute})
	if !strings.HasPrefix(r.BurnIn, "passed=true ") || strings.Count(r.BurnIn, "=true/") != 4 {
		t.Errorf("burn-in before available: %q, want passed with 4 tests", r.BurnIn)
	}
	if r.FaultReason != "digest_mismatch" || !r.FaultCleared || r.NetbootSeconds <= 0 {
		t.Errorf("the faulty build: reason %q, partition table cleared %v, netbooted again after %.1f s; want digest_mismatch, cleared, netbooted",
			r.FaultReason, r.FaultCleared, r.NetbootSeconds)
	}
	mustShowRelease(t, "bios", r)
	fmt.Printf("e2e: bios verify failure (%s) left the disk unbootable; the VM netbooted the agent again %.1f s after a power cycle\n", r.FaultReason, r.NetbootSeconds)
}

// TestE2EUEFI: OVMF + iPXE EFI, the virtual Redfish BMC and a TPM 2.0
// (swtpm), the lab OS release to provisioned through the attestation gate
// (issue 16): the first claim of the model is refused (no approved state)
// with no credential staged; its measured boot is learned and approved;
// the second build attests, passes, gets its credentials (the cluster
// token among them), and the written OS boots from the disk (systemd-boot)
// and reports its first boot (issue 15).
func TestE2EUEFI(t *testing.T) {
	gate(t)
	testreq.Commands(t, "swtpm", "swtpm_setup") // the attested UEFI e2e gives the VM a TPM 2.0
	testreq.Commands(t, "veritysetup", "mksquashfs", "mkfs.ext4", "sgdisk", "syslinux", "mcopy")
	r := run(t, Options{Firmware: "uefi", BMC: "redfish", DiskMiB: 80, Release: true, Attest: true, ExtraConfig: e2eAttest, Timeout: 10 * time.Minute})
	if r.AttestPassed == nil || r.AttestPassed.Result != "passed" || r.AttestPassed.State == "" || r.AttestPassed.Events == 0 {
		t.Fatalf("the provisioned build's attestation: %+v, want passed against an approved state", r.AttestPassed)
	}
	if r.AttestRefused == nil || r.AttestRefused.Events == 0 {
		t.Errorf("the reference build's refusal: %+v", r.AttestRefused)
	}
	if r.AttestSeconds <= 0 {
		t.Error("no attest step started→succeeded in the passing build's events")
	}
	mustShowRelease(t, "uefi", r)
	fmt.Printf("e2e: attested uefi provisioned in %.1f s (attest step %.2f s; the model's first build refused: %s)\n",
		r.Seconds, r.AttestSeconds, r.AttestRefused.Reason)
}

// TestE2EDiskTooSmall: a VM whose disk is smaller than the image ends failed
// with reason disk_too_small, its disk untouched.
func TestE2EDiskTooSmall(t *testing.T) {
	gate(t)
	r := run(t, Options{Firmware: "bios", BMC: "ipmi", DiskMiB: 8, ImageMiB: 24, WantReason: "disk_too_small"})
	if r.FinalState != client.StateFailed || r.Reason != "disk_too_small" {
		t.Fatalf("machine ended %s (%s), want failed (disk_too_small)", r.FinalState, r.Reason)
	}
	if !r.DiskUntouched {
		t.Fatal("the too-small disk was written to")
	}
	fmt.Printf("e2e: bios disk_too_small failed in %.1f s\n", r.Seconds)
}

// mustShowRelease is the must-show of a release build (issue 15).
func mustShowRelease(t *testing.T, fw string, r *Result) {
	t.Helper()
	if r.FinalState != client.StateProvisioned || r.Reason != "first_boot_reported" {
		t.Fatalf("machine ended %s (%s), want provisioned (first_boot_reported)", r.FinalState, r.Reason)
	}
	b := r.Machine.Build
	if b == nil || b.FirstBoot == nil || !b.FirstBoot.Match || b.FirstBoot.Hostname != "lab-node-1" ||
		b.FirstBoot.SSHHostKeyFingerprint == "" || b.FirstBoot.SSHHostKeyFingerprint != b.SSHHostKeyFingerprint {
		t.Fatalf("first-boot record %+v, want a matching report with hostname lab-node-1 and the build's host key fingerprint", b)
	}
	if !r.OSUp {
		t.Error("the written OS did not say it was up with the claim's hostname on the console")
	}
	if r.ReleaseProblem != "" {
		t.Errorf("the disk is not as the build record says: %s", r.ReleaseProblem)
	}
	if !strings.Contains(r.LayerChoice, "control-plane (") || !strings.Contains(r.LayerChoice, "skipped") || !strings.Contains(r.LayerChoice, "gpu (") {
		t.Errorf("layer choice %q: want control-plane chosen (role) and gpu skipped (no NVIDIA device in the VM)", r.LayerChoice)
	}
	if !r.JoinDataStaged {
		t.Error("the cluster token is not in the node layer on the disk")
	}
	if r.SecretLeak != "" {
		t.Errorf("the cluster token appeared in: %s", r.SecretLeak)
	}
	fmt.Printf("e2e: %s provisioned (first boot reported) in %.1f s (its build to the first-boot report %.1f s); layers %s\n", fw, r.Seconds, r.BuildSeconds, r.LayerChoice)
}
