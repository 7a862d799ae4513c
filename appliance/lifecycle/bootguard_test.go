package lifecycle

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"kiln/api/agentapi"
	"kiln/store"
)

// expectHeld asserts BootFor(mac) refuses with ErrAgentActive and leaves
// the stored token hash (and so the running agent's token) alone.
func expectHeld(t *testing.T, h *harness, mac, id, tok string) {
	t.Helper()
	before := h.get(id).BootTokenHash
	b, err := h.c.BootFor(bg, mac)
	if !errors.Is(err, ErrAgentActive) || b != (Boot{}) {
		t.Fatalf("BootFor(%s) = %+v, %v; want ErrAgentActive", mac, b, err)
	}
	if after := h.get(id).BootTokenHash; after != before {
		t.Fatal("held boot rotated the token hash")
	}
	if tok != "" && !h.c.VerifyAgentToken(id, tok) {
		t.Fatal("held boot invalidated the running agent's token")
	}
}

// TestBootForKeepsLiveAgent is the regression test for "anyone on the boot
// network can cut a running agent off by fetching /ipxe/{mac}": while the
// agent registers, polls or reports (a long write heartbeating every
// AgentHeartbeat), BootFor answers ErrAgentActive and the agent's token
// keeps working; once the agent is silent for AgentLiveWindow, a genuine
// reboot gets a new token.
func TestBootForKeepsLiveAgent(t *testing.T) {
	f := newStore(t)
	h := newHarness(t, f, nil)
	if w := h.c.AgentLiveWindow(); w != 2*DefaultAgentHeartbeat {
		t.Fatalf("default live window %v, want 2×heartbeat", w)
	}
	a := importPlan(t, h)[1] // node-b: no BMC involvement needed
	const mac = "52:54:00:00:00:0b"
	boot, err := h.c.BootFor(bg, mac)
	must(t, err)
	if boot.Action != BootAgent {
		t.Fatalf("first boot %+v", boot)
	}
	tok := boot.Token
	_, err = h.c.AgentRegister(bg, a.ID, agentapi.Registration{Inventory: inventory(a)})
	must(t, err)
	h.mustState(a.ID, store.StateAvailable)
	expectHeld(t, h, mac, a.ID, tok)

	// An idle agent polling every AgentPollAfter stays live.
	for range 5 {
		h.clk.Advance(DefaultAgentPollAfter)
		_, err = h.c.AgentTask(bg, a.ID)
		must(t, err)
		expectHeld(t, h, mac, a.ID, tok)
	}

	// A long write: only heartbeats (every AgentHeartbeat) for 10 minutes.
	img := h.image("guard.raw")
	_, err = h.c.Provision(bg, a.ID, store.Claim{Image: img.ID}, store.W{Actor: "capi"})
	must(t, err)
	task, err := h.c.AgentTask(bg, a.ID)
	must(t, err)
	if task.Action != agentapi.ActionProvision {
		t.Fatalf("task %+v", task)
	}
	must(t, h.c.AgentReport(bg, a.ID, agentapi.Report{Step: agentapi.StepCheck, State: agentapi.StateSucceeded}))
	must(t, h.c.AgentReport(bg, a.ID, agentapi.Report{Step: agentapi.StepWrite, State: agentapi.StateStarted}))
	for i := range 20 {
		h.clk.Advance(DefaultAgentHeartbeat - time.Second)
		expectHeld(t, h, mac, a.ID, tok) // just before the heartbeat is due
		h.clk.Advance(time.Second)
		must(t, h.c.AgentReport(bg, a.ID, agentapi.Report{Step: agentapi.StepWrite, State: agentapi.StateRunning,
			Progress: float64(i) / 20}))
	}
	// One heartbeat late (network hiccup) still holds: the window is 2×heartbeat.
	h.clk.Advance(2*DefaultAgentHeartbeat - time.Second)
	expectHeld(t, h, mac, a.ID, tok)
	if m := h.get(a.ID); m.State != store.StateProvisioning {
		t.Fatalf("held boots moved the machine to %s", m.State)
	}
	if v := h.metric("kiln_lifecycle_boots_held_total", "reason", holdAgentActive); v < 25 {
		t.Fatalf("boots_held_total{agent_active} = %v", v)
	}

	// The agent goes silent (the machine really rebooted): after the
	// window a new token is issued and the old one is dead.
	h.clk.Advance(2 * time.Second)
	boot, err = h.c.BootFor(bg, mac)
	must(t, err)
	if boot.Action != BootAgent || boot.Token == tok || h.c.VerifyAgentToken(a.ID, tok) || !h.c.VerifyAgentToken(a.ID, boot.Token) {
		t.Fatalf("stale agent: boot %+v", boot)
	}
	// The rebooted agent registers mid-build: the machine fails as before
	// (agent_restarted), and is no netboot state any more.
	_, err = h.c.AgentRegister(bg, a.ID, agentapi.Registration{Inventory: inventory(a)})
	must(t, err)
	if m := h.mustState(a.ID, store.StateFailed); m.Reason != ReasonAgentRestarted {
		t.Fatalf("reason %q", m.Reason)
	}
}

