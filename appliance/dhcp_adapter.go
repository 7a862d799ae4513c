package appliance

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"time"

	"kiln/dhcp"
	"kiln/store"
)

// dhcpBackend adapts the replicated store to dhcp.Backend. Machine reads the
// local replica (the boot path never waits on raft); Discovered goes to the
// lifecycle (the only writer of machine records, with its discovery limits)
// and SaveLeases writes through raft (forwarded to the leader by the store).
type dhcpBackend struct {
	st          *store.Store
	discover    discoverer
	scriptURL   func(mac string) string
	log         *slog.Logger
	discoveries chan discovery
}

func (b *dhcpBackend) Machine(mac net.HardwareAddr) (dhcp.MachineInfo, bool) {
	m, err := b.st.MachineByMAC(strings.ToLower(mac.String()))
	if err != nil {
		return dhcp.MachineInfo{}, false
	}
	info := dhcp.MachineInfo{
		ID:           m.ID,
		Hostname:     m.Name,
		Netboot:      m.Netboot == nil || *m.Netboot,
		BootOverride: m.BootOverride,
		ScriptURL:    b.scriptURL(strings.ToLower(mac.String())),
	}
	if m.Claim != nil && m.Claim.Hostname != "" {
		info.Hostname = m.Claim.Hostname
	}
	if ip, err := netip.ParseAddr(m.IPv4); err == nil {
		info.IP = ip
	}
	switch m.State {
	case store.StateRetired:
		info.Netboot = false
	}
	return info, true
}

// discoverer is the lifecycle's DHCP discovery (lifecycle.Controller.DiscoverDHCP).
type discoverer interface {
	DiscoverDHCP(ctx context.Context, mac, arch, vendorClass string) (bool, error)
}

// Discovered queues an unknown MAC for the lifecycle to record as a
// `discovered` machine so the site team sees every server that asks. The
// DHCP server rate-limits calls per MAC; the lifecycle applies its own
// discovery rate and cap.
func (b *dhcpBackend) Discovered(mac net.HardwareAddr, arch uint16, vendorClass string) {
	select {
	case b.discoveries <- discovery{mac: strings.ToLower(mac.String()), arch: arch, vendorClass: vendorClass}:
	default:
		b.log.Warn("discovery queue full; dropped", "mac", mac.String())
	}
}

type discovery struct {
	mac         string
	arch        uint16
	vendorClass string
}

// runDiscoveries writes queued discoveries until ctx ends (one writer, so a
// burst of unknown MACs cannot start unbounded goroutines).
func (b *dhcpBackend) runDiscoveries(ctx context.Context) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case d := <-b.discoveries:
			wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			_, err := b.discover.DiscoverDHCP(wctx, d.mac, dhcp.ArchName(d.arch), d.vendorClass)
			cancel()
			if err != nil {
				b.log.Warn("recording discovered machine failed", "mac", d.mac, "err", err)
			}
		}
	}
}

func (b *dhcpBackend) LoadLeases() ([]dhcp.Lease, error) {
	ls, err := b.st.Leases()
	if err != nil {
		return nil, err
	}
	out := make([]dhcp.Lease, 0, len(ls))
	for _, l := range ls {
		mac, err := net.ParseMAC(l.MAC)
		if err != nil {
			return nil, errors.New("lease with malformed MAC " + l.MAC)
		}
		ip, err := netip.ParseAddr(l.IP)
		if err != nil {
			return nil, errors.New("lease with malformed IP " + l.IP)
		}
		out = append(out, dhcp.Lease{MAC: mac, IP: ip, Hostname: l.Hostname, Expiry: l.Expiry, State: l.State})
	}
	return out, nil
}

func (b *dhcpBackend) SaveLeases(ctx context.Context, ls []dhcp.Lease) error {
	out := make([]store.Lease, len(ls))
	for i, l := range ls {
		out[i] = store.Lease{MAC: strings.ToLower(l.MAC.String()), IP: l.IP.String(), Hostname: l.Hostname, Expiry: l.Expiry.UTC(), State: l.State}
	}
	return b.st.PutLeases(ctx, out)
}
