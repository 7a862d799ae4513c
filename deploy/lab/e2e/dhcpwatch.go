package e2e

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"sync"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"golang.org/x/sys/unix"
)

// ACK is one DHCPACK seen on the wire (RFC 2131 §4.3.1): the address
// (yiaddr) given to the client hardware address chaddr, by the server
// named in option 54, for option 51's lease time, at the time it was seen.
type ACK struct {
	At       time.Time
	MAC      string // chaddr, lower-case colon form
	IP       string // yiaddr
	Server   string // option 54, server identifier
	Lease    time.Duration
	Renewal  bool // ciaddr set: a RENEWING/REBINDING answer
	TxID     string
	Hostname string
}

// dhcpWatch captures every DHCPv4 server reply crossing a bridge, without
// libpcap: an AF_PACKET socket (packet(7)) opened inside the bridge's
// namespace, bound to the bridge, with the bridge in promiscuous mode
// (PACKET_MR_PROMISC) so that the bridge hands it a copy of every frame it
// forwards between its ports — unicast replies to a VM's tap included.
type dhcpWatch struct {
	fd   int
	mu   sync.Mutex
	acks []ACK
	naks int
	stop chan struct{} // closed by Close
	done chan struct{} // closed when loop has returned
}

// watchDHCP starts the capture on bridge ifname in namespace ns.
func watchDHCP(ns, ifname string) (*dhcpWatch, error) {
	type result struct {
		fd  int
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		fd, restored, err := packetSocketIn(netnsDir+"/"+ns, ifname)
		if restored {
			runtime.UnlockOSThread()
		}
		ch <- result{fd, err}
	}()
	r := <-ch
	if r.err != nil {
		return nil, r.err
	}
	w := &dhcpWatch{fd: r.fd, stop: make(chan struct{}), done: make(chan struct{})}
	go w.loop()
	return w, nil
}

// packetSocketIn runs on a locked thread: it enters the namespace, opens and
// binds the socket there, and goes back (see dialIn).
func packetSocketIn(path, ifname string) (fd int, restored bool, err error) {
	self, err := os.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()))
	if err != nil {
		return -1, true, err
	}
	defer self.Close()
	target, err := os.Open(path)
	if err != nil {
		return -1, true, fmt.Errorf("netns %s: %w", path, err)
	}
	defer target.Close()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		return -1, true, fmt.Errorf("netns: enter %s: %w", path, err)
	}
	fd, err = openPacket(ifname)
	if rerr := unix.Setns(int(self.Fd()), unix.CLONE_NEWNET); rerr != nil {
		if fd >= 0 {
			unix.Close(fd)
		}
		return -1, false, fmt.Errorf("netns: return from %s: %w", path, rerr)
	}
	return fd, true, err
}

func openPacket(ifname string) (int, error) {
	ifi, err := net.InterfaceByName(ifname)
	if err != nil {
		return -1, fmt.Errorf("dhcp capture: %w", err)
	}
	proto := int(htons16(unix.ETH_P_IP))
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, proto)
	if err != nil {
		return -1, fmt.Errorf("dhcp capture: AF_PACKET socket (needs root): %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: uint16(proto), Ifindex: ifi.Index}); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("dhcp capture: bind %s: %w", ifname, err)
	}
	mr := unix.PacketMreq{Ifindex: int32(ifi.Index), Type: unix.PACKET_MR_PROMISC}
	if err := unix.SetsockoptPacketMreq(fd, unix.SOL_PACKET, unix.PACKET_ADD_MEMBERSHIP, &mr); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("dhcp capture: promiscuous %s: %w", ifname, err)
	}
	// A read returns at least every 200 ms, so Close is noticed.
	tv := unix.Timeval{Usec: 200_000}
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

func htons16(v uint16) uint16 { return v<<8 | v>>8 }

func (w *dhcpWatch) loop() {
	defer close(w.done)
	buf := make([]byte, 65536)
	for {
		n, _, err := unix.Recvfrom(w.fd, buf, 0)
		if err != nil {
			if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
				select {
				case <-w.stop:
					return
				default:
					continue
				}
			}
			return // closed
		}
		w.frame(buf[:n], time.Now())
	}
}

// frame parses one Ethernet frame: IPv4 (RFC 791), UDP from port 67
// (RFC 768), a BOOTP reply holding a DHCP message type.
func (w *dhcpWatch) frame(b []byte, at time.Time) {
	if len(b) < 14+20+8 || binary.BigEndian.Uint16(b[12:14]) != unix.ETH_P_IP {
		return
	}
	ip := b[14:]
	ihl := int(ip[0]&0x0f) * 4
	if ip[0]>>4 != 4 || ihl < 20 || len(ip) < ihl+8 || ip[9] != unix.IPPROTO_UDP {
		return
	}
	if off := binary.BigEndian.Uint16(ip[6:8]) & 0x1fff; off != 0 || ip[6]&0x20 != 0 {
		return // fragments: DHCP replies fit one frame
	}
	udp := ip[ihl:]
	if binary.BigEndian.Uint16(udp[0:2]) != 67 {
		return
	}
	end := int(binary.BigEndian.Uint16(udp[4:6]))
	if end < 8 || end > len(udp) {
		return
	}
	m, err := dhcpv4.FromBytes(udp[8:end])
	if err != nil || m.OpCode != dhcpv4.OpcodeBootReply {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	switch m.MessageType() {
	case dhcpv4.MessageTypeAck:
		if m.YourIPAddr == nil || m.YourIPAddr.IsUnspecified() {
			return // an ACK to a DHCPINFORM gives no address
		}
		a := ACK{At: at, MAC: m.ClientHWAddr.String(), IP: m.YourIPAddr.String(), Lease: m.IPAddressLeaseTime(0),
			Renewal: m.ClientIPAddr != nil && !m.ClientIPAddr.IsUnspecified(), TxID: m.TransactionID.String(), Hostname: m.HostName()}
		if s := m.ServerIdentifier(); s != nil {
			a.Server = s.String()
		}
		w.acks = append(w.acks, a)
	case dhcpv4.MessageTypeNak:
		w.naks++
	}
}

// ACKs returns the ACKs seen so far, in the order seen, and the NAK count.
func (w *dhcpWatch) ACKs() ([]ACK, int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]ACK(nil), w.acks...), w.naks
}

// Close ends the capture.
func (w *dhcpWatch) Close() {
	close(w.stop)
	<-w.done
	unix.Close(w.fd)
}

// ackOverlaps counts the addresses that the ACKs gave to two different
// clients for overlapping times: ACK a (MAC A, IP x, seen at t, lease L)
// holds x for A over [t, t+L); another client's ACK for x starting inside
// that span is a second holder. It returns the addresses, each once.
func ackOverlaps(acks []ACK) []string {
	type span struct {
		mac      string
		from, to time.Time
	}
	byIP := map[string][]span{}
	for _, a := range acks {
		byIP[a.IP] = append(byIP[a.IP], span{a.MAC, a.At, a.At.Add(a.Lease)})
	}
	var dup []string
	for ip, ss := range byIP {
	next:
		for i := range ss {
			for j := range ss {
				if ss[i].mac != ss[j].mac && !ss[j].from.Before(ss[i].from) && ss[j].from.Before(ss[i].to) {
					dup = append(dup, ip)
					break next
				}
			}
		}
	}
	return dup
}
