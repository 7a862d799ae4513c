package tftp

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	ptftp "github.com/pin/tftp/v3"
	"github.com/prometheus/client_golang/prometheus"
	ipxebin "github.com/tinkerbell/ipxedust/binary"
)

// File classes used as the "class" metric label.
const (
	ClassIPXE  = "ipxe"  // an embedded iPXE binary
	ClassOther = "other" // a file under Config.Root, or a refused/missing name
)

// EmbeddedNames are the iPXE binaries served from memory, by the names DHCP
// hands out as the boot file (top-level DESIGN.md "Boot flow").
var EmbeddedNames = []string{"undionly.kpxe", "ipxe.efi", "snp.efi"}

// Server is a read-only TFTP server (RFC 1350 with the option extension of
// RFC 2347, blksize RFC 2348 and tsize RFC 2349) on github.com/pin/tftp/v3.
// Create it with New; serve with Run or Serve.
type Server struct {
	cfg      Config
	root     *os.Root // nil when Config.Root is empty
	embedded map[string][]byte
	m        metrics

	mu   sync.Mutex
	addr net.Addr
	log  *slog.Logger
	gate *gate // the socket pin serves on, once Serve has started
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
	reasonUnknownTID   = "unknown_tid"   // DATA/ACK from a client with no transfer, ERROR 5
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
			Name: "kiln_tftp_errors_total", Help: "TFTP requests refused or failed, by file class and reason (not_found|refused|write_refused|illegal|unknown_tid|busy|aborted|timeout|internal).",
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
// then waits for the running transfers and returns nil.
//
// The TFTP engine is pin/tftp in single-port mode: every transfer is served
// from conn's own port (pin picks no new TID), and pin reads and writes
// through a gate (gate.go) that admits only well-formed requests for files
// that exist, answers everything refused from the replies table, sends each
// reply from the address the request was sent to (IP_PKTINFO, or
// IPV6_PKTINFO on an IPv6 or dual-stack socket) and replaces every ERROR
// pin writes with the fixed one of its class. Errors: pin's (an unparsable
// local address).
func (s *Server) Serve(ctx context.Context, log *slog.Logger, conn *net.UDPConn) error {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	log = log.With("component", "tftp")
	// A rack powering on sends a burst of RRQs; they are read one at a time.
	_ = conn.SetReadBuffer(4 << 20) // best effort (capped by net.core.rmem_max)
	g := newGate(s, conn)
	s.mu.Lock()
	s.addr = conn.LocalAddr()
	s.log = log
	s.gate = g
	s.mu.Unlock()

	srv := ptftp.NewServer(s.read, nil) // WRQs never pass the gate
	srv.EnableSinglePort()
	srv.SetTimeout(s.cfg.Timeout)
	srv.SetRetries(s.cfg.Retries)
	// pin's default backoff sleeps a random 0-1 s on top of Timeout before
	// each resend; the Timeout alone spaces resends here.
	srv.SetBackoff(func(int) time.Duration { return 0 })
	// The gate writes the negotiated blksize into the request pin sees
	// (canonical, capped by blockLimit); pin's own MTU clamp is off because
	// it cannot see the receiving interface through a wrapped socket.
	// SetBlockSize ignores 512 (its floor is exclusive); 512 is the default.
	srv.SetBlockSize(s.cfg.MaxBlockSize)
	srv.SetBlockSizeNegotiation(false)
	// SetAnticipate stays off: it is not RFC 7440 and lockstep clients choke on it.

	log.Info("tftp serving", "addr", conn.LocalAddr().String(), "root", s.cfg.Root,
		"max_block_size", s.cfg.MaxBlockSize, "max_transfers", s.cfg.MaxTransfers)
	done := make(chan error, 1)
	go func() { done <- srv.Serve(g) }()
	var err error
	select {
	case <-ctx.Done():
		g.shutdown()
		// In single-port mode Shutdown only wakes pin's read loop; Serve
		// returns once the running transfers have ended.
		srv.Shutdown()
		err = <-done
	case err = <-done:
	}
	g.Close()
	g.release()
	if err != nil {
		return fmt.Errorf("tftp: serve: %w", err)
	}
	return nil
}

func (s *Server) logger() *slog.Logger {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.log
}

func (s *Server) currentGate() *gate {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.gate
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
	case errors.Is(err, ErrUnknownTID):
		return reasonUnknownTID
	case errors.Is(err, ErrBusy):
		return reasonBusy
	case errors.Is(err, ErrPeer):
		return reasonAborted
	case errors.Is(err, ErrTimeout):
		return reasonTimeout
	}
	return reasonInternal
}

