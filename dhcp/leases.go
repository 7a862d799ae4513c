package dhcp

import (
	"encoding/binary"
	"net"
	"net/netip"
	"sync"
	"time"
)

// stateOffered is a local, tentative hold of an address for a client that
// was sent an OFFER. It is never committed: only the REQUEST's binding is.
const stateOffered = "offered"

type leaseEntry struct {
	mac      string // string(net.HardwareAddr)
	ip       netip.Addr
	hostname string
	expiry   time.Time
	state    string
}

// live reports whether e keeps its address from other clients at now.
func (e *leaseEntry) live(now time.Time) bool {
	return e.state != LeaseReleased && now.Before(e.expiry)
}

// rank orders what a MAC's entry may be: a live binding, a live offer,
// anything else (released, expired).
func (e *leaseEntry) rank(now time.Time) int {
	switch {
	case e.state == LeaseBound && e.live(now):
		return 2
	case e.state == stateOffered && e.live(now):
		return 1
	}
	return 0
}

// leaseTable is the server's view of the addresses: the committed record of
// each address as the LeaseCommitter's feed delivers it (reset, applied),
// plus this server's own tentative offers. It decides only what to offer
// and what to ask for; the committer decides who gets an address.
type leaseTable struct {
	mu sync.Mutex
	// byIP: the committed record of each address, or a live local offer.
	byIP map[netip.Addr]*leaseEntry
	// byMAC: the client's binding or offer (its best entry by rank, then
	// the later expiry), or its last released address; never a decline.
	byMAC  map[string]*leaseEntry
	cursor map[netip.Prefix]netip.Addr
}

func newLeaseTable() *leaseTable {
	return &leaseTable{byMAC: map[string]*leaseEntry{}, byIP: map[netip.Addr]*leaseEntry{}, cursor: map[netip.Prefix]netip.Addr{}}
}

func entryOf(l Lease) (*leaseEntry, bool) {
	if !l.IP.Is4() || len(l.MAC) == 0 {
		return nil, false
	}
	return &leaseEntry{mac: string(l.MAC), ip: l.IP, hostname: l.Hostname, expiry: l.Expiry, state: l.State}, true
}

// reset replaces the committed view with ls (one record per address); live
// local offers on addresses that no other client holds survive.
func (t *leaseTable) reset(ls []Lease, now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	var offers []*leaseEntry
	for _, e := range t.byIP {
		if e.state == stateOffered && e.live(now) {
			offers = append(offers, e)
		}
	}
	clear(t.byIP)
	clear(t.byMAC)
	for _, l := range ls {
		if e, ok := entryOf(l); ok {
			t.installLocked(e, now)
		}
	}
	for _, o := range offers {
		if cur := t.byIP[o.ip]; cur == nil || !cur.live(now) {
			t.installLocked(o, now)
		}
	}
}

// applied installs committed changes, in commit order.
func (t *leaseTable) applied(ls []Lease, now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, l := range ls {
		if e, ok := entryOf(l); ok {
			t.installLocked(e, now)
		}
	}
}

// installLocked makes e the entry of its address. A committed record is
// the newest state of its address, so it replaces what was there, except
// that a record nobody holds (released, expired) leaves another client's
// live offer in place. The client that lost the address loses its entry.
func (t *leaseTable) installLocked(e *leaseEntry, now time.Time) {
	if old := t.byIP[e.ip]; old != nil && old != e {
		if old.state == stateOffered && old.mac != e.mac && old.live(now) && !e.live(now) {
			return
		}
		if old.mac != e.mac && t.byMAC[old.mac] == old {
			delete(t.byMAC, old.mac)
		}
	}
	t.byIP[e.ip] = e
	if e.state == LeaseDeclined { // a declined address is not the decliner's binding
		if cur := t.byMAC[e.mac]; cur != nil && cur.ip == e.ip {
			delete(t.byMAC, e.mac)
		}
		return
	}
	cur := t.byMAC[e.mac]
	if cur == nil || cur.ip == e.ip || e.rank(now) > cur.rank(now) || e.rank(now) == cur.rank(now) && e.expiry.After(cur.expiry) {
		if cur != nil && cur != e && cur.state == stateOffered && t.byIP[cur.ip] == cur {
			delete(t.byIP, cur.ip) // the client's tentative hold elsewhere ends
		}
		t.byMAC[e.mac] = e
	}
}

// freeForLocked reports whether ip may be given to mac at now.
func (t *leaseTable) freeForLocked(ip netip.Addr, mac string, now time.Time) bool {
	e := t.byIP[ip]
	if e == nil || e.state == LeaseReleased {
		return true
	}
	if e.state == LeaseDeclined {
		return !now.Before(e.expiry)
	}
	return e.mac == mac || !now.Before(e.expiry)
}

// FreeFor is freeForLocked under the lock.
func (t *leaseTable) FreeFor(ip netip.Addr, mac net.HardwareAddr, now time.Time) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.freeForLocked(ip, string(mac), now)
}

