package fleetsim

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/iana"
	"github.com/pin/tftp/v3"

	"kiln/api/agentapi"
	"kiln/deploy/lab/swtpm"
)

// machine is one simulated server: its NIC's MAC, its hardware as the rack
// plan and its agent report it, and its BMC's address. Its vbmc
// ComputerSystem calls PowerOn and PowerOff (it implements vbmc.Power); a
// power-on runs boot in a goroutine until the machine is powered off.
type machine struct {
	f      *fleet
	i      int
	name   string
	mac    net.HardwareAddr
	serial string
	uuid   string
	bmc    netip.Addr
	id     string // Kiln's machine ID, set after the import
	// tpm is the machine's TPM (Options.Attest), measured: since its last
	// reset; reclaim: the reference, to be claimed again once available
	// (attest.go); cmdline: the kernel command line of the last agent boot.
	tpm      *swtpm.TPM
	measured bool
	reclaim  bool
	cmdline  string
	// claimed: claimed in the day-2 set-up (POST /v1/machines/claim); not a spare.
	claimed bool

	mu     sync.Mutex
	on     bool
	cancel context.CancelFunc
	boots  int

	t   times // guarded by mu
	err error // the first error of the simulation itself, guarded by mu
}

// times are the moments of one machine's run (zero: not reached).
type times struct {
	powerOn, dhcpStart, dhcpDone, stageDone, envDone time.Time
	registered, available, writeStart, writeDone     time.Time
	verifyStart, verifyDone, rebootReport            time.Time
	provisioned, failed                              time.Time
	erased                                           time.Time       // the first erase report (day 2)
	reports                                          []time.Duration // each agent report's round trip
	failReason                                       string
	retries                                          int      // network boots tried again after an error
	retryErrs                                        []string // their errors
	downloads                                        int      // image downloads begun
}

const (
	fleetVendor = "Kiln Labs"
	fleetModel  = "FS-1"
	fleetCPUs   = 8
	fleetMemGiB = 16
	diskBytes   = 480_000_000_000
)

func (m *machine) PowerOn(override, mode string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.on {
		return nil
	}
	m.on = true
	m.boots++
	if m.t.powerOn.IsZero() {
		m.t.powerOn = time.Now()
	}
	ctx, cancel := context.WithCancel(m.f.ctx)
	m.cancel = cancel
	go m.run(ctx)
	return nil
}

func (m *machine) PowerOff() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cancel != nil {
		m.cancel()
	}
	m.on = false
	return nil
}

func (m *machine) PoweredOn() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.on
}

func (m *machine) setErr(err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.err == nil {
		m.err = err
	}
}

func (m *machine) mark(p *time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if p.IsZero() {
		*p = time.Now()
	}
}

// netbootRetries is how often a machine tries its network boot again after
// an error (DHCP without an answer, a TFTP or HTTP error) before the
// simulation records the error and leaves the machine powered on and stuck;
// the wait between tries grows 2 s, 4 s, … up to 10 s (about 3 min in all,
// as a PXE ROM looping over its boot order). Five tries 2 s apart were too
// few when 2,000 machines reboot at once after a day-2 claim: Kiln's TFTP
// refuses past 256 transfers ("server busy") for longer than that.
const netbootRetries = 20

// run is one power-on: network boot, then the agent, then (after the build)
// the reboot's network boot to the local disk, after which the machine runs
// its installed OS (idle) until powered off.
func (m *machine) run(ctx context.Context) {
	for n := 0; ctx.Err() == nil; n++ {
		m.mu.Lock()
		first := m.boots == 1 && n == 0 // the first network boot of the run (inspection)
		m.mu.Unlock()
		act, err := m.netboot(ctx, first)
		for try := 1; err != nil && ctx.Err() == nil && try <= netbootRetries; try++ {
			// As PXE firmware does after a failed network boot: try again.
			m.mu.Lock()
			m.t.retries++
			m.t.retryErrs = append(m.t.retryErrs, err.Error())
			m.mu.Unlock()
			if !sleepCtx(ctx, min(time.Duration(try)*2*time.Second, 10*time.Second)) {
				return
			}
			act, err = m.netboot(ctx, false)
		}
		if err != nil {
			if ctx.Err() == nil {
				m.setErr(err)
			}
			return
		}
		if act.action == "local" {
			return // booted the local disk: the installed OS runs
		}
		rebooted, err := m.agent(ctx, act)
		if err != nil {
			if ctx.Err() == nil {
				m.setErr(err)
			}
			return
		}
		if !rebooted {
			return
		}
	}
}

