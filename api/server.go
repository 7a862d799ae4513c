package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Defaults applied by New to zero Config fields.
const (
	DefaultAddr              = "127.0.0.1:7480"
	DefaultListLimit         = 100
	MaxListLimitCap          = 1000
	DefaultMaxEventWait      = 60 * time.Second
	DefaultMaxJSONBytes      = 1 << 20  // 1 MiB
	DefaultMaxImportBytes    = 64 << 20 // 64 MiB
	DefaultShutdownTimeout   = 10 * time.Second
	DefaultReadHeaderTimeout = 10 * time.Second
	DefaultIdleTimeout       = 120 * time.Second
	// DefaultMaxHeaderBytes bounds a request's header block (bytes): bearer
	// tokens and query strings are short; net/http's default is 1 MiB.
	DefaultMaxHeaderBytes = 32 << 10
	// DefaultBodyIdleTimeout is the longest a read of a request body waits
	// for the next bytes (see body.go).
	DefaultBodyIdleTimeout = 30 * time.Second
	// DefaultJSONBodyTimeout is the longest a JSON request body may take to
	// arrive whole (at most MaxJSONBytes; see body.go).
	DefaultJSONBodyTimeout = 15 * time.Second
	// FailuresInStatus bounds the failed machines listed by /v1/site/status.
	FailuresInStatus = 50
)

// Config of the REST API. Zero values take the Default* constants.
type Config struct {
	// Addr is the listen address (host:port) for Run.
	Addr string `yaml:"addr"`
	// TLSCert and TLSKey are PEM file paths; when both are set Run serves HTTPS.
	TLSCert string `yaml:"tls_cert"`
	TLSKey  string `yaml:"tls_key"`
	// Tokens are the static bearer tokens (hashed). Agent tokens are not here:
	// they are per boot and checked with Backend.VerifyAgentToken.
	Tokens []TokenSpec `yaml:"tokens"`
	// DefaultListLimit and MaxListLimit bound ?limit= on lists (items).
	DefaultListLimit int `yaml:"default_list_limit"`
	MaxListLimit     int `yaml:"max_list_limit"`
	// MaxEventWait caps ?wait= of the events long-poll.
	MaxEventWait time.Duration `yaml:"max_event_wait"`
	// MaxJSONBytes bounds JSON request bodies; MaxImportBytes bounds import files (bytes).
	MaxJSONBytes   int64 `yaml:"max_json_bytes"`
	MaxImportBytes int64 `yaml:"max_import_bytes"`
	// ReadHeaderTimeout, IdleTimeout, MaxHeaderBytes and ShutdownTimeout of
	// the HTTP server. There is no whole-request read/write timeout: uploads
	// stream and events long-poll (bounded by MaxEventWait); bodies are
	// bounded per read by BodyIdleTimeout and, for JSON, in total by
	// JSONBodyTimeout (body.go says why).
	ReadHeaderTimeout time.Duration `yaml:"read_header_timeout"`
	IdleTimeout       time.Duration `yaml:"idle_timeout"`
	MaxHeaderBytes    int           `yaml:"max_header_bytes"`
	BodyIdleTimeout   time.Duration `yaml:"body_idle_timeout"`
	JSONBodyTimeout   time.Duration `yaml:"json_body_timeout"`
	ShutdownTimeout   time.Duration `yaml:"shutdown_timeout"`
	// ErrorClasses maps other packages' sentinel errors to statuses and
	// codes (set in code by the appliance, not from the config file).
	ErrorClasses []ErrorClass `yaml:"-"`
}

