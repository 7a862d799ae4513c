package dhcp

import (
	"net"
	"net/netip"
	"sync"
	"time"
)

// leaseState is the in-memory state of an address; "offered" is never persisted.
const stateOffered = "offered"

type leaseEntry struct {
	mac      string // string(net.HardwareAddr)
	ip       netip.Addr
	hostname string
	expiry   time.Time
	state    string
}

// leaseTable is the server's authoritative in-memory view of addresses. It is
// loaded from Backend.LoadLeases and every change that must survive a restart
// is handed to the group committer as a Lease.
type leaseTable struct {
	mu     sync.Mutex
	byMAC  map[string]*leaseEntry
	byIP   map[netip.Addr]*leaseEntry
	cursor map[netip.Prefix]netip.Addr
}

func newLeaseTable() *leaseTable {
	return &leaseTable{byMAC: map[string]*leaseEntry{}, byIP: map[netip.Addr]*leaseEntry{}, cursor: map[netip.Prefix]netip.Addr{}}
}

func (t *leaseTable) load(ls []Lease) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, l := range ls {
		if !l.IP.Is4() || len(l.MAC) == 0 {
			continue
		}
		t.setLocked(&leaseEntry{mac: string(l.MAC), ip: l.IP, hostname: l.Hostname, expiry: l.Expiry, state: l.State})
	}
}

// setLocked installs e, unlinking whatever held its IP or its MAC before.
func (t *leaseTable) setLocked(e *leaseEntry) {
	if old := t.byIP[e.ip]; old != nil && t.byMAC[old.mac] == old {
		delete(t.byMAC, old.mac)
	}
	if old := t.byMAC[e.mac]; old != nil && t.byIP[old.ip] == old {
		delete(t.byIP, old.ip)
	}
	t.byIP[e.ip] = e
	if e.state != LeaseDeclined { // a declined address is not the decliner's binding
		t.byMAC[e.mac] = e
	}
}

// freeFor reports whether ip may be given to mac at now.
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

// current returns the MAC's binding if it is bound or offered and unexpired.
func (t *leaseTable) current(mac net.HardwareAddr, now time.Time) (netip.Addr, string, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.byMAC[string(mac)]
	if e == nil || e.state == LeaseReleased || !now.Before(e.expiry) {
		return netip.Addr{}, "", false
	}
	return e.ip, e.state, true
}

// offer picks an address for mac in sn (its previous one when still free, else
// the next free pool address) and holds it until now+hold.
func (t *leaseTable) offer(sn *Subnet, mac net.HardwareAddr, want netip.Addr, now time.Time, hold time.Duration) (netip.Addr, bool) {
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
		ip := start
		for {
			if t.freeForLocked(ip, m, now) {
				pick = ip
				break
			}
			ip = ip.Next()
			if !inPool(sn, ip) {
				ip = sn.PoolStart
			}
			if ip == start {
				return netip.Addr{}, false
			}
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
	t.setLocked(&leaseEntry{mac: m, ip: pick, expiry: now.Add(hold), state: stateOffered})
	return pick, true
}

// bind records an ACKed binding and returns the Lease to persist.
func (t *leaseTable) bind(mac net.HardwareAddr, ip netip.Addr, host string, expiry time.Time) Lease {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.setLocked(&leaseEntry{mac: string(mac), ip: ip, hostname: host, expiry: expiry, state: LeaseBound})
	return Lease{MAC: append(net.HardwareAddr(nil), mac...), IP: ip, Hostname: host, Expiry: expiry, State: LeaseBound}
}

// release frees ip if mac holds it (RFC 2131 §4.4.6); ok=false when not.
func (t *leaseTable) release(mac net.HardwareAddr, ip netip.Addr, now time.Time) (Lease, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.byIP[ip]
	if e == nil || e.mac != string(mac) || e.state == LeaseDeclined {
		return Lease{}, false
	}
	e.state = LeaseReleased
	e.expiry = now
	return Lease{MAC: append(net.HardwareAddr(nil), mac...), IP: ip, Hostname: e.hostname, Expiry: now, State: LeaseReleased}, true
}

// decline marks ip unusable until now+hold (RFC 2131 §4.3.3).
func (t *leaseTable) decline(mac net.HardwareAddr, ip netip.Addr, now time.Time, hold time.Duration) Lease {
	t.mu.Lock()
	defer t.mu.Unlock()
	if old := t.byMAC[string(mac)]; old != nil && old.ip == ip {
		delete(t.byMAC, string(mac))
	}
	e := &leaseEntry{mac: string(mac), ip: ip, expiry: now.Add(hold), state: LeaseDeclined}
	t.setLocked(e)
	return Lease{MAC: append(net.HardwareAddr(nil), mac...), IP: ip, Expiry: e.expiry, State: LeaseDeclined}
}

func inPool(sn *Subnet, ip netip.Addr) bool {
	return ip.IsValid() && !ip.Less(sn.PoolStart) && !sn.PoolEnd.Less(ip)
}
