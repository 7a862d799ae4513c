package dhcp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"syscall"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/net/ipv4"
	"golang.org/x/sys/unix"
)

// Server is the PXE-aware DHCPv4 server. Create it with New; Run serves.
type Server struct {
	cfg    Config
	b      Backend
	m      *metrics
	leases *leaseTable
	chain  []step
	disc   *macGate
	limit  *macBucket
	// unwatch ends the lease feed (Backend.WatchLeases), when Run returns.
	unwatch func()

	mu    sync.Mutex
	conns []*listener
}

type listener struct {
	pc      *ipv4.PacketConn
	raw     net.PacketConn
	port    int
	ifindex int
}

// New validates cfg, registers the metrics on reg (nil: not registered) and
// starts following the committed leases (Backend.WatchLeases; the watch ends
// when Run returns). Errors wrap ErrInvalidConfig / ErrFieldTooLong, or come
// from Backend.WatchLeases or the registry.
func New(cfg Config, b Backend, reg *prometheus.Registry) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if b == nil {
		return nil, fmt.Errorf("%w: nil backend", ErrInvalidConfig)
	}
	m, err := newMetrics(reg)
	if err != nil {
		return nil, fmt.Errorf("dhcp: metrics: %w", err)
	}
	s := &Server{cfg: cfg, b: b, m: m, leases: newLeaseTable(), disc: newMACGate(cfg.DiscoverInterval)}
	if cfg.PerMACRate > 0 {
		s.limit = newMACBucket(cfg.PerMACRate, 2*cfg.PerMACRate)
	}
	s.chain = s.buildChain(cfg.Mode)
	s.unwatch, err = b.WatchLeases(
		func(ls []Lease) { s.leases.reset(ls, time.Now()) },
		func(ls []Lease) { s.leases.applied(ls, time.Now()) })
	if err != nil {
		return nil, fmt.Errorf("dhcp: following the committed leases: %w", err)
	}
	return s, nil
}

// Listen opens the sockets (the DHCP port, and the proxy port in proxy mode)
// on Config.Interface without SO_REUSEADDR/SO_REUSEPORT, so a port another
// socket holds gives ErrPortInUse instead of silent sharing. Run calls it when
// it was not called before; calling it first lets a caller open the sockets
// inside a network namespace.
func (s *Server) Listen() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.conns) > 0 {
		return nil
	}
	ifi, err := net.InterfaceByName(s.cfg.Interface)
	if err != nil {
		return fmt.Errorf("dhcp: interface %q: %w", s.cfg.Interface, err)
	}
	ports := []int{s.cfg.ListenPort}
	if s.cfg.Mode == ModeProxy {
		ports = append(ports, s.cfg.ProxyPort)
	}
	for _, p := range ports {
		l, err := s.listen(ifi, p)
		if err != nil {
			for _, c := range s.conns {
				c.raw.Close()
			}
			s.conns = nil
			return err
		}
		s.conns = append(s.conns, l)
	}
	return nil
}

func (s *Server) listen(ifi *net.Interface, port int) (*listener, error) {
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) {
			for _, o := range []struct{ opt, v int }{{unix.SO_REUSEADDR, 0}, {unix.SO_REUSEPORT, 0}, {unix.SO_BROADCAST, 1}} {
				if serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, o.opt, o.v); serr != nil {
					return
				}
			}
			if s.cfg.ReadBuffer > 0 {
				if unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, s.cfg.ReadBuffer) != nil {
					_ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, s.cfg.ReadBuffer) // best effort, capped by rmem_max
				}
			}
			serr = unix.SetsockoptString(int(fd), unix.SOL_SOCKET, unix.SO_BINDTODEVICE, ifi.Name)
		})
		if err != nil {
			return err
		}
		return serr
	}}
	raw, err := lc.ListenPacket(context.Background(), "udp4", fmt.Sprintf("0.0.0.0:%d", port))
	if err != nil {
		if errors.Is(err, syscall.EADDRINUSE) {
			return nil, fmt.Errorf("%w: udp %d on %s: %w", ErrPortInUse, port, ifi.Name, err)
		}
		return nil, fmt.Errorf("dhcp: listen udp %d on %s: %w", port, ifi.Name, err)
	}
	pc := ipv4.NewPacketConn(raw)
	if err := pc.SetControlMessage(ipv4.FlagDst|ipv4.FlagInterface, true); err != nil {
		raw.Close()
		return nil, fmt.Errorf("dhcp: IP_PKTINFO: %w", err)
	}
	return &listener{pc: pc, raw: raw, port: port, ifindex: ifi.Index}, nil
}

