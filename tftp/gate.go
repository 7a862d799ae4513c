package tftp

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"runtime"
	"strings"
	"sync"
	"time"

	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"
	"golang.org/x/sys/unix"
)

// gate is the net.PacketConn that pin/tftp serves on (single-port mode, so
// every packet of every transfer goes through it). It owns the real socket:
//
//   - ReadFrom admits a request from a client with no transfer only when it
//     passes parseRequest, CleanName, the transfer bound and the file lookup;
//     everything refused is answered here with the ERROR of its class (the
//     replies table) and never reaches pin. An admitted request is handed to
//     pin in its canonical form (see canonical). From a client with a
//     transfer, ACK and ERROR are handed on; anything else is dropped.
//   - WriteTo sends every datagram pin writes from the address the client's
//     request was sent to (IP_PKTINFO / IPV6_PKTINFO). An ERROR pin writes is
//     replaced by the one of its class from the replies table, or dropped
//     when it answers the client's own ERROR (RFC 1350 §7).
//
// pin holds its server-wide mutex while it calls WriteTo, so a sendmsg made
// there serializes every transfer behind one system call at a time. WriteTo
// therefore copies the datagram to a queue and returns; one sender
// goroutine per P makes the system calls, each through its own duplicate
// of the socket's descriptor (Go lets one write at a time through one
// descriptor). 200 parallel fetches of ipxe.efi over a veth link took
// 3.0–3.4 s with the sendmsg inside WriteTo and 2.4–2.7 s queued (one
// interleaved run; DESIGN.md has the figures). Queues are chosen by client address, so one
// client's datagrams keep their order. A send error is logged, not
// returned: pin would only resend, which its own timeout does anyway.
//
// ReadFrom is called only from pin's single read loop; WriteTo from pin's
// transfer goroutines; the peers map is shared with the read handler under
// mu.
type gate struct {
	s    *Server
	conn *net.UDPConn
	v6   bool           // an AF_INET6 socket: control messages are IPV6_PKTINFO
	oob  []byte         // ReadFrom's control-message buffer
	dups []*net.UDPConn // the senders' duplicates of conn's descriptor

	out     []chan outgoing // one queue per sender goroutine
	bufs    sync.Pool       // *[]byte of bufSize octets
	bufSize int             // the largest datagram pin writes: MaxBlockSize + 4
	stop    chan struct{}   // closed by close: the senders return
	wg      sync.WaitGroup  // the senders

	mu      sync.Mutex
	peers   map[netip.AddrPort]*peer // clients with an admitted request
	closing bool                     // Serve is shutting down: admit nothing
}

// outgoing is one queued datagram.
type outgoing struct {
	b   *[]byte // pooled when cap(*b) == gate.bufSize
	oob []byte
	dst netip.AddrPort
}

// queueLen is each sender's backlog; WriteTo waits when it is full.
const queueLen = 256

// peer is one admitted request, from ReadFrom until the read handler's
// transfer has ended.
type peer struct {
	local   netip.Addr // the address the request was sent to; invalid: unknown
	oob     []byte     // the control message that sends from local; nil: OS choice
	req     request    // as the client sent it (logs)
	name    string     // CleanName's result
	r       io.ReadCloser
	size    int64
	class   string
	since   time.Time
	started bool // the read handler has taken it
	aborted bool // the client sent ERROR
}

// newGate enables destination-address control messages on conn (best
// effort: without them replies leave from the OS's choice of address) and
// starts the sender goroutines; close stops them.
func newGate(s *Server, conn *net.UDPConn) *gate {
	g := &gate{s: s, conn: conn, peers: make(map[netip.AddrPort]*peer),
		oob:     make([]byte, 2*unix.CmsgSpace(unix.SizeofInet6Pktinfo)),
		out:     make([]chan outgoing, max(2, runtime.GOMAXPROCS(0))),
		bufSize: s.cfg.MaxBlockSize + 4, // DATA of the largest blksize; OACK and ERROR are shorter
		stop:    make(chan struct{})}
	g.bufs.New = func() any { b := make([]byte, g.bufSize); return &b }
	la, _ := conn.LocalAddr().(*net.UDPAddr)
	if la != nil && la.IP.To4() != nil {
		_ = ipv4.NewPacketConn(conn).SetControlMessage(ipv4.FlagDst|ipv4.FlagInterface, true)
	} else {
		g.v6 = true
		_ = ipv6.NewPacketConn(conn).SetControlMessage(ipv6.FlagDst|ipv6.FlagInterface, true)
	}
	for i := range g.out {
		g.out[i] = make(chan outgoing, queueLen)
		g.wg.Add(1)
		go g.sender(g.out[i], g.senderConn(i))
	}
	return g
}