// bootAction is what the iPXE script told the machine to do.
type bootAction struct {
	action            string // agent, discover, local
	ip                netip.Addr
	kernel, initrd    string
	url, id, token    string
	cmdline           string // the kernel line's arguments
	pollAfterRetryOff bool
}

// netboot is the firmware and iPXE: DHCP with PXE options, TFTP of the first
// stage, DHCP again as iPXE, the per-machine script (following its
// wait-and-retry answers), and a Range of the kernel and the initramfs.
func (m *machine) netboot(ctx context.Context, first bool) (bootAction, error) {
	pxeOpts := []dhcpv4.Modifier{
		dhcpv4.WithBroadcast(true),
		dhcpv4.WithOption(dhcpv4.OptClassIdentifier("PXEClient:Arch:00000:UNDI:002001")),
		dhcpv4.WithOption(dhcpv4.OptClientArch(iana.INTEL_X86PC)),
		dhcpv4.WithGeneric(dhcpv4.OptionClientMachineIdentifier, append([]byte{0}, uuidBytes(m.uuid)...)),
		dhcpv4.WithRequestedOptions(dhcpv4.OptionBootfileName, dhcpv4.OptionTFTPServerName, dhcpv4.OptionVendorSpecificInformation),
	}
	t0 := time.Now()
	m.mu.Lock()
	if first {
		m.t.dhcpStart = t0
	}
	m.mu.Unlock()
	ack, err := m.dora(ctx, pxeOpts)
	if err != nil {
		return bootAction{}, err
	}
	if first {
		m.mark(&m.t.dhcpDone)
	}
	ip, ok := netip.AddrFromSlice(ack.YourIPAddr.To4())
	if !ok || !ip.IsValid() || ip.IsUnspecified() {
		return bootAction{}, fmt.Errorf("dhcp: ACK without an address")
	}
	file := ack.BootFileName
	if file == "" {
		return bootAction{}, fmt.Errorf("dhcp: PXE ACK without a boot file (is the machine known and netboot allowed?)")
	}
	tftpSrv := ack.ServerIPAddr
	if tftpSrv == nil || tftpSrv.IsUnspecified() {
		tftpSrv = ack.ServerIdentifier()
	}
	if err := m.tftp(ip, tftpSrv.String(), file); err != nil {
		return bootAction{}, err
	}
	if first {
		m.mark(&m.t.stageDone)
	}
	// iPXE: DHCP again (option 77 "iPXE"), then its script.
	ipxeOpts := append(pxeOpts[:len(pxeOpts):len(pxeOpts)], dhcpv4.WithOption(dhcpv4.OptUserClass("iPXE")))
	ack, err = m.dora(ctx, ipxeOpts)
	if err != nil {
		return bootAction{}, err
	}
	if !strings.HasPrefix(ack.BootFileName, "http://") {
		return bootAction{}, fmt.Errorf("dhcp: iPXE ACK boot file %q, want the script's http:// URL", ack.BootFileName)
	}
	hc := m.f.bootClient(ip)
	scriptURL := ack.BootFileName
	for {
		act, retry, err := m.script(ctx, hc, scriptURL)
		if err != nil {
			return bootAction{}, err
		}
		if retry > 0 {
			if !sleepCtx(ctx, retry) {
				return bootAction{}, ctx.Err()
			}
			continue
		}
		act.ip = ip
		if act.action == "local" {
			return act, nil
		}
		for _, u := range []string{act.kernel, act.initrd} {
			if err := m.f.rangeGet(ctx, hc, u, m.f.o.EnvBytes); err != nil {
				return bootAction{}, err
			}
		}
		if first {
			m.mark(&m.t.envDone)
		}
		return act, nil
	}
}