// TestAgentLiveWindowConfig: the window is max(AgentStaleAfter, 2×AgentHeartbeat).
func TestAgentLiveWindowConfig(t *testing.T) {
	for _, tc := range []struct {
		stale, hb, want time.Duration
	}{
		{0, 0, 2 * DefaultAgentHeartbeat},
		{5 * time.Minute, 0, 5 * time.Minute},
		{10 * time.Second, 20 * time.Second, 40 * time.Second},
	} {
		h := newHarness(t, newStore(t), func(c *Config) { c.AgentStaleAfter, c.AgentHeartbeat = tc.stale, tc.hb })
		if got := h.c.AgentLiveWindow(); got != tc.want {
			t.Errorf("stale %v heartbeat %v: window %v, want %v", tc.stale, tc.hb, got, tc.want)
		}
	}
}

// TestBootForOtherNode: a node that did not issue the current token and
// has not heard the agent (the agent talks to another node) holds the boot
// — on the replicated step evidence while the agent reports, otherwise
// conservatively — but never longer than AgentLiveWindow, and never a
// machine with no token outstanding.
func TestBootForOtherNode(t *testing.T) {
	f := newStore(t)
	h := newHarness(t, f, nil) // node A: issues the token, hears the agent
	regB := prometheus.NewRegistry()
	other, err := New(h.c.cfg, f, nil, regB)
	must(t, err) // node B: same store, own memory, same clock
	hb := &harness{t: t, c: other, st: f, clk: h.clk, reg: regB}
	ms := importPlan(t, h)
	a := ms[0]
	const macA, macB = "52:54:00:00:00:0a", "52:54:00:00:00:0b"

	// No token outstanding: node B boots it at once.
	bb, err := other.BootFor(bg, macB)
	must(t, err)
	if bb.Action != BootAgent {
		t.Fatalf("fresh machine on node B: %+v", bb)
	}

	boot, err := h.c.BootFor(bg, macA)
	must(t, err)
	_, err = h.c.AgentRegister(bg, a.ID, agentapi.Registration{Inventory: inventory(a)})
	must(t, err)
	hash := h.get(a.ID).BootTokenHash

	// The register wrote Step{inspect succeeded} just now: evidence for node B.
	if _, err := other.BootFor(bg, macA); !errors.Is(err, ErrAgentActive) {
		t.Fatalf("node B with step evidence: %v", err)
	}
	// The idle agent keeps polling node A only; the stored evidence ages.
	// Node B cannot tell: it holds from its first unsure request for one window.
	w := h.c.AgentLiveWindow()
	h.clk.Advance(w + time.Second)
	_, err = h.c.AgentTask(bg, a.ID)
	must(t, err)
	if _, err := other.BootFor(bg, macA); !errors.Is(err, ErrAgentActive) {
		t.Fatalf("node B unsure: %v", err)
	}
	h.clk.Advance(w / 2)
	if _, err := other.BootFor(bg, macA); !errors.Is(err, ErrAgentActive) {
		t.Fatalf("node B unsure, half a window later: %v", err)
	}
	if h.get(a.ID).BootTokenHash != hash || !h.c.VerifyAgentToken(a.ID, boot.Token) {
		t.Fatal("node B rotated the token while holding")
	}
	// A genuine boot retrying every few seconds gets its token within one window.
	var got Boot
	for i := 0; i < 20 && got.Action == ""; i++ {
		h.clk.Advance(5 * time.Second)
		got, err = other.BootFor(bg, macA)
		if err != nil && !errors.Is(err, ErrAgentActive) {
			t.Fatal(err)
		}
	}
	if got.Action != BootAgent || !other.VerifyAgentToken(a.ID, got.Token) {
		t.Fatalf("node B never released the hold: %+v", got)
	}
	if v := hb.metric("kiln_lifecycle_boots_held_total", "reason", holdUnknown); v < 2 {
		t.Fatalf("node B boots_held_total{unknown} = %v", v)
	}
	if v := hb.metric("kiln_lifecycle_boots_held_total", "reason", holdAgentActive); v != 1 {
		t.Fatalf("node B boots_held_total{agent_active} = %v", v)
	}
}

