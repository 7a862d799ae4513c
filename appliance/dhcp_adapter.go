package appliance

import (
	"context"
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
// lifecycle (the only writer of machine records, with its discovery limits);
// CommitLeases writes through raft (forwarded to the leader by the store).
// The lease methods are in dhcp_leases.go.
type dhcpBackend struct {
	st          *store.Store
	discover    discoverer
	scriptURL   func(mac string) string
	log         *slog.Logger
	discoveries chan discovery
	voters      voterCache // Members (dhcp_leases.go)
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
