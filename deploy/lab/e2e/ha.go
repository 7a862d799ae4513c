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
	"sync"
	"syscall"
	"time"

	"kiln/api"
	"kiln/api/client"
	"kiln/deploy/lab/ipmilab"
	"kiln/deploy/lab/labimage"
)

// HAOptions of one HA run (RunHA).
type HAOptions struct {
	Root     string // repository root (bin/, build/env, deploy/lab)
	Work     string // scratch directory (created)
	Prefix   string // namespace prefix, e.g. "kha"
	VMs      []VMSpec
	MemMiB   int           // each VM's memory (default 256)
	DiskMiB  int           // each VM's disk (default 64)
	ImageMiB int           // the image's ext4 size (default 24)
	Down     time.Duration // how long the killed leader stays down (default 5 s)
	Cut      time.Duration // the partition's length (default 30 s)
	Timeout  time.Duration // the whole run (default 9 min)
	Out      io.Writer
}

// VMSpec is one VM of the HA lab: firmware "bios" or "uefi", BMC "ipmi"
// (ipmi_sim) or "redfish" (the lab's vbmc).
type VMSpec struct{ Firmware, BMC string }

// DefaultHAVMs: BIOS and UEFI mixed, both BMC kinds.
var DefaultHAVMs = []VMSpec{{"bios", "ipmi"}, {"uefi", "redfish"}, {"bios", "redfish"}, {"uefi", "redfish"}}

// HAResult is what RunHA measured and checked.
type HAResult struct {
	Machines    []HAMachine
	Provisioned int     // machines provisioned with their disk verified
	Seconds     float64 // first power-on → last machine provisioned

	KilledNode   string  // the leader that got SIGKILL
	KilledAt     float64 // seconds after the first power-on
	KilledBuild  []string
	KilledServes []string // VMs whose agent registered with it
	NewLeader    string   // elected after the kill
	ElectedIn    float64  // seconds from the kill to a new leader seen

	RestartedNode   string // the non-leader stopped with SIGTERM and started again
	RestartedAt     float64
	RestartedBuild  []string // machines mid-build when it was stopped
	RestartedServes []string // VMs whose agent registered with it

	CutNode   string // the node partitioned from the others
	CutAt     float64
	CutFor    time.Duration
	CutBuild  []string // machines not yet provisioned when the cut began
	CutLeader bool     // the cut node was the leader
	CutServes []string // VMs whose agent registered with it

	AckedWrites int // writes the run saw acknowledged (all kinds)
	LostWrites  int
	Lost        []string // the first few lost writes, described
	ACKs        int      // DHCPACKs captured on the bridge
	NAKs        int
	DupAddrs    int
	Dups        []string
	Problems    []string // every failed check (empty on success)
}

// HAMachine is one VM's outcome.
type HAMachine struct {
	Name, ID, MAC string
	Firmware, BMC string
	State         client.MachineState
	Reason        string
	IP            string // its live lease in the store
	ACKs          int
	DiskOK        bool
	DiskProblem   string
	Cidata        bool
	DiskBooted    bool // it left iPXE for its disk (leftForDisk)
	AgentBoots    int  // times the in-RAM agent started on it (1: no needless power cycle, no restarted build)
	Seconds       float64
}

// Line is the one summary line of `make e2e-ha`.
func (r *HAResult) Line() string {
	return fmt.Sprintf("e2e-ha: %d provisioned in %.1f s; leader killed at %.1f s; partition %.0f s; duplicate addresses %d; lost writes %d",
		r.Provisioned, r.Seconds, r.KilledAt, r.CutFor.Seconds(), r.DupAddrs, r.LostWrites)
}

const (
	haBMCUser = "admin"
	haBMCPass = "lab-bmc-Secret-42"
)

func haMAC(i int) string  { return fmt.Sprintf("52:54:00:99:02:%02x", i+1) }
func haUUID(i int) string { return fmt.Sprintf("5e1f0000-0000-4000-8000-5254009902%02x", i+1) }

// haVM is one VM of the run and what the controller knows of it.
type haVM struct {
	i             int
	spec          VMSpec
	name, mac, id string
	disk, dir     string
	powerOn       time.Time
	claimed       bool
	last          api.Machine
	settledAt     time.Time
}

func (v *haVM) settled() bool {
	s := v.last.State
	return s == client.StateProvisioned || s == client.StateFailed || s == client.StateQuarantined
}

