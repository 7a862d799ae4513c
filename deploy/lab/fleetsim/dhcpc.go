package fleetsim

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// dhcpClient is the DHCP side of every simulated machine: one AF_PACKET
// socket on the LAN interface, which sends each machine's broadcast
// DHCPDISCOVER and DHCPREQUEST from the machine's own MAC (Ethernet source
// and chaddr) and hands each reply to the machine waiting for its xid. The
// packets are built by github.com/insomniacslk/dhcp/dhcpv4 (client side);
// Ethernet, IPv4 and UDP headers are written here (RFC 791, RFC 768: the UDP
// checksum is optional over IPv4 and left zero). A classic BPF filter keeps
// the socket to UDP datagrams for port 68, so the image downloads on the same
// interface are not copied to it.
type dhcpClient struct {
	f       *os.File
	ifindex int

	mu      sync.Mutex
	waiting map[uint32]chan *dhcpv4.DHCPv4 // xid -> the machine waiting
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// udpDst68 is "udp dst port 68" over IPv4 without fragments (tcpdump -dd, by hand).
var udpDst68 = []bpf.Instruction{
	bpf.LoadAbsolute{Off: 12, Size: 2},                          // ethertype
	bpf.JumpIf{Cond: bpf.JumpEqual, Val: 0x0800, SkipFalse: 8},  // IPv4
	bpf.LoadAbsolute{Off: 23, Size: 1},                          // protocol
	bpf.JumpIf{Cond: bpf.JumpEqual, Val: 17, SkipFalse: 6},      // UDP
	bpf.LoadAbsolute{Off: 20, Size: 2},                          // flags, fragment offset
	bpf.JumpIf{Cond: bpf.JumpBitsSet, Val: 0x1fff, SkipTrue: 4}, // a fragment
	bpf.LoadMemShift{Off: 14},                                   // X = IP header length
	bpf.LoadIndirect{Off: 16, Size: 2},                          // UDP destination port
	bpf.JumpIf{Cond: bpf.JumpEqual, Val: 68, SkipFalse: 1},
	bpf.RetConstant{Val: 0xffff},
	bpf.RetConstant{Val: 0},
}

func newDHCPClient(ifname string) (*dhcpClient, error) {
	ifi, err := net.InterfaceByName(ifname)
	if err != nil {
		return nil, fmt.Errorf("fleetsim: dhcp: interface %s: %w", ifname, err)
	}
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, int(htons(unix.ETH_P_IP)))
	if err != nil {
		return nil, fmt.Errorf("fleetsim: dhcp: AF_PACKET socket (needs root): %w", err)
	}
	prog, err := bpf.Assemble(udpDst68)
	if err != nil {
		unix.Close(fd)
		return nil, err
	}
	filter := make([]unix.SockFilter, len(prog))
	for i, in := range prog {
		filter[i] = unix.SockFilter{Code: in.Op, Jt: in.Jt, Jf: in.Jf, K: in.K}
	}
	if err := unix.SetsockoptSockFprog(fd, unix.SOL_SOCKET, unix.SO_ATTACH_FILTER,
		&unix.SockFprog{Len: uint16(len(filter)), Filter: &filter[0]}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("fleetsim: dhcp: attach filter: %w", err)
	}
	_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 8<<20)
	if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_IP), Ifindex: ifi.Index}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("fleetsim: dhcp: bind %s: %w", ifname, err)
	}
	c := &dhcpClient{f: os.NewFile(uintptr(fd), "dhcp-packet"), ifindex: ifi.Index, waiting: map[uint32]chan *dhcpv4.DHCPv4{}}
	go c.readLoop()
	return c, nil
}

func (c *dhcpClient) Close() error { return c.f.Close() }