// senderConn returns sender i's handle on the socket: sender 0 uses conn,
// the others a duplicate of its descriptor (the same socket: same address
// and port), because Go lets only one write at a time through one
// descriptor. A failed dup falls back to conn.
func (g *gate) senderConn(i int) *net.UDPConn {
	if i == 0 {
		return g.conn
	}
	f, err := g.conn.File()
	if err != nil {
		return g.conn
	}
	defer f.Close()
	pc, err := net.FilePacketConn(f)
	if err != nil {
		return g.conn
	}
	uc, ok := pc.(*net.UDPConn)
	if !ok {
		pc.Close()
		return g.conn
	}
	g.dups = append(g.dups, uc)
	return uc
}

// sender makes the system calls for one queue until close.
func (g *gate) sender(q chan outgoing, c *net.UDPConn) {
	defer g.wg.Done()
	for {
		select {
		case <-g.stop:
			return
		case o := <-q:
			if _, _, err := c.WriteMsgUDPAddrPort(*o.b, o.oob, o.dst); err != nil {
				g.s.logger().Debug("tftp send", "remote", o.dst.String(), "err", err)
			}
			if cap(*o.b) == g.bufSize {
				g.bufs.Put(o.b)
			}
		}
	}
}

// queue hands a copy of b to dst's sender.
func (g *gate) queue(b, oob []byte, dst netip.AddrPort) error {
	var p *[]byte
	if len(b) <= g.bufSize {
		p = g.bufs.Get().(*[]byte)
		*p = append((*p)[:0], b...)
	} else {
		c := append([]byte(nil), b...)
		p = &c
	}
	h := dst.Addr().As16()
	i := (uint(binary.BigEndian.Uint32(h[12:])) + uint(dst.Port())) % uint(len(g.out))
	select {
	case g.out[i] <- outgoing{b: p, oob: oob, dst: dst}:
		return nil
	case <-g.stop:
		return net.ErrClosed
	}
}

// ReadFrom returns the next datagram pin should see (see gate). p must hold
// more than MaxRequestLen octets (pin's single-port buffers hold the block
// size + 4). Errors: the socket's (a deadline pin set, a closed socket).
func (g *gate) ReadFrom(p []byte) (int, net.Addr, error) {
	for {
		n, oobn, _, src, err := g.conn.ReadMsgUDPAddrPort(p, g.oob)
		if err != nil {
			return 0, nil, err
		}
		if n = g.admit(p, n, g.oob[:oobn], src); n > 0 {
			return n, net.UDPAddrFromAddrPort(src), nil
		}
	}
}

// admit decides about one datagram p[:n] from src and returns the length
// of what pin gets in p, or 0 when pin gets nothing.
func (g *gate) admit(p []byte, n int, oob []byte, src netip.AddrPort) int {
	if n < 2 {
		return 0 // no opcode: nothing to answer
	}
	opc := binary.BigEndian.Uint16(p)
	g.mu.Lock()
	if pe := g.peers[src]; pe != nil {
		defer g.mu.Unlock()
		switch opc {
		case opACK:
			return n
		case opERROR:
			pe.aborted = true
			return n
		}
		return 0 // a repeated RRQ, DATA, OACK: pin's sender would ignore it
	}
	g.mu.Unlock()

	local, ifIndex := destination(oob, g.v6)
	switch opc {
	case opERROR:
		return 0 // an ERROR is never answered (RFC 1350 §7)
	case opDATA, opACK:
		// Port 69 is every transfer's port in single-port mode, so this is a
		// packet for a transfer that does not exist (RFC 1350 §4).
		g.refuse(src, local, ifIndex, request{}, ClassOther, fmt.Errorf("%w: opcode %d", ErrUnknownTID, opc))
		return 0
	}
	req, err := parseRequest(p[:n])
	if err == nil && req.op == opWRQ {
		err = ErrWriteRefused
	}
	name := ""
	if err == nil {
		name, err = CleanName(req.filename)
	}
	if err != nil {
		g.refuse(src, local, ifIndex, req, ClassOther, err)
		return 0
	}
	if g.full() {
		g.refuse(src, local, ifIndex, req, ClassOther, fmt.Errorf("%w: %d transfers running", ErrBusy, g.s.cfg.MaxTransfers))
		return 0
	}
	r, size, class, err := g.s.open(name)
	if err != nil {
		g.refuse(src, local, ifIndex, req, class, err)
		return 0
	}
	canon := canonical(req, name, g.s.blockLimit(ifIndex, local))
	pe := &peer{local: local, oob: pktinfo(local, ifIndex, g.v6), req: req, name: name, r: r, size: size,
		class: class, since: time.Now()}
	g.mu.Lock()
	if g.closing {
		g.mu.Unlock()
		r.Close()
		return 0 // shutting down: pin would drop it too
	}
	g.peers[src] = pe
	g.mu.Unlock()
	return copy(p, canon)
}