// midBuild: the build's write step has begun and the machine is not yet
// provisioned (the "mid-build": after the image started to flow).
func (v *haVM) midBuild() bool {
	st := v.last.Step
	return v.last.State == client.StateProvisioning && st != nil &&
		(st.Step == "write" || st.Step == "verify" || st.Step == "stage")
}

// haWrites is every write the run saw acknowledged, to be found again on
// every node at the end.
type haWrites struct {
	mu       sync.Mutex
	machines []string // machine IDs created (201) by the writer and the intake
	failed   int      // answers that were not acknowledgements
	sent     int
}

func (w *haWrites) ack(ids ...string) {
	w.mu.Lock()
	w.machines = append(w.machines, ids...)
	w.mu.Unlock()
}

// haRun is one RunHA's state.
type haRun struct {
	o      HAOptions
	say    func(string, ...any)
	net    *haNet
	nodes  []*haNode
	vms    []*haVM
	dhcp   *dhcpWatch
	img    labimage.Image
	imgID  string
	writes haWrites
	seen   map[[2]uint64]api.Event // every event read during the run, by (index, seq)
	cursor uint64
	cut    int // the partitioned node, -1 when none
	t0     time.Time
	leader int // last leader seen, -1 unknown
	claims int // acknowledged provisions
	enrols int // acknowledged BMC enrolments
}

// RunHA runs the HA scenario (the package's ha_test.go and `make e2e-ha`):
// three nodes, the VMs power on together, the leader is killed while a VM
// is mid-build and restarted, a non-leader is restarted, then a node is
// partitioned from the others for Cut; at the end every check of HAResult
// is made on every node. It returns an error when the lab itself fails;
// failed checks are in HAResult.Problems.
func RunHA(ctx context.Context, o HAOptions) (*HAResult, error) {
	if o.Out == nil {
		o.Out = io.Discard
	}
	if len(o.VMs) == 0 {
		o.VMs = DefaultHAVMs
	}
	if o.MemMiB == 0 {
		o.MemMiB = 256
	}
	if o.DiskMiB == 0 {
		o.DiskMiB = 64
	}
	if o.ImageMiB == 0 {
		o.ImageMiB = 24
	}
	if o.Down == 0 {
		o.Down = 5 * time.Second
	}
	if o.Cut == 0 {
		o.Cut = 30 * time.Second
	}
	if o.Timeout == 0 {
		o.Timeout = 9 * time.Minute
	}
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	if err := haPreflight(o); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(o.Work, 0o755); err != nil {
		return nil, err
	}
	r := &haRun{o: o, say: func(f string, a ...any) { fmt.Fprintf(o.Out, f+"\n", a...) },
		seen: map[[2]uint64]api.Event{}, cut: -1, leader: -1}
	res := &HAResult{}
	var err error
	if r.net, err = setupHANet(o.Prefix, 3, len(o.VMs)); err != nil {
		return nil, err
	}
	defer r.net.teardown()
	if r.dhcp, err = watchDHCP(r.net.lan, "br0"); err != nil {
		return nil, err
	}
	defer r.dhcp.Close()
	if err := haRadvd(o, r.net.lan); err != nil {
		return nil, err
	}
	r.say("lab: nodes %s on bridge br0 (10.99.0.1-3), %d VMs and their BMCs in %s", strings.Join(r.net.nodes, ", "), len(o.VMs), r.net.lan)
	if r.img, err = buildImage(Options{Work: o.Work, ImageMiB: o.ImageMiB}); err != nil {
		return nil, err
	}
	if err := r.startCluster(ctx); err != nil {
		return nil, err
	}
	if err := r.startVMs(ctx); err != nil {
		return nil, err
	}
	if err := r.intake(ctx); err != nil {
		return nil, err
	}

	stopWriter := r.startWriter(ctx)
	if err := r.powerOn(ctx); err != nil {
		stopWriter()
		return nil, err
	}
	err = r.control(ctx, res)
	stopWriter()
	if err != nil {
		r.dumpStates()
		return res, err
	}
	if err := r.verify(ctx, res); err != nil {
		return res, err
	}
	return res, nil
}