// packet is one received datagram waiting for a worker.
type packet struct {
	buf  []byte
	src  netip.AddrPort
	dst  netip.AddrPort
	l    *listener
	recv time.Time
}

// outgoing is an encoded reply; lease (when set) must be committed first,
// and x is the exchange it answers (for a NAK if the commit is refused).
type outgoing struct {
	data  []byte
	to    netip.AddrPort
	src   netip.Addr
	l     *listener
	recv  time.Time
	lease *Lease
	x     *exchange
	label [2]string
}

// Run serves until ctx ends, then stops reading, lets the workers and the
// committer finish the queued packets, ends the lease watch and returns nil. One reader per socket
// feeds a bounded queue (QueueLen; excess dropped as queue_full) served by
// Workers goroutines; replies that bind a lease go through the group
// committer. Errors: ErrPortInUse or socket errors from Listen.
func (s *Server) Run(ctx context.Context, log *slog.Logger) error {
	log = log.With("component", "dhcp")
	defer s.unwatch()
	if err := s.Listen(); err != nil {
		return err
	}
	s.mu.Lock()
	conns := s.conns
	s.mu.Unlock()
	defer func() {
		for _, c := range conns {
			c.raw.Close()
		}
		s.mu.Lock()
		s.conns = nil
		s.mu.Unlock()
	}()
	log.Info("serving", "interface", s.cfg.Interface, "server_ip", s.cfg.ServerIP, "mode", s.cfg.Mode, "port", s.cfg.ListenPort, "workers", s.cfg.Workers)

	queue := make(chan packet, s.cfg.QueueLen)
	commits := make(chan outgoing, 2*s.cfg.BatchMax)
	var readers, workers sync.WaitGroup
	stop := context.AfterFunc(ctx, func() {
		for _, c := range conns {
			c.raw.SetReadDeadline(time.Unix(1, 0))
		}
	})
	defer stop()
	for _, c := range conns {
		readers.Add(1)
		go func() { defer readers.Done(); s.readLoop(ctx, c, queue, log) }()
	}
	for range s.cfg.Workers {
		workers.Add(1)
		go func() { defer workers.Done(); s.worker(queue, commits, log) }()
	}
	committerDone := make(chan struct{})
	go func() { defer close(committerDone); s.committer(commits, log) }()

	readers.Wait()
	close(queue)
	workers.Wait()
	close(commits)
	<-committerDone
	log.Info("stopped")
	return nil
}

func (s *Server) readLoop(ctx context.Context, l *listener, queue chan<- packet, log *slog.Logger) {
	buf := make([]byte, 4096)
	for {
		n, cm, src, err := l.pc.ReadFrom(buf)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			log.Error("read", "err", err)
			time.Sleep(10 * time.Millisecond)
			continue
		}
		now := time.Now()
		if cm != nil && cm.IfIndex != 0 && cm.IfIndex != l.ifindex {
			continue // not our interface (cannot happen with SO_BINDTODEVICE)
		}
		if n < 240 {
			s.m.drops.WithLabelValues("malformed").Inc()
			continue
		}
		if s.limit != nil && !s.limit.allow([6]byte(buf[28:34]), now) {
			s.m.drops.WithLabelValues("rate_limited").Inc()
			continue
		}
		p := packet{buf: append([]byte(nil), buf[:n]...), l: l, recv: now}
		if ua, ok := src.(*net.UDPAddr); ok {
			p.src = ua.AddrPort()
		}
		dst := netip.IPv4Unspecified()
		if cm != nil {
			if a, ok := netip.AddrFromSlice(cm.Dst.To4()); ok {
				dst = a
			}
		}
		p.dst = netip.AddrPortFrom(dst, uint16(l.port))
		select {
		case queue <- p:
		default:
			s.m.drops.WithLabelValues("queue_full").Inc()
		}
	}
}

