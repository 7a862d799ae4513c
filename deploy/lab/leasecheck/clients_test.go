package leasecheck

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"

	"kiln/deploy/lab/testkit"
)

// wire is the DHCP side of every simulated client: one AF_PACKET socket on
// the clients' port of the provisioning bridge. It sends each client's
// frames from the client's own MAC (Ethernet source and chaddr):
// broadcasts (DISCOVER, SELECTING/INIT-REBOOT/REBINDING REQUESTs) and
// unicasts to a server's MAC and address from the client's leased address
// (RENEWING REQUEST, RELEASE), and hands every reply — broadcast, or unicast
// to a ciaddr routed to this port — to the client waiting for its xid.
// Packets are built and parsed by github.com/insomniacslk/dhcp/dhcpv4;
// Ethernet, IPv4 and UDP headers are written here (RFC 791, RFC 768: the
// UDP checksum is optional over IPv4 and left zero).
type wire struct {
	f       *os.File
	servers map[netip.Addr]net.HardwareAddr

	mu      sync.Mutex
	waiting map[uint32]chan reply
}

type reply struct {
	m  *dhcpv4.DHCPv4
	at time.Time
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// udpDst68 is "udp dst port 68" over IPv4 without fragments.
var udpDst68 = []bpf.Instruction{
	bpf.LoadAbsolute{Off: 12, Size: 2},
	bpf.JumpIf{Cond: bpf.JumpEqual, Val: 0x0800, SkipFalse: 8},
	bpf.LoadAbsolute{Off: 23, Size: 1},
	bpf.JumpIf{Cond: bpf.JumpEqual, Val: 17, SkipFalse: 6},
	bpf.LoadAbsolute{Off: 20, Size: 2},
	bpf.JumpIf{Cond: bpf.JumpBitsSet, Val: 0x1fff, SkipTrue: 4},
	bpf.LoadMemShift{Off: 14},
	bpf.LoadIndirect{Off: 16, Size: 2},
	bpf.JumpIf{Cond: bpf.JumpEqual, Val: 68, SkipFalse: 1},
	bpf.RetConstant{Val: 0xffff},
	bpf.RetConstant{Val: 0},
}

// newWire opens the socket inside namespace ns on interface ifname.
func newWire(t *testing.T, ns, ifname string, servers map[netip.Addr]net.HardwareAddr) *wire {
	t.Helper()
	var fd int
	var err error
	testkit.InNetns(t, ns, func() {
		var ifi *net.Interface
		if ifi, err = net.InterfaceByName(ifname); err != nil {
			return
		}
		if fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, int(htons(unix.ETH_P_IP))); err != nil {
			return
		}
		var prog []bpf.RawInstruction
		if prog, err = bpf.Assemble(udpDst68); err != nil {
			return
		}
		filter := make([]unix.SockFilter, len(prog))
		for i, in := range prog {
			filter[i] = unix.SockFilter{Code: in.Op, Jt: in.Jt, Jf: in.Jf, K: in.K}
		}
		if err = unix.SetsockoptSockFprog(fd, unix.SOL_SOCKET, unix.SO_ATTACH_FILTER, &unix.SockFprog{Len: uint16(len(filter)), Filter: &filter[0]}); err != nil {
			return
		}
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 8<<20)
		err = unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_IP), Ifindex: ifi.Index})
	})
	if err != nil {
		t.Fatalf("AF_PACKET socket on %s in %s: %v", ifname, ns, err)
	}
	w := &wire{f: os.NewFile(uintptr(fd), "dhcp-packet"), servers: servers, waiting: map[uint32]chan reply{}}
	go w.readLoop()
	t.Cleanup(func() { w.f.Close() })
	return w
}

func (w *wire) readLoop() {
	buf := make([]byte, 2048)
	for {
		n, err := w.f.Read(buf)
		if err != nil {
			if errors.Is(err, os.ErrClosed) {
				return
			}
			continue
		}
		at := time.Now()
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
		w.mu.Lock()
		ch := w.waiting[xid]
		w.mu.Unlock()
		if ch != nil {
			select {
			case ch <- reply{m, at}:
			default:
			}
		}
	}
}

var bcastMAC = net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