func haPreflight(o HAOptions) error {
	if os.Geteuid() != 0 {
		return errors.New("e2e-ha: needs root (network namespaces, tap devices)")
	}
	need := []string{"ip", "qemu-system-x86_64", "mkfs.ext4", "sfdisk", "mtype", "radvd", "curl", "ipmi_sim", "ipmitool"}
	for _, b := range need {
		if _, err := exec.LookPath(b); err != nil {
			return fmt.Errorf("%s not found: run deploy/scripts/install-deps.sh", b)
		}
	}
	for _, f := range []string{"bin/kiln", "bin/vbmc", "build/env/vmlinuz", "build/env/initramfs"} {
		if _, err := os.Stat(filepath.Join(o.Root, f)); err != nil {
			return fmt.Errorf("%s missing: run make build env (or make e2e-ha)", f)
		}
	}
	for _, f := range []string{ovmfCode, ovmfVars} {
		if _, err := os.Stat(f); err != nil {
			return fmt.Errorf("%s missing: apt-get install ovmf", f)
		}
	}
	return nil
}

// haRadvd answers router solicitations on br0 from the LAN namespace, as a
// site's router would (iPXE otherwise waits ~12 s for IPv6 on every boot).
func haRadvd(o HAOptions, ns string) error {
	conf := filepath.Join(o.Work, "radvd.conf")
	body := `interface br0 {
  AdvSendAdvert on;
  MinRtrAdvInterval 3;
  MaxRtrAdvInterval 10;
  AdvDefaultLifetime 0;
  prefix fd99:0:0:99::/64 { AdvOnLink on; AdvAutonomous on; };
};
`
	if err := os.WriteFile(conf, []byte(body), 0o644); err != nil {
		return err
	}
	if out, err := exec.Command("ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv6.conf.all.forwarding=1").CombinedOutput(); err != nil {
		return fmt.Errorf("sysctl in %s: %v: %s", ns, err, out)
	}
	logf, err := os.Create(filepath.Join(o.Work, "radvd.log"))
	if err != nil {
		return err
	}
	cmd := exec.Command("ip", "netns", "exec", ns, "radvd", "-n", "-C", conf, "-p", filepath.Join(o.Work, "radvd.pid"), "-m", "stderr")
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("radvd: %w", err)
	}
	go func() { _ = cmd.Wait(); logf.Close() }()
	return nil
}

// startCluster starts node 1 (bootstrap), then nodes 2 and 3 each with a
// one-time join token from node 1, and waits for a leader with two peers.
func (r *haRun) startCluster(ctx context.Context) error {
	for i, ns := range r.net.nodes {
		dir := filepath.Join(r.o.Work, fmt.Sprintf("n%d", i+1))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		r.nodes = append(r.nodes, &haNode{i: i, id: fmt.Sprintf("kiln-n%d", i+1), ns: ns, ip: haNodeIP(i),
			bin: filepath.Join(r.o.Root, "bin/kiln"), cfg: filepath.Join(dir, "kiln.yaml"), data: filepath.Join(dir, "data"),
			logPath: filepath.Join(dir, "kiln.log")})
	}
	start := time.Now()
	var join []string
	for i, n := range r.nodes {
		token := ""
		if i > 0 {
			jt, err := r.nodes[0].api.CreateJoinToken(ctx, api.JoinTokenRequest{TTL: "15m"})
			if err != nil {
				return fmt.Errorf("join token for %s: %w", n.id, err)
			}
			token = jt.Token
		}
		if err := os.WriteFile(n.cfg, []byte(haNodeConfig(r.o, n, r.nodes, join, token)), 0o600); err != nil {
			return err
		}
		if err := n.start(); err != nil {
			return err
		}
		if err := n.waitReady(ctx, 90*time.Second); err != nil {
			return err
		}
		join = append(join, n.fwdAddr())
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		if l := r.findLeader(ctx); l >= 0 {
			st, err := r.nodes[l].api.SiteStatus(ctx)
			if err == nil && st.Raft.Stats["num_peers"] == "2" {
				r.say("cluster: 3 nodes up in %.1f s (mutual TLS, join tokens), leader %s", time.Since(start).Seconds(), r.nodes[l].id)
				return nil
			}
		}
		if time.Now().After(deadline) {
			return errors.New("cluster: no leader with two peers 60 s after the third node started")
		}
		time.Sleep(300 * time.Millisecond)
	}
}

// findLeader asks every running, connected node which node leads; the node
// that says it is leader wins. -1: none known.
func (r *haRun) findLeader(ctx context.Context) int {
	for _, n := range r.nodes {
		if !n.running() || n.api == nil || n.i == r.cut {
			continue
		}
		c, cancel := context.WithTimeout(ctx, 2*time.Second)
		st, err := n.api.SiteStatus(c)
		cancel()
		if err == nil && st.Raft.IsLeader {
			r.leader = n.i
			return n.i
		}
	}
	return -1
}

