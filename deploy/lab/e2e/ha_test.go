package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"kiln/deploy/lab/testreq"
)

// TestE2EHA is `make e2e-ha` (issue 12, "the site cluster, for real"):
// three `kiln serve` nodes (bin/kiln) in their own network namespaces on one
// provisioning bridge; four VMs (SeaBIOS+iPXE and OVMF, ipmi_sim and vbmc
// Redfish BMCs) enrolled at once, so Kiln powers them on together. While a
// VM is mid-build (its write step has begun) the raft leader gets SIGKILL
// and is started again 5 s later; then a non-leader (the node that served
// a building VM's boot, when there is one) is stopped with SIGTERM and
// started again; then the leader of that moment is cut off from the other
// nodes for 30 s and healed. A writer streams machine creations at all
// three nodes throughout. At the end, on every node: every VM provisioned
// (reason booted_local_disk) and its disk as the build must leave it,
// every acknowledged write and every event read during the run present,
// the same live leases; and on the wire: no address ACKed to two clients
// for overlapping leases, and every live ACK the store's holder; and every
// VM's agent started once (no needless power cycle, no restarted build).
func TestE2EHA(t *testing.T) {
	if os.Getenv("KILN_E2E") == "" {
		t.Skip("HA end-to-end VM test: run it with `make e2e-ha` (sets KILN_E2E=1; needs root, qemu, the built env)")
	}
	testreq.Root(t, "HA end-to-end VM test: network namespaces, tap devices")
	o := HAOptions{Root: repoRoot(t), Work: filepath.Join(t.TempDir(), "ha"), Prefix: "kha", Out: logWriter{t}}
	if w := os.Getenv("KILN_E2E_HA_WORK"); w != "" {
		o.Work = w // kept after the run: node logs, serial logs, BMC state
		_ = os.RemoveAll(w)
	}
	if p := os.Getenv("KILN_LAB_PREFIX"); p != "" {
		o.Prefix = p + "h"
	}
	start := time.Now()
	r, err := RunHA(context.Background(), o)
	if err != nil || (r != nil && len(r.Problems) > 0) {
		for i := 1; i <= 3; i++ {
			tailFile(t, filepath.Join(o.Work, fmt.Sprintf("n%d", i), "kiln.log"), 8000)
		}
		for i := 1; i <= len(DefaultHAVMs); i++ {
			tailFile(t, filepath.Join(o.Work, fmt.Sprintf("vm%d", i), "bmc", "serial-1.log"), 3000)
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range r.Machines {
		t.Logf("%s (%s, %s/%s): %s (%s) in %.1f s, lease %s, %d ACKs, agent booted %d×, disk ok %v, cidata %v, left iPXE for the firmware %v",
			m.Name, m.ID, m.Firmware, m.BMC, m.State, m.Reason, m.Seconds, m.IP, m.ACKs, m.AgentBoots, m.DiskOK, m.Cidata, m.DiskBooted)
	}
	t.Logf("leader %s (agents of %v) killed at %.1f s (mid-build: %s), new leader %s in %.1f s", r.KilledNode, r.KilledServes, r.KilledAt,
		strings.Join(r.KilledBuild, ", "), r.NewLeader, r.ElectedIn)
	t.Logf("non-leader %s (agents of %v) restarted (SIGTERM) at %.1f s (not yet provisioned: %s)", r.RestartedNode, r.RestartedServes,
		r.RestartedAt, strings.Join(r.RestartedBuild, ", "))
	t.Logf("leader %s (agents of %v) partitioned at %.1f s for %s (not yet provisioned: %s)", r.CutNode, r.CutServes, r.CutAt, r.CutFor,
		strings.Join(r.CutBuild, ", "))
	t.Logf("%d acknowledged writes, %d DHCPACKs and %d NAKs on the bridge; whole run %.1f s", r.AckedWrites, r.ACKs, r.NAKs, time.Since(start).Seconds())
	fmt.Println(r.Line())
	for _, p := range r.Problems {
		t.Error(p)
	}
	if r.Provisioned != len(DefaultHAVMs) || r.DupAddrs != 0 || r.LostWrites != 0 {
		t.Fatalf("%d of %d provisioned, %d duplicate addresses, %d lost writes", r.Provisioned, len(DefaultHAVMs), r.DupAddrs, r.LostWrites)
	}
	if len(r.KilledBuild) == 0 {
		t.Fatal("the leader was not killed while a VM was mid-build")
	}
}

func tailFile(t *testing.T, path string, n int) {
	b, err := os.ReadFile(path)
	if err != nil {
		return
	}
	if len(b) > n {
		b = b[len(b)-n:]
	}
	t.Logf("---- %s (tail)\n%s", path, b)
}
