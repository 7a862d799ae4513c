package tftp

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	ipxebin "github.com/tinkerbell/ipxedust/binary"
	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"
)

// File classes used as the "class" metric label.
const (
	ClassIPXE  = "ipxe"  // an embedded iPXE binary
	ClassOther = "other" // a file under Config.Root, or a refused/missing name
)

// EmbeddedNames are the iPXE binaries served from memory, by the names DHCP
// hands out as the boot file (DESIGN.md "Boot flow").
var EmbeddedNames = []string{"undionly.kpxe", "ipxe.efi", "snp.efi"}

// Server is a read-only TFTP server (RFC 1350 with the option extension of
// RFC 2347, blksize RFC 2348 and tsize RFC 2349). Create it with New; serve
// with Run or Serve.
type Server struct {
	cfg      Config
	root     *os.Root // nil when Config.Root is empty
	embedded map[string][]byte
	sem      chan struct{}
	m        metrics
	wg       sync.WaitGroup // running transfers

	mu   sync.Mutex
	addr net.Addr
	log  *slog.Logger
}

type metrics struct {
	transfers *prometheus.CounterVec
	bytes     *prometheus.CounterVec
	errors    *prometheus.CounterVec
	active    prometheus.Gauge
}

// Error reasons (the "reason" label of kiln_tftp_errors_total).
const (
	reasonNotFound     = "not_found"     // ERROR 1
	reasonRefused      = "refused"       // name refused, ERROR 2
	reasonWriteRefused = "write_refused" // WRQ, ERROR 2
	reasonIllegal      = "illegal"       // malformed request or bad mode, ERROR 4
	reasonBusy         = "busy"          // MaxTransfers reached, ERROR 0
	reasonAborted      = "aborted"       // the client sent ERROR (e.g. after a tsize probe)
	reasonTimeout      = "timeout"       // the client stopped acknowledging
	reasonInternal     = "internal"      // a read or socket error on our side
)

// New validates cfg (after WithDefaults), opens Config.Root read-only when
// set, and registers the package metrics on reg (nil: a private registry).
// Errors: ErrConfig, an os error for Root, or a prometheus registration error.
func New(cfg Config, reg prometheus.Registerer) (*Server, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s := &Server{
		cfg:      cfg,
		embedded: make(map[string][]byte, len(EmbeddedNames)),
		sem:      make(chan struct{}, cfg.MaxTransfers),
		log:      slog.New(slog.DiscardHandler),
	}
	for _, n := range EmbeddedNames {
		b, ok := ipxebin.Files[n]
		if !ok || len(b) == 0 {
			return nil, fmt.Errorf("%w: embedded %s missing from ipxedust", ErrConfig, n)
		}
		s.embedded[n] = b
	}
	if cfg.Root != "" {
		r, err := os.OpenRoot(cfg.Root)
		if err != nil {
			return nil, fmt.Errorf("tftp: open root: %w", err)
		}
		s.root = r
	}
	s.m = metrics{
		transfers: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kiln_tftp_transfers_total", Help: "TFTP read transfers finished, by file class (ipxe|other) and result (ok|error).",
		}, []string{"class", "result"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kiln_tftp_sent_bytes_total", Help: "TFTP payload bytes sent in DATA packets (first sends), by file class.",
		}, []string{"class"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kiln_tftp_errors_total", Help: "TFTP requests refused or failed, by file class and reason (not_found|refused|write_refused|illegal|busy|aborted|timeout|internal).",
		}, []string{"class", "reason"}),
		active: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kiln_tftp_active_transfers", Help: "TFTP transfers in progress.",
		}),
	}
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	for _, c := range []prometheus.Collector{s.m.transfers, s.m.bytes, s.m.errors, s.m.active} {
		if err := reg.Register(c); err != nil {
			s.Close()
			return nil, fmt.Errorf("tftp: register metrics: %w", err)
		}
	}
	return s, nil
}

// Close releases the root directory handle. Run and Serve do not call it.
func (s *Server) Close() error {
	if s.root != nil {
		return s.root.Close()
	}
	return nil
}

// Addr returns the bound UDP address once Run or Serve has started, else nil.
func (s *Server) Addr() net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.addr
}

