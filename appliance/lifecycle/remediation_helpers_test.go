package lifecycle

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"kiln/api/agentapi"
	"kiln/bmc"
	"kiln/deploy/lab/vbmc/vbmc"
	"kiln/store"
)

// simPower is the machine behind a vbmc system: it counts the power calls
// the virtual BMC makes on it.
type simPower struct {
	mu       sync.Mutex
	on       bool
	ons      int
	offs     int
	override []string
}

func (p *simPower) PowerOn(override, _ string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.on = true
	p.ons++
	p.override = append(p.override, override)
	return nil
}
func (p *simPower) PowerOff() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.on = false
	p.offs++
	return nil
}
func (p *simPower) PoweredOn() bool { p.mu.Lock(); defer p.mu.Unlock(); return p.on }

// vbmcFleet is one real virtual Redfish BMC (deploy/lab/vbmc) per machine,
// driven by Kiln's real bmc.Controller: it implements the controller's BMC
// interface by machine ID, as the appliance's adapter does over the
// enrolled records.
type vbmcFleet struct {
	t      *testing.T
	ctl    *bmc.Controller
	mu     sync.Mutex
	srv    map[string]*vbmc.Server
	power  map[string]*simPower
	health map[string]bmc.Health // bmcHealth's answers
}

func newVBMCFleet(t *testing.T) *vbmcFleet {
	ctl, err := bmc.New(bmc.Config{CallTimeout: 5 * time.Second, NoRetries: true, RedfishBasicAuth: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return &vbmcFleet{t: t, ctl: ctl, srv: map[string]*vbmc.Server{}, power: map[string]*simPower{}, health: map[string]bmc.Health{}}
}

// add starts machine id's BMC.
func (f *vbmcFleet) add(id string) {
	t := f.t
	p := &simPower{on: true}
	v, err := vbmc.New(vbmc.Config{Listen: "127.0.0.1:0", Username: "admin", Password: "Rem-Secret-1",
		Systems: []vbmc.SystemConfig{{ID: "1", Serial: "SN-" + id, Power: p}}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = v.Run(ctx, slog.New(slog.NewTextHandler(io.Discard, nil))) }()
	t.Cleanup(func() { cancel(); <-done })
	f.mu.Lock()
	f.srv[id], f.power[id] = v, p
	f.mu.Unlock()
}

func (f *vbmcFleet) target(id string) (bmc.Target, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	v := f.srv[id]
	if v == nil {
		return bmc.Target{}, fmt.Errorf("machine %s has no vbmc", id)
	}
	return bmc.Target{Address: v.Addr(), Driver: "redfish", Username: "admin", Password: "Rem-Secret-1", CACertPEM: v.CACertPEM()}, nil
}

func (f *vbmcFleet) do(ctx context.Context, id string, fn func(bmc.Target) error) error {
	t, err := f.target(id)
	if err != nil {
		return err
	}
	return fn(t)
}
func (f *vbmcFleet) PowerOn(ctx context.Context, id string) error {
	return f.do(ctx, id, func(t bmc.Target) error { return f.ctl.Power(ctx, t, bmc.ActionOn) })
}
func (f *vbmcFleet) PowerOff(ctx context.Context, id string) error {
	return f.do(ctx, id, func(t bmc.Target) error { return f.ctl.Power(ctx, t, bmc.ActionOff) })
}
func (f *vbmcFleet) PowerCycle(ctx context.Context, id string) error {
	return f.do(ctx, id, func(t bmc.Target) error { return f.ctl.Power(ctx, t, bmc.ActionCycle) })
}
func (f *vbmcFleet) SetNextBootPXE(ctx context.Context, id string, mode store.BootMode) error {
	m := bmc.BootLegacy
	if mode == store.BootModeUEFI {
		m = bmc.BootUEFI
	}
	return f.do(ctx, id, func(t bmc.Target) error { return f.ctl.SetNextBootPXE(ctx, t, m) })
}

// Health is lifecycle.HealthReader: kiln/bmc's Controller.Health against
// the machine's vbmc (Redfish Status.Health of system and chassis, the SEL
// LogService), which the test sets with the vbmc's health knob (setHealth).
func (f *vbmcFleet) Health(ctx context.Context, id string) (bmc.Health, error) {
	t, err := f.target(id)
	if err != nil {
		return bmc.Health{}, err
	}
	return f.ctl.Health(ctx, t)
}

// setHealth turns machine id's vbmc health knob.
func (f *vbmcFleet) setHealth(id string, u vbmc.HealthUpdate) {
	f.mu.Lock()
	v := f.srv[id]
	f.mu.Unlock()
	if err := v.SetHealth("1", u); err != nil {
		f.t.Fatal(err)
	}
}

// actions counts the state-changing requests (POST of a Reset action,
// PATCH of the boot override) every BMC of the fleet served.
func (f *vbmcFleet) actions() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, v := range f.srv {
		for _, r := range v.Requests() {
			if r.Method == "PATCH" || (r.Method == "POST" && len(r.Path) > 8 && r.Path[len(r.Path)-6:] == ".Reset") {
				n++
			}
		}
	}
	return n
}

// powerCalls is how often machine id was powered on and off by its BMC.
func (f *vbmcFleet) powerCalls(id string) (ons, offs int) {
	f.mu.Lock()
	p := f.power[id]
	f.mu.Unlock()
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.ons, p.offs
}

// bmcHealth is a HealthReader that answers what the test sets per
// machine, with a delay and errors on demand: TestPollHealthBoundedAndBackoff
// measures the poll's concurrency and backoff with it (the other tests read
// the real vbmc through bmc.Controller.Health).
type bmcHealth struct {
	mu    sync.Mutex
	h     map[string]bmc.Health
	err   map[string]error
	reads map[string]int
	inUse int
	most  int
	delay time.Duration
}

func newBMCHealth() *bmcHealth {
	return &bmcHealth{h: map[string]bmc.Health{}, err: map[string]error{}, reads: map[string]int{}}
}

func (b *bmcHealth) set(id string, h bmc.Health) { b.mu.Lock(); b.h[id] = h; b.mu.Unlock() }

func (b *bmcHealth) Health(ctx context.Context, id string) (bmc.Health, error) {
	b.mu.Lock()
	b.reads[id]++
	b.inUse++
	b.most = max(b.most, b.inUse)
	d := b.delay
	b.mu.Unlock()
	if d > 0 {
		select {
		case <-time.After(d):
		case <-ctx.Done():
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.inUse--
	if err := b.err[id]; err != nil {
		return bmc.Health{}, err
	}
	h, ok := b.h[id]
	if !ok {
		return bmc.Health{System: bmc.HealthOK, Chassis: bmc.HealthOK}, nil
	}
	return h, nil
}

// remFleet is a harness with n claimed, provisioned machines (each with a
// real vbmc) in racks of perRack, built by the real flow: registered,
// inspected by the agent, claimed by ClaimMachines (selector role=web),
// built by the agent's reports, booted to disk; and spares more available
// machines in the last rack.
type remFleet struct {
	*harness
	st     *store.Store
	bmcs   *vbmcFleet
	hr     *bmcHealth
	img    store.Image
	ids    []string // claimed
	spares []string
}

func newRemFleet(t *testing.T, n, perRack, spares int, mod func(*Config)) *remFleet {
	st := newStore(t)
	f := &remFleet{st: st, bmcs: newVBMCFleet(t), hr: newBMCHealth()}
	h := newHarness(t, st, func(c *Config) {
		c.Inspection = InspectManual
		c.Health = f.bmcs // the real bmc.Controller.Health against each vbmc
		c.BMCTimeout = 5 * time.Second
		c.Remediation = RemediationConfig{
			PowerCycleTimeout: 2 * time.Minute, ReinspectTimeout: 5 * time.Minute, ReprovisionTimeout: 10 * time.Minute,
			Settle: 30 * time.Second, DrainTimeout: -1, BrakeWindow: 15 * time.Minute,
		}
		if mod != nil {
			mod(c)
		}
	})
	h.c.bmc = f.bmcs
	f.harness = h
	// The BMC workers run (Run's, without its loop: the test ticks).
	wctx, wcancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for i := 0; i < 2; i++ {
		wg.Add(1)
		go func() { defer wg.Done(); h.c.worker(wctx) }()
	}
	t.Cleanup(func() { wcancel(); h.c.jobs.signal(); wg.Wait() })
	f.img = h.image("web.raw")
	total := n + spares
	for i := 0; i < total; i++ {
		rack := fmt.Sprintf("rack-%d", i/perRack+1)
		mac := fmt.Sprintf("52:54:00:14:%02x:%02x", i/256, i%256)
		m, err := st.PutMachine(bg, store.Machine{Name: fmt.Sprintf("n%02d", i), Rack: rack, BMC: "bmc-" + fmt.Sprint(i),
			Labels:   map[string]string{"pool": "web", LabelClass: "gp"},
			Intended: store.Hardware{Serial: fmt.Sprintf("SER%02d", i), CPUs: 8, MemoryBytes: 32 << 30, NICs: []store.NIC{{MAC: mac}}}},
			store.W{Actor: "test", Reason: "setup"})
		must(t, err)
		f.bmcs.add(m.ID)
		_, err = h.c.AgentRegister(bg, m.ID, agentapi.Registration{Inventory: inventory(m)})
		must(t, err)
		h.mustState(m.ID, store.StateAvailable)
		if i < n {
			f.ids = append(f.ids, m.ID)
		} else {
			f.spares = append(f.spares, m.ID)
		}
	}
	// Claim exactly the first n by marking the spares' pool label apart until the claim is placed.
	for _, id := range f.spares {
		setLabel(t, st, id, "pool", "hold")
	}
	if n > 0 {
		ms, err := h.c.ClaimMachines(bg, "web", map[string]string{"pool": "web"}, n, store.Claim{Image: f.img.ID}, store.W{Actor: "alice"})
		must(t, err)
		if len(ms) != n {
			t.Fatalf("claimed %d", len(ms))
		}
	}
	for _, id := range f.spares {
		setLabel(t, st, id, "pool", "web")
	}
	for _, id := range f.ids {
		f.build(id)
		h.mustState(id, store.StateProvisioned)
	}
	return f
}

func setLabel(t *testing.T, st *store.Store, id, k, v string) {
	t.Helper()
	m, err := st.GetMachine(id)
	must(t, err)
	m.Labels[k] = v
	_, err = st.PutMachine(bg, m, store.W{Actor: "test", Reason: "setup"})
	must(t, err)
}

// build is the agent's side of one gated build of machine id: the task,
// every step's success, then the post-build netboot BootFor answers with
// the local disk.
func (f *remFleet) build(id string) {
	t := f.t
	task, err := f.c.AgentTask(bg, id)
	must(t, err)
	if task.Action != agentapi.ActionProvision {
		t.Fatalf("machine %s: task %s, want provision (state %s)", id, task.Action, f.get(id).State)
	}
	for _, s := range buildSteps[:len(buildSteps)-1] {
		must(t, f.c.AgentReport(bg, id, agentapi.Report{Step: s, State: agentapi.StateStarted, Attempt: task.Attempt}))
		must(t, f.c.AgentReport(bg, id, agentapi.Report{Step: s, State: agentapi.StateSucceeded, Attempt: task.Attempt}))
	}
	m := f.get(id)
	b, err := f.c.BootFor(bg, m.Intended.NICs[0].MAC)
	must(t, err)
	if b.Action != BootLocal {
		t.Fatalf("post-build boot %+v", b)
	}
}

// tick advances the clock by d, runs one Tick and waits for the BMC queue
// to drain (the jobs run on the harness's workers).
func (f *remFleet) tick(d time.Duration) {
	f.t.Helper()
	f.clk.Advance(d)
	must(f.t, f.c.Tick(bg))
	f.idle()
}

// idle waits until no BMC sequence is queued or running.
func (f *remFleet) idle() {
	f.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		f.c.jobs.mu.Lock()
		n := len(f.c.jobs.inflight)
		f.c.jobs.mu.Unlock()
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			f.t.Fatal("BMC queue never drained")
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func (f *remFleet) critical(id, why string) {
	f.t.Helper()
	_, err := f.c.ReportHealth(bg, id, "Ready", store.HealthCritical, "NodeNotReady", why, store.W{Actor: "api:capi"})
	must(f.t, err)
}