// send writes msg from mac: to the server's MAC and address from src when
// to is a node's address (unicast), else broadcast from src (0.0.0.0 for a
// client without an address).
func (w *wire) send(mac net.HardwareAddr, src, to netip.Addr, msg *dhcpv4.DHCPv4) error {
	dstMAC, dstIP := bcastMAC, netip.AddrFrom4([4]byte{255, 255, 255, 255})
	if m, ok := w.servers[to]; ok {
		dstMAC, dstIP = m, to
	}
	payload := msg.ToBytes()
	frame := make([]byte, 14+20+8+len(payload))
	copy(frame[0:6], dstMAC)
	copy(frame[6:12], mac)
	binary.BigEndian.PutUint16(frame[12:], 0x0800)
	ip := frame[14:34]
	ip[0] = 0x45
	binary.BigEndian.PutUint16(ip[2:], uint16(20+8+len(payload)))
	ip[8], ip[9] = 64, 17
	s4, d4 := src.As4(), dstIP.As4()
	copy(ip[12:16], s4[:])
	copy(ip[16:20], d4[:])
	binary.BigEndian.PutUint16(ip[10:], ipChecksum(ip))
	udp := frame[34:42]
	binary.BigEndian.PutUint16(udp[0:], 68)
	binary.BigEndian.PutUint16(udp[2:], 67)
	binary.BigEndian.PutUint16(udp[4:], uint16(8+len(payload)))
	copy(frame[42:], payload)
	_, err := w.f.Write(frame)
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

var errNAK = errors.New("NAK")

// exchange sends the message build(secs) makes, from mac and src to `to`
// (a node's address: unicast; anything else: broadcast), retransmitting
// with the same xid after 1, 2, 4, 4, ... s (RFC 2131 §4.1, ±0.5 s of
// jitter) until a reply of type want for which accept is true arrives, a
// NAK arrives (errNAK, with the NAK's arrival time), or until passes.
// secs is the whole seconds since the exchange's first transmission, which
// is returned as sent.
func (w *wire) exchange(ctx context.Context, rng *rand.Rand, mac net.HardwareAddr, src, to netip.Addr, until time.Time,
	build func(xid uint32, secs uint16) *dhcpv4.DHCPv4, want dhcpv4.MessageType, accept func(*dhcpv4.DHCPv4) bool) (r reply, sent time.Time, err error) {
	xid := rng.Uint32()
	ch := make(chan reply, 8)
	w.mu.Lock()
	w.waiting[xid] = ch
	w.mu.Unlock()
	defer func() {
		w.mu.Lock()
		delete(w.waiting, xid)
		w.mu.Unlock()
	}()
	wait := time.Second
	for {
		now := time.Now()
		if sent.IsZero() {
			sent = now
		}
		if err := w.send(mac, src, to, build(xid, uint16(now.Sub(sent)/time.Second))); err != nil {
			return reply{}, sent, fmt.Errorf("send: %w", err)
		}
		d := wait + time.Duration(rng.Int64N(int64(time.Second))) - 500*time.Millisecond
		if left := time.Until(until); left < d {
			d = left
		}
		if d <= 0 {
			return reply{}, sent, context.DeadlineExceeded
		}
		tm := time.NewTimer(d)
	recv:
		for {
			select {
			case <-ctx.Done():
				tm.Stop()
				return reply{}, sent, ctx.Err()
			case <-tm.C:
				break recv
			case rp := <-ch:
				if rp.m.ClientHWAddr.String() != mac.String() {
					continue
				}
				switch rp.m.MessageType() {
				case want:
					if accept == nil || accept(rp.m) {
						tm.Stop()
						return rp, sent, nil
					}
				case dhcpv4.MessageTypeNak:
					tm.Stop()
					return rp, sent, errNAK
				}
			}
		}
		if !time.Now().Before(until) {
			return reply{}, sent, context.DeadlineExceeded
		}
		wait = min(2*wait, 4*time.Second)
	}
}

// recorder is the history of a run and counters of what the clients did.
type recorder struct {
	mu   sync.Mutex
	hist History

	sent      map[string]*atomic.Int64 // exchanges by kind
	naks      atomic.Int64
	timeouts  atomic.Int64
	releases  atomic.Int64
	shortAcks atomic.Int64 // ACKs with a lease shorter than configured (a minority node's time left)
	byServer  sync.Map     // netip.Addr -> *atomic.Int64 ACKs
}

func newRecorder() *recorder {
	r := &recorder{sent: map[string]*atomic.Int64{}}
	for _, k := range []string{"discover", string(KindSelect), string(KindReboot), string(KindRenew), string(KindRebind)} {
		r.sent[k] = new(atomic.Int64)
	}
	return r
}

func (r *recorder) ack(a Ack) {
	r.mu.Lock()
	r.hist.Acks = append(r.hist.Acks, a)
	r.mu.Unlock()
	v, _ := r.byServer.LoadOrStore(a.Server, new(atomic.Int64))
	v.(*atomic.Int64).Add(1)
}

func (r *recorder) stop(s Stop) {
	r.mu.Lock()
	r.hist.Stops = append(r.hist.Stops, s)
	r.mu.Unlock()
}

func (r *recorder) history() History {
	r.mu.Lock()
	defer r.mu.Unlock()
	return History{Acks: append([]Ack(nil), r.hist.Acks...), Stops: append([]Stop(nil), r.hist.Stops...)}
}

// client is one simulated DHCP client (RFC 2131 §4.4 client state machine).
type client struct {
	mac   net.HardwareAddr
	smac  string
	w     *wire
	rec   *recorder
	rng   *rand.Rand
	lease time.Duration // the configured lease time (to tell short ACKs)

	// bound state
	ip     netip.Addr
	server netip.Addr
	last   Ack
	t1, t2 time.Duration
	// remembered: an address of an earlier lease the client may ask for
	// again after a restart (INIT-REBOOT), valid or not.
	remembered netip.Addr
}

func clientMAC(i int) net.HardwareAddr {
	return net.HardwareAddr{0x02, 0x4c, 0x43, byte(i >> 16), byte(i >> 8), byte(i)}
}

var reqOpts = dhcpv4.WithRequestedOptions(dhcpv4.OptionSubnetMask, dhcpv4.OptionRouter, dhcpv4.OptionIPAddressLeaseTime,
	dhcpv4.OptionRenewTimeValue, dhcpv4.OptionRebindingTimeValue)

func (c *client) msg(t dhcpv4.MessageType, xid uint32, secs uint16, mods ...dhcpv4.Modifier) *dhcpv4.DHCPv4 {
	var x dhcpv4.TransactionID
	binary.BigEndian.PutUint32(x[:], xid)
	m, _ := dhcpv4.New(append([]dhcpv4.Modifier{dhcpv4.WithHwAddr(c.mac), dhcpv4.WithMessageType(t),
		dhcpv4.WithTransactionID(x), reqOpts}, mods...)...)
	m.NumSeconds = secs
	return m
}

func ip4(a netip.Addr) net.IP { return a.AsSlice() }

// accepted takes an ACK for ip as the client's lease and records it.
func (c *client) accepted(k Kind, ip netip.Addr, rp reply, sent time.Time) bool {
	lease := rp.m.IPAddressLeaseTime(0)
	sid := rp.m.ServerIdentifier()
	srv, _ := netip.AddrFromSlice(sid.To4())
	if lease <= 0 || !srv.IsValid() {
		return false
	}
	a := Ack{MAC: c.smac, IP: ip, Server: srv, Kind: k, Sent: sent, Recv: rp.at, Lease: lease}
	c.rec.ack(a)
	if lease < c.lease {
		c.rec.shortAcks.Add(1)
	}
	c.ip, c.server, c.last, c.remembered = ip, srv, a, ip
	c.t1, c.t2 = rp.m.IPAddressRenewalTime(lease/2), rp.m.IPAddressRebindingTime(lease*7/8)
	if c.t1 <= 0 || c.t1 > lease {
		c.t1 = lease / 2
	}
	if c.t2 <= c.t1 || c.t2 > lease {
		c.t2 = lease * 7 / 8
	}
	return true
}

// drop ends the client's use of its address (a release it is about to send,
// or a NAK it got) and records the stop.
func (c *client) drop(ip netip.Addr, at time.Time, why string) {
	c.rec.stop(Stop{MAC: c.smac, IP: ip, At: at, Reason: why})
	if c.ip == ip {
		c.ip = netip.Addr{}
	}
}

func (c *client) sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-tm.C:
		return true
	}
}

