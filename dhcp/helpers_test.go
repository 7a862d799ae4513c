package dhcp

import (
	"context"
	"encoding/binary"
	"net"
	"net/netip"
	"os"
	"sync"
	"testing"

	"github.com/insomniacslk/dhcp/dhcpv4"
)

// memBackend is an in-memory Backend for the handler tests (the netns tests
// and the bench use a bbolt file).
type memBackend struct {
	mu         sync.Mutex
	machines   map[string]MachineInfo
	saved      []Lease
	discovered []string
	saves      int
}

func newMemBackend() *memBackend { return &memBackend{machines: map[string]MachineInfo{}} }

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
func (b *memBackend) LoadLeases() ([]Lease, error) { return nil, nil }
func (b *memBackend) SaveLeases(_ context.Context, ls []Lease) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.saves++
	b.saved = append(b.saved, ls...)
	return nil
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
