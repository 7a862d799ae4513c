package appliance

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"kiln/appliance/lifecycle"
	"kiln/dhcp"
	"kiln/store"
	"kiln/store/storetest"
)

func newDHCPBackend(t *testing.T) (*dhcpBackend, *store.Store) {
	t.Helper()
	st := storetest.NewLocal(t)
	life, err := lifecycle.New(lifecycle.Config{ImageBaseURL: "http://10.0.0.1:8080"}, st, nil, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	return &dhcpBackend{
		st:          st,
		discover:    life,
		scriptURL:   func(mac string) string { return "http://10.0.0.1:8080/ipxe/" + mac },
		log:         slog.New(slog.NewTextHandler(io.Discard, nil)),
		discoveries: make(chan discovery, 4),
	}, st
}

// An unknown MAC seen by DHCP becomes a `discovered` machine (through the
// single bounded writer), labelled with its architecture; a second report of
// the same MAC adds nothing.
func TestDHCPDiscoveredBecomesAMachine(t *testing.T) {
	b, st := newDHCPBackend(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- b.runDiscoveries(ctx) }()
	defer func() { cancel(); <-done }()

	mac, _ := net.ParseMAC("52:54:00:AB:CD:01")
	b.Discovered(mac, 7, "PXEClient:Arch:00007:UNDI:003016")
	var m store.Machine
	deadline := time.Now().Add(5 * time.Second)
	for {
		var err error
		if m, err = st.MachineByMAC("52:54:00:ab:cd:01"); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("discovered machine not recorded: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if m.State != store.StateDiscovered || m.Labels["kiln.io/arch"] != "efi_x64" || m.Labels["kiln.io/discovered-by"] != "dhcp" ||
		m.Labels["kiln.io/vendor-class"] != "PXEClient:Arch:00007:UNDI:003016" {
		t.Fatalf("recorded %s with labels %v", m.State, m.Labels)
	}
	b.Discovered(mac, 7, "")
	time.Sleep(200 * time.Millisecond)
	ms, _, err := st.ListMachines(store.ListOptions{})
	if err != nil || len(ms) != 1 {
		t.Fatalf("after a repeat: %d machines (%v), want 1", len(ms), err)
	}
}

// A full queue drops (and logs) instead of blocking the DHCP worker.
func TestDHCPDiscoveredNeverBlocks(t *testing.T) {
	b, _ := newDHCPBackend(t) // nobody drains the queue
	mac, _ := net.ParseMAC("52:54:00:ab:cd:02")
	start := time.Now()
	for i := 0; i < 100; i++ {
		b.Discovered(mac, 0, "")
	}
	if time.Since(start) > time.Second {
		t.Fatal("Discovered blocked on a full queue")
	}
}

// Machine maps the record: reservation, override, netboot, script URL; a
// retired machine is never offered a boot file.
func TestDHCPMachineInfo(t *testing.T) {
	b, st := newDHCPBackend(t)
	no := false
	m, err := st.PutMachine(context.Background(), store.Machine{Name: "r1-u07", IPv4: "10.0.0.57", BootOverride: "snp.efi",
		Intended: store.Hardware{NICs: []store.NIC{{MAC: "52:54:00:ab:cd:03"}}}}, store.W{Actor: "test"})
	if err != nil {
		t.Fatal(err)
	}
	mac, _ := net.ParseMAC("52:54:00:AB:CD:03")
	info, ok := b.Machine(mac)
	if !ok || info.ID != m.ID || info.IP != netip.MustParseAddr("10.0.0.57") || info.BootOverride != "snp.efi" ||
		!info.Netboot || info.Hostname != "r1-u07" || info.ScriptURL != "http://10.0.0.1:8080/ipxe/52:54:00:ab:cd:03" {
		t.Fatalf("info %+v ok=%v", info, ok)
	}
	m.Netboot = &no
	if _, err := st.PutMachine(context.Background(), m, store.W{Actor: "test"}); err != nil {
		t.Fatal(err)
	}
	if info, _ := b.Machine(mac); info.Netboot {
		t.Fatal("netboot=false not honoured")
	}
	// The answer is cached per MAC until the record changes: a deleted
	// machine is unknown at once, and a new machine with the same NIC is
	// answered as itself.
	if err := st.DeleteMachine(context.Background(), m.ID, store.W{Actor: "test"}); err != nil {
		t.Fatal(err)
	}
	if info, ok := b.Machine(mac); ok {
		t.Fatalf("deleted machine still answered: %+v", info)
	}
	m2, err := st.PutMachine(context.Background(), store.Machine{Name: "r1-u08", IPv4: "10.0.0.58",
		Intended: store.Hardware{NICs: []store.NIC{{MAC: "52:54:00:ab:cd:03"}}}}, store.W{Actor: "test"})
	if err != nil {
		t.Fatal(err)
	}
	if info, ok := b.Machine(mac); !ok || info.ID != m2.ID || info.Hostname != "r1-u08" || info.IP != netip.MustParseAddr("10.0.0.58") || !info.Netboot {
		t.Fatalf("re-created machine: %+v ok=%v", info, ok)
	}
	if _, ok := b.Machine(net.HardwareAddr{2, 0, 0, 0, 0, 9}); ok {
		t.Fatal("unknown MAC reported known")
	}
}

// Leases round-trip through the replicated store: a committed binding
// reaches the watcher with its fields intact; a second client's binding of
// the same address is refused with dhcp.ErrAddressTaken.
func TestDHCPLeasesRoundTrip(t *testing.T) {
	b, _ := newDHCPBackend(t)
	var got []dhcp.Lease
	stop, err := b.WatchLeases(func([]dhcp.Lease) {}, func(ls []dhcp.Lease) { got = append(got, ls...) })
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	mac, _ := net.ParseMAC("52:54:00:ab:cd:04")
	exp := time.Now().Add(time.Hour).UTC().Truncate(time.Second)
	in := []dhcp.Lease{{MAC: mac, IP: netip.MustParseAddr("10.0.0.100"), Hostname: "h", Expiry: exp, State: dhcp.LeaseBound}}
	if errs, err := b.CommitLeases(context.Background(), in); err != nil || errs[0] != nil {
		t.Fatal(errs, err)
	}
	if len(got) != 1 {
		t.Fatalf("watcher got %v", got)
	}
	if got[0].MAC.String() != mac.String() || got[0].IP != in[0].IP || !got[0].Expiry.Equal(exp) || got[0].State != dhcp.LeaseBound || got[0].Hostname != "h" {
		t.Fatalf("lease changed on the way: %+v", got[0])
	}
	other, _ := net.ParseMAC("52:54:00:ab:cd:05")
	errs, err := b.CommitLeases(context.Background(), []dhcp.Lease{{MAC: other, IP: in[0].IP, Expiry: exp, State: dhcp.LeaseBound}})
	if err != nil || !errors.Is(errs[0], dhcp.ErrAddressTaken) || !errors.Is(errs[0], store.ErrAddressTaken) {
		t.Fatalf("second holder: %v %v", errs, err)
	}
	if self, all := b.Members(); self != store.LocalNodeID || len(all) != 1 || all[0] != self || !b.CanCommit() {
		t.Fatalf("members %q %v, can commit %v", self, all, b.CanCommit())
	}
}
