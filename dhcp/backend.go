package dhcp

import (
	"context"
	"net"
	"net/netip"
	"time"
)

// Backend is everything the DHCP server needs from the rest of Kiln. The
// appliance adapts the replicated store to it; tests use a bbolt file.
// Methods are called concurrently from the worker pool and must be safe for
// concurrent use. Machine is on the hot path (every request) and should read a
// local replica.
type Backend interface {
	// Machine returns boot facts for a MAC; ok=false when unknown.
	Machine(mac net.HardwareAddr) (m MachineInfo, ok bool)
	// Discovered is called for a MAC no record knows, at most once per MAC per
	// Config.DiscoverInterval. arch is option 93's first value (0xFFFF when
	// absent), vendorClass option 60 (may be empty). It must not block for long.
	Discovered(mac net.HardwareAddr, arch uint16, vendorClass string)
	// LoadLeases returns every persisted lease; called once by New.
	LoadLeases() ([]Lease, error)
	// SaveLeases makes a batch of leases durable (one call per batch; the
	// server groups ACKed leases and sends those ACKs only after this returns
	// nil — group commit). Store them keyed by IP: the newest record for an
	// address wins, and a declined address keeps its record when the
	// decliner binds another one. ctx carries Config.SaveTimeout.
	SaveLeases(ctx context.Context, ls []Lease) error
}

// MachineInfo is what the server knows about a known machine.
type MachineInfo struct {
	// ID is the machine's store ID (logged only).
	ID string
	// IP is the reserved IPv4 address; the zero Addr means "take one from the pool".
	IP netip.Addr
	// Hostname is sent as option 12 when set.
	Hostname string
	// Netboot false: no boot file is offered (authoritative: plain lease;
	// proxy: no answer).
	Netboot bool
	// BootOverride replaces the first-stage binary name, e.g. "snp.efi" for a
	// NIC whose native iPXE driver fails. Applies to TFTP and HTTP boot.
	BootOverride string
	// ScriptURL is the iPXE second-pass script URL; empty means the default
	// {HTTPBootURL}/ipxe/{mac} (aa:bb:cc:dd:ee:ff, lower case).
	ScriptURL string
}

// Lease states stored in Lease.State.
const (
	// LeaseBound: the address is ACKed to the MAC until Expiry.
	LeaseBound = "bound"
	// LeaseReleased: the client released it (RFC 2131 §4.4.6); the address is free.
	LeaseReleased = "released"
	// LeaseDeclined: the client reported the address in use (DHCPDECLINE,
	// RFC 2131 §4.3.3); it is not handed out until Expiry. MAC is the decliner.
	LeaseDeclined = "declined"
)

// Lease is one persisted address binding.
type Lease struct {
	MAC      net.HardwareAddr
	IP       netip.Addr
	Hostname string
	// Expiry is the absolute end of the binding (UTC).
	Expiry time.Time
	// State is one of LeaseBound, LeaseReleased, LeaseDeclined.
	State string
}
