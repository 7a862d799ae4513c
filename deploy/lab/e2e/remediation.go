package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"kiln/api"
	"kiln/api/client"
	"kiln/deploy/lab/labnet"
)

// The remediation lab's second BMC address (the first is labnet.BMCAddr),
// added to the LAN namespace's end of the BMC veth.
const bmcAddr2 = "10.99.1.11"

// stateRMA is stateRMA (a machine declared failed, returned to the
// vendor); api/client has no name for it yet.
const stateRMA client.MachineState = "rma"

// remediationConfig is the lab's `remediation:` section: the ladder's
// timeouts cut to what TCG VMs need (a BIOS boot to the agent is ~15 s,
// a build ~30 s), the health poll every 2 s, and no drain (the lab claim
// has no owner to acknowledge it).
const remediationConfig = `remediation:
  settle: 5s
  steps:
    power_cycle: 60s
    reinspect: 120s
    reprovision: 150s
  drain:
    timeout: -1s
  health:
    interval: 2s
    backoff: 2s
    max_backoff: 10s
`

// RemediationResult is what RunRemediation saw.
type RemediationResult struct {
	Failed, Spare string // machine IDs: the claimed VM made Critical, the VM that took its claim
	FailedState   client.MachineState
	Steps         []string         // the failed machine's ladder, as its record tells it (history, then the final step)
	Remediation   *api.Remediation // the failed machine's record (history, RMA report)
	SpareState    client.MachineState
	SpareReason   string
	SpareReplaces string // the spare's Claim.Replaces
	Selector      map[string]string
	CriticalAt    time.Time // the test told the failed VM's BMC Critical (this host's clock)
	LadderAt      time.Time // Kiln started the ladder (Remediation.Started)
	DeclaredAt    time.Time // Kiln declared the machine failed (the erase step's start, or rma's)
	ProvisionedAt time.Time // the spare's transition to provisioned (event time)
	StillCritical bool      // the failed VM's BMC still reports Critical at the end
	DiskImageOK   bool      // the spare's disk (checkDisk)
	DiskProblem   string
	DiskBooted    bool // the spare booted the image's boot sector
	Cidata        map[string]string
	FailedWiped   bool // the failed VM's first MiB is zero (the erase before rma)
	Seconds       float64
}

// labVM is one VM of the shared lab with its own virtual Redfish BMC.
type labVM struct {
	name, mac, uuid, tap, bmc string
	id, stateDir, disk        string
}

