package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"kiln/api"
	"kiln/api/client"
)

// verify makes the end-of-run checks on every node.
func (r *haRun) verify(ctx context.Context, res *HAResult) error {
	// Every node up, connected and caught up.
	for _, n := range r.nodes {
		if err := n.waitReady(ctx, 60*time.Second); err != nil {
			return err
		}
	}
	problem := func(f string, a ...any) { res.Problems = append(res.Problems, fmt.Sprintf(f, a...)) }
	lost := func(f string, a ...any) {
		res.LostWrites++
		if len(res.Lost) < 10 {
			res.Lost = append(res.Lost, fmt.Sprintf(f, a...))
		}
	}
	r.writes.mu.Lock()
	acked := append([]string(nil), r.writes.machines...)
	sent, failed := r.writes.sent, r.writes.failed
	r.writes.mu.Unlock()
	res.AckedWrites = len(acked) + r.enrols + r.claims + 1 // + the image upload
	r.say("writes: %d machine creations acknowledged (%d sent by the writer, %d not acknowledged), %d BMC enrolments, %d claims, 1 image; %d events read",
		len(acked), sent, failed, r.enrols, r.claims, len(r.seen))

	// Machines, claims, BMCs, image: on every node.
	var first map[string]api.Machine
	for _, n := range r.nodes {
		ms, err := n.api.ListAllMachines(ctx, client.MachineQuery{Consistent: true, Limit: 500})
		if err != nil {
			return fmt.Errorf("%s: machines: %w", n.id, err)
		}
		byID := map[string]api.Machine{}
		for _, m := range ms {
			byID[m.ID] = m
		}
		for _, id := range acked {
			if _, ok := byID[id]; !ok {
				lost("%s: acknowledged machine %s missing", n.id, id)
			}
		}
		for _, v := range r.vms {
			m := byID[v.id]
			if m.BMC == "" {
				lost("%s: %s has no BMC (enrolment acknowledged)", n.id, v.name)
			}
			if m.Claim == nil || m.Claim.Image != r.imgID {
				lost("%s: %s has no claim for %s (provision acknowledged)", n.id, v.name, r.imgID)
			}
			if m.State != client.StateProvisioned {
				problem("%s: %s is %s (%s), want provisioned", n.id, v.name, m.State, m.Reason)
			}
		}
		if first == nil {
			first = byID
		} else {
			for id, m := range byID {
				if f, ok := first[id]; !ok || f.ResourceVersion != m.ResourceVersion || f.State != m.State {
					problem("%s: machine %s differs from %s's replica (rv %d/%d, %s/%s)", n.id, id, r.nodes[0].id, f.ResourceVersion, m.ResourceVersion, f.State, m.State)
				}
			}
			if len(byID) != len(first) {
				problem("%s: %d machines, %s has %d", n.id, len(byID), r.nodes[0].id, len(first))
			}
		}
		imgs, err := n.api.ListImages(ctx)
		if err != nil {
			return fmt.Errorf("%s: images: %w", n.id, err)
		}
		found := false
		for _, im := range imgs {
			found = found || im.ID == r.imgID
		}
		if !found {
			lost("%s: image %s missing", n.id, r.imgID)
		}
		// Every event read during the run, identical on this node.
		evs := map[[2]uint64]api.Event{}
		for after := uint64(0); ; {
			el, err := n.api.Events(ctx, client.EventQuery{After: after, Limit: api.MaxListLimitCap})
			if err != nil {
				return fmt.Errorf("%s: events after %d: %w", n.id, after, err)
			}
			for _, e := range el.Events {
				evs[[2]uint64{e.Index, uint64(e.Seq)}] = e
			}
			if len(el.Events) == 0 || el.Next <= after {
				break
			}
			after = el.Next
		}
		for k, e := range r.seen {
			g, ok := evs[k]
			if !ok || g.Kind != e.Kind || g.Subject != e.Subject || g.To != e.To || !g.Time.Equal(e.Time) {
				lost("%s: event %d.%d (%s %s) missing or changed", n.id, k[0], k[1], e.Kind, e.Subject)
			}
		}
	}

	// Leases: each node's replica (kiln leases --consistent) and the ACKs on the wire.
	acks, naks := r.dhcp.ACKs()
	res.ACKs, res.NAKs = len(acks), naks
	dups := map[string]string{}
	var views []api.LeaseList
	for _, n := range r.nodes {
		var ll api.LeaseList
		if err := n.cliJSON(ctx, &ll, "leases", "--consistent"); err != nil {
			return err
		}
		views = append(views, ll)
	}
	live := func(ll api.LeaseList) map[string]string {
		m := map[string]string{}
		for _, l := range ll.Items {
			if (l.State == "bound" || l.State == "declined") && l.Expiry.After(ll.Time) {
				m[l.IP] = l.MAC
			}
		}
		return m
	}
	held := live(views[0])
	for i, ll := range views[1:] {
		other := live(ll)
		for ip, mac := range other {
			if held[ip] != mac {
				dups[ip] = fmt.Sprintf("%s holds %s for %s, %s for %q", r.nodes[i+1].id, ip, mac, r.nodes[0].id, held[ip])
			}
		}
		if len(other) != len(held) {
			problem("%s: %d live leases, %s has %d", r.nodes[i+1].id, len(other), r.nodes[0].id, len(held))
		}
	}
	for _, ip := range ackOverlaps(acks) {
		dups[ip] = "ACKed to two clients with overlapping leases"
	}
	now := time.Now()
	for _, a := range acks {
		if !a.At.Add(a.Lease).After(now) || held[a.IP] == a.MAC {
			continue
		}
		if h := held[a.IP]; h != "" {
			dups[a.IP] = fmt.Sprintf("ACKed to %s by %s at %s, but the store's live holder is %s", a.MAC, a.Server, a.At.Format(time.RFC3339), h)
		} else {
			problem("%s ACKed to %s by %s at %s for %s has no live binding in the store (an ACK not backed by a commit)",
				a.IP, a.MAC, a.Server, a.At.Format(time.RFC3339), a.Lease)
		}
	}
	for ip, why := range dups {
		res.Dups = append(res.Dups, ip+": "+why)
	}
	sort.Strings(res.Dups)
	res.DupAddrs = len(dups)

	// The VMs: a reboot exits to the disk (a BIOS VM's boot sector prints
	// diskMsg on the serial port; iPXE hands OVMF back its boot order);
	// give them a little time; then stop them all and read their disks.
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(250 * time.Millisecond) {
		all := true
		for _, v := range r.vms {
			all = all && (v.last.State != client.StateProvisioned || leftForDisk(v.spec.Firmware, filepath.Join(v.dir, "bmc")))
		}
		if all {
			break
		}
	}
	killNSProcs(r.net.lan, "qemu-system")
	time.Sleep(300 * time.Millisecond)
	last := r.t0
	for _, v := range r.vms {
		hm := HAMachine{Name: v.name, ID: v.id, MAC: v.mac, Firmware: v.spec.Firmware, BMC: v.spec.BMC, State: v.last.State, Reason: v.last.Reason}
		for ip, mac := range held {
			if mac == v.mac {
				hm.IP = ip
			}
		}
		for _, a := range acks {
			if a.MAC == v.mac {
				hm.ACKs++
			}
		}
		if hm.ACKs == 0 {
			problem("%s: no DHCPACK seen on the bridge", v.name)
		}
		if hm.IP == "" {
			problem("%s: no live lease in the store", v.name)
		}
		if !v.settledAt.IsZero() {
			if v.settledAt.After(last) {
				last = v.settledAt
			}
			if !v.powerOn.IsZero() {
				hm.Seconds = v.settledAt.Sub(v.powerOn).Seconds()
			}
		}
		hm.DiskBooted = leftForDisk(v.spec.Firmware, filepath.Join(v.dir, "bmc"))
		hm.AgentBoots = serialCount(filepath.Join(v.dir, "bmc"), agentStart)
		if hm.AgentBoots != 1 {
			problem("%s: the in-RAM agent started %d times, want 1 (a power cycle of a machine whose agent was alive, or a restarted build)", v.name, hm.AgentBoots)
		}
		var err error
		if hm.DiskProblem, err = checkDisk(v.disk, r.img); err != nil {
			return err
		}
		hm.DiskOK = hm.DiskProblem == ""
		if cd, err := readCidata(v.disk); err == nil {
			hm.Cidata = strings.Contains(cd["meta-data"], v.name) && strings.Contains(cd["meta-data"], v.id)
		}
		switch {
		case v.last.State != client.StateProvisioned:
			problem("%s ended %s (%s): %s", v.name, v.last.State, v.last.Reason, v.last.Message)
		case !hm.DiskOK:
			problem("%s: disk: %s", v.name, hm.DiskProblem)
		case !hm.Cidata:
			problem("%s: the cidata partition lacks its hostname or instance id", v.name)
		case !hm.DiskBooted:
			problem("%s: provisioned, but after the exit-to-disk script it did not leave iPXE for the firmware's next boot device (%s)", v.name, v.spec.Firmware)
		default:
			res.Provisioned++
		}
		res.Machines = append(res.Machines, hm)
	}
	first0 := r.t0
	for _, v := range r.vms {
		if !v.powerOn.IsZero() && (first0.Equal(r.t0) || v.powerOn.Before(first0)) {
			first0 = v.powerOn
		}
	}
	res.Seconds = last.Sub(first0).Seconds()
	res.KilledAt -= first0.Sub(r.t0).Seconds()
	res.RestartedAt -= first0.Sub(r.t0).Seconds()
	res.CutAt -= first0.Sub(r.t0).Seconds()
	if res.LostWrites > 0 {
		problem("%d acknowledged writes lost: %s", res.LostWrites, strings.Join(res.Lost, "; "))
	}
	if res.DupAddrs > 0 {
		problem("%d addresses held by two machines: %s", res.DupAddrs, strings.Join(res.Dups, "; "))
	}
	return nil
}