func (c *Config) setDefaults() {
	if c.Addr == "" {
		c.Addr = DefaultAddr
	}
	if c.DefaultListLimit == 0 {
		c.DefaultListLimit = DefaultListLimit
	}
	if c.MaxListLimit == 0 {
		c.MaxListLimit = MaxListLimitCap
	}
	if c.MaxEventWait == 0 {
		c.MaxEventWait = DefaultMaxEventWait
	}
	if c.MaxJSONBytes == 0 {
		c.MaxJSONBytes = DefaultMaxJSONBytes
	}
	if c.MaxImportBytes == 0 {
		c.MaxImportBytes = DefaultMaxImportBytes
	}
	if c.ReadHeaderTimeout == 0 {
		c.ReadHeaderTimeout = DefaultReadHeaderTimeout
	}
	if c.IdleTimeout == 0 {
		c.IdleTimeout = DefaultIdleTimeout
	}
	if c.MaxHeaderBytes == 0 {
		c.MaxHeaderBytes = DefaultMaxHeaderBytes
	}
	if c.BodyIdleTimeout == 0 {
		c.BodyIdleTimeout = DefaultBodyIdleTimeout
	}
	if c.JSONBodyTimeout == 0 {
		c.JSONBodyTimeout = DefaultJSONBodyTimeout
	}
	if c.ShutdownTimeout == 0 {
		c.ShutdownTimeout = DefaultShutdownTimeout
	}
}

// Validate checks a Config (after defaults). Errors wrap ErrBadConfig.
func (c Config) Validate() error {
	c.setDefaults()
	if _, _, err := net.SplitHostPort(c.Addr); err != nil {
		return fmt.Errorf("%w: addr %q: %v", ErrBadConfig, c.Addr, err)
	}
	if (c.TLSCert == "") != (c.TLSKey == "") {
		return fmt.Errorf("%w: tls_cert and tls_key must be set together", ErrBadConfig)
	}
	if c.DefaultListLimit < 1 || c.MaxListLimit < c.DefaultListLimit {
		return fmt.Errorf("%w: need 1 <= default_list_limit <= max_list_limit", ErrBadConfig)
	}
	if c.MaxEventWait < 0 || c.MaxJSONBytes < 0 || c.MaxImportBytes < 0 || c.MaxHeaderBytes < 0 {
		return fmt.Errorf("%w: limits must not be negative", ErrBadConfig)
	}
	if c.ReadHeaderTimeout < 0 || c.IdleTimeout < 0 || c.BodyIdleTimeout < 0 || c.JSONBodyTimeout < 0 || c.ShutdownTimeout < 0 {
		return fmt.Errorf("%w: timeouts must not be negative", ErrBadConfig)
	}
	for i, ec := range c.ErrorClasses {
		if ec.Err == nil || ec.Status < 400 || ec.Status > 599 || ec.Code == "" {
			return fmt.Errorf("%w: error_classes[%d]: need an error, a 4xx/5xx status and a code", ErrBadConfig, i)
		}
	}
	_, err := newTokenTable(c.Tokens)
	return err
}

// Server is the REST API. Create it with New; serve it with Run or mount Handler.
type Server struct {
	cfg    Config
	b      Backend
	log    *slog.Logger
	reg    *prometheus.Registry
	m      *metrics
	tokens *tokenTable
	e      *echo.Echo
	h      http.Handler // dispatch behind guardBodies
	mounts []mount      // handlers beside the API (Mount), fixed before serving
	doc    []byte       // the OpenAPI document, rendered once
}

// New builds the API over b. Metrics are registered in reg (an error if
// already registered there). log gets a component=api attribute.
func New(cfg Config, b Backend, reg *prometheus.Registry, log *slog.Logger) (*Server, error) {
	if b == nil || reg == nil || log == nil {
		return nil, fmt.Errorf("%w: backend, registry and logger are required", ErrBadConfig)
	}
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	tt, err := newTokenTable(cfg.Tokens)
	if err != nil {
		return nil, err
	}
	m, err := newMetrics(reg)
	if err != nil {
		return nil, fmt.Errorf("api: metrics: %w", err)
	}
	doc, err := json.MarshalIndent(OpenAPI(), "", "  ")
	if err != nil {
		return nil, fmt.Errorf("api: openapi: %w", err)
	}
	s := &Server{cfg: cfg, b: b, log: log.With("component", "api"), reg: reg, m: m, tokens: tt, doc: doc}
	e := echo.New()
	e.HideBanner = true
	e.HidePort = true
	e.HTTPErrorHandler = s.errorHandler
	e.Use(m.middleware)
	e.Use(s.recoverPanics)
	s.e = e
	s.h = s.guardBodies(http.HandlerFunc(s.dispatch))
	s.routes()
	return s, nil
}