// Run listens on Config.Addr and serves until ctx ends, then waits for the
// running transfers (each bounded by Timeout × (Retries+1) per packet) and
// returns nil. Errors: the listen error.
func (s *Server) Run(ctx context.Context, log *slog.Logger) error {
	ua, err := net.ResolveUDPAddr("udp", s.cfg.Addr)
	if err != nil {
		return fmt.Errorf("tftp: resolve %s: %w", s.cfg.Addr, err)
	}
	conn, err := net.ListenUDP("udp", ua)
	if err != nil {
		return fmt.Errorf("tftp: listen %s: %w", s.cfg.Addr, err)
	}
	return s.Serve(ctx, log, conn)
}

// Serve serves on an already bound conn (which it closes) until ctx ends,
// then waits for the running transfers and returns nil. Replies leave from
// the address each request was sent to: the destination address and
// receiving interface are read with IP_PKTINFO (IPV6_PKTINFO on an IPv6 or
// dual-stack socket), and each transfer gets its own socket bound to that
// address (its transfer ID, RFC 1350 §4). Errors: a read error on conn.
func (s *Server) Serve(ctx context.Context, log *slog.Logger, conn *net.UDPConn) error {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	log = log.With("component", "tftp")
	s.mu.Lock()
	s.addr = conn.LocalAddr()
	s.log = log
	s.mu.Unlock()

	// A rack powering on sends a burst of RRQs; they are read one at a time.
	_ = conn.SetReadBuffer(4 << 20) // best effort (capped by net.core.rmem_max)
	read := newReader(conn)

	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	log.Info("tftp serving", "addr", conn.LocalAddr().String(), "root", s.cfg.Root,
		"max_block_size", s.cfg.MaxBlockSize, "max_transfers", s.cfg.MaxTransfers)

	// One octet more than MaxRequestLen, so that a longer request is seen
	// as too long rather than cut short.
	buf := make([]byte, MaxRequestLen+1)
	var err error
	for {
		var in inbound
		in, err = read(buf)
		if err != nil {
			break
		}
		s.handle(buf[:in.n], in)
	}
	conn.Close()
	s.wg.Wait()
	if ctx.Err() != nil {
		return nil
	}
	return fmt.Errorf("tftp: serve: %w", err)
}

// inbound is one datagram read from the server port.
type inbound struct {
	n       int
	dst     net.IP // the address it was sent to; nil when unknown
	ifIndex int    // the receiving interface; 0 when unknown
	src     *net.UDPAddr
}

// newReader returns a read function for conn that reports each datagram's
// destination address and interface when the OS provides them.
func newReader(conn *net.UDPConn) func([]byte) (inbound, error) {
	la, _ := conn.LocalAddr().(*net.UDPAddr)
	if la != nil && la.IP.To4() != nil {
		pc := ipv4.NewPacketConn(conn)
		if pc.SetControlMessage(ipv4.FlagDst|ipv4.FlagInterface, true) == nil {
			return func(b []byte) (inbound, error) {
				n, cm, src, err := pc.ReadFrom(b)
				in := inbound{n: n}
				in.src, _ = src.(*net.UDPAddr)
				if cm != nil {
					in.dst, in.ifIndex = cm.Dst, cm.IfIndex
				}
				return in, err
			}
		}
	} else {
		pc := ipv6.NewPacketConn(conn)
		if pc.SetControlMessage(ipv6.FlagDst|ipv6.FlagInterface, true) == nil {
			return func(b []byte) (inbound, error) {
				n, cm, src, err := pc.ReadFrom(b)
				in := inbound{n: n}
				in.src, _ = src.(*net.UDPAddr)
				if cm != nil {
					in.dst, in.ifIndex = cm.Dst, cm.IfIndex
				}
				return in, err
			}
		}
	}
	return func(b []byte) (inbound, error) {
		n, src, err := conn.ReadFromUDP(b)
		return inbound{n: n, src: src}, err
	}
}

func (s *Server) logger() *slog.Logger {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.log
}

