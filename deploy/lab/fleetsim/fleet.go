package fleetsim

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"kiln/api/agentapi"
	"kiln/deploy/lab/swtpm"
	"kiln/deploy/lab/vbmc/vbmc"
)

// Errors of Run.
var (
	// ErrNotRoot: the simulator creates network namespaces and an AF_PACKET socket.
	ErrNotRoot = errors.New("fleetsim: needs root (network namespaces, AF_PACKET)")
	// ErrMissing: a binary or the in-RAM environment is not built.
	ErrMissing = errors.New("fleetsim: missing input")
)

// Options of one run. Zero values take the defaults named below.
type Options struct {
	// N is the number of simulated machines, 1..MaxMachines.
	N int `json:"n"`
	// Work is a scratch directory (created; Kiln's data and images under it).
	Work string `json:"work"`
	// Prefix names the namespaces PREFIX-srv and PREFIX-lan (default "kfs").
	Prefix string `json:"prefix"`
	// KilnBin is the built bin/kiln; EnvDir holds vmlinuz and initramfs
	// (build/env, KILN_ENV_DIR).
	KilnBin string `json:"kiln_bin"`
	EnvDir  string `json:"env_dir"`
	// ImageMiB is the raw image's size (default 4 MiB).
	ImageMiB int `json:"image_mib"`
	// EnvBytes is how much of the kernel and of the initramfs each machine
	// fetches, from the start, with a Range request (default 1 MiB; 0 < n).
	EnvBytes int64 `json:"env_bytes"`
	// WriteTime is how long each machine's write step lasts after the image
	// is hashed (a real disk write), with a running heartbeat every
	// Task.Heartbeat meanwhile (default 0: the write ends with the download).
	WriteTime time.Duration `json:"write_time"`
	// AgentPoll is Kiln's lifecycle.agent_poll_after (0: Kiln's default).
	AgentPoll time.Duration `json:"agent_poll"`
	// BMCConcurrency is Kiln's bmc.concurrency (0: Kiln's default).
	BMCConcurrency int `json:"bmc_concurrency"`
	// Timeout bounds the run from the import to the last machine's end
	// (default 5 min + 0.5 s per machine).
	Timeout time.Duration `json:"timeout"`
	// DHCPTimeout bounds one machine's DORA, retransmissions included (default 60 s).
	DHCPTimeout time.Duration `json:"dhcp_timeout"`
	// EnrollWorkers is how many BMC enrolments run at once (default 16).
	EnrollWorkers int `json:"enroll_workers"`
	// Day2, when set, adds the day-2 phase after the storm (day2.go): the
	// machines but Day2.Spares are claimed, then failures are injected
	// through the BMCs' health (mode A, then mode B).
	Day2 *Day2Options `json:"day2,omitempty"`
	// Attest is how many machines (the first ones) have a TPM 2.0, a swtpm
	// each (attest.go); with Attest > 0 the model requires attestation and
	// allows machines without a TPM (labelled), so every build attests.
	// 0..N; not with Day2.
	Attest int `json:"attest"`
	// Nodes is how many `kiln serve` nodes run, as one site cluster (1 or 3;
	// default 1). With 3, the nodes are in namespaces PREFIX-n1..n3 on one
	// bridge (netns.go), join with one-time tokens over mutual TLS, and the
	// machines' agents fail over across agentapi.Task.Endpoints.
	Nodes int `json:"nodes"`
	// KillLeaderAt (Nodes > 1): this long after the import starts, the raft
	// leader gets SIGKILL; it is started again Down later (default 5 s). The
	// run then checks every node's store and leases (checkCluster).
	KillLeaderAt time.Duration `json:"kill_leader_at"`
	Down         time.Duration `json:"down"`
	// APIListen is kiln serve's api.addr (default ServerIP:7480; the
	// simulator always calls ServerIP:7480). A lab that reaches the site
	// over another link of PREFIX-srv sets "0.0.0.0:7480".
	APIListen string `json:"api_listen"`
	// OnLab, when set, is called (in the calling process) once the
	// namespaces exist, with the name of PREFIX-srv, before Kiln starts:
	// a lab adds its own links there (a WAN to a central). An error ends
	// the run.
	OnLab func(srvNS string) error `json:"-"`
	// Hold, when set, keeps the site up after the run: the simulation
	// writes the whole event feed as served (one JSON object a line) to
	// Work/events.jsonl, creates the file Hold+".ready", and waits until
	// the file Hold exists (at most HoldMax, default 10 min) before
	// stopping Kiln.
	Hold    string        `json:"hold"`
	HoldMax time.Duration `json:"hold_max"`
	// Out receives progress lines and the result lines (nil: discard).
	Out io.Writer `json:"-"`
}

