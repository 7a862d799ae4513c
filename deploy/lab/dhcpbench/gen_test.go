package dhcpbench_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/net/ipv4"
	"golang.org/x/sys/unix"

	"kiln/deploy/lab/testkit"
)

// The load generator: DORA exchanges from relay addresses, like perfdhcp
// -l (giaddr = the client's address, replies come to its port 67), but
// costing the machine little. perfdhcp busy-waits: one perfdhcp took half a
// core at 2,000/s and 0.8–1.3 cores at 8,000/s against a responder that
// does nothing (dhcp/DESIGN.md), on a 2-core machine where the server under
// test needs those cores; and it reads replies through one socket with the
// default receive buffer, which a burst of ACKs (a group commit's) overflows.
// This one sleeps between 1 ms send ticks, reads with recvmmsg into a
// 4 MiB buffer (SO_RCVBUFFORCE, its own socket: no global sysctl) and sends
// each REQUEST the moment its OFFER arrives.

// genResult is one run of the generator against one target.
type genResult struct {
	sent, offers, acked, naks int
}

// genClient is one relay address in the client namespace.
type genClient struct {
	pc   *ipv4.PacketConn
	raw  net.PacketConn
	addr netip.Addr
	macs [][6]byte
	next int // next MAC to start an exchange for (cycles)

	mu      sync.Mutex
	pending map[uint32]*genExchange
	res     genResult
	xid     uint32
	srcID   uint32
}

type genExchange struct {
	mac   [6]byte
	stage byte // 1: DISCOVER sent, 3: REQUEST sent
}