func (c *client) sleepUntil(ctx context.Context, t time.Time) bool {
	return c.sleep(ctx, time.Until(t))
}

func (c *client) jitter(max time.Duration) time.Duration {
	if max <= 0 {
		return 0
	}
	return time.Duration(c.rng.Int64N(int64(max)))
}

var zero4 = netip.AddrFrom4([4]byte{})

// initReboot is INIT-REBOOT (RFC 2131 §4.4.2): a broadcast REQUEST for ip
// (option 50), no server identifier, ciaddr 0.
func (c *client) initReboot(ctx context.Context, ip netip.Addr) bool {
	c.rec.sent[string(KindReboot)].Add(1)
	rp, sent, err := c.w.exchange(ctx, c.rng, c.mac, zero4, zero4, time.Now().Add(8*time.Second),
		func(xid uint32, secs uint16) *dhcpv4.DHCPv4 {
			return c.msg(dhcpv4.MessageTypeRequest, xid, secs, dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(ip4(ip))))
		}, dhcpv4.MessageTypeAck, func(m *dhcpv4.DHCPv4) bool { return m.YourIPAddr.Equal(ip4(ip)) })
	switch {
	case err == nil:
		return c.accepted(KindReboot, ip, rp, sent)
	case errors.Is(err, errNAK):
		c.rec.naks.Add(1)
		c.drop(ip, rp.at, "nak")
	case ctx.Err() == nil:
		c.rec.timeouts.Add(1)
	}
	c.remembered, c.ip = netip.Addr{}, netip.Addr{}
	return false
}