func (o *Options) defaults() error {
	if o.N < 1 || o.N > MaxMachines {
		return fmt.Errorf("fleetsim: N=%d: want 1..%d", o.N, MaxMachines)
	}
	if o.Prefix == "" {
		o.Prefix = "kfs"
	}
	if o.ImageMiB <= 0 {
		o.ImageMiB = 4
	}
	if o.EnvBytes <= 0 {
		o.EnvBytes = 1 << 20
	}
	if o.Timeout <= 0 {
		o.Timeout = 5*time.Minute + time.Duration(o.N)*500*time.Millisecond
	}
	if o.DHCPTimeout <= 0 {
		o.DHCPTimeout = 60 * time.Second
	}
	if o.EnrollWorkers <= 0 {
		o.EnrollWorkers = 16
	}
	if o.Out == nil {
		o.Out = io.Discard
	}
	if o.Nodes <= 0 {
		o.Nodes = 1
	}
	if o.Nodes != 1 && o.Nodes != 3 {
		return fmt.Errorf("fleetsim: Nodes=%d: want 1 or 3", o.Nodes)
	}
	if o.KillLeaderAt != 0 && o.Nodes == 1 {
		return fmt.Errorf("fleetsim: KillLeaderAt needs Nodes 3 (a single node has no one to fail over to)")
	}
	if o.Down <= 0 {
		o.Down = 5 * time.Second
	}
	if o.Day2 != nil {
		if err := o.Day2.defaults(o.N); err != nil {
			return err
		}
	}
	if o.Attest < 0 || o.Attest > o.N {
		return fmt.Errorf("fleetsim: Attest=%d: want 0..N (%d)", o.Attest, o.N)
	}
	if o.Attest > 0 && o.Day2 != nil {
		return fmt.Errorf("fleetsim: Attest and Day2 are separate runs")
	}
	if o.Attest > 0 {
		if why := swtpm.Available(); why != "" {
			return fmt.Errorf("%w: %s", ErrMissing, why)
		}
	}
	if o.APIListen == "" {
		o.APIListen = apiAddr
	}
	if o.HoldMax <= 0 {
		o.HoldMax = 10 * time.Minute
	}
	if o.Work == "" {
		return fmt.Errorf("fleetsim: Options.Work is required")
	}
	for _, f := range []string{o.KilnBin, filepath.Join(o.EnvDir, "vmlinuz"), filepath.Join(o.EnvDir, "initramfs")} {
		if _, err := os.Stat(f); err != nil {
			return fmt.Errorf("%w: %s: run make build env (or set KILN_ENV_DIR)", ErrMissing, f)
		}
	}
	return nil
}

// childEnv carries the Options to the simulator's second half, which runs
// inside the machines' namespace (Run re-executes the binary there).
const childEnv = "KILN_FLEETSIM_CHILD"

// Run creates the lab's namespaces, runs the simulation in the machines'
// namespace (the running executable again, under `ip netns exec`: every
// socket the machines, their BMCs and the REST client open is then in that
// namespace), removes the namespaces and returns the Result. The executable
// must call ChildMain first thing when IsChild reports true (main() of
// cmd/fleetsim, TestMain of the package's tests).
func Run(ctx context.Context, o Options) (*Result, error) {
	if err := o.defaults(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(o.Work, 0o755); err != nil {
		return nil, err
	}
	var l *lab
	var err error
	if o.Nodes > 1 {
		l, err = setupHALab(o.Prefix, o.Nodes)
	} else {
		l, err = setupLab(o.Prefix)
	}
	if err != nil {
		return nil, err
	}
	defer l.teardown()
	if o.OnLab != nil {
		if err := o.OnLab(l.srv); err != nil {
			return nil, fmt.Errorf("fleetsim: OnLab: %w", err)
		}
	}
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	enc, _ := json.Marshal(o)
	rp, wp, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", l.lan, self}, childArgs()...)...)
	cmd.Env = append(os.Environ(), childEnv+"="+string(enc))
	cmd.Stdout, cmd.Stderr = o.Out, o.Out
	cmd.ExtraFiles = []*os.File{wp} // fd 3: the Result as JSON
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		rp.Close()
		wp.Close()
		return nil, err
	}
	wp.Close()
	// The Result is read while the child runs; once the child has ended
	// (or ctx ended it), what it wrote is in the pipe: the read gets a
	// moment more, then the pipe is closed, so a process that still holds
	// its write end cannot hang Run. WaitDelay bounds Wait the same way for
	// the output pipes.
	cmd.WaitDelay = 5 * time.Second
	var res Result
	decoded := make(chan error, 1)
	go func() { decoded <- json.NewDecoder(rp).Decode(&res) }()
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()
	var derr, werr error
	select {
	case derr = <-decoded:
		werr = <-waited
	case werr = <-waited:
		select {
		case derr = <-decoded:
		case <-time.After(2 * time.Second):
			rp.Close()
			derr = <-decoded
		}
	}
	rp.Close()
	if derr != nil {
		return nil, fmt.Errorf("fleetsim: the simulation ended without a result (%v): %v", werr, derr)
	}
	if res.Error != "" {
		return &res, errors.New(res.Error)
	}
	return &res, nil
}