// dora is DISCOVER → OFFER → REQUEST → ACK from the machine's MAC.
func (m *machine) dora(ctx context.Context, opts []dhcpv4.Modifier) (*dhcpv4.DHCPv4, error) {
	dctx, cancel := context.WithTimeout(ctx, m.f.o.DHCPTimeout)
	defer cancel()
	disc, err := dhcpv4.NewDiscovery(m.mac, opts...)
	if err != nil {
		return nil, err
	}
	offer, err := m.f.dhcp.exchange(dctx, m.mac, disc, dhcpv4.MessageTypeOffer)
	if err != nil {
		return nil, err
	}
	req, err := dhcpv4.NewRequestFromOffer(offer, opts...)
	if err != nil {
		return nil, err
	}
	ack, err := m.f.dhcp.exchange(dctx, m.mac, req, dhcpv4.MessageTypeAck)
	if err != nil {
		return nil, err
	}
	if ip, ok := netip.AddrFromSlice(ack.YourIPAddr.To4()); ok && !ip.IsUnspecified() {
		m.f.recordAck(m.mac.String(), ip)
	}
	return ack, nil
}

func (m *machine) tftp(ip netip.Addr, server, file string) error {
	c, err := tftp.NewClient(net.JoinHostPort(server, "69"))
	if err != nil {
		return err
	}
	if err := c.SetLocalAddr(ip.String()); err != nil {
		return err
	}
	c.SetTimeout(2 * time.Second)
	c.SetRetries(5)
	c.SetBlockSize(1468) // iPXE's undionly asks for 1432..1468; PXE ROMs 1456
	wt, err := c.Receive(file, "octet")
	if err != nil {
		return fmt.Errorf("tftp %s: %w", file, err)
	}
	n, err := wt.WriteTo(io.Discard)
	if err != nil {
		return fmt.Errorf("tftp %s: %w", file, err)
	}
	if n == 0 {
		return fmt.Errorf("tftp %s: empty", file)
	}
	return nil
}

// script fetches and reads the iPXE script: "# kiln: action=X", the kernel
// line's URL and arguments, the initrd URL, or a retry script's sleep.
func (m *machine) script(ctx context.Context, hc *http.Client, u string) (bootAction, time.Duration, error) {
	req, err := http.NewRequestWithContext(ctx, "GET", u, nil)
	if err != nil {
		return bootAction{}, 0, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return bootAction{}, 0, fmt.Errorf("ipxe script: %w", err)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	if err != nil {
		return bootAction{}, 0, fmt.Errorf("ipxe script: %w", err)
	}
	if resp.StatusCode != 200 {
		return bootAction{}, 0, fmt.Errorf("ipxe script: HTTP %d: %s", resp.StatusCode, bytes.TrimSpace(body))
	}
	var act bootAction
	var sleep time.Duration
	sc := bufio.NewScanner(bytes.NewReader(body))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 {
			continue
		}
		switch {
		case len(f) >= 3 && f[0] == "#" && f[1] == "kiln:":
			act.action = strings.TrimPrefix(f[2], "action=")
		case f[0] == "kernel":
			act.cmdline = kernelArgs(f[1:])
			for _, a := range f[1:] {
				switch {
				case strings.HasPrefix(a, "http://"):
					act.kernel = a
				case strings.HasPrefix(a, agentapi.ArgURL+"="):
					act.url = strings.TrimPrefix(a, agentapi.ArgURL+"=")
				case strings.HasPrefix(a, agentapi.ArgMachine+"="):
					act.id = strings.TrimPrefix(a, agentapi.ArgMachine+"=")
				case strings.HasPrefix(a, agentapi.ArgToken+"="):
					act.token = strings.TrimPrefix(a, agentapi.ArgToken+"=")
				}
			}
		case f[0] == "initrd":
			for _, a := range f[1:] {
				if strings.HasPrefix(a, "http://") {
					act.initrd = a
				}
			}
		case f[0] == "sleep" && len(f) == 2 && sleep == 0:
			if n, err := strconv.Atoi(f[1]); err == nil {
				sleep = time.Duration(n) * time.Second
			}
		}
	}
	switch act.action {
	case "retry":
		return act, max(sleep, time.Second), nil
	case "local":
		return act, 0, nil
	case "agent", "discover":
		if act.kernel == "" || act.initrd == "" || act.url == "" || act.id == "" || act.token == "" {
			return act, 0, fmt.Errorf("ipxe script: agent boot without kernel, initrd or kiln.* arguments:\n%s", body)
		}
		if act.id != m.id {
			return act, 0, fmt.Errorf("ipxe script: kiln.machine=%s, want %s", act.id, m.id)
		}
		return act, 0, nil
	}
	return act, 0, fmt.Errorf("ipxe script: unknown action %q:\n%s", act.action, body)
}

