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

// TestE2EBIOS: SeaBIOS + iPXE ROM, an IPMI BMC (ipmi_sim), to provisioned,
// with burn-in required: the machine is available only after its burn-in
// (CPU, memory, disk, NIC) passed in the VM.
func TestE2EBIOS(t *testing.T) {
	gate(t)
	r := run(t, Options{Firmware: "bios", BMC: "ipmi", DiskMiB: 64, ImageMiB: 24, ExtraConfig: e2eBurnIn})
	if !strings.HasPrefix(r.BurnIn, "passed=true ") || strings.Count(r.BurnIn, "=true/") != 4 {
		t.Errorf("burn-in before available: %q, want passed with 4 tests", r.BurnIn)
	}
	checkProvisioned(t, "bios", r)
	if !r.DiskBooted {
		t.Error("after the build, the VM did not boot the image's boot sector from its disk")
	}
}

// TestE2EUEFI: OVMF + iPXE EFI, the virtual Redfish BMC and a TPM 2.0
// (swtpm), to provisioned through the attestation gate (issue 16): the
// first claim of the model is refused (no approved state) with nothing
// staged; its measured boot is learned and approved; the second build
// attests, passes and is provisioned with the claim's join data on disk.
func TestE2EUEFI(t *testing.T) {
	gate(t)
	testreq.Commands(t, "swtpm", "swtpm_setup") // the attested UEFI e2e gives the VM a TPM 2.0
	r := run(t, Options{Firmware: "uefi", BMC: "redfish", DiskMiB: 64, ImageMiB: 24, Attest: true, ExtraConfig: e2eAttest})
	checkProvisioned(t, "uefi", r)
	if !r.DiskBooted {
		t.Error("after the build's exit-to-disk script, OVMF did not go on to the disk's boot option (an iPXE shell, or back to the network)")
	}
	if r.AttestPassed == nil || r.AttestPassed.Result != "passed" || r.AttestPassed.State == "" || r.AttestPassed.Events == 0 {
		t.Fatalf("the provisioned build's attestation: %+v, want passed against an approved state", r.AttestPassed)
	}
	if r.AttestRefused == nil || r.AttestRefused.Events == 0 {
		t.Errorf("the reference build's refusal: %+v", r.AttestRefused)
	}
	if !r.JoinDataStaged {
		t.Error("the attested build's disk holds no join data")
	}
	if r.AttestSeconds <= 0 {
		t.Error("no attest step started→succeeded in the passing build's events")
	}
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

func checkProvisioned(t *testing.T, fw string, r *Result) {
	t.Helper()
	if r.FinalState != client.StateProvisioned {
		t.Fatalf("machine ended %s (%s), want provisioned", r.FinalState, r.Reason)
	}
	if !r.DiskImageOK {
		t.Errorf("the disk is not as the build must leave it: %s", r.DiskProblem)
	}
	md := r.Cidata["meta-data"]
	if !strings.Contains(md, "lab-node-1") || !strings.Contains(md, r.MachineID) {
		t.Errorf("cidata meta-data lacks the hostname or instance id: %q", md)
	}
	if _, ok := r.Cidata["user-data"]; !ok {
		t.Error("cidata has no user-data")
	}
	if r.Reason != "booted_local_disk" {
		t.Errorf("provisioned with reason %q, want booted_local_disk (the reboot's netboot was told to exit to disk)", r.Reason)
	}
	if r.PowerOnAt.IsZero() {
		t.Error("power-on was never observed")
	}
	fmt.Printf("e2e: %s provisioned in %.1f s\n", fw, r.Seconds)
}
