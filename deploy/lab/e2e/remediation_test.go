package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"kiln/api/client"
)

// TestE2ERemediation (issue 14): two BIOS VMs behind their own virtual
// Redfish BMCs on one lab; the claimed one's BMC turns Critical and stays
// so; the ladder climbs to rma and the claim's spare (the other VM, which
// matches the claim's selector) is built and verified byte for byte.
func TestE2ERemediation(t *testing.T) {
	gate(t)
	o := Options{Root: repoRoot(t), Work: filepath.Join(t.TempDir(), "lab"), Prefix: "kln", Out: logWriter{t},
		DiskMiB: 64, ImageMiB: 24, MemMiB: 384, Timeout: 6 * time.Minute}
	if p := os.Getenv("KILN_LAB_PREFIX"); p != "" {
		o.Prefix = p
	}
	r, err := RunRemediation(context.Background(), o)
	if err != nil {
		for _, f := range []string{"kiln.log", "bmc-1/serial-1.log", "bmc-2/serial-1.log", "bmc-1/vbmc.log", "bmc-2/vbmc.log"} {
			if b, rerr := os.ReadFile(filepath.Join(o.Work, f)); rerr == nil {
				if len(b) > 6000 {
					b = b[len(b)-6000:]
				}
				t.Logf("---- %s (tail)\n%s", f, b)
			}
		}
		t.Fatal(err)
	}
	for _, h := range r.Remediation.History {
		t.Logf("ladder %s: %-12s %-9s %5.1f s  %s", r.Failed, h.Step, h.Result, h.Ended.Sub(h.Started).Seconds(), h.Why)
	}
	for _, h := range r.Remediation.History {
		// The VM's only fault is its BMC's Critical health: a step that failed
		// for another reason (a build refused, a BMC error) was not really tried.
		if h.Result == "failed" && !strings.Contains(h.Why, "still Critical") && !strings.Contains(h.Why, "still unhealthy") {
			t.Errorf("ladder step %s failed for a reason other than the health it was to repair: %s", h.Step, h.Why)
		}
	}
	if r.FailedState != stateRMA {
		t.Errorf("failed machine %s ended %s, want rma", r.Failed, r.FailedState)
	}
	if len(r.Steps) < 2 || r.Steps[0] != "power_cycle" || r.Steps[len(r.Steps)-1] != "rma" {
		t.Errorf("ladder %v: want it to start at power_cycle (cheapest first) and end at rma", r.Steps)
	}
	if r.Remediation.Report == nil || len(r.Remediation.Report.Conditions) == 0 {
		t.Errorf("the RMA report carries no health conditions: %+v", r.Remediation.Report)
	} else if !strings.Contains(fmt.Sprint(r.Remediation.Report.BMCEvents), "CPU1 IERR") {
		t.Errorf("the RMA report's BMC events lack the SEL entry the BMC logged: %+v", r.Remediation.Report.BMCEvents)
	}
	if !r.StillCritical {
		t.Error("the failed VM's BMC no longer reports Critical: the scenario did not keep it broken")
	}
	if !r.FailedWiped {
		t.Errorf("the failed machine %s's disk was not erased before rma (first MiB not zero)", r.Failed)
	}
	if r.SpareState != client.StateProvisioned {
		t.Fatalf("spare %s ended %s (%s), want provisioned", r.Spare, r.SpareState, r.SpareReason)
	}
	if r.SpareReplaces != r.Failed {
		t.Errorf("spare %s's claim replaces %q, want %s", r.Spare, r.SpareReplaces, r.Failed)
	}
	if r.SpareReason != "booted_local_disk" {
		t.Errorf("spare provisioned with reason %q, want booted_local_disk", r.SpareReason)
	}
	if !r.DiskImageOK {
		t.Errorf("the spare's disk is not as the build must leave it: %s", r.DiskProblem)
	}
	if !r.DiskBooted {
		t.Error("the spare did not boot the image's boot sector from its disk")
	}
	if md := r.Cidata["meta-data"]; !strings.Contains(md, "lab-node-1") || !strings.Contains(md, r.Spare) {
		t.Errorf("the spare's cidata meta-data lacks the claim's hostname or its instance id: %q", md)
	}
	if r.ProvisionedAt.IsZero() || r.DeclaredAt.IsZero() {
		t.Fatalf("no time for the spare's provisioned (%v) or the declared failure (%v)", r.ProvisionedAt, r.DeclaredAt)
	}
	fmt.Printf("e2e: remediation %s %s; spare %s provisioned in %.1f s after failure (BMC set Critical; %.1f s after Kiln declared it failed; ladder started %.1f s after Critical; run %.0f s)\n",
		r.Failed, strings.Join(r.Steps, "→"), r.Spare, r.ProvisionedAt.Sub(r.CriticalAt).Seconds(),
		r.ProvisionedAt.Sub(r.DeclaredAt).Seconds(), r.LadderAt.Sub(r.CriticalAt).Seconds(), r.Seconds)
}