// kernelArgs is the command line the kernel gets from iPXE's
// `kernel [--opts] URL ARGS... [|| goto …]` (httpboot's agent script):
// the words after the URL, up to "||".
func kernelArgs(words []string) string {
	for i, w := range words {
		if strings.HasPrefix(w, "http://") || strings.HasPrefix(w, "https://") {
			rest := words[i+1:]
			if j := slices.Index(rest, "||"); j >= 0 {
				rest = rest[:j]
			}
			return strings.Join(rest, " ")
		}
	}
	return ""
}

// agentConn is the in-RAM agent's side of the agent API for one boot.
type agentConn struct {
	m     *machine
	hc    *http.Client
	token string

	// eps are the appliance URLs: kiln.url first, then Task.Endpoints as
	// tasks bring them (no duplicates); cur is the one in use. As
	// cmd/kiln-agent/agent does, a call that finds no answer (a transport
	// error, 502/503/504) moves on to the next.
	eps []string
	cur int
}

func (a *agentConn) base() string { return a.eps[a.cur] }

func (a *agentConn) addEndpoints(urls []string) {
	for _, u := range urls {
		u = strings.TrimRight(u, "/")
		if u == "" || slices.Contains(a.eps, u) {
			continue
		}
		a.eps = append(a.eps, u)
	}
}

// failover moves to the next endpoint if from is still the current one.
func (a *agentConn) failover(from string) {
	if len(a.eps) > 1 && a.eps[a.cur] == from {
		a.cur = (a.cur + 1) % len(a.eps)
	}
}

// imageURLs is u, then u on each other endpoint (the same path).
func (a *agentConn) imageURLs(u string) []string {
	for _, e := range a.eps {
		rest, ok := strings.CutPrefix(u, e)
		if !ok || (rest != "" && rest[0] != '/') {
			continue
		}
		out := []string{u}
		for _, o := range a.eps {
			if o != e {
				out = append(out, o+rest)
			}
		}
		return out
	}
	return []string{u}
}

func (a *agentConn) call(ctx context.Context, method, path string, in, out any) error {
	var body []byte
	if in != nil {
		var err error
		if body, err = json.Marshal(in); err != nil {
			return err
		}
	}
	delay := 500 * time.Millisecond
	var last error
	tries := 6
	if a.m.f.o.Nodes > 1 {
		tries = 12 // a site cluster: ride out an election and a node's restart
	}
	for try := 0; try < tries; try++ {
		if try > 0 && !sleepCtx(ctx, delay) {
			return ctx.Err()
		}
		delay = min(2*delay, 10*time.Second)
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		base := a.base()
		req, err := http.NewRequestWithContext(cctx, method, base+path, bytes.NewReader(body))
		if err != nil {
			cancel()
			return err
		}
		if body != nil {
			req.Header.Set("Content-Type", "application/json")
		}
		req.Header.Set("Authorization", "Bearer "+a.token)
		req.Header.Set(agentapi.HeaderMachine, a.m.id)
		resp, err := a.hc.Do(req)
		if err != nil {
			cancel()
			last = err
			a.failover(base)
			continue
		}
		rb, rerr := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		resp.Body.Close()
		cancel()
		if rerr != nil {
			last = rerr
			continue
		}
		if resp.StatusCode >= 300 {
			last = fmt.Errorf("%s %s: HTTP %d: %s", method, path, resp.StatusCode, bytes.TrimSpace(rb))
			if resp.StatusCode >= 400 && resp.StatusCode < 500 && resp.StatusCode != 429 && resp.StatusCode != 408 {
				return last
			}
			if resp.StatusCode == 502 || resp.StatusCode == 503 || resp.StatusCode == 504 {
				a.failover(base)
			}
			continue
		}
		if out != nil {
			return json.Unmarshal(rb, out)
		}
		return nil
	}
	return fmt.Errorf("agent: %s %s: %w", method, path, last)
}

