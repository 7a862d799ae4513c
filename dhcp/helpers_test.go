package dhcp

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
)

// memBackend is an in-memory Backend for the handler tests (the netns tests
// and the bench use a bbolt file; the real store's committer is tested with
// real DHCP clients in package appliance, which may import both).
type memBackend struct {
	mu         sync.Mutex
	machines   map[string]MachineInfo
	saved      []Lease // every change committed, in order
	discovered []string
	saves      int
	*leaseLog  // shared by the servers of one simulated cluster
	members
}

func newMemBackend() *memBackend {
	return &memBackend{machines: map[string]MachineInfo{}, leaseLog: &leaseLog{}}
}

func (b *memBackend) Machine(mac net.HardwareAddr) (MachineInfo, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	m, ok := b.machines[mac.String()]
	return m, ok
}
func (b *memBackend) Discovered(mac net.HardwareAddr, arch uint16, vc string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.discovered = append(b.discovered, mac.String())
}
func (b *memBackend) CommitLeases(ctx context.Context, ls []Lease) ([]error, error) {
	errs, err := b.leaseLog.CommitLeases(ctx, ls)
	b.mu.Lock()
	defer b.mu.Unlock()
	b.saves++
	for i, l := range ls {
		if err == nil && errs[i] == nil {
			b.saved = append(b.saved, l)
		}
	}
	return errs, err
}

// leaseLog is the lease record of the package's tests: one record per
// address, the address rule of the LeaseCommitter contract (a binding or
// decline of an address another client holds unexpired is refused with
// ErrAddressTaken), and a feed that tells the watchers synchronously.
// save, when set, makes each accepted batch durable first.
type leaseLog struct {
	lmu      sync.Mutex
	byIP     map[netip.Addr]Lease
	watchers []func([]Lease)
	refuse   map[netip.Addr]bool // test hook: refuse bindings of these, as if another node had won them
	save     func([]Lease) error
}

func (g *leaseLog) WatchLeases(reset, applied func([]Lease)) (func(), error) {
	g.lmu.Lock()
	defer g.lmu.Unlock()
	all := make([]Lease, 0, len(g.byIP))
	for _, l := range g.byIP {
		all = append(all, l)
	}
	reset(all)
	g.watchers = append(g.watchers, applied)
	return func() {}, nil
}

func (g *leaseLog) CommitLeases(_ context.Context, ls []Lease) ([]error, error) {
	g.lmu.Lock()
	defer g.lmu.Unlock()
	if g.byIP == nil {
		g.byIP = map[netip.Addr]Lease{}
	}
	now := time.Now()
	errs := make([]error, len(ls))
	var done []Lease
	for i, l := range ls {
		cur, ok := g.byIP[l.IP]
		live := ok && (cur.State == LeaseBound || cur.State == LeaseDeclined) && cur.Expiry.After(now)
		other := live && (cur.MAC.String() != l.MAC.String() || cur.State == LeaseDeclined && l.State == LeaseBound)
		switch {
		case l.State == LeaseBound && g.refuse[l.IP]:
			errs[i] = fmt.Errorf("%w: %v (test)", ErrAddressTaken, l.IP)
		case l.State == LeaseReleased && (!ok || cur.MAC.String() != l.MAC.String()):
			if other {
				errs[i] = fmt.Errorf("%w: %v", ErrAddressTaken, l.IP)
			}
		case l.State == LeaseReleased && (cur.State != LeaseBound || !cur.Expiry.Equal(l.Expiry)):
			// Not the binding it names (renewed or replaced since): nothing.
		case l.State == LeaseReleased:
			l.Expiry = now
			done = append(done, l)
		case other:
			errs[i] = fmt.Errorf("%w: %v held by %v", ErrAddressTaken, l.IP, cur.MAC)
		default:
			done = append(done, l)
		}
	}
	if g.save != nil && len(done) > 0 {
		if err := g.save(done); err != nil {
			return nil, err
		}
	}
	for _, l := range done {
		g.byIP[l.IP] = l
	}
	if len(done) > 0 {
		for _, w := range g.watchers {
			w(done)
		}
	}
	return errs, nil
}

// members is the Membership of the tests: a lone server unless set.
type members struct {
	mmu      sync.Mutex
	self     string
	all      []string
	minority bool
}

func (m *members) Members() (string, []string) {
	m.mmu.Lock()
	defer m.mmu.Unlock()
	return m.self, m.all
}

func (m *members) CanCommit() bool {
	m.mmu.Lock()
	defer m.mmu.Unlock()
	return !m.minority
}