// childArgs are the arguments the executable is re-run with: a test binary
// runs only TestMain's child branch.
func childArgs() []string {
	if strings.HasSuffix(os.Args[0], ".test") {
		return []string{"-test.run=^$"}
	}
	return nil
}

// IsChild reports whether this process is the simulation half started by Run.
func IsChild() bool { return os.Getenv(childEnv) != "" }

// ChildMain runs the simulation (inside the machines' namespace), writes the
// Result to fd 3 and exits.
func ChildMain() {
	// fd 3 is the Result pipe's write end: not inherited by what the
	// simulation starts (kiln serve, vbmc), or a process outliving this one
	// would keep Run's read of the Result from ever ending.
	syscall.CloseOnExec(3)
	var o Options
	res := &Result{}
	if err := json.Unmarshal([]byte(os.Getenv(childEnv)), &o); err != nil {
		res.Error = "fleetsim child: options: " + err.Error()
	} else {
		o.Out = os.Stdout
		r, err := simulate(context.Background(), o)
		if r != nil {
			res = r
		}
		if err != nil {
			res.Error = err.Error()
		}
	}
	f := os.NewFile(3, "result")
	_ = json.NewEncoder(f).Encode(res)
	f.Close()
	if res.Error != "" {
		os.Exit(1)
	}
	os.Exit(0)
}

// fleet is one simulation: the machines, their DHCP socket and HTTP clients,
// the Kiln process and the image.
type fleet struct {
	ctx      context.Context
	o        Options
	k        *kiln   // nodes[0]: the node whose process figures a run reports
	nodes    []*kiln // every node of the site cluster
	dhcp     *dhcpClient
	machines []*machine
	byID     map[string]*machine
	imageID  string
	att      *attestState // Options.Attest > 0

	mu      sync.Mutex
	clients map[netip.Addr]*http.Client
	cur     int                            // the node f.do tries first
	acks    map[netip.Addr]map[string]bool // address -> MACs it was ACKed to
	ackN    int                            // ACKs received
}

func dialerFrom(ip netip.Addr) *net.Dialer {
	return &net.Dialer{LocalAddr: &net.TCPAddr{IP: ip.AsSlice()}, Timeout: 10 * time.Second}
}

// bootClient is the firmware's HTTP client (iPXE): from the machine's
// leased address, one connection, no keep-alive across boots.
func (f *fleet) bootClient(ip netip.Addr) *http.Client {
	return &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{Proxy: nil,
		DialContext: dialerFrom(ip).DialContext, DisableKeepAlives: true}}
}

// agentClient is the agent's HTTP client (keep-alive, as net/http's default
// transport), from the machine's leased address.
func (f *fleet) agentClient(ip netip.Addr) *http.Client {
	f.mu.Lock()
	defer f.mu.Unlock()
	if c := f.clients[ip]; c != nil {
		return c
	}
	c := &http.Client{Transport: &http.Transport{Proxy: nil, DialContext: dialerFrom(ip).DialContext,
		MaxIdleConnsPerHost: 2, IdleConnTimeout: 90 * time.Second, ResponseHeaderTimeout: 30 * time.Second}}
	f.clients[ip] = c
	return c
}