func (a *agentConn) report(ctx context.Context, r agentapi.Report) error {
	r.MachineID = a.m.id
	t0 := time.Now()
	err := a.call(ctx, "POST", "/v1/agent/report", r, nil)
	a.m.mu.Lock()
	a.m.t.reports = append(a.m.t.reports, time.Since(t0))
	a.m.mu.Unlock()
	return err
}

func (m *machine) inventory() agentapi.Inventory {
	return agentapi.Inventory{Vendor: fleetVendor, Product: fleetModel, Serial: m.serial, UUID: m.uuid,
		CPUs: fleetCPUs, MemoryBytes: fleetMemGiB << 30,
		Disks: []agentapi.Disk{{Name: "sda", Path: "/dev/sda", Serial: "D" + m.serial, Model: "FS-SSD",
			SizeBytes: diskBytes, Health: "ok"}},
		NICs:       []agentapi.NIC{{Name: "eth0", MAC: m.mac.String(), LinkUp: true}},
		BMCAddress: m.bmc.String(), TPM: m.tpmInfo()}
}

// tpmInfo is the inventory's TPM (/sys/class/tpm): swtpm is a TPM 2.0 of
// manufacturer IBM; nil without one.
func (m *machine) tpmInfo() *agentapi.TPMInfo {
	if m.tpm == nil {
		return nil
	}
	return &agentapi.TPMInfo{Version: "2.0", Manufacturer: "IBM"}
}

// agent is the in-RAM agent of one boot (cmd/kiln-agent/agent's protocol):
// register with the inventory, poll for tasks, run a provision task's steps
// with their reports and heartbeats, download and hash the image. It returns
// rebooted=true after a build (the machine then network-boots again).
func (m *machine) agent(ctx context.Context, act bootAction) (rebooted bool, err error) {
	a := &agentConn{m: m, hc: m.f.agentClient(act.ip), eps: []string{strings.TrimRight(act.url, "/")}, token: act.token}
	m.cmdline = act.cmdline
	var task agentapi.Task
	m.mark(&m.t.registered) // sent: Kiln may finish the inspection before it answers
	if err := a.call(ctx, "POST", "/v1/agent/register", agentapi.Registration{MachineID: m.id,
		AgentVersion: "fleetsim", Inventory: m.inventory()}, &task); err != nil {
		return false, err
	}
	registered := true // task answers a registration that has just sent the inventory
	for {
		a.addEndpoints(task.Endpoints)
		switch task.Action {
		case agentapi.ActionProvision:
			err := m.build(ctx, a, &task)
			var se *stepErr
			if errors.As(err, &se) && se.reason == agentapi.ReasonAttestationFailed {
				// Refused and quarantined: as cmd/kiln-agent after a failed
				// step, the agent waits for its next task.
				task = agentapi.Task{Action: agentapi.ActionWait}
				break
			}
			if err != nil {
				return false, err
			}
			return true, nil
		case agentapi.ActionErase:
			_ = a.report(ctx, agentapi.Report{Step: agentapi.StepErase, State: agentapi.StateStarted})
			_ = a.report(ctx, agentapi.Report{Step: agentapi.StepErase, State: agentapi.StateSucceeded, Progress: 1,
				Message: "1 of 1 disks erased", Erase: []agentapi.DiskErase{m.eraseCert()}})
			m.mark(&m.t.erased)
		case agentapi.ActionPowerOff:
			_ = m.PowerOff()
			return false, nil
		case agentapi.ActionInspect:
			m.mu.Lock()
			asked := m.reclaim
			m.mu.Unlock()
			if registered || !asked {
				break // the inventory just sent is the inspection
			}
			// Inspected again (the attestation reference, attest.go) while the
			// agent runs: the inventory once more, as cmd/kiln-agent's Inspect.
			// Only then: in TestFleetLeaderKill, re-registering on every
			// inspect answer failed 2 of 30 machines (agent_restarted during
			// write) after the leader kill.
			_ = a.report(ctx, agentapi.Report{Step: agentapi.StepInspect, State: agentapi.StateStarted})
			var next agentapi.Task
			if err := a.call(ctx, "POST", "/v1/agent/register", agentapi.Registration{MachineID: m.id,
				AgentVersion: "fleetsim", Inventory: m.inventory()}, &next); err == nil {
				task, registered = next, true
				continue
			}
		}
		registered = false
		poll := task.PollAfter
		if poll <= 0 {
			poll = 5 * time.Second
		}
		if task.Action != agentapi.ActionWait && task.Action != agentapi.ActionInspect {
			poll = min(poll, time.Second)
		}
		if !sleepCtx(ctx, poll) {
			return false, ctx.Err()
		}
		var next agentapi.Task
		if err := a.call(ctx, "GET", "/v1/agent/task", nil, &next); err != nil {
			if ctx.Err() != nil {
				return false, ctx.Err()
			}
			task = agentapi.Task{Action: agentapi.ActionWait, PollAfter: poll}
			continue
		}
		task = next
	}
}

