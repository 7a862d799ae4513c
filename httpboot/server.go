package httpboot

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/tinkerbell/ipxedust/binary"
)

// File classes (the "class" metric label).
const (
	ClassIPXE   = "ipxe"
	ClassEnv    = "env"
	ClassImage  = "image"
	ClassScript = "script"
)

// Environment file names under Config.EnvDir, served at /env/NAME.
const (
	EnvKernel    = "vmlinuz"
	EnvInitramfs = "initramfs"
)

// HeaderImageSHA256 carries the declared SHA-256 (hex) of a PUT upload.
const HeaderImageSHA256 = "X-Image-SHA256"

// Server is the HTTP boot handler plus its listener loop.
type Server struct {
	cfg     Config
	backend Backend
	catalog *Catalog
	digests *digestCache
	ipxe    map[string]embedded
	mux     *http.ServeMux
	m       metrics
	log     atomic.Pointer[slog.Logger]
	addr    atomic.Pointer[net.Addr]
	envHold atomic.Pointer[string] // HoldEnv's reason; nil or "" = serve
}

type embedded struct {
	data   []byte
	sha256 string // lower-case hex
	mod    time.Time
}

type metrics struct {
	transfers *prometheus.CounterVec
	bytes     *prometheus.CounterVec
	errors    *prometheus.CounterVec
	active    prometheus.Gauge
	digest    prometheus.Histogram
}

// New validates cfg (after WithDefaults), opens the catalog in
// Config.ImageDir, and registers metrics on reg (nil: a private registry).
// backend may not be nil. Errors: ErrConfig, catalog or registration errors.
func New(cfg Config, backend Backend, reg prometheus.Registerer) (*Server, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if backend == nil {
		return nil, fmt.Errorf("%w: nil backend", ErrConfig)
	}
	s := &Server{cfg: cfg, backend: backend, ipxe: map[string]embedded{}}
	s.log.Store(slog.New(slog.DiscardHandler))
	s.m = metrics{
		transfers: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kiln_httpboot_transfers_total", Help: "HTTP boot responses finished, by file class (ipxe|env|image|script) and result (ok|error).",
		}, []string{"class", "result"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kiln_httpboot_sent_bytes_total", Help: "HTTP boot body bytes written, by file class.",
		}, []string{"class"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kiln_httpboot_errors_total", Help: "HTTP boot errors by file class and reason (not_found|bad_request|backend|unsafe_value|upload|aborted|held).",
		}, []string{"class", "reason"}),
		active: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kiln_httpboot_active_transfers", Help: "HTTP boot responses in progress.",
		}),
		digest: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "kiln_httpboot_digest_seconds", Help: "Time to compute one file's SHA-256 ETag.",
			Buckets: prometheus.ExponentialBuckets(0.001, 4, 10),
		}),
	}
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	for _, c := range []prometheus.Collector{s.m.transfers, s.m.bytes, s.m.errors, s.m.active, s.m.digest} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("httpboot: register metrics: %w", err)
		}
	}
	s.digests = newDigestCache(func(d time.Duration) { s.m.digest.Observe(d.Seconds()) })
	if cfg.ImageDir != "" {
		c, err := openCatalog(cfg.ImageDir, s.digests)
		if err != nil {
			return nil, err
		}
		s.catalog = c
	}
	start := time.Now().UTC().Truncate(time.Second)
	for _, n := range []string{"ipxe.efi", "snp.efi", "undionly.kpxe"} {
		b := binary.Files[n]
		if len(b) == 0 {
			return nil, fmt.Errorf("%w: embedded %s missing", ErrConfig, n)
		}
		sum := sha256.Sum256(b)
		s.ipxe[n] = embedded{data: b, sha256: hex.EncodeToString(sum[:]), mod: start}
	}

	mux := http.NewServeMux()
	mux.HandleFunc("GET /ipxe/{mac}", s.handleScript)
	mux.HandleFunc("GET /env/{file}", s.handleEnv)
	mux.HandleFunc("GET /images/{name}", s.handleImage)
	if cfg.AllowUpload {
		mux.HandleFunc("PUT /images/{name}", s.handleUpload)
	}
	for n := range s.ipxe {
		mux.HandleFunc("GET /"+n, s.handleIPXE)
	}
	s.mux = mux
	return s, nil
}