// rangeGet fetches the first n bytes of u (Range: bytes=0-(n-1)), as a
// stand-in for the whole file: the request, headers and the first megabyte
// load Kiln as a full fetch does, without the simulator copying the rest.
func (f *fleet) rangeGet(ctx context.Context, hc *http.Client, u string, n int64) error {
	req, err := http.NewRequestWithContext(ctx, "GET", u, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Range", fmt.Sprintf("bytes=0-%d", n-1))
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("environment %s: %w", u, err)
	}
	defer resp.Body.Close()
	got, err := io.Copy(io.Discard, resp.Body)
	if err != nil {
		return fmt.Errorf("environment %s: %w", u, err)
	}
	if resp.StatusCode != http.StatusPartialContent && resp.StatusCode != http.StatusOK {
		return fmt.Errorf("environment %s: HTTP %d", u, resp.StatusCode)
	}
	if resp.StatusCode == http.StatusPartialContent && got != n {
		return fmt.Errorf("environment %s: %d bytes for a range of %d", u, got, n)
	}
	return nil
}

// download streams the image with the agent's token into SHA-256 and
// discards it, sending a running heartbeat halfway and every Task.Heartbeat.
// On an error it starts again from the image's start on the next of
// a.imageURLs (the same image on each other node), a round over them at most.
func (f *fleet) download(ctx context.Context, a *agentConn, u string) (sum string, n int64, err error) {
	a.m.mu.Lock()
	a.m.t.downloads++
	a.m.mu.Unlock()
	for _, v := range a.imageURLs(u) {
		if sum, n, err = f.download1(ctx, a, v); err == nil || ctx.Err() != nil {
			return sum, n, err
		}
	}
	return sum, n, err
}

func (f *fleet) download1(ctx context.Context, a *agentConn, u string) (string, int64, error) {
	req, err := http.NewRequestWithContext(ctx, "GET", u, nil)
	if err != nil {
		return "", 0, err
	}
	req.Header.Set("Authorization", "Bearer "+a.token)
	resp, err := a.hc.Do(req)
	if err != nil {
		return "", 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return "", 0, fmt.Errorf("image: HTTP %d: %s", resp.StatusCode, strings.TrimSpace(string(b)))
	}
	total := resp.ContentLength
	h := sha256.New()
	buf := make([]byte, 256<<10)
	var n int64
	beat := false
	for {
		k, err := resp.Body.Read(buf)
		h.Write(buf[:k])
		n += int64(k)
		if !beat && total > 0 && n*2 >= total {
			beat = true
			_ = a.report(ctx, agentapi.Report{Step: agentapi.StepWrite, State: agentapi.StateRunning,
				Progress: float64(n) / float64(total), Message: fmt.Sprintf("%d%%", n*100/total)})
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return "", n, err
		}
	}
	return hex.EncodeToString(h.Sum(nil)), n, nil
}

func (f *fleet) say(format string, a ...any) { fmt.Fprintf(f.o.Out, format+"\n", a...) }

// macOf is machine i's MAC: locally administered unicast 02:4b:46:xx:xx:xx.
func macOf(i int) net.HardwareAddr {
	return net.HardwareAddr{0x02, 0x4b, 0x46, byte(i >> 16), byte(i >> 8), byte(i)}
}

const (
	bmcUser = "admin"
	bmcPort = 8443
)