// agentStart is what the in-RAM environment's /init prints as it starts the agent.
const agentStart = "kiln-init: starting kiln-agent"

// serialCount counts the occurrences of marker in the serial logs in dir.
func serialCount(dir, marker string) int {
	n := 0
	logs, _ := filepath.Glob(filepath.Join(dir, "serial*.log"))
	for _, l := range logs {
		if b, err := os.ReadFile(l); err == nil {
			n += strings.Count(string(b), marker)
		}
	}
	return n
}

// serialHas reports whether any serial log in dir contains marker.
// leftForDisk reports whether the VM whose serial logs are in dir left
// iPXE for its disk: BIOS, the image's boot sector ran; UEFI, iPXE gave
// control back to OVMF after the exit-to-disk script
// (uefiReturnedToFirmware: during the faults OVMF's next network option
// may wait out its DHCP timeout before the disk's option comes).
func leftForDisk(firmware, dir string) bool {
	if firmware == "bios" {
		return serialHas(dir, diskMsg)
	}
	logs, _ := filepath.Glob(filepath.Join(dir, "serial*.log"))
	for _, l := range logs {
		if b, err := os.ReadFile(l); err == nil && uefiReturnedToFirmware(b) {
			return true
		}
	}
	return false
}

func serialHas(dir, marker string) bool {
	logs, _ := filepath.Glob(filepath.Join(dir, "serial*.log"))
	for _, l := range logs {
		if b, err := os.ReadFile(l); err == nil && strings.Contains(string(b), marker) {
			return true
		}
	}
	return false
}

// killNSProcs sends SIGKILL to the processes in ns whose command line
// starts with prefix.
func killNSProcs(ns, prefix string) {
	out, _ := exec.Command("ip", "netns", "pids", ns).Output()
	for _, f := range strings.Fields(string(out)) {
		var pid int
		if _, err := fmt.Sscan(f, &pid); err != nil {
			continue
		}
		cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if strings.HasPrefix(string(cmdline), prefix) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}
