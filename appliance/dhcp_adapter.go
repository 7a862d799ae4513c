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
// local replica (the boot path never waits on raft); Discovered and
// CommitLeases write through raft (forwarded to the leader by the store);
// the lease methods are in dhcp_leases.go.
type dhcpBackend struct {
	st          *store.Store
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

// Discovered records an unknown MAC as a `discovered` machine so the site team
// sees every server that asks. The DHCP server rate-limits calls per MAC.
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
			if _, err := b.st.MachineByMAC(d.mac); err == nil {
				continue
			}
			labels := map[string]string{"kiln.io/discovered-by": "dhcp", "kiln.io/arch": archName(d.arch)}
			if d.vendorClass != "" {
				labels["kiln.io/vendor-class"] = sanitizeLabel(d.vendorClass)
			}
			m := store.Machine{
				State:    store.StateDiscovered,
				Labels:   labels,
				Intended: store.Hardware{NICs: []store.NIC{{MAC: d.mac}}},
			}
			wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			_, err := b.st.PutMachine(wctx, m, store.W{Actor: "dhcp", Reason: "unknown_mac"})
			cancel()
			if err != nil {
				b.log.Warn("recording discovered machine failed", "mac", d.mac, "err", err)
			}
		}
	}
}

// archName names an RFC 4578 option 93 value for a label.
func archName(a uint16) string {
	switch a {
	case 0:
		return "bios"
	case 7, 9:
		return "efi-x86_64"
	case 11:
		return "efi-arm64"
	case 16:
		return "efi-x86_64-http"
	case 19:
		return "efi-arm64-http"
	case 0xFFFF:
		return "none"
	}
	return "other"
}

// sanitizeLabel keeps printable ASCII without spaces, at most 63 bytes.
func sanitizeLabel(s string) string {
	var b strings.Builder
	for _, r := range s {
		if b.Len() >= 63 {
			break
		}
		if r > 32 && r < 127 {
			b.WriteRune(r)
		}
	}
	return b.String()
}