// read is pin's read handler: it serves the request the gate admitted from
// the same client (its file is already open) and returns nil; pin has sent
// any ERROR and closed the transfer by then. Without an admitted request it
// returns ErrInternal, which pin sends and the gate turns into ERROR 0.
func (s *Server) read(filename string, rf io.ReaderFrom) error {
	log := s.logger()
	g := s.currentGate()
	ot, ok := rf.(ptftp.OutgoingTransfer)
	if !ok || g == nil {
		return ErrInternal
	}
	ra := ot.RemoteAddr()
	remote := ra.AddrPort()
	pe := g.take(remote)
	if pe == nil {
		s.m.errors.WithLabelValues(ClassOther, reasonInternal).Inc()
		log.Error("tftp transfer without an admitted request", "remote", remote.String(), "file", sanitize(filename))
		return ErrInternal
	}
	defer g.end(remote)
	ot.SetSize(pe.size) // answered only when the request kept tsize (canonical)

	s.m.active.Inc()
	start := time.Now()
	n, err := rf.ReadFrom(pe.r)
	s.m.active.Dec()
	s.m.bytes.WithLabelValues(pe.class).Add(float64(n))
	attrs := []any{"remote", remote.String(), "local", pe.local.String(), "file", pe.name,
		"mode", strings.ToLower(pe.req.mode), "bytes", n, "seconds", time.Since(start).Seconds()}
	if err == nil {
		s.m.transfers.WithLabelValues(pe.class, "ok").Inc()
		log.Debug("tftp transfer done", attrs...)
		return nil
	}
	s.m.transfers.WithLabelValues(pe.class, "error").Inc()
	var ne net.Error
	switch {
	case g.aborted(remote):
		err = fmt.Errorf("%w: %v", ErrPeer, err)
	case errors.As(err, &ne) && ne.Timeout():
		err = fmt.Errorf("%w: %v", ErrTimeout, err)
	}
	rs := reason(err)
	s.m.errors.WithLabelValues(pe.class, rs).Inc()
	attrs = append(attrs, "err", err)
	if rs == reasonAborted {
		// UEFI aborts its tsize probe with ERROR 8 on every boot.
		log.Debug("tftp transfer ended by client", attrs...)
		return nil
	}
	log.Warn("tftp transfer failed", attrs...)
	return nil
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

// blockLimit is the largest blksize a request received on interface
// ifIndex at local may get: Config.MaxBlockSize, capped at the link's MTU
// minus the IP, UDP and TFTP DATA headers (32 octets on IPv4, 52 on IPv6),
// never below 512.
func (s *Server) blockLimit(ifIndex int, local netip.Addr) int {
	limit := s.cfg.MaxBlockSize
	if ifIndex > 0 {
		if ifc, err := net.InterfaceByIndex(ifIndex); err == nil {
			overhead := 20 + 8 + 4 // IPv4, UDP, TFTP DATA header
			if local.IsValid() && !local.Unmap().Is4() {
				overhead = 40 + 8 + 4 // IPv6
			}
			limit = min(limit, ifc.MTU-overhead)
		}
	}
	return max(limit, MinBlockSize)
}

// canonical is the request pin/tftp is handed for an admitted req: the
// cleaned name, the mode in lower case (pin compares "netascii" exactly),
// and only the options Kiln answers (RFC 2347), in lower case: blksize
// (RFC 2348) when its value is 1–18 plain digits in 512–65464, lowered to
// limit; tsize (RFC 2349) when its value is plain digits and the mode is
// octet (in netascii the octets sent differ from the file's size). pin then
// sends an OACK with exactly these options, or DATA 1 when there are none,
// and fills in tsize from SetSize. Unknown options (windowsize, timeout,
// multicast) and invalid values are left out, never refused.
func canonical(req request, name string, limit int) []byte {
	c := request{op: opRRQ, filename: name, mode: strings.ToLower(req.mode)}
	for _, o := range req.options {
		switch strings.ToLower(o.name) {
		case "blksize":
			n, ok := decimal(o.value)
			if !ok || n < MinBlockSize || n > MaxLargeBlockSize {
				continue
			}
			c.options = append(c.options, option{"blksize", strconv.FormatInt(min(n, int64(limit)), 10)})
		case "tsize":
			if _, ok := decimal(o.value); !ok || req.netascii() {
				continue
			}
			c.options = append(c.options, option{"tsize", "0"})
		}
	}
	return c.encode()
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