// mount is one handler served beside the API under a path prefix.
type mount struct {
	prefix string
	h      http.Handler
}

// Mount serves h for every request whose path starts with prefix (which
// ends in "/"; the prefix without its slash is redirected to it), on the
// API's listener and behind the same body guards; the appliance mounts the
// web UI (api/ui) at "/ui/". When root is true, GET / is redirected to the
// prefix too. Call it before Serve or Run.
func (s *Server) Mount(prefix string, h http.Handler, root bool) {
	s.mounts = append(s.mounts, mount{prefix: prefix, h: h})
	if root {
		s.mounts = append(s.mounts, mount{prefix: "", h: http.RedirectHandler(prefix, http.StatusFound)})
	}
}

// dispatch sends a request to a mounted handler or to the API.
func (s *Server) dispatch(w http.ResponseWriter, r *http.Request) {
	p := r.URL.Path
	for _, m := range s.mounts {
		switch {
		case m.prefix == "" && p == "/":
			m.h.ServeHTTP(w, r)
			return
		case m.prefix == "":
		case strings.HasPrefix(p, m.prefix):
			m.h.ServeHTTP(w, r)
			return
		case p+"/" == m.prefix:
			http.Redirect(w, r, m.prefix, http.StatusFound)
			return
		}
	}
	s.e.ServeHTTP(w, r)
}

// LocalHandler is the API's routes without the body guards or the mounts,
// for an in-process caller whose request bodies are already in memory (the
// web UI calls the API through it with the signed-in token, so its every
// read and action takes the same route, role check and audit as a remote
// client's).
func (s *Server) LocalHandler() http.Handler { return s.e }

// Handler returns the API as an http.Handler (for httptest or mounting, as
// the appliance mounts /v1/agent/ on the boot listener). Request bodies are
// bounded in time (body.go) on whatever server runs it.
func (s *Server) Handler() http.Handler { return s.h }

// Run serves the API on cfg.Addr (HTTPS when TLSCert/TLSKey are set) until
// ctx ends, then shuts down gracefully within ShutdownTimeout and returns
// nil. A listen error is returned at once. log, when non-nil, replaces the
// logger given to New and is used as given (the caller adds component=api).
func (s *Server) Run(ctx context.Context, log *slog.Logger) error {
	if log != nil {
		s.log = log
	}
	ln, err := net.Listen("tcp", s.cfg.Addr)
	if err != nil {
		return fmt.Errorf("api: listen %s: %w", s.cfg.Addr, err)
	}
	return s.Serve(ctx, ln)
}