// discover is INIT then SELECTING (RFC 2131 §4.4.1): a broadcast DISCOVER
// (asking for the remembered address, if any), the first OFFER, and a
// broadcast REQUEST naming its server (option 54) and address (option 50).
func (c *client) discover(ctx context.Context) bool {
	c.rec.sent["discover"].Add(1)
	var mods []dhcpv4.Modifier
	if c.remembered.IsValid() {
		mods = append(mods, dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(ip4(c.remembered))))
	}
	offer, _, err := c.w.exchange(ctx, c.rng, c.mac, zero4, zero4, time.Now().Add(10*time.Second),
		func(xid uint32, secs uint16) *dhcpv4.DHCPv4 {
			return c.msg(dhcpv4.MessageTypeDiscover, xid, secs, mods...)
		}, dhcpv4.MessageTypeOffer, func(m *dhcpv4.DHCPv4) bool {
			return !m.YourIPAddr.IsUnspecified() && m.ServerIdentifier() != nil
		})
	if err != nil {
		if ctx.Err() == nil {
			c.rec.timeouts.Add(1)
		}
		return false
	}
	ip, _ := netip.AddrFromSlice(offer.m.YourIPAddr.To4())
	sid := offer.m.ServerIdentifier()
	c.rec.sent[string(KindSelect)].Add(1)
	rp, sent, err := c.w.exchange(ctx, c.rng, c.mac, zero4, zero4, time.Now().Add(8*time.Second),
		func(xid uint32, secs uint16) *dhcpv4.DHCPv4 {
			return c.msg(dhcpv4.MessageTypeRequest, xid, secs,
				dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(ip4(ip))), dhcpv4.WithOption(dhcpv4.OptServerIdentifier(sid)))
		}, dhcpv4.MessageTypeAck, func(m *dhcpv4.DHCPv4) bool { return m.YourIPAddr.Equal(ip4(ip)) })
	switch {
	case err == nil:
		return c.accepted(KindSelect, ip, rp, sent)
	case errors.Is(err, errNAK):
		c.rec.naks.Add(1)
		c.drop(ip, rp.at, "nak")
	case ctx.Err() == nil:
		c.rec.timeouts.Add(1)
	}
	return false
}