// simulate is the run inside the machines' namespace.
func simulate(ctx context.Context, o Options) (*Result, error) {
	if err := o.defaults(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	f := &fleet{ctx: ctx, o: o, byID: map[string]*machine{}, clients: map[netip.Addr]*http.Client{}}
	res := &Result{N: o.N}
	for i := 0; i < o.N; i++ {
		m := &machine{f: f, i: i, name: fmt.Sprintf("fs-%04d", i+1), mac: macOf(i),
			serial: fmt.Sprintf("FS%06d", i+1), uuid: fmt.Sprintf("5e1f0000-0000-4000-8000-%012x", i+1), bmc: bmcAddr(i)}
		f.machines = append(f.machines, m)
	}
	if o.Attest > 0 {
		f.att = &attestState{}
		defer f.closeTPMs()
		if err := f.makeTPMs(); err != nil {
			return nil, err
		}
	}
	var err error
	if f.dhcp, err = newDHCPClient(dhcpIf(o.Nodes)); err != nil {
		return nil, err
	}
	defer f.dhcp.Close()

	// The BMCs: one vbmc process (this one) serving every machine's
	// ComputerSystem, each on its own address.
	pwb := make([]byte, 12)
	_, _ = rand.Read(pwb)
	bmcPass := "Fleet-" + hex.EncodeToString(pwb)
	var systems []vbmc.SystemConfig
	for _, m := range f.machines {
		systems = append(systems, vbmc.SystemConfig{ID: strconv.Itoa(m.i + 1), Addr: m.bmc, Serial: m.serial,
			Manufacturer: fleetVendor, Model: fleetModel, UUID: m.uuid, MACs: []string{m.mac.String()}, Power: m})
	}
	acts := &actionLog{}
	vb, err := vbmc.New(vbmc.Config{Listen: fmt.Sprintf("0.0.0.0:%d", bmcPort), Username: bmcUser, Password: bmcPass,
		Systems: systems, NoRequestLog: true, OnRequest: acts.onRequest})
	if err != nil {
		return nil, err
	}
	vbDone := make(chan struct{})
	go func() {
		defer close(vbDone)
		_ = vb.Run(ctx, slog.New(slog.NewTextHandler(io.Discard, nil)))
	}()
	defer func() { cancel(); <-vbDone }()

	img, sum, err := makeImage(o)
	if err != nil {
		return nil, err
	}
	l := &lab{srv: o.Prefix + "-srv", lan: o.Prefix + "-lan", nodes: []string{o.Prefix + "-srv"}}
	if o.Nodes > 1 {
		l.nodes = nil
		for i := 0; i < o.Nodes; i++ {
			l.nodes = append(l.nodes, fmt.Sprintf("%s-n%d", o.Prefix, i+1))
		}
	}
	f.nodes = newNodes(o, l)
	f.k = f.nodes[0]
	defer func() {
		for _, k := range f.nodes {
			k.stop()
		}
	}()
	if err := startNodes(ctx, o, f.nodes); err != nil {
		return nil, err
	}
	if o.Nodes > 1 {
		for deadline := time.Now().Add(60 * time.Second); f.leader(ctx) == nil; {
			if time.Now().After(deadline) || !sleepCtx(ctx, 300*time.Millisecond) {
				return nil, errors.New("fleetsim: no raft leader 60 s after the nodes started")
			}
		}
		f.say("fleet: %d kiln nodes ready (API and boot on %s..%s); %d machines, BMCs %s..%s:%d", o.Nodes, nodeIP(0), nodeIP(o.Nodes-1),
			o.N, bmcAddr(0), bmcAddr(o.N-1), bmcPort)
	} else {
		f.say("fleet: kiln pid %d ready (API %s, boot %s); %d machines, BMCs %s..%s:%d", f.k.pid, apiAddr, bootHTTP, o.N,
			bmcAddr(0), bmcAddr(o.N-1), bmcPort)
	}

	var im struct {
		ID string `json:"id"`
	}
	imgFile, err := os.Open(img)
	if err != nil {
		return nil, err
	}
	q := url.Values{"name": {"fleet-image"}, "version": {"1"}, "sha256": {sum}, "format": {"raw"}}
	err = f.do(ctx, "POST", "/v1/images", q, imgFile, "application/octet-stream", &im)
	imgFile.Close()
	if err != nil {
		return nil, err
	}
	f.imageID = im.ID
	if o.Nodes > 1 {
		if err := f.imageEverywhere(ctx); err != nil {
			return nil, err
		}
	}

	before := f.procAll()
	runCtx, runCancel := context.WithTimeout(ctx, o.Timeout)
	defer runCancel()
	start := time.Now()
	if f.att != nil {
		f.att.start = start
	}

	// The rack plan: one row per machine, with the hardware the agent will report.
	var plan strings.Builder
	plan.WriteString("name,serial,vendor,model,rack,u,macs,cpus,memory_gib,boot_mode,labels\n")
	for _, m := range f.machines {
		fmt.Fprintf(&plan, "%s,%s,%s,%s,fs-r%03d,%d,%s,%d,%d,legacy,fleet=sim\n", m.name, m.serial, fleetVendor, fleetModel,
			m.i/40+1, m.i%40+1, m.mac, fleetCPUs, fleetMemGiB)
	}
	var ir struct {
		Created int      `json:"created"`
		IDs     []string `json:"ids"`
	}
	if err := f.do(runCtx, "POST", "/v1/machines/import", url.Values{"format": {"csv"}}, strings.NewReader(plan.String()), "text/csv", &ir); err != nil {
		return nil, err
	}
	if ir.Created != o.N || len(ir.IDs) != o.N {
		return nil, fmt.Errorf("fleetsim: import created %d machines (%d IDs), want %d", ir.Created, len(ir.IDs), o.N)
	}
	if err := f.mapIDs(runCtx); err != nil {
		return nil, err
	}
	res.ImportSeconds = time.Since(start).Seconds()
	f.say("fleet: imported %d machines in %.1f s", o.N, res.ImportSeconds)

	// Follow the events: each machine that becomes available is provisioned.
	w := newWatcher(f)
	tl := &transitionLog{all: map[*machine][]transitionAt{}}
	if o.Day2 != nil {
		w.log = tl // and no provisioner: the claim waits for the whole fleet's inspection
	}
	if o.Day2 != nil {
		go w.follow(ctx) // day 2 goes on after the storm's timeout
	} else {
		go w.follow(runCtx)
	}
	if o.Day2 == nil {
		go w.provisioner(runCtx)
	}

	t0 := time.Now()
	if err := f.enroll(runCtx, bmcPass); err != nil {
		return nil, err
	}
	res.EnrollSeconds = time.Since(t0).Seconds()
	f.say("fleet: enrolled %d BMCs in %.1f s", o.N, res.EnrollSeconds)

	killErr := make(chan error, 1)
	if o.KillLeaderAt > 0 {
		go func() { killErr <- f.killLeader(runCtx, start, res) }()
	} else {
		killErr <- nil
	}

	tick := time.NewTicker(5 * time.Second)
	defer tick.Stop()
	finished := w.finished
	if o.Day2 != nil {
		claimN := o.N - o.Day2.Spares
		claimedYet := false
		finished = func() bool {
			if !claimedYet && w.availableN() >= o.N {
				claimedYet = true
				if err := f.claimAll(runCtx, w, claimN); err != nil {
					f.say("%v", err)
					runCancel()
				}
				f.say("fleet: day 2: %d machines claimed (POST /v1/machines/claim), %d spares", claimN, o.Day2.Spares)
			}
			return claimedYet && w.provisionedN() >= claimN
		}
	}
	for !finished() {
		select {
		case <-runCtx.Done():
			f.say("fleet: run timeout after %s", o.Timeout)
			goto done
		case <-w.changed:
		case <-tick.C:
			p, fl, a := w.counts()
			f.say("fleet: %5.0f s  provisioned %d, failed %d, available %d, errors %d", time.Since(start).Seconds(), p, fl, a, f.simErrors())
		}
	}
done:
	end := time.Now()
	if err := <-killErr; err != nil {
		res.Problems = append(res.Problems, "leader kill: "+err.Error())
	}
	after := f.procAll()
	res.fill(f, w, before, after, start, end)
	res.Nodes = o.Nodes
	if o.Nodes > 1 {
		f.checkCluster(ctx, res)
	}
	if err := f.countEvents(ctx, res); err != nil {
		return nil, err
	}
	f.trails(ctx, res, start)
	if m, err := f.k.metrics(ctx); err == nil {
		res.Metrics = m
	} else {
		f.say("fleet: kiln /metrics: %v", err)
	}
	if f.att != nil {
		res.Attest = f.att.finish(res.Metrics)
	}
	res.RaftBytes, res.FSMBytes = storeFiles(f.k.data)
	res.StoreBytes = dirSize(f.k.data)

	for _, line := range res.Lines() {
		f.say("%s", line)
	}
	if o.Day2 != nil {
		if runCtx.Err() != nil {
			return res, fmt.Errorf("fleetsim: the storm did not end in %s: no day 2", o.Timeout)
		}
		res.Day2 = &Day2Result{}
		err := f.day2(ctx, vb, acts, tl, res.Day2)
		for _, line := range res.Day2.Lines() {
			f.say("%s", line)
		}
		if err != nil {
			return res, err
		}
	}
	if o.Hold != "" {
		if err := f.hold(ctx); err != nil {
			return res, err
		}
	}
	return res, nil
}

// hold is Options.Hold: dump the feed, signal ready, wait for the release.
func (f *fleet) hold(ctx context.Context) error {
	out, err := os.Create(filepath.Join(f.o.Work, "events.jsonl"))
	if err != nil {
		return err
	}
	var after uint64
	n := 0
	for {
		var el struct {
			Events []json.RawMessage `json:"events"`
			Next   uint64            `json:"next"`
		}
		q := url.Values{"after": {strconv.FormatUint(after, 10)}, "limit": {"1000"}}
		if err := f.k.do(ctx, "GET", "/v1/events", q, nil, "", &el); err != nil {
			out.Close()
			return err
		}
		if len(el.Events) == 0 {
			break
		}
		for _, e := range el.Events {
			out.Write(append(append([]byte{}, e...), '\n'))
			n++
		}
		after = el.Next
	}
	if err := out.Close(); err != nil {
		return err
	}
	f.say("fleet: hold: %d events dumped (up to index %d); waiting for %s", n, after, f.o.Hold)
	if err := os.WriteFile(f.o.Hold+".ready", []byte(strconv.FormatUint(after, 10)), 0o644); err != nil {
		return err
	}
	deadline := time.Now().Add(f.o.HoldMax)
	for time.Now().Before(deadline) {
		if _, err := os.Stat(f.o.Hold); err == nil {
			return nil
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("fleetsim: hold %s not released in %s", f.o.Hold, f.o.HoldMax)
}

// mapIDs reads the machines' IDs by name (GET /v1/machines, paged).
func (f *fleet) mapIDs(ctx context.Context) error {
	byName := map[string]*machine{}
	for _, m := range f.machines {
		byName[m.name] = m
	}
	after := ""
	for {
		var ml struct {
			Items []struct {
				ID   string `json:"id"`
				Name string `json:"name"`
			} `json:"items"`
			Next string `json:"next"`
		}
		q := url.Values{"limit": {"500"}}
		if after != "" {
			q.Set("after", after)
		}
		if err := f.do(ctx, "GET", "/v1/machines", q, nil, "", &ml); err != nil {
			return err
		}
		for _, it := range ml.Items {
			if m := byName[it.Name]; m != nil {
				m.id = it.ID
				f.byID[it.ID] = m
			}
		}
		if ml.Next == "" || len(ml.Items) == 0 {
			break
		}
		after = ml.Next
	}
	if len(f.byID) != len(f.machines) {
		return fmt.Errorf("fleetsim: %d of %d machines listed after the import", len(f.byID), len(f.machines))
	}
	return nil
}

// enroll enrols every BMC (POST /v1/machines/{id}/bmc), EnrollWorkers at a
// time; Kiln then powers the machines on in the batches it chooses.
func (f *fleet) enroll(ctx context.Context, pass string) error {
	jobs := make(chan *machine)
	errc := make(chan error, len(f.machines))
	var wg sync.WaitGroup
	for w := 0; w < f.o.EnrollWorkers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for m := range jobs {
				body := map[string]any{"address": fmt.Sprintf("%s:%d", m.bmc, bmcPort), "driver": "redfish",
					"username": bmcUser, "password": pass, "insecure_tls": true}
				if err := f.do(ctx, "POST", "/v1/machines/"+m.id+"/bmc", nil, body, "", nil); err != nil {
					errc <- fmt.Errorf("enroll %s: %w", m.name, err)
				}
			}
		}()
	}
	for _, m := range f.machines {
		jobs <- m
	}
	close(jobs)
	wg.Wait()
	close(errc)
	return <-errc // nil when none
}

// procAll is the CPU time (summed) and the largest peak RSS of the nodes'
// current processes; a node killed and restarted counts from its restart.
func (f *fleet) procAll() procStat {
	var ps procStat
	for _, k := range f.nodes {
		k.mu.Lock()
		pid := k.pid
		k.mu.Unlock()
		if p, err := readProc(pid); err == nil {
			ps.CPU += p.CPU
			ps.PeakRSS = max(ps.PeakRSS, p.PeakRSS)
		}
	}
	return ps
}

func (f *fleet) simErrors() int {
	n := 0
	for _, m := range f.machines {
		m.mu.Lock()
		if m.err != nil {
			n++
		}
		m.mu.Unlock()
	}
	return n
}

// countEvents pages through /v1/events and counts them, and those about machines.
func (f *fleet) countEvents(ctx context.Context, res *Result) error {
	var after uint64
	kinds := map[string]int{}
	for {
		var el struct {
			Events []struct {
				Index   uint64 `json:"index"`
				Subject string `json:"subject"`
				Kind    string `json:"kind"`
			} `json:"events"`
			Next uint64 `json:"next"`
		}
		q := url.Values{"after": {strconv.FormatUint(after, 10)}, "limit": {"1000"}}
		if err := f.do(ctx, "GET", "/v1/events", q, nil, "", &el); err != nil {
			return err
		}
		if len(el.Events) == 0 {
			break
		}
		for _, e := range el.Events {
			res.Events++
			if strings.HasPrefix(e.Subject, "machine/") {
				res.MachineEvents++
			}
			kinds[e.Kind]++
			after = max(after, e.Index)
		}
		if el.Next > after {
			after = el.Next
		}
	}
	res.EventKinds = kinds
	return nil
}

// maxTrails bounds Result.Trails.
const maxTrails = 3

// trails fills res.Trails for the first maxTrails machines Kiln failed:
// their transition events (GET /v1/events?subject=machine/ID) and their
// BMC jobs with each job's last state (GET /v1/jobs?machine=ID), in time
// order, seconds after start. A read that fails is said and skipped.
func (f *fleet) trails(ctx context.Context, res *Result, start time.Time) {
	type entry struct {
		at   time.Time
		text string
	}
	for _, m := range f.machines {
		if len(res.Trails) >= maxTrails {
			return
		}
		m.mu.Lock()
		failed := !m.t.failed.IsZero()
		m.mu.Unlock()
		if !failed {
			continue
		}
		var es []entry
		var el struct {
			Events []struct {
				Time    time.Time `json:"time"`
				Kind    string    `json:"kind"`
				From    string    `json:"from"`
				To      string    `json:"to"`
				Actor   string    `json:"actor"`
				Reason  string    `json:"reason"`
				Message string    `json:"message"`
			} `json:"events"`
		}
		q := url.Values{"after": {"0"}, "limit": {"1000"}, "subject": {"machine/" + m.id}}
		if err := f.do(ctx, "GET", "/v1/events", q, nil, "", &el); err != nil {
			f.say("fleet: trail of %s: %v", m.name, err)
			continue
		}
		for _, e := range el.Events {
			if e.Kind == "transition" {
				es = append(es, entry{e.Time, fmt.Sprintf("%s→%s (%s %s)", e.From, e.To, e.Actor, e.Reason)})
			}
		}
		var jl struct {
			Items []struct {
				Kind    string    `json:"kind"`
				State   string    `json:"state"`
				Reason  string    `json:"reason"`
				Created time.Time `json:"created_at"`
				Updated time.Time `json:"updated_at"`
			} `json:"items"`
		}
		if err := f.do(ctx, "GET", "/v1/jobs", url.Values{"machine": {m.id}}, nil, "", &jl); err != nil {
			f.say("fleet: jobs of %s: %v", m.name, err)
		}
		for _, j := range jl.Items {
			es = append(es, entry{j.Created, fmt.Sprintf("job %s queued, %s %s at %+.1f s", j.Kind, j.State, j.Reason, j.Updated.Sub(start).Seconds())})
		}
		sort.SliceStable(es, func(i, k int) bool { return es[i].at.Before(es[k].at) })
		var b strings.Builder
		b.WriteString(m.name + ":")
		for _, e := range es {
			fmt.Fprintf(&b, " %+.1f s %s;", e.at.Sub(start).Seconds(), e.text)
		}
		res.Trails = append(res.Trails, strings.TrimSuffix(b.String(), ";"))
	}
}

// makeImage writes a raw image of ImageMiB pseudo-random MiB and returns its path and SHA-256.
func makeImage(o Options) (string, string, error) {
	p := filepath.Join(o.Work, "fleet-image.raw")
	fh, err := os.Create(p)
	if err != nil {
		return "", "", err
	}
	h := sha256.New()
	buf := make([]byte, 1<<20)
	for i := 0; i < o.ImageMiB; i++ {
		_, _ = rand.Read(buf)
		h.Write(buf)
		if _, err := fh.Write(buf); err != nil {
			fh.Close()
			return "", "", err
		}
	}
	if err := fh.Close(); err != nil {
		return "", "", err
	}
	return p, hex.EncodeToString(h.Sum(nil)), nil
}

// sortedDurations returns ds sorted (a copy).
func sortedDurations(ds []time.Duration) []time.Duration {
	out := append([]time.Duration(nil), ds...)
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}