// Catalog returns the image catalog (nil when Config.ImageDir is empty).
func (s *Server) Catalog() *Catalog { return s.catalog }

// Addr returns the bound address once Run or Serve has started, else nil.
func (s *Server) Addr() net.Addr {
	if a := s.addr.Load(); a != nil {
		return *a
	}
	return nil
}

// ServeHTTP cleans the path so that Go's ServeMux never issues its
// "clean path" 301 ("//x", "/a/../x") nor a trailing-slash redirect, then
// dispatches. Every boot path answers 2xx, 4xx or 5xx, never 3xx. A request
// with a body is refused at once (refuseBody), except an upload when
// Config.AllowUpload is set: no boot endpoint reads one.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.ContentLength != 0 && !(s.cfg.AllowUpload && r.Method == http.MethodPut) {
		refuseBody(w)
		return
	}
	p := r.URL.Path
	if p == "" || p[0] != '/' {
		http.NotFound(w, r)
		return
	}
	cp := path.Clean(p)
	if cp != p {
		r2 := new(http.Request)
		*r2 = *r
		u := *r.URL
		u.Path, u.RawPath = cp, ""
		r2.URL = &u
		r = r2
	}
	s.mux.ServeHTTP(w, r)
}

// Run listens on Config.Addr and serves until ctx ends, then drains for up
// to ShutdownTimeout and returns nil. Errors: the listen or serve error.
func (s *Server) Run(ctx context.Context, log *slog.Logger) error {
	ln, err := net.Listen("tcp", s.cfg.Addr)
	if err != nil {
		return fmt.Errorf("httpboot: listen %s: %w", s.cfg.Addr, err)
	}
	return s.Serve(ctx, log, ln)
}

// Serve serves on ln (which it closes) until ctx ends.
func (s *Server) Serve(ctx context.Context, log *slog.Logger, ln net.Listener) error {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	log = log.With("component", "httpboot")
	s.log.Store(log)
	a := ln.Addr()
	s.addr.Store(&a)
	hs := &http.Server{
		Handler:           s,
		ReadHeaderTimeout: s.cfg.ReadHeaderTimeout,
		IdleTimeout:       s.cfg.IdleTimeout,
		MaxHeaderBytes:    s.cfg.MaxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
		BaseContext:       func(net.Listener) context.Context { return ctx },
	}
	done := make(chan error, 1)
	go func() { done <- hs.Serve(ln) }()
	log.Info("httpboot serving", "addr", a.String(), "base_url", s.cfg.BaseURL, "unknown_policy", s.cfg.UnknownPolicy)
	select {
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.Background(), s.cfg.ShutdownTimeout)
		defer cancel()
		if err := hs.Shutdown(sctx); err != nil {
			hs.Close()
		}
		<-done
		return nil
	case err := <-done:
		if errors.Is(err, http.ErrServerClosed) {
			return nil
		}
		return fmt.Errorf("httpboot: serve: %w", err)
	}
}

func (s *Server) logger() *slog.Logger { return s.log.Load() }

// refuseBody answers 413 to a request that carries a body (Content-Length
// above 0, or chunked) without reading it: the connection's read deadline
// is set to now, so net/http does not first read up to 256 KiB of the body
// (which a client trickling it would hold for as long as it liked), and the
// connection is closed after the answer.
func refuseBody(w http.ResponseWriter) {
	_ = http.NewResponseController(w).SetReadDeadline(time.Now())
	w.Header().Set("Connection", "close")
	http.Error(w, "boot endpoints take no request body", http.StatusRequestEntityTooLarge)
}