func (c *dhcpClient) readLoop() {
	buf := make([]byte, 2048)
	for {
		n, err := c.f.Read(buf)
		if err != nil {
			if errors.Is(err, os.ErrClosed) {
				return
			}
			continue
		}
		b := buf[:n]
		if len(b) < 14+20+8 {
			continue
		}
		ihl := int(b[14]&0x0f) * 4
		if len(b) < 14+ihl+8+240 {
			continue
		}
		m, err := dhcpv4.FromBytes(b[14+ihl+8:])
		if err != nil || m.OpCode != dhcpv4.OpcodeBootReply {
			continue
		}
		xid := binary.BigEndian.Uint32(m.TransactionID[:])
		c.mu.Lock()
		ch := c.waiting[xid]
		c.mu.Unlock()
		if ch != nil {
			select {
			case ch <- m:
			default: // a duplicate reply while the machine has one pending
			}
		}
	}
}

// send writes msg as a broadcast from mac.
func (c *dhcpClient) send(mac net.HardwareAddr, msg *dhcpv4.DHCPv4) error {
	payload := msg.ToBytes()
	frame := make([]byte, 14+20+8+len(payload))
	copy(frame[0:6], []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	copy(frame[6:12], mac)
	binary.BigEndian.PutUint16(frame[12:], 0x0800)
	ip := frame[14:34]
	ip[0] = 0x45
	binary.BigEndian.PutUint16(ip[2:], uint16(20+8+len(payload)))
	ip[8] = 64 // TTL
	ip[9] = 17 // UDP
	copy(ip[12:16], []byte{0, 0, 0, 0})
	copy(ip[16:20], []byte{255, 255, 255, 255})
	binary.BigEndian.PutUint16(ip[10:], ipChecksum(ip))
	udp := frame[34:42]
	binary.BigEndian.PutUint16(udp[0:], 68)
	binary.BigEndian.PutUint16(udp[2:], 67)
	binary.BigEndian.PutUint16(udp[4:], uint16(8+len(payload)))
	copy(frame[42:], payload)
	_, err := c.f.Write(frame)
	return err
}

func ipChecksum(h []byte) uint16 {
	var sum uint32
	for i := 0; i < len(h); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(h[i:]))
	}
	for sum > 0xffff {
		sum = sum>>16 + sum&0xffff
	}
	return ^uint16(sum)
}

// exchange sends req from mac until a reply of type want arrives for req's
// xid, retransmitting after 1 s, 2 s, 4 s (RFC 2131 §4.1, without the jitter;
// capped at 4 s) until ctx ends. A DHCPNAK ends it with an error.
func (c *dhcpClient) exchange(ctx context.Context, mac net.HardwareAddr, req *dhcpv4.DHCPv4, want dhcpv4.MessageType) (*dhcpv4.DHCPv4, error) {
	xid := binary.BigEndian.Uint32(req.TransactionID[:])
	ch := make(chan *dhcpv4.DHCPv4, 4)
	c.mu.Lock()
	c.waiting[xid] = ch
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		delete(c.waiting, xid)
		c.mu.Unlock()
	}()
	wait := time.Second
	t0 := time.Now()
	for first := true; ; first = false {
		if !first {
			// As PXE firmware does: secs (RFC 2131 §2) is the time since the
			// client began; with several servers, those that do not own the
			// client (RFC 3074) answer once it has waited (dhcp/balance.go).
			req.NumSeconds = uint16(min(time.Since(t0)/time.Second, 0xffff))
		}
		if err := c.send(mac, req); err != nil {
			return nil, fmt.Errorf("dhcp: send %s: %w", req.MessageType(), err)
		}
		t := time.NewTimer(wait)
	recv:
		for {
			select {
			case <-ctx.Done():
				t.Stop()
				return nil, fmt.Errorf("dhcp: no %s for %s: %w", want, req.MessageType(), ctx.Err())
			case <-t.C:
				break recv
			case m := <-ch:
				if m.ClientHWAddr.String() != mac.String() {
					continue
				}
				switch m.MessageType() {
				case want:
					t.Stop()
					return m, nil
				case dhcpv4.MessageTypeNak:
					t.Stop()
					return nil, fmt.Errorf("dhcp: NAK for %s: %s", req.MessageType(), m.Message())
				}
			}
		}
		wait = min(2*wait, 4*time.Second)
	}
}
