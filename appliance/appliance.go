// Package appliance wires Kiln's services together: the replicated store,
// DHCP, TFTP, HTTP boot, the REST API, BMC control and the lifecycle
// controller, all started under one context (DESIGN.md "Start and stop"). It adapts
// the store to the small interfaces the protocol packages declare.
package appliance

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"golang.org/x/sync/errgroup"

	"kiln/api"
	"kiln/api/ui"
	"kiln/appliance/lifecycle"
	"kiln/bmc"
	"kiln/dhcp"
	"kiln/httpboot"
	"kiln/store"
	"kiln/store/pki"
	"kiln/tftp"
)

// NewLogger returns the slog logger the config asks for, writing to w.
func NewLogger(c LogConfig, w io.Writer) *slog.Logger {
	var lvl slog.Level
	_ = lvl.UnmarshalText([]byte(c.Level))
	opts := &slog.HandlerOptions{Level: lvl}
	if c.Format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// Run starts every service of a validated cfg and blocks until ctx ends or a
// service fails; it then stops the rest and closes the store. version is
// reported by /v1/site/status.
func Run(ctx context.Context, cfg Config, version string) error {
	log := NewLogger(cfg.Log, os.Stderr)
	a, err := New(cfg, version, log)
	if err != nil {
		return err
	}
	return a.Run(ctx)
}

// Appliance is one node's set of services, built by New and run by Run.
type Appliance struct {
	cfg     Config
	log     *slog.Logger
	reg     *prometheus.Registry
	Store   *store.Store
	life    *lifecycle.Controller
	api     *api.Server
	boot    *httpboot.Server
	bootLn  net.Listener
	dhcp    *dhcp.Server
	dhcpB   *dhcpBackend
	bmc     *bmcAdapter // opens BMC credentials with the site key
	tftp    *tftp.Server
	version string
	// images copies image files between members (imagesync.go); peerFiles
	// is its handler on the forward RPC.
	images    *imageSync
	peerFiles http.Handler
	// env compares the in-RAM environment with the other nodes'
	// (envcheck.go); envP is it for the store's registration, which may
	// ask before New has built it.
	env  *envCheck
	envP atomic.Pointer[envCheck]
}

// New builds the appliance: it gets the node's site certificate and the
// site key (siteCredentials: made at bootstrap, received from a member when
// joining with a token), opens the store (a corrupt data file is an error
// naming it), creates the admin token on first start, and constructs every
// service. Nothing listens until Run, except the store's raft
// transport and the boot HTTP listener (bound here so a busy port fails fast).
func New(cfg Config, version string, log *slog.Logger) (*Appliance, error) {
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("data dir: %w", err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	a := &Appliance{cfg: cfg, log: log, reg: reg, version: version}

	ident, keys, err := siteCredentials(cfg, log)
	if err != nil {
		return nil, err
	}
	siteK, err := newSiteKeys(cfg.BMC.KeyFile, keys, log)
	if err != nil {
		return nil, err
	}
	st, err := store.Open(store.Config{
		NodeID:      cfg.NodeID,
		DataDir:     filepath.Join(cfg.DataDir, "store"),
		RaftAddr:    cfg.Raft.Addr,
		ForwardAddr: cfg.Raft.ForwardAddr,
		Bootstrap:   cfg.Raft.Bootstrap,
		Identity:    ident,
		JoinSecrets: siteK.joinSecrets,
		OnSecrets:   siteK.update,
		Version:     version,
		Env:         func() map[string]string { return a.envP.Load().digests() },
		// Renewed certificates and CA rotation steps are saved before use.
		OnIdentity:    func(id *pki.Identity) error { return id.Save(cfg.Raft.TLSDir) },
		CertLifetime:  cfg.Raft.CertLifetime,
		RenewFraction: cfg.Raft.CertRenewFraction,
		// Set in New below, before Run serves the forward RPC.
		PeerFiles: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { a.peerFiles.ServeHTTP(w, r) }),
	}, log, reg)
	if err != nil {
		return nil, err
	}
	a.Store = st
	siteK.st = st
	ok := false
	defer func() {
		if !ok {
			a.close()
		}
	}()

	sealer := siteK.sealer
	bmcCtl, err := bmc.New(bmc.Config{
		CallTimeout:        cfg.BMC.Timeout,
		Retries:            cfg.BMC.Retries,
		MaxConcurrent:      cfg.BMC.Concurrency,
		IPMICipherSuite:    cfg.BMC.IPMICipherSuite,
		IPMIIgnoreValidBit: cfg.BMC.IPMIIgnoreValidBit,
		Logger:             log,
	}, reg)
	if err != nil {
		return nil, err
	}

	catalog, err := httpboot.OpenCatalog(cfg.Boot.ImageDir)
	if err != nil {
		return nil, fmt.Errorf("image catalog %s: %w", cfg.Boot.ImageDir, err)
	}
	baseURL := "http://" + cfg.Boot.HTTPAddr
	var agentEndpoints []string
	if len(cfg.Boot.PeerHTTPAddrs) > 0 {
		agentEndpoints = append(agentEndpoints, baseURL)
		for _, p := range cfg.Boot.PeerHTTPAddrs {
			agentEndpoints = append(agentEndpoints, "http://"+p)
		}
	}

	bmcA := &bmcAdapter{st: st, sealer: sealer, ctl: bmcCtl}
	a.bmc = bmcA
	attestCfg, err := cfg.Attest.lifecycle()
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	life, err := lifecycle.New(lifecycle.Config{
		ImageBaseURL:       baseURL,
		ImageHere:          func(img store.Image) bool { return a.images.holds(img) }, // set below, before Run
		UnknownMachines:    cfg.Boot.UnknownMachines,
		DefaultStepTimeout: cfg.Lifecycle.StepTimeout,
		BootTimeout:        cfg.Lifecycle.BootTimeout,
		MinReadMBps:        cfg.Lifecycle.MinReadMBps,
		AgentPollAfter:     cfg.Lifecycle.AgentPollAfter,
		AgentEndpoints:     agentEndpoints,
		RebootTimeout:      cfg.Lifecycle.RebootTimeout,
		FirstBootTimeout:   cfg.Lifecycle.FirstBootTimeout,
		Remediation:        cfg.Remediation.lifecycle(),
		Attest:             attestCfg,
		BurnIn:             cfg.BurnIn.lifecycle(),
		StepDeadlines:      cfg.BurnIn.stepDeadlines(),
		Health:             healthFor(bmcA),
		Sealer:             SealerFor(sealer),
		Catalog:            CatalogFor(catalog),
	}, st, bmcA, reg)
	if err != nil {
		return nil, err
	}
	a.life = life
	a.images = newImageSync(st, catalog, life, cfg.NodeID, log)
	a.peerFiles = a.images.peerHandler()

	tokens := make([]api.TokenSpec, 0, len(cfg.API.Tokens)+1)
	admin, err := api.LoadOrCreateAdminToken(cfg.API.AdminTokenFile)
	if err != nil {
		return nil, fmt.Errorf("admin token %s: %w", cfg.API.AdminTokenFile, err)
	}
	tokens = append(tokens, api.TokenSpec{Name: "admin", Role: api.RoleAdmin, SHA256: api.HashToken(admin)})
	for _, t := range cfg.API.Tokens {
		tokens = append(tokens, api.TokenSpec{Name: t.Name, Role: api.Role(t.Role), SHA256: t.SHA256})
	}
	apiB := newAPIBackend(lifecycle.NewService(life, st), st, siteK, version)
	apiB.images = a.images
	apiB.bk = &backupSource{st: st, catalog: catalog, envDir: cfg.Boot.EnvDir, version: version}
	apiSrv, err := api.New(api.Config{
		Addr:            cfg.API.Addr,
		TLSCert:         cfg.API.TLSCert,
		TLSKey:          cfg.API.TLSKey,
		Tokens:          tokens,
		BodyIdleTimeout: cfg.API.BodyIdleTimeout,
		JSONBodyTimeout: cfg.API.JSONBodyTimeout,
		ErrorClasses:    ErrorClasses(),
	}, apiB, reg, log)
	if err != nil {
		return nil, err
	}
	a.api = apiSrv
	if !cfg.API.UI.Disabled {
		webUI, err := ui.New(ui.Config{API: apiSrv, Keys: siteK.keyring, SessionTTL: cfg.API.UI.SessionTTL,
			Secure: cfg.API.TLSCert != ""}, log)
		if err != nil {
			return nil, err
		}
		apiSrv.Mount(ui.Prefix, webUI, true)
	}

	a.boot, err = httpboot.New(httpboot.Config{
		Addr:          cfg.Boot.HTTPAddr,
		BaseURL:       baseURL,
		AgentURL:      baseURL,
		EnvDir:        cfg.Boot.EnvDir,
		ImageDir:      cfg.Boot.ImageDir,
		UnknownPolicy: cfg.Boot.UnknownMachines,
		KernelArgs:    cfg.Boot.KernelArgs,
	}, &bootBackend{life: life}, reg)
	if err != nil {
		return nil, err
	}
	if a.env, err = newEnvCheck(st, a.boot, cfg.NodeID, log, reg); err != nil {
		return nil, err
	}
	a.envP.Store(a.env)
	apiB.env = a.env
	if a.bootLn, err = net.Listen("tcp", cfg.Boot.HTTPAddr); err != nil {
		return nil, fmt.Errorf("boot http %s: %w", cfg.Boot.HTTPAddr, err)
	}

	if cfg.Boot.Interface != "" {
		a.tftp, err = tftp.New(tftp.Config{Addr: cfg.Boot.TFTPAddr}, reg)
		if err != nil {
			return nil, err
		}
	}
	if cfg.Boot.DHCP.Enabled {
		dc := dhcp.DefaultConfig()
		dc.Interface = cfg.Boot.Interface
		dc.ServerIP = netip.MustParseAddr(cfg.Boot.ServerIP)
		dc.Mode = dhcp.Mode(cfg.Boot.DHCP.Mode)
		if cfg.Boot.DHCP.Port != 0 {
			dc.ListenPort = cfg.Boot.DHCP.Port
		}
		if w := cfg.Boot.DHCP.BalanceWait; w != nil {
			dc.BalanceWait = *w
		}
		dc.HTTPBootURL = baseURL
		for _, s := range cfg.Boot.DHCP.Subnets {
			sn, err := s.dhcpSubnet()
			if err != nil {
				return nil, err
			}
			dc.Subnets = append(dc.Subnets, sn)
		}
		a.dhcpB = &dhcpBackend{
			st:          st,
			discover:    life,
			scriptURL:   func(mac string) string { return baseURL + "/ipxe/" + mac },
			log:         log.With("component", "dhcp"),
			discoveries: make(chan discovery, 256),
		}
		a.dhcp, err = dhcp.New(dc, a.dhcpB, reg)
		if err != nil {
			return nil, err
		}
	}
	ok = true
	return a, nil
}

func (s SubnetConfig) dhcpSubnet() (dhcp.Subnet, error) {
	var sn dhcp.Subnet
	var err error
	if sn.CIDR, err = netip.ParsePrefix(s.CIDR); err != nil {
		return sn, fmt.Errorf("config: boot.dhcp.subnets cidr: %w", err)
	}
	parse := func(key, v string) (netip.Addr, error) {
		if v == "" {
			return netip.Addr{}, nil
		}
		ip, err := netip.ParseAddr(v)
		if err != nil {
			return ip, fmt.Errorf("config: boot.dhcp.subnets %s: %w", key, err)
		}
		return ip, nil
	}
	if sn.Router, err = parse("router", s.Router); err != nil {
		return sn, err
	}
	if sn.PoolStart, err = parse("pool_start", s.PoolStart); err != nil {
		return sn, err
	}
	if sn.PoolEnd, err = parse("pool_end", s.PoolEnd); err != nil {
		return sn, err
	}
	for _, d := range s.DNS {
		ip, err := parse("dns", d)
		if err != nil {
			return sn, err
		}
		sn.DNS = append(sn.DNS, ip)
	}
	sn.LeaseTime = s.LeaseTime
	return sn, nil
}

// Registry is the appliance's Prometheus registry (served at /metrics).
func (a *Appliance) Registry() *prometheus.Registry { return a.reg }

// Run serves until ctx ends or a service fails, then stops everything and
// closes the store.
func (a *Appliance) Run(ctx context.Context) error {
	defer a.close()
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return a.Store.Run(ctx, a.log) })
	if len(a.cfg.Raft.Join) > 0 && !a.Store.HasState() {
		g.Go(func() error { return a.Store.JoinVia(ctx, a.cfg.Raft.Join) })
	}
	g.Go(func() error { return a.life.Run(ctx, a.log) })
	g.Go(func() error {
		return (&eventTrimmer{st: a.Store, cfg: a.cfg.Store.Events, now: time.Now}).Run(ctx, a.log)
	})
	g.Go(func() error { return a.images.Run(ctx) })
	g.Go(func() error { return a.env.Run(ctx) })
	g.Go(func() error { return a.api.Run(ctx, a.log) })
	g.Go(func() error { return a.serveBoot(ctx) })
	if a.tftp != nil {
		g.Go(func() error { return a.tftp.Run(ctx, a.log) })
	}
	if a.dhcp != nil {
		g.Go(func() error { return a.dhcpB.runDiscoveries(ctx) })
		g.Go(func() error { return a.dhcp.Run(ctx, a.log) })
	}
	a.log.Info("kiln appliance started", "node", a.cfg.NodeID, "version", a.version,
		"api", a.cfg.API.Addr, "boot_http", a.cfg.Boot.HTTPAddr, "interface", a.cfg.Boot.Interface,
		"dhcp", a.dhcp != nil, "tftp", a.tftp != nil, "data_dir", a.cfg.DataDir)
	err := g.Wait()
	if errors.Is(err, context.Canceled) {
		err = nil
	}
	return err
}