// eraseCert is the erase certificate of the machine's one disk as the real
// agent reports it for a SATA SSD (cmd/kiln-agent/agent erase: ATA SECURITY
// ERASE UNIT enhanced, then a sampled read-back). Nothing is written: the
// simulated disk holds nothing.
func (m *machine) eraseCert() agentapi.DiskErase {
	now := time.Now().UTC()
	return agentapi.DiskErase{Name: "sda", Path: "/dev/sda", Serial: "D" + m.serial, Model: "FS-SSD", SizeBytes: diskBytes,
		Transport: "ata", Method: agentapi.EraseATASecurityEnhanced, Outcome: agentapi.EraseErased,
		Reason: "security supported, not frozen, enhanced erase supported", Verification: "sample: 1024 blocks of 4 KiB read zeros",
		Verified: true, Coverage: 1024 * 4096 / float64(diskBytes), Started: now, Ended: now,
		Attempts: []agentapi.EraseAttempt{{Method: agentapi.EraseATASecurityEnhanced, Outcome: agentapi.EraseErased}}}
}

// build reports check, write (the image streamed and hashed, discarded),
// verify, stage, finalize and reboot as the real agent does, with one running
// heartbeat in each long step and more every Task.Heartbeat while it lasts.
func (m *machine) build(ctx context.Context, a *agentConn, task *agentapi.Task) error {
	img := task.Image
	if img == nil || img.URL == "" || len(img.SHA256) != 64 {
		_ = a.report(ctx, agentapi.Report{Step: agentapi.StepCheck, State: agentapi.StateFailed, Reason: agentapi.ReasonInternal,
			Message: "task needs image url, sha256 and size"})
		return errors.New("agent: provision task without an image")
	}
	steps := []struct {
		name string
		fn   func() (string, error)
	}{
		{agentapi.StepCheck, func() (string, error) {
			return fmt.Sprintf("disk /dev/sda (sda) %d bytes health ok read 2000 MB/s", uint64(diskBytes)), nil
		}},
		{agentapi.StepAttest, func() (string, error) { return m.attest(ctx, a, m.cmdline) }},
		{agentapi.StepWrite, func() (string, error) {
			m.mark(&m.t.writeStart)
			sum, n, err := m.f.download(ctx, a, img.URL)
			if err != nil {
				return "", &stepErr{agentapi.ReasonImageFetchFailed, err}
			}
			if sum != strings.ToLower(img.SHA256) {
				return "", &stepErr{agentapi.ReasonDigestMismatch, fmt.Errorf("served image sha256 %s, want %s", sum, img.SHA256)}
			}
			if err := m.busy(ctx, a, agentapi.StepWrite, task.Heartbeat, m.f.o.WriteTime); err != nil {
				return "", err
			}
			m.mark(&m.t.writeDone)
			return fmt.Sprintf("%d bytes, 0 resumptions", n), nil
		}},
		{agentapi.StepVerify, func() (string, error) {
			m.mark(&m.t.verifyStart)
			_ = a.report(ctx, agentapi.Report{Step: agentapi.StepVerify, State: agentapi.StateRunning, Progress: 0.5, Message: "50%"})
			m.mark(&m.t.verifyDone)
			return "sha256 " + strings.ToLower(img.SHA256), nil
		}},
	}
	if !task.Attest {
		steps = slices.DeleteFunc(steps, func(s struct {
			name string
			fn   func() (string, error)
		}) bool {
			return s.name == agentapi.StepAttest
		})
	}
	if task.Stage != nil {
		steps = append(steps, struct {
			name string
			fn   func() (string, error)
		}{agentapi.StepStage, func() (string, error) { return "cidata partition 2 (mbr) at 5242880", nil }})
	}
	for _, s := range steps {
		if err := a.report(ctx, agentapi.Report{Step: s.name, State: agentapi.StateStarted}); err != nil {
			return err
		}
		msg, err := s.fn()
		if err != nil {
			var se *stepErr
			reason := agentapi.ReasonInternal
			if errors.As(err, &se) {
				reason = se.reason
			}
			_ = a.report(ctx, agentapi.Report{Step: s.name, State: agentapi.StateFailed, Reason: reason, Message: err.Error()})
			return err
		}
		if err := a.report(ctx, agentapi.Report{Step: s.name, State: agentapi.StateSucceeded, Progress: 1, Message: msg}); err != nil {
			return err
		}
	}
	if err := a.report(ctx, agentapi.Report{Step: agentapi.StepFinalize, State: agentapi.StateStarted}); err != nil {
		return err
	}
	written := map[string]string{"disk": "/dev/sda", "disk_name": "sda", "bytes": strconv.FormatUint(img.Size, 10),
		"sha256": strings.ToLower(img.SHA256), "sector_size": "512"}
	if err := a.report(ctx, agentapi.Report{Step: agentapi.StepFinalize, State: agentapi.StateSucceeded, Progress: 1, Written: written}); err != nil {
		return err
	}
	m.mark(&m.t.rebootReport)
	return a.report(ctx, agentapi.Report{Step: agentapi.StepReboot, State: agentapi.StateStarted})
}