// RunRemediation runs issue 14's VM scenario on one lab: two BIOS VMs, each
// behind its own vbmc, inspected to available; one claimed by label (the
// other matches the selector too) and built; then its BMC is told Critical
// and left so. Kiln's health poll sees it, the ladder climbs to rma, and
// the claim is built on the other VM. o.Firmware is bios and o.BMC redfish.
func RunRemediation(ctx context.Context, o Options) (*RemediationResult, error) {
	if o.Out == nil {
		o.Out = io.Discard
	}
	o.Firmware, o.BMC = "bios", "redfish"
	o.ExtraConfig += remediationConfig
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	t0 := time.Now()
	if err := preflight(o); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(o.Work, 0o755); err != nil {
		return nil, err
	}
	say := func(f string, a ...any) { fmt.Fprintf(o.Out, f+"\n", a...) }
	r := &RemediationResult{}

	lab, err := labnet.Setup(o.Prefix)
	if err != nil {
		return nil, err
	}
	if !o.KeepUp {
		defer lab.Teardown()
	}
	vms := []*labVM{
		{name: "lab-rem-1", mac: "52:54:00:99:01:01", uuid: "5e1f0000-0000-4000-8000-525400990101", tap: "tap0", bmc: labnet.BMCAddr},
		{name: "lab-rem-2", mac: "52:54:00:99:01:02", uuid: "5e1f0000-0000-4000-8000-525400990102", tap: "tap1", bmc: bmcAddr2},
	}
	for _, v := range vms {
		if err := lab.AddTap(v.tap); err != nil {
			return nil, err
		}
	}
	if out, err := exec.Command("ip", "-n", lab.LAN, "addr", "add", bmcAddr2+"/24", "dev", "bmc0-p").CombinedOutput(); err != nil {
		return nil, fmt.Errorf("second BMC address: %v: %s", err, out)
	}
	img, err := buildImage(o)
	if err != nil {
		return nil, err
	}
	k, err := startKiln(ctx, o, lab)
	if err != nil {
		return nil, err
	}
	if err := startRadvd(o, lab); err != nil {
		return nil, err
	}
	say("kiln: serving on %s (log %s); remediation: settle 5s, health poll 2s, no drain", labnet.ServerIf, k.logPath)
	for i, v := range vms {
		v.stateDir = filepath.Join(o.Work, fmt.Sprintf("bmc-%d", i+1))
		v.disk = filepath.Join(o.Work, fmt.Sprintf("disk-%d.img", i+1))
		if err := os.MkdirAll(v.stateDir, 0o755); err != nil {
			return nil, err
		}
		if err := os.WriteFile(v.disk, nil, 0o644); err != nil {
			return nil, err
		}
		if err := os.Truncate(v.disk, int64(o.DiskMiB)<<20); err != nil {
			return nil, err
		}
		listen := v.bmc + ":8443"
		if err := startVBMC(ctx, o, lab, v.stateDir, listen, vmArgs(o, v.disk, vmSpec{mac: v.mac, uuid: v.uuid, tap: v.tap}), v.mac, v.uuid); err != nil {
			return nil, err
		}
		v.bmc = listen
	}
	csv := "name,macs,boot_mode,rack,u,labels\n"
	for i, v := range vms {
		csv += fmt.Sprintf("%s,%s,legacy,lab-r%d,1,lab=e2e\n", v.name, v.mac, i+1)
	}
	if _, err := k.api.ImportMachines(ctx, "csv", strings.NewReader(csv)); err != nil {
		return nil, fmt.Errorf("import: %w", err)
	}
	ms, err := k.api.ListAllMachines(ctx, client.MachineQuery{})
	if err != nil {
		return nil, err
	}
	for _, m := range ms {
		for _, v := range vms {
			if m.Name == v.name {
				v.id = m.ID
			}
		}
	}
	if len(ms) != 2 || vms[0].id == "" || vms[1].id == "" {
		return nil, fmt.Errorf("after import: %d machines, want %s and %s", len(ms), vms[0].name, vms[1].name)
	}
	im, err := uploadImage(ctx, k.api, img)
	if err != nil {
		return nil, err
	}
	for _, v := range vms {
		if _, err := k.api.EnrollBMC(ctx, v.id, api.BMCEnrollRequest{Address: v.bmc, Driver: "redfish",
			Username: bmcUser, Password: bmcPass, InsecureTLS: true}); err != nil {
			return nil, fmt.Errorf("bmc enroll %s: %w", v.id, err)
		}
		say("machine %s (%s): BMC %s enrolled; Kiln powers it on to inspect", v.id, v.name, v.bmc)
	}

	w := &watcher{k: k, o: o, id: vms[0].id, stateDir: vms[0].stateDir, say: say}
	get := func(id string) (api.Machine, error) { return k.api.GetMachine(ctx, id) }
	settledIn := func(m api.Machine) bool {
		return m.State == client.StateAvailable || m.State == client.StateFailed || m.State == client.StateQuarantined
	}
	var other api.Machine
	if err := w.until(ctx, func(m api.Machine) bool {
		if !settledIn(m) {
			return false
		}
		other, err = get(vms[1].id)
		return err == nil && settledIn(other)
	}); err != nil {
		return r, err
	}
	if w.last.State != client.StateAvailable || other.State != client.StateAvailable {
		return r, fmt.Errorf("inspection ended %s (%s) and %s (%s), want both available", w.last.State, w.last.Message, other.State, other.Message)
	}
	say("inspect: both available after %.0f s", time.Since(t0).Seconds())

	sel := map[string]string{"lab": "e2e"}
	claimed, err := k.api.Claim(ctx, api.ClaimRequest{Role: "worker", Labels: sel, Count: 1, Reason: "e2e remediation",
		Claim: api.Claim{Image: im.ID, Hostname: "lab-node-1", Labels: sel}})
	if err != nil || len(claimed) != 1 {
		return r, fmt.Errorf("claim: %d machines, %v", len(claimed), err)
	}
	var bad, spare *labVM
	for _, v := range vms {
		if v.id == claimed[0].ID {
			bad = v
		} else {
			spare = v
		}
	}
	if bad == nil {
		return r, fmt.Errorf("claim took %s, not a lab VM", claimed[0].ID)
	}
	r.Failed, r.Selector = bad.id, claimed[0].Claim.Selector
	say("claim: %s (selector %v); %s matches it too and stays a spare", bad.id, sel, spare.id)
	w = &watcher{k: k, o: o, id: bad.id, stateDir: bad.stateDir, say: say, after: w.after}
	if err := w.until(ctx, func(m api.Machine) bool {
		return m.State == client.StateProvisioned || m.State == client.StateFailed || m.State == client.StateQuarantined
	}); err != nil {
		return r, err
	}
	if w.last.State != client.StateProvisioned {
		return r, fmt.Errorf("claimed machine %s ended %s (%s), want provisioned", bad.id, w.last.State, w.last.Message)
	}
	if !waitSerial(ctx, bad.stateDir, diskMsg, 60*time.Second) {
		return r, fmt.Errorf("claimed machine %s: provisioned but its boot sector never ran", bad.id)
	}
	say("provisioned: %s booted its disk after %.0f s", bad.id, time.Since(t0).Seconds())

	// The failure: the BMC reports the system Critical, with a SEL entry, and keeps it.
	if out, err := vbmcHealth(ctx, lab, bad.bmc, "POST", `{"system":"Critical","event":"CPU1 IERR (e2e)"}`); err != nil {
		return r, fmt.Errorf("vbmc health knob: %v: %s", err, out)
	}
	r.CriticalAt = time.Now()
	say("failure: BMC %s says Critical (CPU1 IERR) and stays so", bad.bmc)

	var sp api.Machine
	if err := w.until(ctx, func(m api.Machine) bool {
		if m.State == stateRMA && m.Remediation != nil && m.Remediation.Spare != "" {
			sp, err = get(m.Remediation.Spare)
			return err == nil && (sp.State == client.StateProvisioned || sp.State == client.StateFailed || sp.State == client.StateQuarantined)
		}
		return m.Remediation != nil && m.Remediation.Outcome == "remediated"
	}); err != nil {
		return r, err
	}
	fm := w.last
	r.FailedState = fm.State
	if fm.Remediation == nil {
		return r, fmt.Errorf("machine %s has no remediation record", bad.id)
	}
	rem := fm.Remediation
	r.Remediation = rem
	for _, h := range rem.History {
		r.Steps = append(r.Steps, h.Step)
		if r.DeclaredAt.IsZero() && (h.Step == "erase" || h.Step == "rma") {
			r.DeclaredAt = h.Started
		}
	}
	if rem.Step != "" && (len(r.Steps) == 0 || r.Steps[len(r.Steps)-1] != rem.Step) {
		r.Steps = append(r.Steps, rem.Step)
		if r.DeclaredAt.IsZero() && rem.Step == "rma" {
			r.DeclaredAt = rem.StepStarted
		}
	}
	r.LadderAt = rem.Started
	if rem.Outcome != "rma" {
		return r, fmt.Errorf("machine %s: ladder %s ended %q (%s), want rma", bad.id, strings.Join(r.Steps, "→"), rem.Outcome, fm.Message)
	}
	if rem.Spare != spare.id {
		return r, fmt.Errorf("machine %s: claim went to %q, want the spare %s", bad.id, rem.Spare, spare.id)
	}
	r.Spare, r.SpareState, r.SpareReason = sp.ID, sp.State, sp.Reason
	if sp.Claim != nil {
		r.SpareReplaces = sp.Claim.Replaces
	}
	for _, e := range w.seen {
		if e.Kind == "transition" && e.Subject == "machine/"+sp.ID && e.To == string(client.StateProvisioned) {
			r.ProvisionedAt = e.Time
		}
	}
	if out, err := vbmcHealth(ctx, lab, bad.bmc, "GET", ""); err == nil {
		r.StillCritical = strings.Contains(string(out), `"system":"Critical"`)
	} else {
		return r, fmt.Errorf("vbmc health read: %v: %s", err, out)
	}
	if sp.State == client.StateProvisioned {
		r.DiskBooted = waitSerial(ctx, spare.stateDir, diskMsg, 60*time.Second)
		stopVM(ctx, k, sp.ID, lab)
		if r.DiskProblem, err = checkDisk(spare.disk, img); err != nil {
			return r, err
		}
		r.DiskImageOK = r.DiskProblem == ""
		if r.Cidata, err = readCidata(spare.disk); err != nil {
			return r, err
		}
		if r.FailedWiped, err = firstMiBZero(bad.disk); err != nil {
			return r, err
		}
		say("disks: spare %s as the build must leave it: %v %s; failed %s first MiB zero (erased): %v",
			sp.ID, r.DiskImageOK, r.DiskProblem, bad.id, r.FailedWiped)
	}
	r.Seconds = time.Since(t0).Seconds()
	return r, nil
}

// vbmcHealth calls the vbmc health knob of the BMC at addr (host:port)
// from the server namespace (deploy/lab/vbmc/README.md): POST body, or GET.
func vbmcHealth(ctx context.Context, lab *labnet.Lab, addr, method, body string) ([]byte, error) {
	args := []string{"-ksS", "--fail-with-body", "-u", bmcUser + ":" + bmcPass, "-X", method}
	if body != "" {
		args = append(args, "-H", "Content-Type: application/json", "-d", body)
	}
	args = append(args, "https://"+addr+"/vbmc/control/systems/1/health")
	return lab.Command(ctx, lab.Srv, "curl", args...).CombinedOutput()
}

// firstMiBZero: the first MiB of the disk image is all zeros (the erase
// zeroes it whatever the discard does).
func firstMiBZero(path string) (bool, error) {
	f, err := os.Open(path)
	if err != nil {
		return false, err
	}
	defer f.Close()
	b := make([]byte, 1<<20)
	if _, err := io.ReadFull(f, b); err != nil && !errors.Is(err, io.ErrUnexpectedEOF) {
		return false, err
	}
	return firstNonZero(b) < 0, nil
}