func (s *Server) worker(queue <-chan packet, commits chan<- outgoing, log *slog.Logger) {
	for p := range queue {
		req, err := dhcpv4.FromBytes(p.buf)
		if err != nil {
			s.m.drops.WithLabelValues("malformed").Inc()
			continue
		}
		x := s.process(req, p.src, p.dst, p.recv)
		if x.err != nil {
			log.Debug("request dropped", "mac", req.ClientHWAddr, "reason", x.drop, "err", x.err)
		}
		o := outgoing{l: p.l, recv: p.recv, lease: x.lease, x: x, src: x.serverID, to: x.replyTo, label: [2]string{"", archLabel(x.c.arch)}}
		if x.resp != nil {
			data, err := encode(x.resp, s.cfg.MaxFileLen, s.cfg.MaxSnameLen)
			if err != nil {
				s.m.drops.WithLabelValues("field_too_long").Inc()
				log.Warn("reply not encodable", "mac", req.ClientHWAddr, "err", err)
				continue
			}
			o.data = data
			o.label[0] = msgLabel(x.resp.MessageType())
		}
		switch {
		case o.lease != nil && o.data == nil:
			commits <- o // DECLINE/RELEASE: rare, no reply; wait for room
		case o.lease != nil:
			select {
			case commits <- o:
			default:
				// The store is behind: shed this ACK (the client retries)
				// rather than stall the workers answering DISCOVERs.
				s.m.drops.WithLabelValues("commit_backlog").Inc()
			}
		case o.data != nil:
			s.send(o, log)
		}
	}
}

func (s *Server) send(o outgoing, log *slog.Logger) {
	if o.data == nil {
		return
	}
	cm := &ipv4.ControlMessage{Src: o.src.AsSlice()}
	if o.to.Addr() == netip.AddrFrom4([4]byte{255, 255, 255, 255}) {
		cm.IfIndex = o.l.ifindex // broadcast leaves only the ingress interface
	}
	if _, err := o.l.pc.WriteTo(o.data, cm, net.UDPAddrFromAddrPort(o.to)); err != nil {
		s.m.drops.WithLabelValues("send_error").Inc()
		log.Warn("send", "to", o.to, "err", err)
		return
	}
	s.m.replies.WithLabelValues(o.label[0], o.label[1]).Inc()
	s.m.latency.WithLabelValues(o.label[0]).Observe(time.Since(o.recv).Seconds())
}