// full reports whether MaxTransfers requests are admitted. Requests pin never
// started (it drops a request that races a transfer's end or shutdown) are
// forgotten once they are older than a transfer may stay silent.
func (g *gate) full() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.peers) < g.s.cfg.MaxTransfers {
		return false
	}
	stale := time.Now().Add(-g.s.cfg.Timeout * time.Duration(g.s.cfg.Retries+1))
	for k, pe := range g.peers {
		if !pe.started && pe.since.Before(stale) {
			pe.r.Close()
			delete(g.peers, k)
		}
	}
	return len(g.peers) >= g.s.cfg.MaxTransfers
}

// refuse counts and logs a refused packet and answers it with the ERROR of
// its class, from the address it was sent to.
func (g *gate) refuse(src netip.AddrPort, local netip.Addr, ifIndex int, req request, class string, err error) {
	s := g.s
	r := reason(err)
	s.m.errors.WithLabelValues(class, r).Inc()
	log := s.logger()
	attrs := []any{"remote", src.String(), "file", sanitize(req.filename), "mode", sanitize(req.mode), "err", err}
	switch r {
	case reasonNotFound:
		log.Debug("tftp file not found", attrs...) // iPXE probes autoexec.ipxe on every boot
	case reasonUnknownTID:
		log.Debug("tftp packet for no transfer", attrs...)
	default:
		log.Warn("tftp request refused", attrs...)
	}
	code, msg := reply(err)
	if _, _, werr := g.conn.WriteMsgUDPAddrPort(errorPacket(code, msg), pktinfo(local, ifIndex, g.v6), src); werr != nil {
		log.Warn("tftp send error packet", "remote", src.String(), "err", werr)
	}
}

// WriteTo queues a datagram pin wrote to addr for sending (see gate). It
// reports len(b) written also when it drops pin's answer to a client's
// ERROR. Errors: addr is not a *net.UDPAddr, or the gate is closed.
func (g *gate) WriteTo(b []byte, addr net.Addr) (int, error) {
	ua, ok := addr.(*net.UDPAddr)
	if !ok {
		return 0, fmt.Errorf("tftp: write to %T", addr)
	}
	dst := ua.AddrPort()
	var oob []byte
	aborted := false
	g.mu.Lock()
	if pe := g.peers[dst]; pe != nil {
		oob, aborted = pe.oob, pe.aborted
	}
	g.mu.Unlock()
	out := b
	if len(b) >= 4 && binary.BigEndian.Uint16(b) == opERROR {
		if aborted {
			return len(b), nil // the client ended the transfer; an ERROR is not answered
		}
		code, msg := reply(pinError(b[4:]))
		out = errorPacket(code, msg)
	}
	if err := g.queue(out, oob, dst); err != nil {
		return 0, err
	}
	return len(b), nil
}

// pinError maps the message of an ERROR packet pin/tftp built (pin sends
// code 1 with err.Error() for every failure) back to Kiln's error class:
// the read handler's sentinels by their exact text, pin's own channel
// timeout as ErrTimeout; anything else is an internal error.
func pinError(msg []byte) error {
	if i := strings.IndexByte(string(msg), 0); i >= 0 {
		msg = msg[:i]
	}
	text := string(msg)
	for _, r := range replies {
		if text == r.err.Error() {
			return r.err
		}
	}
	if strings.HasPrefix(text, "channel timeout") { // pin's chanConnection.readFrom
		return fmt.Errorf("%w: %s", ErrTimeout, text)
	}
	return errors.New(text)
}