// TestBootForPowerCycleEndsAgent: after this node power-cycles the machine
// through its BMC (agent gone by construction), the next netboot gets a
// token at once even though the agent was heard from moments earlier.
func TestBootForPowerCycleEndsAgent(t *testing.T) {
	f := newStore(t)
	h := newHarness(t, f, nil)
	a := importPlan(t, h)[0]
	const mac = "52:54:00:00:00:0a"
	_, err := h.c.BootFor(bg, mac)
	must(t, err)
	_, err = h.c.AgentRegister(bg, a.ID, agentapi.Registration{Inventory: inventory(a)})
	must(t, err)
	expectHeld(t, h, mac, a.ID, "")
	h.c.agentReset(a.ID) // what runWork does right before power_cycle/power_on/power_off
	boot, err := h.c.BootFor(bg, mac)
	must(t, err)
	if boot.Action != BootAgent {
		t.Fatalf("after power cycle: %+v", boot)
	}
	// The new agent registers: live again.
	_, err = h.c.AgentRegister(bg, a.ID, agentapi.Registration{Inventory: inventory(a)})
	must(t, err)
	expectHeld(t, h, mac, a.ID, boot.Token)
}

// TestDiscoveryRateLimit is the regression test for "300 unknown MACs in
// 0.37 s created 300 discovered machines": the token bucket admits
// DiscoverBurst at once and DiscoverRate per second after; the rest get
// the exit answer (BootLocal, no record) and count as dropped{rate}.
func TestDiscoveryRateLimit(t *testing.T) {
	f := newStore(t)
	h := newHarness(t, f, func(c *Config) { c.DiscoverRate, c.DiscoverBurst = 2, 20 })
	discover := func(from, n int) (created int) {
		for i := from; i < from+n; i++ {
			b, err := h.c.BootFor(bg, fmt.Sprintf("02:aa:00:00:%02x:%02x", i>>8, i&0xff))
			must(t, err)
			switch b.Action {
			case BootDiscover:
				created++
			case BootLocal:
				if b.MachineID != "" || b.Token != "" {
					t.Fatalf("dropped discovery answered %+v", b)
				}
			default:
				t.Fatalf("unknown MAC answered %+v", b)
			}
		}
		return created
	}
	if n := discover(0, 300); n != 20 {
		t.Fatalf("flood created %d discovered, want the burst (20)", n)
	}
	if n := h.metric("kiln_lifecycle_discoveries_dropped_total", "reason", dropRate); n != 280 {
		t.Fatalf("dropped{rate} = %v", n)
	}
	h.clk.Advance(3 * time.Second)
	if n := discover(300, 50); n != 6 {
		t.Fatalf("3 s later created %d, want 6", n)
	}
	counts, err := f.CountByState()
	must(t, err)
	if counts[store.StateDiscovered] != 26 {
		t.Fatalf("discovered machines %d", counts[store.StateDiscovered])
	}
	// A dropped MAC asking again once tokens refill is discovered normally.
	h.clk.Advance(time.Second)
	b, err := h.c.BootFor(bg, "02:aa:00:00:00:63")
	must(t, err)
	if b.Action != BootDiscover {
		t.Fatalf("retry after refill %+v", b)
	}
	// The record follows the DHCP path's convention.
	m := h.get(b.MachineID)
	if m.Name != "" || m.Labels[LabelDiscoveredBy] != DiscoveredByIPXE || len(m.Labels) != 1 ||
		len(m.Intended.NICs) != 1 || m.Intended.NICs[0].MAC != "02:aa:00:00:00:63" || m.Reason != ReasonDiscovered {
		t.Fatalf("discovered record %+v", m)
	}
}