// openGen opens one socket per relay address (addr:67 on ifname inside
// namespace ns); macs are split over them (MAC i to client i mod n).
func openGen(t *testing.T, ns, ifname string, addrs []string, macs []string) []*genClient {
	t.Helper()
	cs := make([]*genClient, len(addrs))
	for i, a := range addrs {
		c := &genClient{addr: netip.MustParseAddr(a), pending: map[uint32]*genExchange{}, xid: uint32(i+1) << 24}
		var err error
		testkit.InNetns(t, ns, func() {
			lc := net.ListenConfig{Control: func(_, _ string, rc syscall.RawConn) error {
				var serr error
				err := rc.Control(func(fd uintptr) {
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
			c.raw, err = lc.ListenPacket(context.Background(), "udp4", a+":67")
		})
		if err != nil {
			t.Fatalf("generator socket %s:67 in %s: %v", a, ns, err)
		}
		c.pc = ipv4.NewPacketConn(c.raw)
		t.Cleanup(func() { c.raw.Close() })
		cs[i] = c
	}
	for i, m := range macs {
		hw, err := net.ParseMAC(m)
		if err != nil || len(hw) != 6 {
			t.Fatalf("generator MAC %q: %v", m, err)
		}
		cs[i%len(cs)].macs = append(cs[i%len(cs)].macs, [6]byte(hw))
	}
	return cs
}

// runGen offers rate exchanges/s (split over the clients) to target:67
// for d, then waits wait for the last replies; exchanges still open then
// are lost. Each client cycles through its MACs, one new exchange per MAC
// in turn, so both servers see the same sequence.
func runGen(cs []*genClient, target netip.Addr, rate int, d, wait time.Duration) genResult {
	to := &net.UDPAddr{IP: target.AsSlice(), Port: 67}
	var stop atomic.Bool
	var wg sync.WaitGroup
	for i, c := range cs {
		c.mu.Lock()
		clear(c.pending)
		c.res = genResult{}
		c.mu.Unlock()
		r := rate / len(cs)
		if i < rate%len(cs) {
			r++
		}
		wg.Add(2)
		go func() { defer wg.Done(); c.receive(to, &stop) }()
		go func() { defer wg.Done(); c.send(to, r, d) }()
	}
	time.Sleep(d + wait)
	stop.Store(true)
	for _, c := range cs {
		c.raw.SetReadDeadline(time.Unix(1, 0))
	}
	wg.Wait()
	var sum genResult
	for _, c := range cs {
		c.raw.SetReadDeadline(time.Time{})
		sum.sent += c.res.sent
		sum.offers += c.res.offers
		sum.acked += c.res.acked
		sum.naks += c.res.naks
	}
	return sum
}

// send starts rate exchanges/s for d, in 1 ms ticks, a batch per tick.
func (c *genClient) send(to *net.UDPAddr, rate int, d time.Duration) {
	start := time.Now()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	total := int(float64(rate) * d.Seconds())
	var msgs []ipv4.Message
	bufs := make([][]byte, 0, 256)
	for started := 0; started < total; {
		<-tick.C
		due := min(total, int(float64(rate)*time.Since(start).Seconds())+1) - started
		if due <= 0 {
			continue
		}
		msgs, bufs = msgs[:0], bufs[:0]
		c.mu.Lock()
		for k := 0; k < due && k < len(c.macs); k++ {
			mac := c.macs[c.next]
			c.next = (c.next + 1) % len(c.macs)
			c.xid++
			c.pending[c.xid] = &genExchange{mac: mac, stage: 1}
			c.res.sent++
			bufs = append(bufs, request(nil, 1, c.xid, mac, c.addr, netip.Addr{}, netip.Addr{}))
		}
		c.mu.Unlock()
		started += due
		for _, b := range bufs {
			msgs = append(msgs, ipv4.Message{Buffers: [][]byte{b}, Addr: to})
		}
		for off := 0; off < len(msgs); {
			n, err := c.pc.WriteBatch(msgs[off:], 0)
			if err != nil {
				break
			}
			off += n
		}
	}
}

// receive answers OFFERs with REQUESTs and counts ACKs and NAKs until stop.
func (c *genClient) receive(to *net.UDPAddr, stop *atomic.Bool) {
	const batch = 64
	in := make([]ipv4.Message, batch)
	for i := range in {
		in[i].Buffers = [][]byte{make([]byte, 1500)}
	}
	var out []ipv4.Message
	for !stop.Load() {
		n, err := c.pc.ReadBatch(in, 0)
		if err != nil {
			var ne net.Error
			if errors.Is(err, net.ErrClosed) || errors.As(err, &ne) && ne.Timeout() && stop.Load() {
				return
			}
			continue
		}
		out = out[:0]
		c.mu.Lock()
		for _, m := range in[:n] {
			p := m.Buffers[0][:m.N]
			mt, sid, ok := replyOf(p)
			if !ok {
				continue
			}
			xid := binary.BigEndian.Uint32(p[4:8])
			x := c.pending[xid]
			if x == nil {
				continue
			}
			switch {
			case mt == 2 && x.stage == 1: // OFFER
				c.res.offers++
				x.stage = 3
				yi := netip.AddrFrom4([4]byte(p[16:20]))
				out = append(out, ipv4.Message{Buffers: [][]byte{request(nil, 3, xid, x.mac, c.addr, yi, sid)}, Addr: to})
			case mt == 5 && x.stage == 3: // ACK
				c.res.acked++
				delete(c.pending, xid)
			case mt == 6: // NAK
				c.res.naks++
				delete(c.pending, xid)
			}
		}
		c.mu.Unlock()
		for off := 0; off < len(out); {
			w, err := c.pc.WriteBatch(out[off:], 0)
			if err != nil {
				break
			}
			off += w
		}
	}
}

// request is a relayed DISCOVER (mt 1) or SELECTING REQUEST (mt 3, with
// options 50 and 54) of mac with transaction xid, giaddr gi.
func request(buf []byte, mt byte, xid uint32, mac [6]byte, gi, yi, sid netip.Addr) []byte {
	buf = append(buf[:0], make([]byte, 240)...)
	buf[0], buf[1], buf[2], buf[3] = 1, 1, 6, 1 // BOOTREQUEST, Ethernet, hlen 6, hops 1 (relayed)
	binary.BigEndian.PutUint32(buf[4:8], xid)
	g := gi.As4()
	copy(buf[24:28], g[:])
	copy(buf[28:34], mac[:])
	binary.BigEndian.PutUint32(buf[236:240], 0x63825363)
	buf = append(buf, 53, 1, mt, 55, 7, 1, 3, 6, 12, 15, 28, 51)
	if mt == 3 {
		y, s := yi.As4(), sid.As4()
		buf = append(buf, 50, 4, y[0], y[1], y[2], y[3], 54, 4, s[0], s[1], s[2], s[3])
	}
	return append(buf, 255)
}

// replyOf reads a BOOTREPLY's message type (option 53) and server
// identifier (option 54).
func replyOf(p []byte) (mt byte, sid netip.Addr, ok bool) {
	if len(p) < 241 || p[0] != 2 || binary.BigEndian.Uint32(p[236:240]) != 0x63825363 {
		return 0, sid, false
	}
	for o := p[240:]; len(o) > 0 && o[0] != 255; {
		if o[0] == 0 {
			o = o[1:]
			continue
		}
		if len(o) < 2 || len(o) < 2+int(o[1]) {
			break
		}
		switch {
		case o[0] == 53 && o[1] == 1:
			mt = o[2]
		case o[0] == 54 && o[1] == 4:
			sid = netip.AddrFrom4([4]byte(o[2:6]))
		}
		o = o[2+int(o[1]):]
	}
	return mt, sid, mt != 0
}

// selfCPU is this process's user+system CPU in seconds (the generator and
// the trivial responder run in it; the test itself is idle meanwhile).
func selfCPU() float64 {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}

func (g genResult) String() string {
	return fmt.Sprintf("%d DISCOVERs, %d OFFERs, %d ACKs, %d NAKs", g.sent, g.offers, g.acked, g.naks)
}