// take hands the admitted request from src to the read handler; nil when
// there is none.
func (g *gate) take(src netip.AddrPort) *peer {
	g.mu.Lock()
	defer g.mu.Unlock()
	pe := g.peers[src]
	if pe != nil {
		pe.started = true
	}
	return pe
}

// end forgets src's request once its transfer has ended (pin has closed it)
// and closes its file.
func (g *gate) end(src netip.AddrPort) {
	g.mu.Lock()
	pe := g.peers[src]
	delete(g.peers, src)
	g.mu.Unlock()
	if pe != nil {
		pe.r.Close()
	}
}

// aborted reports whether src ended its transfer with an ERROR.
func (g *gate) aborted(src netip.AddrPort) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	pe := g.peers[src]
	return pe != nil && pe.aborted
}

// shutdown makes ReadFrom admit nothing more.
func (g *gate) shutdown() {
	g.mu.Lock()
	g.closing = true
	g.mu.Unlock()
}

// release closes the files of requests pin never started.
func (g *gate) release() {
	g.mu.Lock()
	defer g.mu.Unlock()
	for k, pe := range g.peers {
		pe.r.Close()
		delete(g.peers, k)
	}
}

// Close stops the senders (datagrams still queued are dropped) and closes
// the socket; pin calls it when it stops, Serve once more after pin.
func (g *gate) Close() error {
	g.mu.Lock()
	select {
	case <-g.stop:
	default:
		close(g.stop)
	}
	dups := g.dups
	g.dups = nil
	g.mu.Unlock()
	g.wg.Wait()
	for _, c := range dups {
		c.Close()
	}
	return g.conn.Close()
}

func (g *gate) LocalAddr() net.Addr                { return g.conn.LocalAddr() }
func (g *gate) SetDeadline(t time.Time) error      { return g.conn.SetDeadline(t) }
func (g *gate) SetReadDeadline(t time.Time) error  { return g.conn.SetReadDeadline(t) }
func (g *gate) SetWriteDeadline(t time.Time) error { return g.conn.SetWriteDeadline(t) }

// destination returns the address a datagram was sent to and the interface
// it came in on, from its IP_PKTINFO / IPV6_PKTINFO control message (an
// IPv4 datagram on a dual-stack socket shows as ::ffff:a.b.c.d). Invalid
// and 0 when the message is missing.
func destination(oob []byte, v6 bool) (netip.Addr, int) {
	if len(oob) == 0 {
		return netip.Addr{}, 0
	}
	var dst net.IP
	var ifIndex int
	if v6 {
		var cm ipv6.ControlMessage
		if cm.Parse(oob) != nil {
			return netip.Addr{}, 0
		}
		dst, ifIndex = cm.Dst, cm.IfIndex
	} else {
		var cm ipv4.ControlMessage
		if cm.Parse(oob) != nil {
			return netip.Addr{}, 0
		}
		dst, ifIndex = cm.Dst, cm.IfIndex
	}
	a, ok := netip.AddrFromSlice(dst)
	if !ok {
		return netip.Addr{}, 0
	}
	if !v6 {
		a = a.Unmap()
	}
	return a, ifIndex
}

// pktinfo returns the control message that makes a datagram leave from
// local, or nil (the OS chooses) when local is unknown, unspecified,
// broadcast or multicast; ifIndex scopes an IPv6 link-local local. It is
// built with x/sys because x/net's ipv6 marshalling drops an IPv4-mapped
// source, which a dual-stack socket needs.
func pktinfo(local netip.Addr, ifIndex int, v6 bool) []byte {
	u := local.Unmap()
	if !local.IsValid() || u.IsUnspecified() || u.IsMulticast() || u == netip.AddrFrom4([4]byte{255, 255, 255, 255}) {
		return nil
	}
	if v6 {
		pi := unix.Inet6Pktinfo{Addr: local.As16()}
		if u.Is6() && u.IsLinkLocalUnicast() && ifIndex > 0 {
			pi.Ifindex = uint32(ifIndex)
		}
		return unix.PktInfo6(&pi)
	}
	if !u.Is4() {
		return nil
	}
	return unix.PktInfo4(&unix.Inet4Pktinfo{Spec_dst: u.As4()})
}