// busy stands for a step that takes d (a disk write of a real image): the
// agent sends a running heartbeat every hb (Task.Heartbeat; 10 s when unset),
// as cmd/kiln-agent/agent's progress does.
func (m *machine) busy(ctx context.Context, a *agentConn, step string, hb, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	if hb <= 0 {
		hb = 10 * time.Second
	}
	end := time.Now().Add(d)
	for {
		left := time.Until(end)
		if left <= 0 {
			return nil
		}
		if !sleepCtx(ctx, min(hb, left)) {
			return ctx.Err()
		}
		if time.Until(end) > 0 {
			p := 1 - float64(time.Until(end))/float64(d)
			_ = a.report(ctx, agentapi.Report{Step: step, State: agentapi.StateRunning, Progress: p,
				Message: fmt.Sprintf("%d%%", int(p*100))})
		}
	}
}

type stepErr struct {
	reason agentapi.Reason
	err    error
}

func (e *stepErr) Error() string { return e.err.Error() }

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// uuidBytes is the 16 bytes of a textual UUID (option 97's GUID, RFC 4578 §2.3).
func uuidBytes(s string) []byte {
	b, err := hex.DecodeString(strings.ReplaceAll(s, "-", ""))
	if err != nil || len(b) != 16 {
		return make([]byte, 16)
	}
	return b
}

// hashCopy reads r to its end into SHA-256 and returns the digest and length.
func hashCopy(r io.Reader) (string, int64, error) {
	h := sha256.New()
	n, err := io.Copy(h, r)
	return hex.EncodeToString(h.Sum(nil)), n, err
}