// renew runs RENEWING at T1 (unicast to the granting server, ciaddr set)
// and, without an answer by T2, REBINDING (broadcast, ciaddr set) until
// the lease ends (RFC 2131 §4.4.5). It reports whether the client is
// still bound.
func (c *client) renew(ctx context.Context) bool {
	ip, start := c.ip, c.last.Sent
	if !c.sleepUntil(ctx, start.Add(c.t1)) {
		return false
	}
	for _, st := range []struct {
		k     Kind
		to    netip.Addr
		until time.Time
	}{{KindRenew, c.server, start.Add(c.t2)}, {KindRebind, zero4, start.Add(c.last.Lease)}} {
		c.rec.sent[string(st.k)].Add(1)
		rp, sent, err := c.w.exchange(ctx, c.rng, c.mac, ip, st.to, st.until,
			func(xid uint32, secs uint16) *dhcpv4.DHCPv4 {
				return c.msg(dhcpv4.MessageTypeRequest, xid, secs, dhcpv4.WithClientIP(ip4(ip)))
			}, dhcpv4.MessageTypeAck, func(m *dhcpv4.DHCPv4) bool { return m.YourIPAddr.Equal(ip4(ip)) })
		switch {
		case err == nil:
			return c.accepted(st.k, ip, rp, sent)
		case errors.Is(err, errNAK):
			c.rec.naks.Add(1)
			c.drop(ip, rp.at, "nak")
			c.remembered = netip.Addr{}
			return false
		case ctx.Err() != nil:
			return false
		}
		c.rec.timeouts.Add(1)
	}
	// The lease ran out: the hold ends at Sent+Lease by itself.
	c.ip = netip.Addr{}
	return false
}

// release sends a DHCPRELEASE for the client's address to its server
// (RFC 2131 §4.4.6), after recording that it stopped using it.
func (c *client) release(ctx context.Context) {
	ip, srv := c.ip, c.server
	c.drop(ip, time.Now(), "release")
	c.remembered = netip.Addr{}
	c.rec.releases.Add(1)
	m := c.msg(dhcpv4.MessageTypeRelease, c.rng.Uint32(), 0, dhcpv4.WithClientIP(ip4(ip)),
		dhcpv4.WithOption(dhcpv4.OptServerIdentifier(ip4(srv))))
	_ = c.w.send(c.mac, ip, srv, m)
}

// live is the client's life until ctx ends: get an address (INIT-REBOOT of
// a remembered one half the time, else DISCOVER), then for each lease one
// fate: renew at T1 (most often), release within T1, go silent past the
// lease's end (keeping the address in mind: a later INIT-REBOOT of an
// expired address is what a machine off for a while does), or restart
// within T1 (INIT-REBOOT of the valid address).
func (c *client) live(ctx context.Context) {
	for ctx.Err() == nil {
		got := false
		if c.remembered.IsValid() && c.rng.IntN(2) == 0 {
			got = c.initReboot(ctx, c.remembered)
		}
		if !got && ctx.Err() == nil {
			got = c.discover(ctx)
		}
		if !got {
			c.sleep(ctx, time.Second+c.jitter(4*time.Second))
			continue
		}
		for bound := true; bound && ctx.Err() == nil; {
			switch p := c.rng.IntN(100); {
			case p < 60:
				bound = c.renew(ctx)
			case p < 72:
				if !c.sleep(ctx, c.jitter(c.t1)) {
					return
				}
				c.release(ctx)
				bound = false
				c.sleep(ctx, c.jitter(3*time.Second))
			case p < 86:
				ip := c.ip
				c.sleepUntil(ctx, c.last.End().Add(c.jitter(c.last.Lease)))
				c.ip, c.remembered, bound = netip.Addr{}, ip, false
			default:
				if !c.sleep(ctx, c.jitter(c.t1)) {
					return
				}
				bound = c.initReboot(ctx, c.ip)
			}
		}
	}
}

// runClients starts n clients (seeded from seed), their starts spread over
// spread, until ctx ends; wait returns when all have stopped.
func runClients(ctx context.Context, w *wire, rec *recorder, n int, seed uint64, lease, spread time.Duration) (wait func()) {
	var wg sync.WaitGroup
	for i := range n {
		c := &client{mac: clientMAC(i), w: w, rec: rec, lease: lease, rng: rand.New(rand.NewPCG(seed, uint64(i)))}
		c.smac = strings.ToLower(c.mac.String())
		wg.Add(1)
		go func() {
			defer wg.Done()
			if !c.sleep(ctx, time.Duration(c.rng.Int64N(int64(spread)+1))) {
				return
			}
			c.live(ctx)
		}()
	}
	return wg.Wait
}
