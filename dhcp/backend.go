package dhcp

import (
	"context"
	"net"
	"net/netip"
	"time"
)

// Backend is everything the DHCP server needs from the rest of Kiln: the
// machines, the agreed lease record and the view of the other servers. The
// appliance adapts the replicated store to it; the package's tests use a
// bbolt file. Methods are called concurrently from the worker pool and must
// be safe for concurrent use. Machine is on the hot path (every request)
// and should read a local replica.
type Backend interface {
	// Machine returns boot facts for a MAC; ok=false when unknown.
	Machine(mac net.HardwareAddr) (m MachineInfo, ok bool)
	// Discovered is called for a MAC no record knows, at most once per MAC per
	// Config.DiscoverInterval. arch is option 93's first value (0xFFFF when
	// absent), vendorClass option 60 (may be empty). It must not block for long.
	Discovered(mac net.HardwareAddr, arch uint16, vendorClass string)
	LeaseCommitter
	Membership
}

// LeaseCommitter is the agreed record of leases: the one place that decides
// who holds an address (in Kiln, the raft log and its FSM), shared by every
// server that answers on the same networks.
type LeaseCommitter interface {
	// WatchLeases follows the committed record: reset is called once, before
	// WatchLeases returns, with one Lease per address (its last committed
	// state), then applied with every later committed change in commit
	// order, and reset again with everything when the record is replaced
	// wholesale. A change may be delivered twice (applying it again must be
	// harmless). Calls are serialised, must be quick and must not call the
	// committer. stop ends the watch. New calls it once.
	WatchLeases(reset, applied func([]Lease)) (stop func(), err error)
	// CommitLeases commits a batch (one call per group commit) and reports
	// each change on its own: errs[i] is nil when ls[i] is committed, wraps
	// ErrAddressTaken when the record refused it because another client
	// holds the address (or it is declined), or is another error for a
	// change that cannot be stored. A bound or declined Lease carries its
	// absolute Expiry; a released one carries the Expiry of the committed
	// binding it ends (as this server's view holds it) and ends at commit,
	// but only if the address's record is still that binding: a release
	// that commits after the same client got the address again (through
	// another server) must not end the newer binding. err (errs nil)
	// means nothing is known to be committed: the server drops the batch's
	// replies and the clients retry. ctx carries Config.SaveTimeout.
	CommitLeases(ctx context.Context, ls []Lease) (errs []error, err error)
}

// Membership is the server's view of the servers sharing its networks.
type Membership interface {
	// Members returns this server's ID and the IDs of every server that
	// shares the answering, self included, in one order that every server
	// agrees on (the load balancing splits the clients over it; see
	// Server.owner). A lone server returns (id, [id]); an empty list means
	// "answer every client".
	Members() (self string, all []string)
	// CanCommit reports whether CommitLeases can succeed now, as far as
	// this server knows (false on the minority side of a partition). While
	// false the server gives no new addresses and answers a renewal only
	// with the time left on the committed binding.
	CanCommit() bool
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

// Lease states stored in Lease.State (the values the store uses too).
const (
	// LeaseBound: the address is ACKed to the MAC until Expiry.
	LeaseBound = "bound"
	// LeaseReleased: the client released it (RFC 2131 §4.4.6); the address is free.
	LeaseReleased = "released"
	// LeaseDeclined: the client reported the address in use (DHCPDECLINE,
	// RFC 2131 §4.3.3); it is not handed out until Expiry. MAC is the decliner.
	LeaseDeclined = "declined"
)

// Lease is one committed change of an address: who holds it, in which
// state, until when.
type Lease struct {
	MAC      net.HardwareAddr
	IP       netip.Addr
	Hostname string
	// Expiry is the absolute end of the binding (UTC); of a release, the
	// end of the binding it releases.
	Expiry time.Time
	// State is one of LeaseBound, LeaseReleased, LeaseDeclined.
	State string
}