// reader returns a running node outside any partition to read from,
// preferring the leader.
func (r *haRun) reader() *haNode {
	if r.leader >= 0 && r.leader != r.cut && r.nodes[r.leader].running() && r.nodes[r.leader].api != nil {
		return r.nodes[r.leader]
	}
	for _, n := range r.nodes {
		if n.running() && n.api != nil && n.i != r.cut {
			return n
		}
	}
	return r.nodes[0]
}

// startVMs writes each VM's disk and starts its BMC (the VM stays off).
func (r *haRun) startVMs(ctx context.Context) error {
	for i, spec := range r.o.VMs {
		v := &haVM{i: i, spec: spec, name: fmt.Sprintf("ha-vm%d-%s", i+1, spec.Firmware), mac: haMAC(i),
			dir: filepath.Join(r.o.Work, fmt.Sprintf("vm%d", i+1))}
		v.disk = filepath.Join(v.dir, "disk.img")
		if err := os.MkdirAll(v.dir, 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(v.disk, nil, 0o644); err != nil {
			return err
		}
		if err := os.Truncate(v.disk, int64(r.o.DiskMiB)<<20); err != nil {
			return err
		}
		if err := r.startBMC(ctx, v); err != nil {
			return err
		}
		r.vms = append(r.vms, v)
	}
	r.say("bmc: %d BMCs up (%s)", len(r.vms), r.describeVMs())
	return nil
}

func (r *haRun) describeVMs() string {
	var s []string
	for _, v := range r.vms {
		s = append(s, fmt.Sprintf("%s %s/%s at %s", v.name, v.spec.Firmware, v.spec.BMC, r.bmcAddr(v)))
	}
	return strings.Join(s, "; ")
}

func (r *haRun) bmcAddr(v *haVM) string {
	if v.spec.BMC == "redfish" {
		return haBMCIP(v.i) + ":8443"
	}
	return haBMCIP(v.i)
}

func (r *haRun) qemuArgs(v *haVM) ([]string, error) {
	args := []string{"qemu-system-x86_64", "-accel", "tcg", "-cpu", "max", "-m", fmt.Sprint(r.o.MemMiB), "-smp", "1",
		"-uuid", haUUID(v.i), "-nodefaults", "-nographic", "-monitor", "none"}
	if v.spec.Firmware == "uefi" {
		vars := filepath.Join(v.dir, "OVMF_VARS.fd")
		b, err := os.ReadFile(ovmfVars)
		if err != nil {
			return nil, err
		}
		if err := os.WriteFile(vars, b, 0o644); err != nil {
			return nil, err
		}
		args = append(args, "-machine", "q35",
			"-drive", "if=pflash,format=raw,unit=0,readonly=on,file="+ovmfCode,
			"-drive", "if=pflash,format=raw,unit=1,file="+vars)
	} else {
		args = append(args, "-machine", "pc")
	}
	return append(args,
		"-netdev", fmt.Sprintf("tap,id=n0,ifname=tap%d,script=no,downscript=no", v.i),
		"-device", "virtio-net-pci,netdev=n0,mac="+v.mac+",bootindex=1",
		"-drive", "file="+v.disk+",format=raw,if=none,id=d0,cache=writeback",
		"-device", "virtio-blk-pci,drive=d0,bootindex=2"), nil
}

func (r *haRun) startBMC(ctx context.Context, v *haVM) error {
	args, err := r.qemuArgs(v)
	if err != nil {
		return err
	}
	state := filepath.Join(v.dir, "bmc")
	if err := os.MkdirAll(state, 0o755); err != nil {
		return err
	}
	probeNS := r.net.nodes[0]
	switch v.spec.BMC {
	case "ipmi":
		_, err := ipmilab.Start(ctx, ipmilab.Options{NetNS: r.net.lan, ProbeNetNS: probeNS, Name: fmt.Sprintf("ha-bmc-%d", v.i+1),
			Addr: haBMCIP(v.i), User: haBMCUser, Password: haBMCPass, StateDir: state,
			LabDir: filepath.Join(r.o.Root, "deploy/lab/ipmi"), QEMUArgs: args})
		return err
	case "redfish":
		if err := os.WriteFile(filepath.Join(state, "qemu.args"), []byte(strings.Join(args, "\n")+"\n"), 0o644); err != nil {
			return err
		}
		pw := filepath.Join(state, "pw")
		if err := os.WriteFile(pw, []byte(haBMCPass), 0o600); err != nil {
			return err
		}
		mode := "Legacy"
		if v.spec.Firmware == "uefi" {
			mode = "UEFI"
		}
		logf, err := os.Create(filepath.Join(state, "vbmc.log"))
		if err != nil {
			return err
		}
		listen := r.bmcAddr(v)
		cmd := exec.Command("ip", "netns", "exec", r.net.lan, filepath.Join(r.o.Root, "bin/vbmc"), "--listen", listen,
			"--user", haBMCUser, "--password-file", pw, "--qemu-args-file", filepath.Join(state, "qemu.args"),
			"--state-dir", state, "--mode", mode, "--uuid", haUUID(v.i), "--mac", v.mac, "--serial", fmt.Sprintf("VBMC%04d", v.i+1))
		cmd.Stdout, cmd.Stderr = logf, logf
		if err := cmd.Start(); err != nil {
			logf.Close()
			return err
		}
		go func() { _ = cmd.Wait(); logf.Close() }()
		for i := 0; i < 50; i++ {
			probe := exec.CommandContext(ctx, "ip", "netns", "exec", probeNS, "curl", "-ksf", "-o", "/dev/null", "https://"+listen+"/redfish/v1/")
			if probe.Run() == nil {
				return nil
			}
			time.Sleep(200 * time.Millisecond)
		}
		return fmt.Errorf("vbmc did not answer on %s (see %s)", listen, filepath.Join(state, "vbmc.log"))
	}
	return fmt.Errorf("unknown BMC kind %q (ipmi or redfish)", v.spec.BMC)
}

// intake imports the VMs (one CSV, through a follower), uploads the image
// through the leader and waits until every node holds it.
func (r *haRun) intake(ctx context.Context) error {
	var b strings.Builder
	b.WriteString("name,macs,boot_mode,rack,u,labels\n")
	for _, v := range r.vms {
		mode := "legacy"
		if v.spec.Firmware == "uefi" {
			mode = "uefi"
		}
		fmt.Fprintf(&b, "%s,%s,%s,ha-r1,%d,lab=ha\n", v.name, v.mac, mode, v.i+1)
	}
	via := r.nodes[(r.leader+1)%len(r.nodes)]
	imp, err := via.api.ImportMachines(ctx, "csv", strings.NewReader(b.String()))
	if err != nil {
		return fmt.Errorf("import through %s: %w", via.id, err)
	}
	if imp.Created != len(r.vms) {
		return fmt.Errorf("import: %d created, want %d", imp.Created, len(r.vms))
	}
	r.writes.ack(imp.IDs...)
	ms, err := via.api.ListAllMachines(ctx, client.MachineQuery{Consistent: true})
	if err != nil {
		return err
	}
	for _, m := range ms {
		for _, v := range r.vms {
			if m.Name == v.name {
				v.id = m.ID
			}
		}
	}
	for _, v := range r.vms {
		if v.id == "" {
			return fmt.Errorf("import: machine %s not listed", v.name)
		}
	}
	lead := r.nodes[r.leader]
	im, err := uploadImage(ctx, lead.api, r.img)
	if err != nil {
		return err
	}
	r.imgID = im.ID
	r.say("intake: %d machines imported through %s; image %s (%d bytes) uploaded to %s", len(r.vms), via.id, im.ID, r.img.Size, lead.id)
	start := time.Now()
	for {
		st, err := lead.api.SiteStatus(ctx)
		if err == nil {
			for _, iv := range st.Images {
				if iv.ID == im.ID && len(iv.Nodes) == len(r.nodes) {
					r.say("image: on all %d nodes, verified, in %.1f s", len(r.nodes), time.Since(start).Seconds())
					return nil
				}
			}
		}
		if time.Since(start) > 90*time.Second {
			return fmt.Errorf("image %s not on every node 90 s after the upload (status: %+v, %v)", im.ID, st.Images, err)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// startWriter streams machine creations (one-row imports) at the nodes in
// turn, every 400 ms, until stopped; each acknowledged ID is recorded.
func (r *haRun) startWriter(ctx context.Context) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for k := 0; ; k++ {
			select {
			case <-ctx.Done():
				return
			case <-time.After(400 * time.Millisecond):
			}
			n := r.nodes[k%len(r.nodes)]
			if n.api == nil {
				continue
			}
			csv := fmt.Sprintf("name,macs,labels\nha-w-%d,02:00:5e:%02x:%02x:%02x,lab=ha-writer\n", k, (k>>16)&0xff, (k>>8)&0xff, k&0xff)
			c, cancel := context.WithTimeout(ctx, 4*time.Second)
			imp, err := n.api.ImportMachines(c, "csv", strings.NewReader(csv))
			cancel()
			r.writes.mu.Lock()
			r.writes.sent++
			if err == nil && imp.Created == 1 && len(imp.IDs) == 1 {
				r.writes.machines = append(r.writes.machines, imp.IDs[0])
			} else {
				r.writes.failed++
			}
			r.writes.mu.Unlock()
		}
	}()
	return func() { cancel(); <-done }
}

// powerOn enrols every VM's BMC at once, each through another node: Kiln
// sets its next boot to PXE and powers it on (auto-inspection).
func (r *haRun) powerOn(ctx context.Context) error {
	r.t0 = time.Now()
	errs := make(chan error, len(r.vms))
	for _, v := range r.vms {
		go func(v *haVM) {
			n := r.nodes[v.i%len(r.nodes)]
			_, err := n.api.EnrollBMC(ctx, v.id, api.BMCEnrollRequest{Address: r.bmcAddr(v), Driver: v.spec.BMC,
				Username: haBMCUser, Password: haBMCPass, InsecureTLS: v.spec.BMC == "redfish"})
			if err != nil {
				err = fmt.Errorf("bmc enroll %s through %s: %w", v.name, n.id, err)
			}
			errs <- err
		}(v)
	}
	for range r.vms {
		if err := <-errs; err != nil {
			return err
		}
		r.enrols++
	}
	r.say("power: %d BMCs enrolled at once (through all three nodes); Kiln powers every VM on", len(r.vms))
	return nil
}

func (r *haRun) since() float64 { return time.Since(r.t0).Seconds() }

// fault phases of control.
const (
	phWaitBuild = iota
	phDown
	phRejoin
	phRestart
	phRestarted
	phCut
	phHealed
	phDone
)

// control follows the machines to the end and injects the faults.
func (r *haRun) control(ctx context.Context, res *HAResult) error {
	phase := phWaitBuild
	var killedAt, cutAt, rejoinedAt time.Time
	lastLeaderCheck := time.Time{}
	for {
		if ctx.Err() != nil {
			var where []string
			for _, v := range r.vms {
				step := ""
				if st := v.last.Step; st != nil {
					step = fmt.Sprintf(" step %s %s", st.Step, st.State)
				}
				where = append(where, fmt.Sprintf("%s %s (%s)%s %q", v.name, v.last.State, v.last.Reason, step, v.last.Message))
			}
			return fmt.Errorf("e2e-ha: timed out in fault phase %d (%s): %w", phase, strings.Join(where, "; "), ctx.Err())
		}
		if time.Since(lastLeaderCheck) > time.Second {
			prev := r.leader
			if l := r.findLeader(ctx); l >= 0 && l != prev {
				r.say("%6.1fs raft: leader is %s", r.since(), r.nodes[l].id)
				if phase >= phDown && res.NewLeader == "" && l != r.nodes0(res.KilledNode) {
					res.NewLeader, res.ElectedIn = r.nodes[l].id, time.Since(killedAt).Seconds()
				}
			}
			lastLeaderCheck = time.Now()
		}
		r.pollEvents(ctx)
		r.pollMachines(ctx)

		switch phase {
		case phWaitBuild:
			if mb := r.midBuild(); len(mb) > 0 && r.leader >= 0 {
				n := r.nodes[r.leader]
				n.stop(syscall.SIGKILL, 5*time.Second)
				killedAt = time.Now()
				res.KilledNode, res.KilledAt, res.KilledBuild, res.KilledServes = n.id, r.since(), mb, r.servedBy(n)
				r.say("%6.1fs FAULT: SIGKILL of the leader %s while %s mid-build", r.since(), n.id, strings.Join(mb, ", "))
				r.leader = -1
				phase = phDown
			} else if r.allSettled() {
				return errors.New("e2e-ha: every machine settled before any was seen mid-build (no leader kill mid-build)")
			}
		case phDown:
			if time.Since(killedAt) >= r.o.Down {
				n := r.nodes[r.nodes0(res.KilledNode)]
				if err := n.start(); err != nil {
					return err
				}
				r.say("%6.1fs restart: %s started again on its data directory", r.since(), n.id)
				phase = phRejoin
			}
		case phRejoin:
			n := r.nodes[r.nodes0(res.KilledNode)]
			if r.ready(ctx, n) {
				r.say("%6.1fs restart: %s ready again (rejoined)", r.since(), n.id)
				rejoinedAt = time.Now()
				phase = phRestart
			}
		case phRestart:
			if r.leader < 0 {
				break
			}
			if time.Since(rejoinedAt) < 5*time.Second {
				break // let the restarted node take part first
			}
			mb := r.midBuild()
			if len(mb) == 0 && time.Since(rejoinedAt) < 30*time.Second && !r.allSettled() {
				break // wait (a while) for a VM mid-build
			}
			if len(mb) == 0 {
				mb = r.midBuildOrPending()
			}
			t := r.restartTarget(r.nodes0(res.KilledNode))
			n := r.nodes[t]
			res.RestartedNode, res.RestartedAt, res.RestartedBuild = n.id, r.since(), mb
			res.RestartedServes = r.servedBy(n)
			r.say("%6.1fs FAULT: SIGTERM of %s (not the leader; agents of %v registered with it) while %s", r.since(), n.id, r.servedBy(n), strings.Join(mb, ", "))
			n.stop(syscall.SIGTERM, 30*time.Second)
			if err := n.start(); err != nil {
				return err
			}
			phase = phRestarted
		case phRestarted:
			if r.ready(ctx, r.nodes[r.nodes0(res.RestartedNode)]) {
				r.say("%6.1fs restart: %s ready again", r.since(), res.RestartedNode)
				phase = phCut
			}
		case phCut:
			if r.leader < 0 {
				break
			}
			i := r.leader
			if err := r.net.partition(i); err != nil {
				return err
			}
			r.cut, cutAt = i, time.Now()
			res.CutNode, res.CutAt, res.CutLeader, res.CutBuild = r.nodes[i].id, r.since(), true, r.midBuildOrPending()
			res.CutServes = r.servedBy(r.nodes[i])
			r.say("%6.1fs FAULT: partition: the leader %s cut off from the other nodes for %s (%s not yet provisioned)",
				r.since(), r.nodes[i].id, r.o.Cut, strings.Join(res.CutBuild, ", "))
			r.leader = -1
			phase = phHealed
		case phHealed:
			if left := r.o.Cut - time.Since(cutAt); left < 1500*time.Millisecond {
				time.Sleep(left) // heal on time, not at the next tick
				if err := r.net.heal(r.cut); err != nil {
					return err
				}
				res.CutFor = time.Since(cutAt).Round(100 * time.Millisecond)
				r.say("%6.1fs heal: %s reconnected after %s", r.since(), r.nodes[r.cut].id, res.CutFor)
				r.cut = -1
				phase = phDone
			}
		}
		if phase == phDone && r.allSettled() {
			return nil
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// nodes0 is the index of the node called id.
func (r *haRun) nodes0(id string) int {
	for _, n := range r.nodes {
		if n.id == id {
			return n.i
		}
	}
	return -1
}

func (r *haRun) ready(ctx context.Context, n *haNode) bool {
	c, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if !n.running() {
		return false
	}
	return n.waitReady(c, time.Second) == nil
}

// restartTarget picks the non-leader whose boot a VM now mid-build is
// running (its agent's console says which node it registered with), else
// a non-leader other than avoid (the node just restarted), else any
// non-leader.
func (r *haRun) restartTarget(avoid int) int {
	for _, v := range r.vms {
		if !v.midBuild() {
			continue
		}
		for _, n := range r.nodes {
			if n.i != r.leader && serialHas(filepath.Join(v.dir, "bmc"), "registered with http://"+n.ip+":8080") {
				return n.i
			}
		}
	}
	for _, n := range r.nodes {
		if n.i != r.leader && n.i != avoid {
			return n.i
		}
	}
	for _, n := range r.nodes {
		if n.i != r.leader {
			return n.i
		}
	}
	return 0
}

// servedBy names the VMs whose agent registered with node n.
func (r *haRun) servedBy(n *haNode) []string {
	var out []string
	for _, v := range r.vms {
		if serialHas(filepath.Join(v.dir, "bmc"), "registered with http://"+n.ip+":8080") {
			out = append(out, v.name)
		}
	}
	return out
}

func (r *haRun) midBuild() []string {
	var out []string
	for _, v := range r.vms {
		if v.midBuild() {
			out = append(out, fmt.Sprintf("%s (%s)", v.name, v.last.Step.Step))
		}
	}
	return out
}

func (r *haRun) midBuildOrPending() []string {
	var out []string
	for _, v := range r.vms {
		if !v.settled() {
			s := string(v.last.State)
			if v.last.Step != nil && v.last.State == client.StateProvisioning {
				s += "/" + v.last.Step.Step
			}
			out = append(out, fmt.Sprintf("%s (%s)", v.name, s))
		}
	}
	if len(out) == 0 {
		return []string{"none"}
	}
	return out
}

func (r *haRun) allSettled() bool {
	for _, v := range r.vms {
		if !v.settled() {
			return false
		}
	}
	return true
}

// pollEvents reads the new events from a connected node and prints the
// machines' transitions; every event read is kept for the final check.
func (r *haRun) pollEvents(ctx context.Context) {
	n := r.reader()
	for {
		c, cancel := context.WithTimeout(ctx, 3*time.Second)
		el, err := n.api.Events(c, client.EventQuery{After: r.cursor, Limit: api.MaxListLimitCap})
		cancel()
		if err != nil {
			return
		}
		for _, e := range el.Events {
			r.seen[[2]uint64{e.Index, uint64(e.Seq)}] = e
			if e.Kind == "transition" && r.isVM(e.Subject) {
				r.say("%6.1fs   %-18s %s→%s %s", r.since(), r.vmName(e.Subject), e.From, e.To, e.Reason)
			}
		}
		if el.Next > r.cursor {
			r.cursor = el.Next
		}
		if len(el.Events) < api.MaxListLimitCap {
			return
		}
	}
}

func (r *haRun) isVM(subject string) bool { return r.vmName(subject) != "" }

func (r *haRun) vmName(subject string) string {
	for _, v := range r.vms {
		if subject == "machine/"+v.id {
			return v.name
		}
	}
	return ""
}

// pollMachines reads each VM's machine and claims the available ones.
func (r *haRun) pollMachines(ctx context.Context) {
	n := r.reader()
	for _, v := range r.vms {
		if v.powerOn.IsZero() {
			if logs, _ := filepath.Glob(filepath.Join(v.dir, "bmc", "serial*.log")); len(logs) > 0 {
				v.powerOn = time.Now()
			}
		}
		c, cancel := context.WithTimeout(ctx, 3*time.Second)
		m, err := n.api.GetMachine(c, v.id)
		cancel()
		if err != nil {
			continue
		}
		if m.Step != nil && (v.last.Step == nil || v.last.Step.Step != m.Step.Step || v.last.Step.Attempt != m.Step.Attempt) {
			r.say("%6.1fs   %-18s step %s %s (attempt %d) %s", r.since(), v.name, m.Step.Step, m.Step.State, m.Step.Attempt, m.Step.Reason)
		}
		v.last = m
		if v.settled() && v.settledAt.IsZero() {
			v.settledAt = time.Now()
		}
		if m.State == client.StateAvailable && !v.claimed {
			via := r.nodes[(v.i+1)%len(r.nodes)]
			if !via.running() || via.i == r.cut || via.api == nil {
				via = n
			}
			c, cancel := context.WithTimeout(ctx, 5*time.Second)
			_, err := via.api.Provision(c, v.id, api.ProvisionRequest{Reason: "e2e-ha", Claim: api.Claim{Image: r.imgID,
				Hostname: v.name, Role: "worker", Labels: map[string]string{"lab": "ha"}}})
			cancel()
			var ce *client.Error
			switch {
			case err == nil:
				v.claimed = true
				r.claims++
				r.say("%6.1fs claim: %s provisioned with %s (through %s)", r.since(), v.name, r.imgID, via.id)
			case errors.As(err, &ce) && ce.Code() == api.CodeIllegalTransition:
				v.claimed = true // an earlier, unacknowledged try took effect
			default:
				r.say("%6.1fs claim: %s through %s: %v (retrying)", r.since(), v.name, via.id, err)
			}
		}
	}
}

func (r *haRun) dumpStates() {
	for _, v := range r.vms {
		step := ""
		if v.last.Step != nil {
			step = v.last.Step.Step + "/" + v.last.Step.State
		}
		r.say("state: %s %s (%s) step %s: %s", v.name, v.last.State, v.last.Reason, step, v.last.Message)
	}
}
