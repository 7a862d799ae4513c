package vbmc_test

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"testing"
	"time"

	"kiln/bmc"
	"kiln/deploy/lab/vbmc/vbmc"
)

// fakePower is a simulated machine: it records the power calls it gets.
type fakePower struct {
	mu    sync.Mutex
	on    bool
	calls []string // "on:pxe:Legacy", "off"
}

func (p *fakePower) PowerOn(override, mode string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.on = true
	p.calls = append(p.calls, "on:"+override+":"+mode)
	return nil
}

func (p *fakePower) PowerOff() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.on = false
	p.calls = append(p.calls, "off")
	return nil
}

func (p *fakePower) PoweredOn() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.on
}

func (p *fakePower) log() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.calls...)
}

// One vbmc serves two ComputerSystems, each on its own loopback address.
// Kiln's BMC controller, given each address as a separate BMC, powers on and
// sets the next boot of that machine only (its Redfish driver takes the first
// system of the collection, which is the address's own); a connection to
// another address of the host sees both systems.
func TestSystemsByAddress(t *testing.T) {
	a, b := &fakePower{}, &fakePower{}
	srv, err := vbmc.New(vbmc.Config{Listen: "0.0.0.0:0", Username: testUser, Password: testPass, NoRequestLog: true,
		Systems: []vbmc.SystemConfig{
			{ID: "7", Addr: netip.MustParseAddr("127.0.0.2"), Serial: "SN-A", Manufacturer: "Acme", Model: "R1",
				MACs: []string{"02:00:00:00:00:0a"}, Power: a},
			{ID: "8", Addr: netip.MustParseAddr("127.0.0.3"), Serial: "SN-B", Manufacturer: "Acme", Model: "R1",
				MACs: []string{"02:00:00:00:00:0b"}, InitialMode: "UEFI", Power: b},
		}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx, slog.New(slog.NewTextHandler(io.Discard, nil))) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("vbmc Run: %v", err)
		}
	})
	_, port, _ := net.SplitHostPort(srv.Addr())
	target := func(ip string) bmc.Target {
		return bmc.Target{Address: net.JoinHostPort(ip, port), Driver: bmc.DriverRedfish, Username: testUser,
			Password: testPass, InsecureTLS: true}
	}
	c := newController(t, bmc.Config{}, nil)
	cctx, ccancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer ccancel()

	if err := c.SetNextBootPXE(cctx, target("127.0.0.2"), bmc.BootLegacy); err != nil {
		t.Fatalf("SetNextBootPXE A: %v", err)
	}
	if err := c.Power(cctx, target("127.0.0.2"), bmc.ActionCycle); err != nil {
		t.Fatalf("power cycle A (off: on): %v", err)
	}
	if got := a.log(); len(got) != 1 || got[0] != "on:pxe:Legacy" {
		t.Fatalf("A's power calls %q, want [on:pxe:Legacy]", got)
	}
	if got := b.log(); len(got) != 0 {
		t.Fatalf("B's power calls %q after A's power-on, want none", got)
	}
	if st, err := c.PowerState(cctx, target("127.0.0.3")); err != nil || st != bmc.PowerOff {
		t.Fatalf("B's power state = %q, %v; want off", st, err)
	}
	inv, err := c.Inventory(cctx, target("127.0.0.3"))
	if err != nil || inv.Serial != "SN-B" || len(inv.NICMACs) != 1 || inv.NICMACs[0] != "02:00:00:00:00:0b" {
		t.Fatalf("B's inventory %+v, %v", inv, err)
	}
	if err := c.Power(cctx, target("127.0.0.3"), bmc.ActionOn); err != nil {
		t.Fatalf("power on B: %v", err)
	}
	if got := b.log(); len(got) != 1 || got[0] != "on::UEFI" {
		t.Fatalf("B's power calls %q, want [on::UEFI] (no override pending)", got)
	}
	if err := c.Power(cctx, target("127.0.0.2"), bmc.ActionOff); err != nil {
		t.Fatalf("power off A: %v", err)
	}
	if got := a.log(); len(got) != 2 || got[1] != "off" || !b.PoweredOn() {
		t.Fatalf("after A off: A %q, B on %v", got, b.PoweredOn())
	}
	if boots := srv.Boots(); len(boots) != 2 || boots[0].System != "7" || boots[0].Override != "pxe" || boots[1].System != "8" {
		t.Fatalf("boots %+v", boots)
	}

	// Plain Redfish reads: the collection as each address sees it.
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	members := func(ip, path string) (int, []string) {
		req, _ := http.NewRequest("GET", "https://"+net.JoinHostPort(ip, port)+path, nil)
		req.SetBasicAuth(testUser, testPass)
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var col struct {
			Members []struct {
				ID string `json:"@odata.id"`
			}
		}
		_ = json.NewDecoder(resp.Body).Decode(&col)
		var ids []string
		for _, m := range col.Members {
			ids = append(ids, m.ID)
		}
		return resp.StatusCode, ids
	}
	for _, tc := range []struct {
		ip   string
		want []string
	}{
		{"127.0.0.2", []string{"/redfish/v1/Systems/7"}},
		{"127.0.0.3", []string{"/redfish/v1/Systems/8"}},
		{"127.0.0.1", []string{"/redfish/v1/Systems/7", "/redfish/v1/Systems/8"}},
	} {
		if st, ids := members(tc.ip, "/redfish/v1/Systems"); st != 200 || len(ids) != len(tc.want) || ids[0] != tc.want[0] || ids[len(ids)-1] != tc.want[len(tc.want)-1] {
			t.Errorf("Systems via %s: %d %q, want %q", tc.ip, st, ids, tc.want)
		}
	}
	if st, _ := members("127.0.0.2", "/redfish/v1/Systems/8"); st != 404 {
		t.Errorf("system 8 via system 7's address: HTTP %d, want 404", st)
	}
}

func TestSystemsConfigRejected(t *testing.T) {
	p := &fakePower{}
	for name, sys := range map[string][]vbmc.SystemConfig{
		"no power":     {{ID: "1"}},
		"bad id":       {{ID: "a/b", Power: p}},
		"duplicate id": {{ID: "1", Power: p}, {ID: "1", Power: p}},
		"duplicate address": {{ID: "1", Addr: netip.MustParseAddr("127.0.0.2"), Power: p},
			{ID: "2", Addr: netip.MustParseAddr("127.0.0.2"), Power: p}},
		"bad mode": {{ID: "1", InitialMode: "BIOS", Power: p}},
	} {
		if _, err := vbmc.New(vbmc.Config{Listen: "127.0.0.1:0", Username: "u", Password: "p", Systems: sys}); err == nil {
			t.Errorf("%s: New accepted %+v", name, sys)
		}
	}
}
