package appliance

import (
	"context"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync"
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
	machines    machineCache
}

// machineCache keeps the MachineInfo of each MAC with the ID and
// ResourceVersion of the record it was made from. Decoding the machine's
// JSON on every DHCP request was a fifth of kiln serve's CPU under the DHCP
// bench (dhcp/DESIGN.md); the index lookup that tells a cached entry is
// still current (store.MachineRefByMAC) is a map read.
type machineCache struct {
	mu sync.RWMutex
	m  map[[6]byte]cachedMachine
}

type cachedMachine struct {
	id      string
	version uint64
	info    dhcp.MachineInfo
}

// Machine returns the boot facts of the machine owning mac, from the local
// replica; ok=false for a MAC no machine has. A 6-byte MAC's answer is
// cached until its record is written again (or deleted).
func (b *dhcpBackend) Machine(mac net.HardwareAddr) (dhcp.MachineInfo, bool) {
	if len(mac) != 6 {
		return b.machine(strings.ToLower(mac.String()))
	}
	k := [6]byte(mac)
	s := macString(k)
	id, ver, err := b.st.MachineRefByMAC(s)
	if err != nil {
		b.machines.mu.Lock()
		delete(b.machines.m, k)
		b.machines.mu.Unlock()
		return dhcp.MachineInfo{}, false
	}
	b.machines.mu.RLock()
	c, ok := b.machines.m[k]
	b.machines.mu.RUnlock()
	if ok && c.id == id && c.version == ver {
		return c.info, true
	}
	m, err := b.st.MachineByMAC(s)
	if err != nil {
		return dhcp.MachineInfo{}, false
	}
	info := b.info(m, s)
	b.machines.mu.Lock()
	if b.machines.m == nil {
		b.machines.m = map[[6]byte]cachedMachine{}
	}
	// keyed by the record's own version: an entry is always the info of
	// the record it names, whichever write raced this read
	b.machines.m[k] = cachedMachine{id: m.ID, version: m.ResourceVersion, info: info}
	b.machines.mu.Unlock()
	return info, true
}

// macString is mac in lower-case colon form (store.NormalizeMAC's).
func macString(mac [6]byte) string {
	const hexd = "0123456789abcdef"
	var b [17]byte
	for i, c := range mac {
		if i > 0 {
			b[3*i-1] = ':'
		}
		b[3*i], b[3*i+1] = hexd[c>>4], hexd[c&0xf]
	}
	return string(b[:])
}

// machine is Machine without the cache (MACs that are not 6 bytes).
func (b *dhcpBackend) machine(mac string) (dhcp.MachineInfo, bool) {
	m, err := b.st.MachineByMAC(mac)
	if err != nil {
		return dhcp.MachineInfo{}, false
	}
	return b.info(m, mac), true
}

// info is the boot facts of m; mac in lower-case colon form.
func (b *dhcpBackend) info(m store.Machine, mac string) dhcp.MachineInfo {
	info := dhcp.MachineInfo{
		ID:           m.ID,
		Hostname:     m.Name,
		Netboot:      m.Netboot == nil || *m.Netboot,
		BootOverride: m.BootOverride,
		ScriptURL:    b.scriptURL(mac),
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
	return info
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
