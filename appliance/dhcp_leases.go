package appliance

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"time"

	"kiln/dhcp"
	"kiln/store"
)

// The lease side of dhcpBackend: the DHCP server's lease record is the
// store's address view (CmdBindLeases), so every node's server follows the
// applied raft log and the FSM alone decides who holds an address.

// WatchLeases follows the store's address view (store.WatchLeases). A record
// the DHCP server cannot read (a MAC or address that does not parse; the
// store never writes one through BindLeases) is logged and left out.
func (b *dhcpBackend) WatchLeases(reset, applied func([]dhcp.Lease)) (func(), error) {
	return b.st.WatchLeases(
		func(ls []store.Lease) { reset(b.fromStore(ls)) },
		func(ls []store.Lease) { applied(b.fromStore(ls)) })
}

func (b *dhcpBackend) fromStore(ls []store.Lease) []dhcp.Lease {
	out := make([]dhcp.Lease, 0, len(ls))
	for _, l := range ls {
		mac, err := net.ParseMAC(l.MAC)
		if err != nil {
			b.log.Warn("lease record with a malformed MAC left out", "mac", l.MAC, "ip", l.IP)
			continue
		}
		ip, err := netip.ParseAddr(l.IP)
		if err != nil {
			b.log.Warn("lease record with a malformed address left out", "mac", l.MAC, "ip", l.IP)
			continue
		}
		out = append(out, dhcp.Lease{MAC: mac, IP: ip, Hostname: l.Hostname, Expiry: l.Expiry, State: l.State})
	}
	return out
}

// CommitLeases binds, declines and releases through raft in one command
// (store.BindLeases); a change the FSM refuses because another client
// holds the address wraps both dhcp.ErrAddressTaken and
// store.ErrAddressTaken.
func (b *dhcpBackend) CommitLeases(ctx context.Context, ls []dhcp.Lease) ([]error, error) {
	in := make([]store.Lease, len(ls))
	for i, l := range ls {
		in[i] = store.Lease{MAC: strings.ToLower(l.MAC.String()), IP: l.IP.String(), Hostname: l.Hostname, Expiry: l.Expiry.UTC(), State: l.State}
	}
	errs, err := b.st.BindLeases(ctx, in)
	if err != nil {
		return nil, err
	}
	for i, e := range errs {
		if errors.Is(e, store.ErrAddressTaken) {
			errs[i] = fmt.Errorf("%w: %w", dhcp.ErrAddressTaken, e)
		}
	}
	return errs, nil
}

// CanCommit is store.CanCommit: false on the minority side of a partition.
func (b *dhcpBackend) CanCommit() bool { return b.st.CanCommit() }

// Members returns this node's raft ID and the voters of the raft
// configuration (sorted, the same list on every node), read at most once
// per voterRefresh.
func (b *dhcpBackend) Members() (string, []string) {
	return b.st.NodeID(), b.voters.get(b.st)
}

// voterRefresh bounds how stale the member list of the DHCP load balancing
// may be (a joined or removed node changes the split within this).
const voterRefresh = time.Second

// voterCache holds the last voter list read from raft.
type voterCache struct {
	mu   sync.Mutex
	ids  []string
	read time.Time
}

func (c *voterCache) get(st *store.Store) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if now := time.Now(); now.Sub(c.read) >= voterRefresh {
		if ids, err := st.VoterIDs(); err == nil {
			c.ids = ids
		}
		c.read = now
	}
	return c.ids
}