func (m *members) set(self string, all []string, minority bool) {
	m.mmu.Lock()
	defer m.mmu.Unlock()
	m.self, m.all, m.minority = self, all, minority
}

var (
	testServerIP = netip.MustParseAddr("10.71.0.1")
	bcastDst     = netip.AddrPortFrom(netip.MustParseAddr("255.255.255.255"), 67)
	anySrc       = netip.AddrPortFrom(netip.IPv4Unspecified(), 68)
)

func testConfig() Config {
	c := DefaultConfig()
	c.Interface = "kdh-srv0"
	c.ServerIP = testServerIP
	c.HTTPBootURL = "http://10.71.0.1:8080"
	c.Subnets = []Subnet{
		{CIDR: netip.MustParsePrefix("10.71.0.0/24"), Router: netip.MustParseAddr("10.71.0.1"), DNS: []netip.Addr{netip.MustParseAddr("10.71.0.1")},
			PoolStart: netip.MustParseAddr("10.71.0.100"), PoolEnd: netip.MustParseAddr("10.71.0.199")},
		{CIDR: netip.MustParsePrefix("10.71.9.0/24"), Router: netip.MustParseAddr("10.71.9.1"),
			PoolStart: netip.MustParseAddr("10.71.9.100"), PoolEnd: netip.MustParseAddr("10.71.9.199")},
	}
	return c
}

func newTestServer(t testing.TB, mut func(*Config)) (*Server, *memBackend) {
	t.Helper()
	c := testConfig()
	if mut != nil {
		mut(&c)
	}
	b := newMemBackend()
	s, err := New(c, b, nil)
	if err != nil {
		t.Fatal(err)
	}
	return s, b
}

// discover builds a DHCPDISCOVER with the given options.
func msg(t testing.TB, mac string, mt dhcpv4.MessageType, opts ...dhcpv4.Option) *dhcpv4.DHCPv4 {
	t.Helper()
	hw, err := net.ParseMAC(mac)
	if err != nil {
		t.Fatal(err)
	}
	d, err := dhcpv4.New(dhcpv4.WithHwAddr(hw), dhcpv4.WithMessageType(mt), dhcpv4.WithBroadcast(true))
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range opts {
		d.UpdateOption(o)
	}
	return d
}

func arch(a uint16) dhcpv4.Option {
	return dhcpv4.OptGeneric(dhcpv4.GenericOptionCode(93), []byte{byte(a >> 8), byte(a)})
}

func vendor(s string) dhcpv4.Option { return dhcpv4.OptClassIdentifier(s) }

func generic(code uint8, v []byte) dhcpv4.Option {
	return dhcpv4.OptGeneric(dhcpv4.GenericOptionCode(code), v)
}

// pcapPayloads returns the UDP payloads to port 67 or 4011 of a classic
// little/big-endian pcap file with Ethernet link type (no gopacket here).
func pcapPayloads(t testing.TB, path string) [][]byte {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(data) < 24 {
		t.Fatalf("%s: short pcap", path)
	}
	var bo binary.ByteOrder
	switch binary.LittleEndian.Uint32(data) {
	case 0xa1b2c3d4, 0xa1b23c4d:
		bo = binary.LittleEndian
	case 0xd4c3b2a1, 0x4d3cb2a1:
		bo = binary.BigEndian
	default:
		t.Fatalf("%s: not a pcap", path)
	}
	if lt := bo.Uint32(data[20:]); lt != 1 {
		t.Fatalf("%s: link type %d, want Ethernet", path, lt)
	}
	var out [][]byte
	for p := data[24:]; len(p) >= 16; {
		incl := int(bo.Uint32(p[8:]))
		if 16+incl > len(p) {
			break
		}
		frame := p[16 : 16+incl]
		p = p[16+incl:]
		if len(frame) < 14+20+8 || binary.BigEndian.Uint16(frame[12:]) != 0x0800 {
			continue
		}
		ip := frame[14:]
		ihl := int(ip[0]&0x0f) * 4
		if ip[9] != 17 || len(ip) < ihl+8 {
			continue
		}
		udp := ip[ihl:]
		if dp := binary.BigEndian.Uint16(udp[2:]); dp != 67 && dp != 4011 {
			continue
		}
		ulen := int(binary.BigEndian.Uint16(udp[4:]))
		if ulen < 8 || ulen > len(udp) {
			continue
		}
		out = append(out, append([]byte(nil), udp[8:ulen]...))
	}
	return out
}
