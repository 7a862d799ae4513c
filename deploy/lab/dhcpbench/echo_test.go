package dhcpbench_test

import (
	"context"
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"golang.org/x/net/ipv4"
	"golang.org/x/sys/unix"

	"kiln/deploy/lab/testkit"
)

// echoServer is the trivial responder the load generator is measured
// against: no lease table, no lookup, no persistence — it turns each
// DISCOVER into an OFFER and each REQUEST into an ACK of an address made
// from the chaddr, by rewriting bytes, and answers a batch of requests with
// one sendmmsg. Whatever perfdhcp cannot complete against it, it cannot
// complete against any server: that is the bench's ceiling on this machine.
type echoServer struct {
	pc   *ipv4.PacketConn
	raw  net.PacketConn
	ip   netip.Addr
	done chan struct{}
}

// startEcho listens on 0.0.0.0:67 of ifname inside namespace ns (the socket
// stays there; its goroutine runs in the test process) as server ip.
func startEcho(t *testing.T, ns, ifname string, ip netip.Addr) *echoServer {
	t.Helper()
	e := &echoServer{ip: ip, done: make(chan struct{})}
	var err error
	testkit.InNetns(t, ns, func() {
		lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
			var serr error
			err := c.Control(func(fd uintptr) {
				if serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_BROADCAST, 1); serr != nil {
					return
				}
				_ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 4<<20)
				serr = unix.SetsockoptString(int(fd), unix.SOL_SOCKET, unix.SO_BINDTODEVICE, ifname)
			})
			if err != nil {
				return err
			}
			return serr
		}}
		e.raw, err = lc.ListenPacket(context.Background(), "udp4", "0.0.0.0:67")
	})
	if err != nil {
		t.Fatalf("echo responder in %s: %v", ns, err)
	}
	e.pc = ipv4.NewPacketConn(e.raw)
	go e.serve()
	t.Cleanup(func() {
		e.raw.Close()
		<-e.done
	})
	return e
}

func (e *echoServer) serve() {
	defer close(e.done)
	const batch = 64
	in := make([]ipv4.Message, batch)
	out := make([]ipv4.Message, batch)
	for i := range in {
		in[i].Buffers = [][]byte{make([]byte, 1500)}
		out[i].Buffers = [][]byte{make([]byte, 0, 1500)}
	}
	sid := e.ip.As4()
	for {
		n, err := e.pc.ReadBatch(in, 0)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(time.Millisecond)
			continue
		}
		k := 0
		for _, m := range in[:n] {
			req := m.Buffers[0][:m.N]
			r, to, ok := echoReply(out[k].Buffers[0][:0], req, sid)
			if !ok {
				continue
			}
			out[k].Buffers[0] = r
			out[k].Addr = to
			k++
		}
		for sent := 0; sent < k; {
			w, err := e.pc.WriteBatch(out[sent:k], 0)
			if err != nil {
				break
			}
			sent += w
		}
	}
}

// echoReply writes into buf the reply to req: OFFER for DISCOVER, ACK for
// REQUEST, yiaddr 10.78.chaddr[4].chaddr[5], options 53, 54, 51, 1; sent to
// giaddr:67 (perfdhcp is a relay). ok=false: not a request to answer.
func echoReply(buf, req []byte, sid [4]byte) ([]byte, *net.UDPAddr, bool) {
	if len(req) < 244 || req[0] != 1 || binary.BigEndian.Uint32(req[236:240]) != 0x63825363 {
		return nil, nil, false
	}
	var mt byte
	for o := req[240:]; len(o) > 0 && o[0] != 255; {
		if o[0] == 0 {
			o = o[1:]
			continue
		}
		if len(o) < 2 || len(o) < 2+int(o[1]) {
			break
		}
		if o[0] == 53 && o[1] == 1 {
			mt = o[2]
		}
		o = o[2+int(o[1]):]
	}
	switch mt {
	case 1:
		mt = 2
	case 3:
		mt = 5
	default:
		return nil, nil, false
	}
	buf = append(buf, req[:240]...)
	buf[0] = 2
	copy(buf[12:16], []byte{0, 0, 0, 0})
	copy(buf[16:20], []byte{10, 78, req[32], req[33]})
	buf = append(buf, 53, 1, mt, 54, 4, sid[0], sid[1], sid[2], sid[3], 51, 4, 0, 0, 0x0e, 0x10, 1, 4, 255, 255, 0, 0, 255)
	gi := net.IP(append([]byte(nil), req[24:28]...))
	if gi.Equal(net.IPv4zero) {
		return buf, &net.UDPAddr{IP: net.IPv4bcast, Port: 68}, true
	}
	return buf, &net.UDPAddr{IP: gi, Port: 67}, true
}