// committedBinding returns the expiry of mac's committed, unexpired binding
// of ip (ok=false when there is none).
func (t *leaseTable) committedBinding(mac net.HardwareAddr, ip netip.Addr, now time.Time) (time.Time, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.byIP[ip]
	if e == nil || e.mac != string(mac) || e.state != LeaseBound || !now.Before(e.expiry) {
		return time.Time{}, false
	}
	return e.expiry, true
}

// share is the part of each pool this server offers from first: the
// addresses whose offset from PoolStart is k modulo n (k = its position
// among the n members), so that servers answering different clients at the
// same moment rarely pick the same address. n ≤ 1: the whole pool.
type share struct{ k, n int }

func (sh share) has(sn *Subnet, ip netip.Addr) bool {
	if sh.n <= 1 {
		return true
	}
	a, b := sn.PoolStart.As4(), ip.As4()
	off := binary.BigEndian.Uint32(b[:]) - binary.BigEndian.Uint32(a[:])
	return int(off%uint32(sh.n)) == sh.k
}

// offer picks an address for mac in sn (its previous one when still free,
// else the requested one, else the next free pool address of this server's
// share, else any free pool address) and holds it until now+hold.
func (t *leaseTable) offer(sn *Subnet, mac net.HardwareAddr, want netip.Addr, now time.Time, hold time.Duration, sh share) (netip.Addr, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	m := string(mac)
	pick := netip.Addr{}
	if e := t.byMAC[m]; e != nil && sn.CIDR.Contains(e.ip) && t.freeForLocked(e.ip, m, now) {
		pick = e.ip
	} else if want.IsValid() && inPool(sn, want) && t.freeForLocked(want, m, now) {
		pick = want
	} else {
		start := t.cursor[sn.CIDR]
		if !inPool(sn, start) {
			start = sn.PoolStart
		}
		for _, own := range []bool{true, false} {
			if !own && sh.n <= 1 {
				break
			}
			ip := start
			for {
				if (!own || sh.has(sn, ip)) && t.freeForLocked(ip, m, now) {
					pick = ip
					break
				}
				ip = ip.Next()
				if !inPool(sn, ip) {
					ip = sn.PoolStart
				}
				if ip == start {
					break
				}
			}
			if pick.IsValid() {
				break
			}
		}
		if !pick.IsValid() {
			return netip.Addr{}, false
		}
		next := pick.Next()
		if !inPool(sn, next) {
			next = sn.PoolStart
		}
		t.cursor[sn.CIDR] = next
	}
	if e := t.byIP[pick]; e != nil && e.mac == m && e.state == LeaseBound && now.Before(e.expiry) {
		return pick, true // already bound: keep the binding as it is
	}
	o := &leaseEntry{mac: m, ip: pick, expiry: now.Add(hold), state: stateOffered}
	if cur := t.byMAC[m]; cur != nil && cur.state == stateOffered && cur.ip != pick && t.byIP[cur.ip] == cur {
		delete(t.byIP, cur.ip)
	}
	if old := t.byIP[pick]; old != nil && old.mac != m && t.byMAC[old.mac] == old {
		delete(t.byMAC, old.mac)
	}
	t.byIP[pick] = o
	if cur := t.byMAC[m]; cur == nil || cur.rank(now) <= o.rank(now) {
		t.byMAC[m] = o
	}
	return pick, true
}

// bind returns the binding to commit for an ACK. The table changes when
// the binding comes back through the committer's feed.
func (t *leaseTable) bind(mac net.HardwareAddr, ip netip.Addr, host string, expiry time.Time) Lease {
	return Lease{MAC: append(net.HardwareAddr(nil), mac...), IP: ip, Hostname: host, Expiry: expiry, State: LeaseBound}
}

// release returns the release to commit when mac's committed binding of ip
// is in the view (RFC 2131 §4.4.6); ok=false when not. Its Expiry names
// that binding (see LeaseCommitter): the record ends only that binding, not
// one the client got since (through another server, before this release
// commits).
func (t *leaseTable) release(mac net.HardwareAddr, ip netip.Addr) (Lease, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.byIP[ip]
	if e == nil || e.mac != string(mac) || e.state != LeaseBound {
		return Lease{}, false
	}
	return Lease{MAC: append(net.HardwareAddr(nil), mac...), IP: ip, Hostname: e.hostname, Expiry: e.expiry, State: LeaseReleased}, true
}

// decline returns the decline to commit: ip unusable until now+hold (RFC
// 2131 §4.3.3).
func (t *leaseTable) decline(mac net.HardwareAddr, ip netip.Addr, now time.Time, hold time.Duration) Lease {
	return Lease{MAC: append(net.HardwareAddr(nil), mac...), IP: ip, Expiry: now.Add(hold), State: LeaseDeclined}
}

func inPool(sn *Subnet, ip netip.Addr) bool {
	return ip.IsValid() && !ip.Less(sn.PoolStart) && !sn.PoolEnd.Less(ip)
}