// Limits of the boot listener's http.Server: httpboot's defaults. It sets
// no ReadTimeout: httpboot refuses every request body unread, and the agent
// routes bound theirs per read (api/body.go).
const (
	bootReadHeaderTimeout = httpboot.DefaultReadHeaderTimeout
	bootIdleTimeout       = httpboot.DefaultIdleTimeout
	bootMaxHeaderBytes    = httpboot.DefaultMaxHeaderBytes
	bootShutdownTimeout   = 5 * time.Second
)

// serveBoot serves the provisioning network's HTTP: the agent endpoints of the
// REST API under /v1/agent/ (the in-RAM agent reaches the appliance here), and
// everything else from httpboot (scripts, environment, images, iPXE).
func (a *Appliance) serveBoot(ctx context.Context) error {
	apiH := a.api.Handler()
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/v1/agent/") {
			apiH.ServeHTTP(w, r)
			return
		}
		a.boot.ServeHTTP(w, r)
	})
	srv := &http.Server{Handler: h, ReadHeaderTimeout: bootReadHeaderTimeout, IdleTimeout: bootIdleTimeout,
		MaxHeaderBytes: bootMaxHeaderBytes, ErrorLog: slog.NewLogLogger(a.log.Handler(), slog.LevelWarn)}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(a.bootLn) }()
	select {
	case err := <-errc:
		return fmt.Errorf("boot http: %w", err)
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.Background(), bootShutdownTimeout)
		defer cancel()
		_ = srv.Shutdown(sctx)
		<-errc
		return nil
	}
}