// Serve is Run on an existing listener (tests pass 127.0.0.1:0). It closes ln.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	srv := &http.Server{
		Handler:           s.h,
		ReadHeaderTimeout: s.cfg.ReadHeaderTimeout,
		IdleTimeout:       s.cfg.IdleTimeout,
		MaxHeaderBytes:    s.cfg.MaxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
		BaseContext:       func(net.Listener) context.Context { return ctx },
	}
	errc := make(chan error, 1)
	tls := s.cfg.TLSCert != ""
	s.log.Info("api listening", "addr", ln.Addr().String(), "tls", tls)
	go func() {
		if tls {
			errc <- srv.ServeTLS(ln, s.cfg.TLSCert, s.cfg.TLSKey)
		} else {
			errc <- srv.Serve(ln)
		}
	}()
	select {
	case err := <-errc:
		return fmt.Errorf("api: serve: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), s.cfg.ShutdownTimeout)
	defer cancel()
	err := srv.Shutdown(sctx)
	if serr := <-errc; serr != nil && !errors.Is(serr, http.ErrServerClosed) {
		return fmt.Errorf("api: serve: %w", serr)
	}
	if err != nil {
		return fmt.Errorf("api: shutdown: %w", err)
	}
	return nil
}

// Route is one registered route: Method and echo Path template (":id").
type Route struct{ Method, Path string }

// Routes lists the registered routes (for documentation and the OpenAPI test).
func (s *Server) Routes() []Route {
	var out []Route
	for _, r := range s.e.Routes() {
		if r.Method == echo.RouteNotFound {
			continue
		}
		out = append(out, Route{Method: r.Method, Path: r.Path})
	}
	return out
}

// routes registers every route. Keep in step with the OpenAPI table in
// openapi.go (TestOpenAPIMatchesRoutes enforces it).
func (s *Server) routes() {
	e := s.e
	view, op, admin := s.requireRole(RoleViewer), s.requireRole(RoleOperator), s.requireRole(RoleAdmin)

	e.GET("/healthz", s.healthz)
	e.GET("/readyz", s.readyz)
	e.GET("/metrics", echo.WrapHandler(promhttp.HandlerFor(s.reg, promhttp.HandlerOpts{})))
	e.GET("/v1/openapi.json", s.openapi)

	e.GET("/v1/site/status", s.siteStatus, view)

	e.GET("/v1/sites", s.listSites, view)
	e.POST("/v1/sites", s.createSite, admin)
	e.GET("/v1/sites/:id", s.getSite, view)
	e.PUT("/v1/sites/:id", s.updateSite, admin)

	e.GET("/v1/racks", s.listRacks, view)
	e.POST("/v1/racks", s.createRack, admin)
	e.GET("/v1/racks/:id", s.getRack, view)
	e.PUT("/v1/racks/:id", s.updateRack, admin)

	e.GET("/v1/machines", s.listMachines, view)
	e.POST("/v1/machines", s.createMachine, admin)
	e.POST("/v1/machines/import", s.importMachines, admin)
	e.POST("/v1/machines/claim", s.claimMachines, op)
	e.GET("/v1/machines/:id", s.getMachine, view)
	e.PATCH("/v1/machines/:id", s.patchMachine, admin)
	e.POST("/v1/machines/:id/provision", s.provision, op)
	e.POST("/v1/machines/:id/release", s.release, op)
	e.POST("/v1/machines/:id/erase", s.erase, op)
	e.POST("/v1/machines/:id/inspect", s.inspect, op)
	e.POST("/v1/machines/:id/bmc", s.enrollBMC, admin)

	e.GET("/v1/images", s.listImages, view)
	e.POST("/v1/images", s.uploadImage, admin)
	e.GET("/v1/images/:id", s.getImage, view)
	e.PUT("/v1/images/:id", s.uploadImage, admin)
	e.DELETE("/v1/images/:id", s.deleteImage, admin)
	e.PUT("/v1/images/:id/manifest", s.putManifest, admin)

	e.GET("/v1/jobs", s.listJobs, view)
	e.GET("/v1/jobs/:id", s.getJob, view)

	e.GET("/v1/events", s.events, view)

	e.POST("/v1/agent/register", s.agentRegister)
	e.GET("/v1/agent/task", s.agentTask)
	e.POST("/v1/agent/report", s.agentReport)
	e.GET("/v1/agent/credentials", s.agentCredentials)
	e.POST("/v1/agent/firstboot", s.agentFirstBoot)

	s.clusterRoutes(admin, view)         // cluster.go
	s.backupRoutes(admin)                // backup.go
	s.remediationRoutes(view, op, admin) // remediation.go
	s.leaseRoutes(view)                  // leases.go
}

// recoverPanics turns a handler panic into a 500 (logged, no stack to the client).
func (s *Server) recoverPanics(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) (err error) {
		defer func() {
			if r := recover(); r != nil {
				if r == http.ErrAbortHandler {
					panic(r)
				}
				s.log.Error("handler panic", "route", c.Path(), "panic", fmt.Sprint(r))
				err = fmt.Errorf("internal error: handler panic")
			}
		}()
		return next(c)
	}
}