// countingWriter counts body bytes and keeps io.ReaderFrom so that
// http.ServeContent of an *os.File still uses sendfile(2). err is the first
// write error: the response could not be sent whole.
type countingWriter struct {
	http.ResponseWriter
	n      int64
	status int
	err    error
}

func (c *countingWriter) WriteHeader(code int) {
	if c.status == 0 {
		c.status = code
	}
	c.ResponseWriter.WriteHeader(code)
}

func (c *countingWriter) Write(p []byte) (int, error) {
	if c.status == 0 {
		c.status = http.StatusOK
	}
	n, err := c.ResponseWriter.Write(p)
	c.n += int64(n)
	if err != nil && c.err == nil {
		c.err = err
	}
	return n, err
}

func (c *countingWriter) ReadFrom(r io.Reader) (int64, error) {
	if c.status == 0 {
		c.status = http.StatusOK
	}
	n, err := c.ResponseWriter.(io.ReaderFrom).ReadFrom(r)
	c.n += n
	if err != nil && c.err == nil {
		c.err = err
	}
	return n, err
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (c *countingWriter) Unwrap() http.ResponseWriter { return c.ResponseWriter }

// setETag sets the strong ETag for a SHA-256 (hex); without a digest no
// ETag is sent rather than an empty one.
func setETag(h http.Header, sha256 string) {
	if sha256 != "" {
		h.Set("ETag", `"`+sha256+`"`)
	}
}

// serveContent serves content with Range/HEAD/conditional support, the
// Content-Type of MediaType(name) and a strong ETag from its SHA-256,
// counting bytes and outcome under class.
func (s *Server) serveContent(w http.ResponseWriter, r *http.Request, class, name, sha256 string, mod time.Time, content io.ReadSeeker) {
	s.m.active.Inc()
	defer s.m.active.Dec()
	cw := &countingWriter{ResponseWriter: w}
	h := w.Header()
	setETag(h, sha256)
	h.Set("Content-Type", MediaType(name))
	h.Set("Accept-Ranges", "bytes")
	http.ServeContent(cw, r, name, mod, content)
	s.m.bytes.WithLabelValues(class).Add(float64(cw.n))
	// Aborted is a response that could not be written whole. The request's
	// context alone does not tell: a client that closes its connection as
	// soon as it has the last byte (no keep-alive) cancels it while
	// ServeContent returns, after a complete transfer (seen by the fleet
	// simulator: 6 of 2,000 complete environment fetches counted aborted).
	if cw.err != nil {
		s.m.transfers.WithLabelValues(class, "error").Inc()
		s.m.errors.WithLabelValues(class, "aborted").Inc()
		return
	}
	result := "ok"
	if cw.status >= 400 {
		result = "error"
	}
	s.m.transfers.WithLabelValues(class, result).Inc()
	s.logger().Debug("httpboot served", "class", class, "file", name, "status", cw.status, "bytes", cw.n,
		"remote", r.RemoteAddr, "range", r.Header.Get("Range"))
}

func (s *Server) notFound(w http.ResponseWriter, class string) {
	s.m.errors.WithLabelValues(class, "not_found").Inc()
	s.m.transfers.WithLabelValues(class, "error").Inc()
	http.Error(w, "not found", http.StatusNotFound)
}

func (s *Server) handleIPXE(w http.ResponseWriter, r *http.Request) {
	e, ok := s.ipxe[path.Base(r.URL.Path)]
	if !ok {
		s.notFound(w, ClassIPXE)
		return
	}
	s.serveContent(w, r, ClassIPXE, path.Base(r.URL.Path), e.sha256, e.mod, bytes.NewReader(e.data))
}

func (s *Server) handleEnv(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("file")
	if s.cfg.EnvDir == "" || (name != EnvKernel && name != EnvInitramfs) {
		s.notFound(w, ClassEnv)
		return
	}
	if why := s.envHold.Load(); why != nil && *why != "" {
		s.logger().Error("httpboot: environment NOT served: "+*why, "file", name, "remote", r.RemoteAddr)
		s.m.errors.WithLabelValues(ClassEnv, "held").Inc()
		s.m.transfers.WithLabelValues(ClassEnv, "error").Inc()
		http.Error(w, "this node does not serve its in-RAM environment: "+*why, http.StatusServiceUnavailable)
		return
	}
	p := filepath.Join(s.cfg.EnvDir, name)
	f, err := os.Open(p)
	if err != nil {
		s.logger().Warn("httpboot env file missing", "file", name, "err", err)
		s.notFound(w, ClassEnv)
		return
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil || !st.Mode().IsRegular() {
		s.notFound(w, ClassEnv)
		return
	}
	sum, err := s.digests.get(p, st.Size(), st.ModTime())
	if err != nil {
		s.m.errors.WithLabelValues(ClassEnv, "not_found").Inc()
		http.Error(w, "read error", http.StatusInternalServerError)
		return
	}
	s.serveContent(w, r, ClassEnv, name, sum, st.ModTime(), f)
}

// EnvFiles are the environment files EnvDigests reports, in order.
var EnvFiles = []string{EnvKernel, EnvInitramfs}

// EnvDigests returns the lower-case hex SHA-256 of each environment file
// present in Config.EnvDir (EnvFiles), as /env/NAME serves it: from the
// digest cache, so a file is hashed once per (size, mtime). A missing file
// is left out; an empty map when EnvDir is "" or holds neither. Errors: an
// I/O error while hashing.
func (s *Server) EnvDigests() (map[string]string, error) {
	out := map[string]string{}
	if s.cfg.EnvDir == "" {
		return out, nil
	}
	for _, name := range EnvFiles {
		p := filepath.Join(s.cfg.EnvDir, name)
		st, err := os.Stat(p)
		if err != nil || !st.Mode().IsRegular() {
			continue
		}
		sum, err := s.digests.get(p, st.Size(), st.ModTime())
		if err != nil {
			return out, fmt.Errorf("httpboot: environment %s: %w", p, err)
		}
		out[name] = sum
	}
	return out, nil
}

// HoldEnv stops serving /env/* (503, the reason in the body, an ERROR log
// line and kiln_httpboot_errors_total{class="env",reason="held"} per
// refused request) while reason is not ""; HoldEnv("") serves again. The
// appliance holds a node's environment when its digests differ from the
// site's.
func (s *Server) HoldEnv(reason string) { s.envHold.Store(&reason) }

func (s *Server) handleImage(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	if s.catalog == nil {
		s.notFound(w, ClassImage)
		return
	}
	f, e, err := s.catalog.Open(name)
	if err != nil {
		if errors.Is(err, ErrNotFound) || errors.Is(err, ErrBadName) {
			s.notFound(w, ClassImage)
			return
		}
		s.logger().Error("httpboot image open", "image", name, "err", err)
		s.m.errors.WithLabelValues(ClassImage, "not_found").Inc()
		http.Error(w, "read error", http.StatusInternalServerError)
		return
	}
	defer f.Close()
	s.serveContent(w, r, ClassImage, name, e.SHA256, e.ModTime, f)
}

func (s *Server) handleUpload(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	if s.catalog == nil {
		s.notFound(w, ClassImage)
		return
	}
	want := r.Header.Get(HeaderImageSHA256)
	if want == "" { // this route always checks the digest (Catalog.Upload allows "" for compressed images)
		s.m.errors.WithLabelValues(ClassImage, "upload").Inc()
		http.Error(w, ErrBadDigest.Error(), http.StatusBadRequest)
		return
	}
	e, err := s.catalog.Upload(r.Context(), name, r.Body, want, r.ContentLength)
	if err != nil {
		s.m.errors.WithLabelValues(ClassImage, "upload").Inc()
		code := http.StatusInternalServerError
		switch {
		case errors.Is(err, ErrBadName), errors.Is(err, ErrBadDigest), errors.Is(err, ErrSizeMismatch):
			code = http.StatusBadRequest
		case errors.Is(err, ErrDigestMismatch):
			code = http.StatusUnprocessableEntity
		}
		s.logger().Warn("httpboot upload failed", "image", name, "err", err)
		http.Error(w, err.Error(), code)
		return
	}
	s.logger().Info("httpboot image stored", "image", e.Name, "bytes", e.Size, "sha256", e.SHA256)
	setETag(w.Header(), e.SHA256)
	w.WriteHeader(http.StatusCreated)
}

// handleScript renders GET /ipxe/{mac}. Never a 404: unknown machines get
// discovery or exit by policy, refused netboot gets an exit script, unsafe
// values get an exit script, backend failures a wait-and-retry script.
func (s *Server) handleScript(w http.ResponseWriter, r *http.Request) {
	log := s.logger()
	mac, err := net.ParseMAC(r.PathValue("mac"))
	if err != nil || !unicastMAC(mac) {
		s.m.errors.WithLabelValues(ClassScript, "bad_request").Inc()
		s.m.transfers.WithLabelValues(ClassScript, "error").Inc()
		http.Error(w, "bad MAC address", http.StatusBadRequest)
		return
	}
	macs := mac.String()
	b, err := s.backend.BootFor(r.Context(), mac)
	var script string
	switch {
	case errors.Is(err, ErrUnknownMachine):
		if s.cfg.UnknownPolicy == PolicyDiscover {
			b = Boot{Action: ActionDiscover}
		} else {
			b = Boot{Action: ActionLocal, Hostname: "unknown-machine"}
		}
		log.Info("httpboot unknown machine", "mac", macs, "policy", s.cfg.UnknownPolicy)
	case errors.Is(err, ErrRetryLater):
		log.Info("httpboot boot held; machine told to retry", "mac", macs, "why", err)
		script = retryScript(s.cfg.BaseURL, macs, 10)
	case err != nil:
		s.m.errors.WithLabelValues(ClassScript, "backend").Inc()
		log.Error("httpboot backend failed", "mac", macs, "err", err)
		script = retryScript(s.cfg.BaseURL, macs, 10)
	}
	if script == "" {
		script, err = Script(s.params(), b)
		if err != nil {
			reason := "unsafe_value"
			if errors.Is(err, ErrBadAction) {
				reason = "backend"
			}
			s.m.errors.WithLabelValues(ClassScript, reason).Inc()
			log.Error("httpboot script refused; exiting to disk", "mac", macs, "machine", displayName(b.MachineID), "err", err)
			script = LocalScript("this-machine")
		}
	}
	s.m.active.Inc()
	defer s.m.active.Dec()
	h := w.Header()
	h.Set("Content-Type", MediaTypeScript)
	h.Set("Cache-Control", "no-store")
	h.Set("Content-Length", strconv.Itoa(len(script)))
	n := 0
	if r.Method != http.MethodHead {
		n, _ = io.WriteString(w, script)
	}
	s.m.bytes.WithLabelValues(ClassScript).Add(float64(n))
	s.m.transfers.WithLabelValues(ClassScript, "ok").Inc()
	log.Debug("httpboot script", "mac", macs, "action", b.Action, "machine", displayName(b.MachineID))
}

// unicastMAC reports whether mac is a 6-byte individual (unicast) address
// that is not all zeros. A NIC never boots with a group (multicast or
// broadcast) or zero address, so such a path names no machine: answering it
// would let any host on the boot network record junk machines.
func unicastMAC(mac net.HardwareAddr) bool {
	if len(mac) != 6 || mac[0]&1 != 0 {
		return false
	}
	for _, b := range mac {
		if b != 0 {
			return true
		}
	}
	return false
}

func (s *Server) params() ScriptParams {
	return ScriptParams{
		BaseURL: s.cfg.BaseURL, AgentURL: s.cfg.AgentURL, KernelArgs: s.cfg.KernelArgs,
		FetchTimeout: s.cfg.FetchTimeout, FetchRetries: s.cfg.FetchRetries, RetryDelay: s.cfg.RetryDelay,
	}
}