// TestDiscoveryCap: at MaxDiscovered machines in state discovered (whoever
// created them, the DHCP path included) BootFor records no more; a
// discovered machine moving on frees a place.
func TestDiscoveryCap(t *testing.T) {
	f := newStore(t)
	h := newHarness(t, f, func(c *Config) { c.MaxDiscovered = 3; c.DiscoverBurst = 1000 })
	// One discovered by the DHCP path.
	_, err := f.PutMachine(bg, store.Machine{State: store.StateDiscovered,
		Labels:   map[string]string{LabelDiscoveredBy: "dhcp", "kiln.io/arch": "x86-64-efi"},
		Intended: store.Hardware{NICs: []store.NIC{{MAC: "02:bb:00:00:00:ff"}}}}, store.W{Actor: "dhcp"})
	must(t, err)
	var ids []string
	for i := range 10 {
		b, err := h.c.BootFor(bg, fmt.Sprintf("02:bb:00:00:00:%02x", i))
		must(t, err)
		if b.Action == BootDiscover {
			ids = append(ids, b.MachineID)
		} else if b.Action != BootLocal || b.MachineID != "" {
			t.Fatalf("capped discovery %+v", b)
		}
	}
	if len(ids) != 2 || h.metric("kiln_lifecycle_discoveries_dropped_total", "reason", dropCap) != 8 {
		t.Fatalf("created %d, dropped{cap} %v", len(ids), h.metric("kiln_lifecycle_discoveries_dropped_total", "reason", dropCap))
	}
	// A discovered machine's agent registers: it leaves discovered.
	_, err = h.c.AgentRegister(bg, ids[0], agentapi.Registration{Inventory: agentapi.Inventory{Serial: "S",
		NICs: []agentapi.NIC{{Name: "eth0", MAC: "02:bb:00:00:00:00"}}}})
	must(t, err)
	b, err := h.c.BootFor(bg, "02:bb:00:00:00:20")
	must(t, err)
	if b.Action != BootDiscover {
		t.Fatalf("after a place freed: %+v", b)
	}
	// Known machines are never subject to the limits.
	if b, err := h.c.BootFor(bg, "02:bb:00:00:00:01"); err != nil || b.Action != BootAgent {
		t.Fatalf("known discovered machine at the cap: %+v %v", b, err)
	}
}