// handle answers one datagram from the server port. Refusals are answered
// here (one ERROR from a fresh socket); an accepted RRQ starts a transfer
// goroutine, at most MaxTransfers at a time.
func (s *Server) handle(p []byte, in inbound) {
	if in.src == nil || len(p) < 2 {
		return // no opcode: nothing to answer
	}
	if binary.BigEndian.Uint16(p) == opERROR {
		return // an ERROR is never answered (RFC 1350 §7)
	}
	req, err := parseRequest(p)
	if err == nil && req.op == opWRQ {
		err = ErrWriteRefused
	}
	name := ""
	if err == nil {
		name, err = CleanName(req.filename)
	}
	if err != nil {
		s.refuse(in, req, ClassOther, err)
		return
	}
	select {
	case s.sem <- struct{}{}:
	default:
		s.refuse(in, req, ClassOther, fmt.Errorf("%w: %d transfers running", ErrBusy, s.cfg.MaxTransfers))
		return
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer func() { <-s.sem }()
		s.transfer(req, name, in)
	}()
}

// reason maps an error class to its metric reason label.
func reason(err error) string {
	switch {
	case errors.Is(err, ErrNotFound):
		return reasonNotFound
	case errors.Is(err, ErrBadPath):
		return reasonRefused
	case errors.Is(err, ErrWriteRefused):
		return reasonWriteRefused
	case errors.Is(err, ErrIllegalOp):
		return reasonIllegal
	case errors.Is(err, ErrBusy):
		return reasonBusy
	case errors.Is(err, ErrPeer):
		return reasonAborted
	case errors.Is(err, ErrTimeout):
		return reasonTimeout
	}
	return reasonInternal
}

// refuse counts and logs a refused request and sends its ERROR (code and
// fixed text from replies) from a fresh socket on the request's address.
func (s *Server) refuse(in inbound, req request, class string, err error) {
	r := reason(err)
	s.m.errors.WithLabelValues(class, r).Inc()
	log := s.logger()
	attrs := []any{"remote", in.src.String(), "file", sanitize(req.filename), "mode", sanitize(req.mode), "err", err}
	if r == reasonNotFound {
		log.Debug("tftp file not found", attrs...) // iPXE probes autoexec.ipxe on every boot
	} else {
		log.Warn("tftp request refused", attrs...)
	}
	conn, lerr := listenFrom(in.dst)
	if lerr != nil {
		log.Error("tftp cannot answer", "remote", in.src.String(), "err", lerr)
		return
	}
	defer conn.Close()
	code, msg := reply(err)
	if _, werr := conn.WriteToUDP(errorPacket(code, msg), in.src); werr != nil {
		log.Warn("tftp send error packet", "remote", in.src.String(), "err", werr)
	}
}

// listenFrom opens a transfer socket on an ephemeral port of dst, the
// address a request was sent to (the OS chooses for a broadcast, multicast
// or unknown one).
func listenFrom(dst net.IP) (*net.UDPConn, error) {
	if dst == nil || dst.IsUnspecified() || dst.Equal(net.IPv4bcast) || dst.IsMulticast() {
		dst = nil
	}
	return net.ListenUDP("udp", &net.UDPAddr{IP: dst})
}

// open resolves a validated name to content, its size and file class.
// Errors: ErrNotFound, ErrBadPath (escapes, permissions), or an I/O error.
func (s *Server) open(name string) (io.ReadCloser, int64, string, error) {
	if b, ok := s.embedded[name]; ok {
		return io.NopCloser(bytes.NewReader(b)), int64(len(b)), ClassIPXE, nil
	}
	if s.root == nil {
		return nil, 0, ClassOther, ErrNotFound
	}
	f, err := s.root.Open(name)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
			return nil, 0, ClassOther, fmt.Errorf("%w: %v", ErrNotFound, err)
		}
		// os.Root reports escapes ("path escapes from parent"), permission
		// and symlink-loop failures: all an access violation for the client.
		return nil, 0, ClassOther, fmt.Errorf("%w: %v", ErrBadPath, err)
	}
	st, err := f.Stat()
	if err != nil || !st.Mode().IsRegular() {
		f.Close()
		return nil, 0, ClassOther, fmt.Errorf("%w: not a regular file", ErrNotFound)
	}
	return f, st.Size(), ClassOther, nil
}