func (a *Appliance) close() {
	if a.bootLn != nil {
		_ = a.bootLn.Close()
	}
	if a.Store != nil {
		if err := a.Store.Close(); err != nil {
			a.log.Warn("closing store", "err", err)
		}
	}
}

// ErrorClasses maps the sentinel errors of the domain and of the parts it
// drives (lifecycle, the image catalog, the BMC adapter) to the REST API's
// statuses and codes (api.Config.ErrorClasses): the one table, used by
// New and by the tests of the API over the real domain.
func ErrorClasses() []api.ErrorClass {
	return []api.ErrorClass{
		{Err: lifecycle.ErrWrongState, Status: http.StatusConflict, Code: "wrong_state"},
		{Err: lifecycle.ErrNoBaseline, Status: http.StatusNotFound, Code: "no_baseline"},
		{Err: lifecycle.ErrFirmwareUnsupported, Status: http.StatusNotImplemented, Code: "unsupported"},
		{Err: lifecycle.ErrInvalid, Status: http.StatusBadRequest, Code: "invalid"},
		{Err: lifecycle.ErrBadReport, Status: http.StatusBadRequest, Code: "bad_report"},
		{Err: lifecycle.ErrDigest, Status: http.StatusBadRequest, Code: "digest_mismatch"},
		{Err: lifecycle.ErrImageFormat, Status: http.StatusBadRequest, Code: "format_mismatch"},
		{Err: lifecycle.ErrImageSize, Status: http.StatusBadRequest, Code: "size_mismatch"},
		{Err: lifecycle.ErrNotEnough, Status: http.StatusConflict, Code: "not_enough_machines"},
		{Err: lifecycle.ErrMachineMismatch, Status: http.StatusForbidden, Code: "machine_mismatch"},
		{Err: lifecycle.ErrNoSealer, Status: http.StatusServiceUnavailable, Code: "no_sealer"},
		{Err: lifecycle.ErrCredentialsRefused, Status: http.StatusForbidden, Code: "credentials_refused"},
		{Err: lifecycle.ErrNoCatalog, Status: http.StatusServiceUnavailable, Code: "no_catalog"},
		{Err: ErrNoBMC, Status: http.StatusConflict, Code: "no_bmc"},
		// The catalog's upload errors are the client's: a body whose
		// SHA-256 or length differs from the declared one, or a bad name.
		{Err: httpboot.ErrDigestMismatch, Status: http.StatusBadRequest, Code: "digest_mismatch"},
		{Err: httpboot.ErrSizeMismatch, Status: http.StatusBadRequest, Code: "size_mismatch"},
		{Err: httpboot.ErrBadDigest, Status: http.StatusBadRequest, Code: "invalid"},
		{Err: httpboot.ErrBadName, Status: http.StatusBadRequest, Code: "invalid"},
	}
}
