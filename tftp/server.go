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
	"os"
	"sync"
	"time"

	ptftp "github.com/pin/tftp/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/tinkerbell/ipxedust/binary"
)

// File classes used as the "class" metric label.
const (
	ClassIPXE  = "ipxe"  // an embedded iPXE binary
	ClassOther = "other" // a file under Config.Root, or a refused/missing name
)

// EmbeddedNames are the iPXE binaries served from memory, by the names DHCP
// hands out as the boot file (top-level DESIGN.md "Boot flow").
var EmbeddedNames = []string{"undionly.kpxe", "ipxe.efi", "snp.efi"}

// Server is a read-only TFTP server. Create it with New; serve with Run or Serve.
type Server struct {
	cfg      Config
	root     *os.Root // nil when Config.Root is empty
	embedded map[string][]byte
	sem      chan struct{}
	m        metrics

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
		b, ok := binary.Files[n]
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
			Name: "kiln_tftp_sent_bytes_total", Help: "TFTP payload bytes sent, by file class.",
		}, []string{"class"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kiln_tftp_errors_total", Help: "TFTP requests refused or failed, by file class and reason (not_found|refused|busy|write_refused|aborted).",
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
// running transfers (each bounded by Timeout × Retries per packet) and
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

// Serve serves on an already bound conn (which it closes) until ctx ends.
// conn must be a *net.UDPConn so replies can leave from the address each
// request was sent to (IP_PKTINFO); pin/tftp opens one socket per transfer
// bound to that address.
func (s *Server) Serve(ctx context.Context, log *slog.Logger, conn *net.UDPConn) error {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	log = log.With("component", "tftp")
	s.mu.Lock()
	s.addr = conn.LocalAddr()
	s.log = log
	s.mu.Unlock()

	// A rack powering on sends a burst of RRQs; pin reads them one at a time.
	_ = conn.SetReadBuffer(4 << 20) // best effort (capped by net.core.rmem_max)

	srv := ptftp.NewServer(s.read, s.write)
	srv.SetTimeout(s.cfg.Timeout)
	srv.SetRetries(s.cfg.Retries)
	// pin's default backoff sleeps a random 0-1 s on top of Timeout before
	// each resend; the Timeout alone spaces resends here.
	srv.SetBackoff(func(int) time.Duration { return 0 })
	// SetBlockSize ignores 512 (its floor is exclusive); 512 is pin's default anyway.
	srv.SetBlockSize(s.cfg.MaxBlockSize)
	srv.SetBlockSizeNegotiation(true) // also clamp to the receiving link's MTU
	// SetAnticipate stays off: it is not RFC 7440 and lockstep clients choke on it.

	done := make(chan error, 1)
	go func() { done <- srv.Serve(conn) }()
	log.Info("tftp serving", "addr", conn.LocalAddr().String(), "root", s.cfg.Root,
		"max_block_size", s.cfg.MaxBlockSize, "max_transfers", s.cfg.MaxTransfers)
	select {
	case <-ctx.Done():
		srv.Shutdown()
		<-done
		return nil
	case err := <-done:
		srv.Shutdown()
		if err != nil {
			return fmt.Errorf("tftp: serve: %w", err)
		}
		return nil
	}
}

func (s *Server) logger() *slog.Logger {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.log
}

// write refuses every WRQ; pin sends the returned text in an ERROR packet.
func (s *Server) write(filename string, wt io.WriterTo) error {
	remote := ""
	if ot, ok := wt.(ptftp.IncomingTransfer); ok {
		a := ot.RemoteAddr()
		remote = a.String()
	}
	s.m.errors.WithLabelValues(ClassOther, "write_refused").Inc()
	s.logger().Warn("tftp write refused", "remote", remote, "file", sanitize(filename))
	return ErrWriteRefused
}

// open resolves a validated name to content, its size and file class.
func (s *Server) open(name string) (io.ReadCloser, int64, string, error) {
	if b, ok := s.embedded[name]; ok {
		return io.NopCloser(bytes.NewReader(b)), int64(len(b)), ClassIPXE, nil
	}
	if s.root == nil {
		return nil, 0, ClassOther, ErrNotFound
	}
	f, err := s.root.Open(name)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, 0, ClassOther, ErrNotFound
		}
		// os.Root reports escapes ("path escapes from parent") and other
		// failures; the client only learns "access violation".
		return nil, 0, ClassOther, fmt.Errorf("%w: %v", ErrBadPath, err)
	}
	st, err := f.Stat()
	if err != nil || !st.Mode().IsRegular() {
		f.Close()
		return nil, 0, ClassOther, ErrNotFound
	}
	return f, st.Size(), ClassOther, nil
}

// read serves one RRQ. pin/tftp has already parsed the request; it sends an
// OACK only for the options the client sent (blksize, tsize), and sends the
// text of a returned error in an ERROR packet at once.
func (s *Server) read(filename string, rf io.ReaderFrom) error {
	log := s.logger()
	ot, _ := rf.(ptftp.OutgoingTransfer)
	var remote, local string
	if ot != nil {
		a := ot.RemoteAddr()
		remote = a.String()
	}
	if pi, ok := rf.(ptftp.RequestPacketInfo); ok && pi.LocalIP() != nil {
		local = pi.LocalIP().String()
	}
	name, err := CleanName(filename)
	if err != nil {
		s.m.errors.WithLabelValues(ClassOther, "refused").Inc()
		log.Warn("tftp request refused", "remote", remote, "file", sanitize(filename), "err", err)
		return ErrBadPath
	}
	select {
	case s.sem <- struct{}{}:
	default:
		s.m.errors.WithLabelValues(ClassOther, "busy").Inc()
		log.Warn("tftp busy", "remote", remote, "file", name, "max_transfers", s.cfg.MaxTransfers)
		return ErrBusy
	}
	defer func() { <-s.sem }()

	r, size, class, err := s.open(name)
	if err != nil {
		reason := "refused"
		if errors.Is(err, ErrNotFound) {
			reason = "not_found"
			log.Debug("tftp file not found", "remote", remote, "file", name)
		} else {
			log.Warn("tftp request refused", "remote", remote, "file", name, "err", err)
		}
		s.m.errors.WithLabelValues(class, reason).Inc()
		if errors.Is(err, ErrNotFound) {
			return ErrNotFound
		}
		return ErrBadPath
	}
	defer r.Close()
	if ot != nil {
		ot.SetSize(size) // answered only if the client sent tsize
	}
	s.m.active.Inc()
	defer s.m.active.Dec()
	start := time.Now()
	n, err := rf.ReadFrom(r)
	s.m.bytes.WithLabelValues(class).Add(float64(n))
	if err != nil {
		// Includes the client's ERROR reply to an OACK (an aborted tsize probe).
		s.m.transfers.WithLabelValues(class, "error").Inc()
		s.m.errors.WithLabelValues(class, "aborted").Inc()
		log.Debug("tftp transfer ended early", "remote", remote, "local", local, "file", name, "bytes", n, "err", err)
		return nil // pin has already sent ERROR / closed the transfer
	}
	s.m.transfers.WithLabelValues(class, "ok").Inc()
	log.Debug("tftp transfer done", "remote", remote, "local", local, "file", name, "bytes", n,
		"seconds", time.Since(start).Seconds())
	return nil
}

// sanitize bounds and defangs a client-supplied name before logging it.
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