// transfer serves one accepted RRQ from its own socket.
func (s *Server) transfer(req request, name string, in inbound) {
	log := s.logger()
	r, size, class, err := s.open(name)
	if err != nil {
		s.refuse(in, req, class, err)
		return
	}
	defer r.Close()
	conn, err := listenFrom(in.dst)
	if err != nil {
		s.m.errors.WithLabelValues(class, reasonInternal).Inc()
		log.Error("tftp cannot answer", "remote", in.src.String(), "err", err)
		return
	}
	defer conn.Close()

	blk, oack := s.negotiate(req, size, in)
	var src io.Reader = r
	if req.netascii() {
		src = newNetasciiReader(r)
	}
	t := &sender{conn: conn, peer: in.src, timeout: s.cfg.Timeout, retries: s.cfg.Retries,
		rbuf: make([]byte, 1500)}
	s.m.active.Inc()
	start := time.Now()
	n, err := t.send(oack, blk, src)
	s.m.active.Dec()
	s.m.bytes.WithLabelValues(class).Add(float64(n))
	attrs := []any{"remote", in.src.String(), "local", conn.LocalAddr().String(), "file", name,
		"mode", strings.ToLower(req.mode), "blksize", blk, "bytes", n, "seconds", time.Since(start).Seconds()}
	if err == nil {
		s.m.transfers.WithLabelValues(class, "ok").Inc()
		log.Debug("tftp transfer done", attrs...)
		return
	}
	s.m.transfers.WithLabelValues(class, "error").Inc()
	rs := reason(err)
	s.m.errors.WithLabelValues(class, rs).Inc()
	attrs = append(attrs, "err", err)
	if rs == reasonAborted {
		// UEFI aborts its tsize probe with ERROR 8 on every boot.
		log.Debug("tftp transfer ended by client", attrs...)
		return
	}
	log.Warn("tftp transfer failed", attrs...)
	code, msg := reply(err)
	_, _ = conn.WriteToUDP(errorPacket(code, msg), in.src) // best effort: the client may be gone
}

// negotiate picks the block size and the OACK for req (RFC 2347): only
// blksize (RFC 2348) and tsize (RFC 2349) are answered, each only when the
// client sent it with a valid value; other options are ignored, as RFC 2347
// requires. blksize is capped at Config.MaxBlockSize and at the receiving
// link's MTU minus the IP, UDP and TFTP headers; values below 512 or outside
// RFC 2348's 8–65464 are left out (the client then uses 512). tsize gets the
// file size, except in netascii mode, where the octets sent differ from the
// file's size and the option is left out. No OACK (nil) means DATA 1 comes
// first.
func (s *Server) negotiate(req request, size int64, in inbound) (int, []option) {
	maxBlk := s.cfg.MaxBlockSize
	if ifc, err := net.InterfaceByIndex(in.ifIndex); in.ifIndex > 0 && err == nil {
		overhead := 20 + 8 + 4 // IPv4, UDP, TFTP DATA header
		if in.dst != nil && in.dst.To4() == nil {
			overhead = 40 + 8 + 4 // IPv6
		}
		if link := ifc.MTU - overhead; link < maxBlk {
			maxBlk = link
		}
	}
	maxBlk = max(maxBlk, MinBlockSize)
	blk := MinBlockSize
	var oack []option
	for _, o := range req.options {
		switch strings.ToLower(o.name) {
		case "blksize":
			n, ok := decimal(o.value)
			if !ok || n < MinBlockSize || n > MaxLargeBlockSize {
				continue
			}
			blk = int(min(n, int64(maxBlk)))
			oack = append(oack, option{o.name, strconv.Itoa(blk)})
		case "tsize":
			if _, ok := decimal(o.value); !ok || req.netascii() {
				continue
			}
			oack = append(oack, option{o.name, strconv.FormatInt(size, 10)})
		}
	}
	return blk, oack
}

// decimal parses 1–18 ASCII digits (no sign, no space).
func decimal(s string) (int64, bool) {
	if s == "" || len(s) > 18 {
		return 0, false
	}
	var n int64
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, false
		}
		n = n*10 + int64(s[i]-'0')
	}
	return n, true
}

// sanitize bounds and defangs a client-supplied string before logging it.
func sanitize(s string) string {
	const max = 64
	b := make([]byte, 0, max)
	for i := 0; i < len(s) && len(b) < max; i++ {
		c := s[i]
		if c < 0x20 || c >= 0x7f {
			c = '?'
		}
		b = append(b, c)
	}
	return string(b)
}