// TestDiscoveryFloodRealStore replays the finding against the real store:
// 300 unknown MACs fetched concurrently create at most the burst plus what
// the rate refills during the flood.
func TestDiscoveryFloodRealStore(t *testing.T) {
	if testing.Short() {
		t.Skip("short: real store")
	}
	s := openRealStore(t)
	h := newHarness(t, s, func(c *Config) { c.Now = time.Now })
	start := time.Now()
	var wg sync.WaitGroup
	var mu sync.Mutex
	created, local := 0, 0
	for i := range 300 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			b, err := h.c.BootFor(bg, fmt.Sprintf("02:cc:00:00:%02x:%02x", i>>8, i&0xff))
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			switch b.Action {
			case BootDiscover:
				created++
			case BootLocal:
				local++
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	limit := DefaultDiscoverBurst + int(DefaultDiscoverRate*elapsed.Seconds()) + 1
	counts, err := s.CountByState()
	must(t, err)
	if created < DefaultDiscoverBurst || created > limit || created+local != 300 || counts[store.StateDiscovered] != created {
		t.Fatalf("flood of 300 in %v: created %d (limit %d), local %d, store has %d discovered",
			elapsed, created, limit, local, counts[store.StateDiscovered])
	}
	t.Logf("flood of 300 unknown MACs in %v: %d discovered, %d dropped", elapsed, created, local)
}

// TestDiscoveryConfigValidate: negative limits are refused.
func TestDiscoveryConfigValidate(t *testing.T) {
	for _, mod := range []func(*Config){
		func(c *Config) { c.DiscoverRate = -1 },
		func(c *Config) { c.DiscoverBurst = -1 },
		func(c *Config) { c.MaxDiscovered = -5 },
	} {
		cfg := Config{ImageBaseURL: "http://10.99.0.1:8080"}
		mod(&cfg)
		if _, err := New(cfg, newStore(t), nil, nil); !errors.Is(err, ErrConfig) {
			t.Errorf("config %+v: err %v", cfg, err)
		}
	}
}

// A built machine that netboots and is told to boot its disk has no agent
// any more (the agent rebooted it): a release right after is not held for
// AgentLiveWindow by the build's last reports. Found by the Cluster API
// provider's tests (cmd/kiln-capi), where a KilnMachine deleted a second
// after provisioning waited a full minute for its erase.
func TestBootedLocalEndsAgent(t *testing.T) {
	f := newStore(t)
	h := newHarness(t, f, nil)
	a := importPlan(t, h)[1] // node-b: no BMC
	const mac = "52:54:00:00:00:0b"
	_, err := h.c.BootFor(bg, mac)
	must(t, err)
	_, err = h.c.AgentRegister(bg, a.ID, agentapi.Registration{Inventory: inventory(a)})
	must(t, err)
	h.mustState(a.ID, store.StateAvailable)
	img := h.image("local.raw")
	_, err = h.c.Provision(bg, a.ID, store.Claim{Image: img.ID}, store.W{Actor: "capi"})
	must(t, err)
	task, err := h.c.AgentTask(bg, a.ID)
	must(t, err)
	if task.Action != agentapi.ActionProvision {
		t.Fatalf("task %+v", task)
	}
	steps := []string{agentapi.StepCheck, agentapi.StepWrite, agentapi.StepVerify}
	if task.Stage != nil {
		steps = append(steps, agentapi.StepStage)
	}
	for _, s := range append(steps, agentapi.StepFinalize) {
		must(t, h.c.AgentReport(bg, a.ID, agentapi.Report{Step: s, State: agentapi.StateStarted}))
		must(t, h.c.AgentReport(bg, a.ID, agentapi.Report{Step: s, State: agentapi.StateSucceeded, Progress: 1,
			Written: map[string]string{"disk": "/dev/sda", "sha256": img.SHA256}}))
	}
	must(t, h.c.AgentReport(bg, a.ID, agentapi.Report{Step: agentapi.StepReboot, State: agentapi.StateStarted}))
	boot, err := h.c.BootFor(bg, mac) // the reboot: told to boot its disk
	must(t, err)
	if boot.Action != BootLocal {
		t.Fatalf("boot after the build %+v", boot)
	}
	h.mustState(a.ID, store.StateProvisioned)
	h.clk.Advance(time.Second)
	_, err = h.c.Release(bg, a.ID, store.W{Actor: "capi"})
	must(t, err)
	h.mustState(a.ID, store.StateErasing)
	boot, err = h.c.BootFor(bg, mac)
	if err != nil || boot.Action != BootAgent {
		t.Fatalf("netboot a second after the release: %+v, %v (want the agent at once)", boot, err)
	}
}