// committer is the group commit: it takes the first waiting lease change,
// drains whatever else is already queued (up to BatchMax; with BatchDelay > 0
// it lingers that long for more), commits the batch with one CommitLeases
// call and hands the committed batch to the replier, which answers: the ACK
// of each committed binding, a NAK for each binding the committer refused
// (another client holds the address). Changes arriving during a commit form
// the next batch, so batches grow with load while an idle server commits at
// once; the next commit starts while the replier is still sending the last
// batch's replies (they are durable already: only the order of sends
// against the next commit changes, never "committed, then ACK"). A failed
// commit drops the batch's replies (the clients retry).
func (s *Server) committer(in <-chan outgoing, log *slog.Logger) {
	type done struct {
		batch []outgoing
		errs  []error
	}
	replies := make(chan done, 2)
	free := make(chan []outgoing, 3) // batch buffers back from the replier
	for range 3 {
		free <- make([]outgoing, 0, s.cfg.BatchMax)
	}
	replierDone := make(chan struct{})
	go func() {
		defer close(replierDone)
		for d := range replies {
			for i, o := range d.batch {
				if d.errs[i] == nil {
					s.m.committed.Inc()
					s.send(o, log)
					continue
				}
				log.Debug("lease refused", "mac", o.lease.MAC, "ip", o.lease.IP, "state", o.lease.State, "err", d.errs[i])
				s.refused(o.x, d.errs[i])
				if o.x.resp == nil {
					continue
				}
				data, err := encode(o.x.resp, s.cfg.MaxFileLen, s.cfg.MaxSnameLen)
				if err != nil {
					continue
				}
				o.data, o.to, o.label[0] = data, o.x.replyTo, msgLabel(o.x.resp.MessageType())
				s.send(o, log)
			}
			clear(d.batch)
			free <- d.batch[:0]
		}
	}()
	leases := make([]Lease, 0, s.cfg.BatchMax)
	flush := func(batch []outgoing) {
		leases = leases[:0]
		for _, o := range batch {
			leases = append(leases, *o.lease)
		}
		t0 := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), s.cfg.SaveTimeout)
		errs, err := s.b.CommitLeases(ctx, leases)
		cancel()
		s.m.commit.Observe(time.Since(t0).Seconds())
		if err == nil && len(errs) != len(batch) {
			err = fmt.Errorf("%d results for %d leases", len(errs), len(batch))
		}
		if err != nil {
			s.m.drops.WithLabelValues("persist_error").Add(float64(len(batch)))
			log.Error("committing leases", "n", len(batch), "err", fmt.Errorf("%w: %w", ErrPersist, err))
			clear(batch)
			free <- batch[:0]
			return
		}
		replies <- done{batch: batch, errs: errs}
	}
	for o := range in {
		batch := <-free
		batch = append(batch, o)
		var linger <-chan time.Time
		if s.cfg.BatchDelay > 0 {
			linger = time.After(s.cfg.BatchDelay)
		}
	fill:
		for len(batch) < s.cfg.BatchMax {
			select {
			case o, ok := <-in:
				if !ok {
					break fill
				}
				batch = append(batch, o)
			case <-linger:
				break fill
			default:
				if linger == nil {
					break fill
				}
				select {
				case o, ok := <-in:
					if !ok {
						break fill
					}
					batch = append(batch, o)
				case <-linger:
					break fill
				}
			}
		}
		flush(batch)
	}
	close(replies)
	<-replierDone
}

// macGate lets one event per MAC through per interval (Discovered).
type macGate struct {
	mu    sync.Mutex
	every time.Duration
	last  map[[6]byte]time.Time
}

func newMACGate(every time.Duration) *macGate {
	return &macGate{every: every, last: map[[6]byte]time.Time{}}
}

func (g *macGate) allow(mac net.HardwareAddr, now time.Time) bool {
	if len(mac) != 6 {
		return false
	}
	k := [6]byte(mac)
	g.mu.Lock()
	defer g.mu.Unlock()
	if t, ok := g.last[k]; ok && now.Sub(t) < g.every {
		return false
	}
	if len(g.last) > 100_000 {
		for m, t := range g.last {
			if now.Sub(t) >= g.every {
				delete(g.last, m)
			}
		}
	}
	g.last[k] = now
	return true
}

// macBucket is a token bucket per MAC (rate per second, burst) against retry
// storms.
type macBucket struct {
	mu          sync.Mutex
	rate, burst float64
	b           map[[6]byte]*bucket
}

type bucket struct {
	tokens float64
	last   time.Time
}

func newMACBucket(rate, burst float64) *macBucket {
	return &macBucket{rate: rate, burst: burst, b: map[[6]byte]*bucket{}}
}

func (m *macBucket) allow(k [6]byte, now time.Time) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	bk := m.b[k]
	if bk == nil {
		if len(m.b) > 100_000 {
			for mk, v := range m.b {
				if now.Sub(v.last).Seconds()*m.rate >= m.burst {
					delete(m.b, mk)
				}
			}
		}
		bk = &bucket{tokens: m.burst, last: now}
		m.b[k] = bk
	}
	bk.tokens = min(m.burst, bk.tokens+now.Sub(bk.last).Seconds()*m.rate)
	bk.last = now
	if bk.tokens < 1 {
		return false
	}
	bk.tokens--
	return true
}
