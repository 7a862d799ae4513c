package vbmc

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/subtle"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Errors of the server.
var (
	// ErrConfig is returned by New for an unusable Config.
	ErrConfig = errors.New("vbmc: bad config")
	// ErrQuirk is returned by ParseQuirk for an unknown quirk.
	ErrQuirk = errors.New("vbmc: unknown quirk")
)

// Quirks replays recorded vendor behaviours.
type Quirks struct {
	IgnoreOverride  bool          // "ignore-override": PATCH Boot answers 200, changes nothing
	RejectMode      bool          // "reject-mode": PATCH with BootSourceOverrideMode answers 400, changes nothing
	HalfApply400    bool          // "half-apply-400": PATCH with ≥2 Boot properties applies all but the last (order Target, Enabled, Mode), answers 400
	ErrorOffWhenOff bool          // "error-off-when-off": ForceOff/GracefulShutdown when off answers 409
	Slow            time.Duration // "slow=DURATION": every answer is delayed
	// "bios-config-job" (Dell iDRAC): staged BIOS settings apply at a reset only when a
	// configuration job covers them (firmware.go, patchBIOS)
	BIOSConfigJob bool
}

// ParseQuirk adds one quirk given as on the command line to q.
func ParseQuirk(s string, q *Quirks) error {
	switch {
	case s == "ignore-override":
		q.IgnoreOverride = true
	case s == "reject-mode":
		q.RejectMode = true
	case s == "half-apply-400":
		q.HalfApply400 = true
	case s == "error-off-when-off":
		q.ErrorOffWhenOff = true
	case s == "bios-config-job":
		q.BIOSConfigJob = true
	case strings.HasPrefix(s, "slow="):
		d, err := time.ParseDuration(strings.TrimPrefix(s, "slow="))
		if err != nil || d < 0 {
			return fmt.Errorf("%w: %q", ErrQuirk, s)
		}
		q.Slow = d
	default:
		return fmt.Errorf("%w: %q", ErrQuirk, s)
	}
	return nil
}

// Config configures a Server.
type Config struct {
	// Listen is the TCP address ("127.0.0.1:0" picks a port).
	Listen string
	// Username and Password are the only accepted credentials.
	Username, Password string
	// QEMUArgs is the VM's command line (argv[0] = qemu binary) without -qmp, -serial
	// and -boot, which the server adds.
	QEMUArgs []string
	// StateDir holds the QMP socket and one serial log per power-on.
	StateDir string
	// CertFile/KeyFile: PEM TLS certificate; empty = self-signed, generated at start.
	CertFile, KeyFile string
	// Quirks to replay.
	Quirks Quirks
	// Inventory shown in the ComputerSystem and its EthernetInterfaces.
	Serial, Manufacturer, Model, UUID string
	MACs                              []string
	// InitialMode is the starting BootSourceOverrideMode ("Legacy" default, or "UEFI").
	InitialMode string
	// GracefulTimeout: after GracefulShutdown, quit the VM if still running (default 5s).
	GracefulTimeout time.Duration
	// Systems, when set, are the ComputerSystems served, each backed by its Power,
	// instead of the one qemu-backed system "1" that QEMUArgs, StateDir and the
	// inventory fields above describe (QEMUArgs and StateDir are then not used).
	Systems []SystemConfig
	// NoRequestLog leaves Requests empty (a fleet's BMC would keep every request).
	NoRequestLog bool
	// OnRequest, when set, is called after each handled request (with or without
	// NoRequestLog), from the request's goroutine: a fleet counts BMC actions with it.
	// It must not block.
	OnRequest func(Request)
	// Firmware is the qemu-backed system's initial firmware versions by component
	// (BIOS, BMC, NIC1, Disk1; DefaultFirmware for the others).
	Firmware map[string]string
	// FirmwareUpdateDuration is how long an update task runs after the image is
	// verified (default 2s).
	FirmwareUpdateDuration time.Duration
}

// Boot is one power-on of a system.
type Boot struct {
	System   string    // the system's ID
	Args     []string  // full qemu argv used (qemu-backed system only)
	Override string    // "pxe", "disk" or "" (no override)
	Mode     string    // BootSourceOverrideMode at start
	Serial   string    // serial log path (qemu-backed system only)
	PID      int       // qemu process id (qemu-backed system only)
	Started  time.Time // start time
}

// Request is one handled HTTP request (no bodies, except the Boot property names of a
// PATCH, sorted).
type Request struct {
	Method, Path string
	Status       int
	BootKeys     []string
}

// Power is the machine behind a ComputerSystem of Config.Systems: the server calls it for
// the system's power actions, one call at a time per system. A simulated machine (the
// fleet simulator, deploy/lab/fleetsim) starts its boot in PowerOn and ends it in
// PowerOff; it must not block for long in either.
type Power interface {
	// PowerOn starts the machine. override is the boot override consumed by this start:
	// "pxe", "disk" or "" (none); mode is the BootSourceOverrideMode ("Legacy" or "UEFI").
	PowerOn(override, mode string) error
	// PowerOff stops the machine at once (ForceOff; GracefulShutdown too, which a
	// simulated machine honours at once).
	PowerOff() error
	// PoweredOn reports whether the machine is on.
	PoweredOn() bool
}

// SystemConfig is one ComputerSystem of Config.Systems.
type SystemConfig struct {
	// ID is the path segment of /redfish/v1/Systems/{ID}: 1 to 64 of [A-Za-z0-9_-], unique.
	ID string
	// Addr, when valid, is a local address of the listener's host (a wildcard Listen
	// accepts connections to it): a connection made to Addr sees this system alone in
	// /redfish/v1/Systems, as with one BMC per machine. Kiln's Redfish driver uses the
	// first system of that collection, so each machine is enrolled with its own address.
	// A connection to any other address sees every system.
	Addr netip.Addr
	// Inventory shown in the ComputerSystem and its EthernetInterfaces.
	Serial, Manufacturer, Model, UUID string
	MACs                              []string
	// InitialMode is the starting BootSourceOverrideMode ("Legacy" default, or "UEFI").
	InitialMode string
	// Firmware is the initial firmware versions by component (DefaultFirmware otherwise).
	Firmware map[string]string
	// Power is the machine (required).
	Power Power
}

type bootState struct{ Target, Enabled, Mode string }

// system is one ComputerSystem: its boot override and its machine, a Power or (the
// single system of a Config without Systems) a qemu process.
type system struct {
	cfg SystemConfig

	mu     sync.Mutex
	boot   bootState
	boots  []Boot
	cmd    *exec.Cmd     // qemu-backed only
	exited chan struct{} // qemu-backed only

	health, chassisHealth string     // Status.Health of the system and its chassis (SetHealth)
	logs                  []LogEntry // SEL LogService, oldest first
	nextLog               int

	fw firmwareState // firmware versions and BIOS attributes (firmware.go)
}

// Server is the virtual BMC. Create with New, serve with Run.
type Server struct {
	cfg   Config
	ln    net.Listener
	cert  tls.Certificate
	caPEM []byte

	systems []*system // in Config order
	byID    map[string]*system
	byAddr  map[netip.Addr]*system

	mu       sync.Mutex // reqs, sessions, nextSess
	reqs     []Request
	sessions map[string]string // token -> id
	nextSess int
	log      *slog.Logger

	tasks    map[string]*task // TaskService (firmware.go), guarded by mu
	nextTask int
	runCtx   context.Context // Run's context: update tasks stop with the server
}

var systemIDRe = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// New validates cfg, loads or generates the TLS certificate and binds the listener.
func New(cfg Config) (*Server, error) {
	if cfg.Listen == "" || cfg.Username == "" || cfg.Password == "" {
		return nil, fmt.Errorf("%w: Listen, Username and Password are required", ErrConfig)
	}
	if len(cfg.Systems) == 0 && (len(cfg.QEMUArgs) == 0 || cfg.StateDir == "") {
		return nil, fmt.Errorf("%w: QEMUArgs and StateDir are required without Systems", ErrConfig)
	}
	if cfg.GracefulTimeout == 0 {
		cfg.GracefulTimeout = 5 * time.Second
	}
	if cfg.FirmwareUpdateDuration == 0 {
		cfg.FirmwareUpdateDuration = 2 * time.Second
	}
	s := &Server{cfg: cfg, sessions: map[string]string{}, byID: map[string]*system{}, byAddr: map[netip.Addr]*system{},
		log: slog.New(slog.NewTextHandler(io.Discard, nil)), runCtx: context.Background()}
	systems := cfg.Systems
	if len(systems) == 0 {
		if cfg.UUID == "" {
			cfg.UUID = "5e1f0000-0000-4000-8000-000000000001"
		}
		if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
			return nil, fmt.Errorf("%w: %v", ErrConfig, err)
		}
		systems = []SystemConfig{{ID: "1", Serial: cfg.Serial, Manufacturer: cfg.Manufacturer, Model: cfg.Model,
			UUID: cfg.UUID, MACs: cfg.MACs, InitialMode: cfg.InitialMode, Firmware: cfg.Firmware}}
	}
	for i, sc := range systems {
		if sc.InitialMode == "" {
			sc.InitialMode = "Legacy"
		}
		switch {
		case sc.InitialMode != "Legacy" && sc.InitialMode != "UEFI":
			return nil, fmt.Errorf("%w: system %q: InitialMode %q", ErrConfig, sc.ID, sc.InitialMode)
		case !systemIDRe.MatchString(sc.ID):
			return nil, fmt.Errorf("%w: system ID %q: want 1 to 64 of [A-Za-z0-9_-]", ErrConfig, sc.ID)
		case s.byID[sc.ID] != nil:
			return nil, fmt.Errorf("%w: system ID %q twice", ErrConfig, sc.ID)
		case len(cfg.Systems) > 0 && sc.Power == nil:
			return nil, fmt.Errorf("%w: system %q has no Power", ErrConfig, sc.ID)
		}
		if sc.UUID == "" {
			sc.UUID = fmt.Sprintf("5e1f0000-0000-4000-8000-%012d", i+1)
		}
		for comp, v := range sc.Firmware {
			if _, ok := DefaultFirmware[comp]; !ok || !versionRe.MatchString(v) {
				return nil, fmt.Errorf("%w: system %q: firmware %s=%q", ErrConfig, sc.ID, comp, v)
			}
		}
		sys := &system{cfg: sc, boot: bootState{"None", "Disabled", sc.InitialMode}, health: "OK", chassisHealth: "OK",
			fw: newFirmwareState(sc.Firmware)}
		if sc.Addr.IsValid() {
			if s.byAddr[sc.Addr] != nil {
				return nil, fmt.Errorf("%w: address %s for two systems", ErrConfig, sc.Addr)
			}
			s.byAddr[sc.Addr] = sys
		}
		s.systems = append(s.systems, sys)
		s.byID[sc.ID] = sys
	}
	host, _, err := net.SplitHostPort(cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("%w: listen %q", ErrConfig, cfg.Listen)
	}
	if cfg.CertFile != "" {
		s.cert, err = tls.LoadX509KeyPair(cfg.CertFile, cfg.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrConfig, err)
		}
		s.caPEM, _ = os.ReadFile(cfg.CertFile)
	} else if s.cert, s.caPEM, err = selfSigned(host); err != nil {
		return nil, err
	}
	s.ln, err = net.Listen("tcp", cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("vbmc: listen: %w", err)
	}
	return s, nil
}

func selfSigned(host string) (tls.Certificate, []byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: "kiln vbmc"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(365 * 24 * time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, BasicConstraintsValid: true, IsCA: true,
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("::1")}, DNSNames: []string{"localhost"},
	}
	if ip := net.ParseIP(host); ip != nil && !ip.IsUnspecified() {
		tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
	} else if host != "" && ip == nil {
		tmpl.DNSNames = append(tmpl.DNSNames, host)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	kb, _ := x509.MarshalECPrivateKey(key)
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	c, err := tls.X509KeyPair(certPEM, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}))
	return c, certPEM, err
}

// Addr is the bound "host:port".
func (s *Server) Addr() string { return s.ln.Addr().String() }

// CACertPEM is the PEM certificate clients should trust.
func (s *Server) CACertPEM() []byte { return s.caPEM }

// QMPSocket is the path of the running VM's QMP socket (the qemu-backed system).
func (s *Server) QMPSocket() string { return filepath.Join(s.cfg.StateDir, "qmp.sock") }

// Boots returns every power-on so far, of every system, in the order of each system.
func (s *Server) Boots() []Boot {
	var out []Boot
	for _, sys := range s.systems {
		sys.mu.Lock()
		out = append(out, sys.boots...)
		sys.mu.Unlock()
	}
	return out
}

// Requests returns the handled requests so far (none with Config.NoRequestLog).
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Request(nil), s.reqs...)
}

// Running reports whether the first system's machine is on (the VM process is alive).
func (s *Server) Running() bool {
	sys := s.systems[0]
	sys.mu.Lock()
	defer sys.mu.Unlock()
	return sys.runningLocked()
}

func (sys *system) runningLocked() bool {
	if sys.cfg.Power != nil {
		return sys.cfg.Power.PoweredOn()
	}
	if sys.cmd == nil {
		return false
	}
	select {
	case <-sys.exited:
		return false
	default:
		return true
	}
}

// Run serves HTTPS until ctx ends, then stops the machines and returns nil (or the serve error).
func (s *Server) Run(ctx context.Context, log *slog.Logger) error {
	if log != nil {
		s.log = log.With("component", "vbmc")
	}
	s.runCtx = ctx
	srv := &http.Server{Handler: s.handler(), ReadHeaderTimeout: 10 * time.Second,
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{s.cert}, MinVersion: tls.VersionTLS12},
		ErrorLog:  slog.NewLogLogger(s.log.Handler(), slog.LevelDebug)}
	errc := make(chan error, 1)
	go func() { errc <- srv.ServeTLS(s.ln, "", "") }()
	s.log.Info("vbmc listening", "addr", s.Addr(), "systems", len(s.systems))
	var err error
	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	sctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	_ = srv.Shutdown(sctx)
	for _, sys := range s.systems {
		sys.mu.Lock()
		s.stopLocked(sys, true)
		sys.mu.Unlock()
	}
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}

// consumeOverrideLocked returns the pending override ("pxe", "disk" or "") and clears
// a Once override, as a power-on does.
func (sys *system) consumeOverrideLocked() string {
	override := ""
	if sys.boot.Enabled != "Disabled" {
		switch sys.boot.Target {
		case "Pxe":
			override = "pxe"
		case "Hdd":
			override = "disk"
		}
		if sys.boot.Enabled == "Once" {
			sys.boot.Target, sys.boot.Enabled = "None", "Disabled"
		}
	}
	return override
}

// startLocked powers the system on, applying and consuming a pending boot override:
// Power.PowerOn, or qemu started from Config.QEMUArgs.
func (s *Server) startLocked(sys *system) error {
	if sys.runningLocked() {
		return nil
	}
	s.onPowerOnLocked(sys)
	if p := sys.cfg.Power; p != nil {
		mode := sys.boot.Mode
		override := sys.consumeOverrideLocked()
		if err := p.PowerOn(override, mode); err != nil {
			return err
		}
		sys.boots = append(sys.boots, Boot{System: sys.cfg.ID, Override: override, Mode: mode, Started: time.Now()})
		return nil
	}
	args := append([]string(nil), s.cfg.QEMUArgs...)
	sock := s.QMPSocket()
	_ = os.Remove(sock)
	serial := filepath.Join(s.cfg.StateDir, fmt.Sprintf("serial-%d.log", len(sys.boots)+1))
	args = append(args, "-qmp", "unix:"+sock+",server=on,wait=off", "-serial", "file:"+serial)
	args = append(args, smbiosArgs(sys)...)
	mode := sys.boot.Mode
	override := sys.consumeOverrideLocked()
	switch override {
	case "pxe":
		args = append(args, "-boot", "once=n")
	case "disk":
		args = append(args, "-boot", "once=c")
	}
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stdin = nil
	out, err := os.OpenFile(filepath.Join(s.cfg.StateDir, "qemu.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		out.Close()
		return err
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); out.Close(); close(exited) }()
	sys.cmd, sys.exited = cmd, exited
	sys.boots = append(sys.boots, Boot{System: sys.cfg.ID, Args: args, Override: override, Mode: mode, Serial: serial,
		PID: cmd.Process.Pid, Started: time.Now()})
	s.log.Info("vm started", "pid", cmd.Process.Pid, "override", override)
	// wait (briefly) for the QMP socket so that observers can query at once
	for i := 0; i < 100; i++ {
		if _, err := os.Stat(sock); err == nil {
			break
		}
		select {
		case <-exited:
			return fmt.Errorf("vbmc: qemu exited at start (see %s)", filepath.Join(s.cfg.StateDir, "qemu.log"))
		case <-time.After(20 * time.Millisecond):
		}
	}
	return nil
}

// stopLocked powers the system off: Power.PowerOff, or QMP quit to qemu, then SIGKILL
// if it is still there after 3 s (at once when force).
func (s *Server) stopLocked(sys *system, force bool) {
	if !sys.runningLocked() {
		return
	}
	if p := sys.cfg.Power; p != nil {
		if err := p.PowerOff(); err != nil {
			s.log.Warn("power off failed", "system", sys.cfg.ID, "error", err)
		}
		return
	}
	cmd, exited := sys.cmd, sys.exited
	if !force {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, _ = QMP(ctx, s.QMPSocket(), "quit", nil)
		cancel()
	}
	select {
	case <-exited:
	case <-time.After(3 * time.Second):
		_ = cmd.Process.Kill()
		<-exited
	}
	if force {
		_ = cmd.Process.Kill()
		<-exited
	}
	s.log.Info("vm stopped", "pid", cmd.Process.Pid)
}

func (sys *system) overridePendingLocked() bool {
	return sys.boot.Enabled != "Disabled" && (sys.boot.Target == "Pxe" || sys.boot.Target == "Hdd")
}

// visible is the systems a request may see: the one whose Addr the connection was
// made to, else all.
func (s *Server) visible(r *http.Request) []*system {
	if len(s.byAddr) > 0 {
		if la, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr); ok {
			if ta, ok := la.(*net.TCPAddr); ok {
				if a, ok := netip.AddrFromSlice(ta.IP); ok {
					if sys := s.byAddr[a.Unmap()]; sys != nil {
						return []*system{sys}
					}
				}
			}
		}
	}
	return s.systems
}

// sys is the system named by the request's {id}, if the request may see it.
func (s *Server) sys(r *http.Request) *system {
	for _, sys := range s.visible(r) {
		if sys.cfg.ID == r.PathValue("id") {
			return sys
		}
	}
	return nil
}

func systemPath(sys *system) string { return "/redfish/v1/Systems/" + sys.cfg.ID }

type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(c int) { w.status = c; w.ResponseWriter.WriteHeader(c) }

func (s *Server) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /redfish", s.json(func() any { return map[string]string{"v1": "/redfish/v1/"} }))
	mux.HandleFunc("GET /redfish/v1", s.serviceRoot)
	mux.HandleFunc("GET /redfish/v1/", s.serviceRoot)
	mux.HandleFunc("POST /redfish/v1/SessionService/Sessions", s.createSession)
	mux.HandleFunc("GET /redfish/v1/SessionService", s.authed(s.json(func() any {
		return map[string]any{"@odata.id": "/redfish/v1/SessionService", "@odata.type": "#SessionService.v1_1_8.SessionService",
			"Id": "SessionService", "Name": "Session Service", "ServiceEnabled": true, "SessionTimeout": 600,
			"Sessions": odata("/redfish/v1/SessionService/Sessions")}
	})))
	mux.HandleFunc("GET /redfish/v1/SessionService/Sessions", s.authed(s.json(func() any {
		s.mu.Lock()
		defer s.mu.Unlock()
		var ids []string
		for _, id := range s.sessions {
			ids = append(ids, "/redfish/v1/SessionService/Sessions/"+id)
		}
		sort.Strings(ids)
		return collection("/redfish/v1/SessionService/Sessions", "#SessionCollection.SessionCollection", ids)
	})))
	mux.HandleFunc("GET /redfish/v1/SessionService/Sessions/{id}", s.authed(func(w http.ResponseWriter, r *http.Request) {
		id := r.PathValue("id")
		writeJSON(w, 200, map[string]any{"@odata.id": "/redfish/v1/SessionService/Sessions/" + id,
			"@odata.type": "#Session.v1_3_0.Session", "Id": id, "Name": "Session", "UserName": s.cfg.Username})
	}))
	mux.HandleFunc("DELETE /redfish/v1/SessionService/Sessions/{id}", s.authed(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		found := false
		for tok, id := range s.sessions {
			if id == r.PathValue("id") {
				delete(s.sessions, tok)
				found = true
			}
		}
		s.mu.Unlock()
		if !found {
			redfishError(w, 404, "Base.1.8.ResourceMissingAtURI", "no such session")
			return
		}
		w.WriteHeader(204)
	}))
	mux.HandleFunc("GET /redfish/v1/Systems", s.authed(func(w http.ResponseWriter, r *http.Request) {
		var ids []string
		for _, sys := range s.visible(r) {
			ids = append(ids, systemPath(sys))
		}
		writeJSON(w, 200, collection("/redfish/v1/Systems", "#ComputerSystemCollection.ComputerSystemCollection", ids))
	}))
	mux.HandleFunc("GET /redfish/v1/Systems/{id}", s.authed(s.onSystem(func(w http.ResponseWriter, r *http.Request, sys *system) {
		writeJSON(w, 200, s.system(sys))
	})))
	mux.HandleFunc("PATCH /redfish/v1/Systems/{id}", s.authed(s.onSystem(s.patchSystem)))
	mux.HandleFunc("POST /redfish/v1/Systems/{id}/Actions/ComputerSystem.Reset", s.authed(s.onSystem(s.reset)))
	mux.HandleFunc("GET /redfish/v1/Systems/{id}/EthernetInterfaces", s.authed(s.onSystem(func(w http.ResponseWriter, r *http.Request, sys *system) {
		var ids []string
		for i := range sys.cfg.MACs {
			ids = append(ids, fmt.Sprintf("%s/EthernetInterfaces/%d", systemPath(sys), i+1))
		}
		writeJSON(w, 200, collection(systemPath(sys)+"/EthernetInterfaces", "#EthernetInterfaceCollection.EthernetInterfaceCollection", ids))
	})))
	mux.HandleFunc("GET /redfish/v1/Systems/{id}/EthernetInterfaces/{n}", s.authed(s.onSystem(func(w http.ResponseWriter, r *http.Request, sys *system) {
		n, err := strconv.Atoi(r.PathValue("n"))
		if err != nil || n < 1 || n > len(sys.cfg.MACs) {
			redfishError(w, 404, "Base.1.8.ResourceMissingAtURI", "no such interface")
			return
		}
		id := systemPath(sys) + "/EthernetInterfaces/" + r.PathValue("n")
		writeJSON(w, 200, map[string]any{"@odata.id": id, "@odata.type": "#EthernetInterface.v1_6_0.EthernetInterface",
			"Id": r.PathValue("n"), "Name": "NIC " + r.PathValue("n"), "MACAddress": sys.cfg.MACs[n-1],
			"PermanentMACAddress": sys.cfg.MACs[n-1], "Status": map[string]string{"State": "Enabled", "Health": "OK"}})
	})))
	systemLinks := func(r *http.Request) []any {
		var out []any
		for _, sys := range s.visible(r) {
			out = append(out, odata(systemPath(sys)))
		}
		return out
	}
	chassisLinks := func(r *http.Request) []any {
		var out []any
		for _, sys := range s.visible(r) {
			out = append(out, odata(chassisPath(sys)))
		}
		return out
	}
	s.healthRoutes(mux)
	s.firmwareRoutes(mux)
	mux.HandleFunc("GET /redfish/v1/Managers", s.authed(s.json(func() any {
		return collection("/redfish/v1/Managers", "#ManagerCollection.ManagerCollection", []string{"/redfish/v1/Managers/1"})
	})))
	mux.HandleFunc("GET /redfish/v1/Managers/1", s.authed(func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, 200, map[string]any{"@odata.id": "/redfish/v1/Managers/1", "@odata.type": "#Manager.v1_10_0.Manager",
			"Id": "1", "Name": "Kiln vbmc", "ManagerType": "BMC", "FirmwareVersion": "kiln-vbmc-1",
			"Status": map[string]string{"State": "Enabled", "Health": "OK"},
			"Links": map[string]any{"ManagerForServers": systemLinks(r),
				"ManagerForChassis": chassisLinks(r)}})
	}))
	mux.HandleFunc("GET /redfish/v1/Chassis", s.authed(func(w http.ResponseWriter, r *http.Request) {
		var ids []string
		for _, sys := range s.visible(r) {
			ids = append(ids, chassisPath(sys))
		}
		writeJSON(w, 200, collection("/redfish/v1/Chassis", "#ChassisCollection.ChassisCollection", ids))
	}))
	// one Chassis per system, with the system's ID
	mux.HandleFunc("GET /redfish/v1/Chassis/{id}", s.authed(s.onSystem(func(w http.ResponseWriter, r *http.Request, sys *system) {
		sys.mu.Lock()
		h := sys.chassisHealth
		sys.mu.Unlock()
		writeJSON(w, 200, map[string]any{"@odata.id": chassisPath(sys), "@odata.type": "#Chassis.v1_14_0.Chassis",
			"Id": sys.cfg.ID, "Name": "Chassis", "ChassisType": "RackMount", "SerialNumber": sys.cfg.Serial,
			"Manufacturer": sys.cfg.Manufacturer, "Model": sys.cfg.Model, "PowerState": sys.powerState(),
			"Status": status(h),
			"Links": map[string]any{"ComputerSystems": []any{odata(systemPath(sys))},
				"ManagedBy": []any{odata("/redfish/v1/Managers/1")}}})
	})))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sw := &statusWriter{ResponseWriter: w, status: 200}
		if d := s.cfg.Quirks.Slow; d > 0 {
			select {
			case <-time.After(d):
			case <-r.Context().Done():
				return
			}
		}
		limit := int64(64 << 10)
		if r.URL.Path == "/redfish/v1/UpdateService/upload" {
			limit = maxFirmwareImage + 1<<20
		}
		r.Body = http.MaxBytesReader(w, r.Body, limit)
		keys := new([]string)
		r = r.WithContext(context.WithValue(r.Context(), bootKeysCtx{}, keys))
		mux.ServeHTTP(sw, r)
		if !s.cfg.NoRequestLog {
			s.mu.Lock()
			s.reqs = append(s.reqs, Request{Method: r.Method, Path: r.URL.Path, Status: sw.status, BootKeys: *keys})
			s.mu.Unlock()
		}
		if s.cfg.OnRequest != nil {
			s.cfg.OnRequest(Request{Method: r.Method, Path: r.URL.Path, Status: sw.status, BootKeys: *keys})
		}
	})
}

type bootKeysCtx struct{}

func odata(id string) map[string]string { return map[string]string{"@odata.id": id} }

func collection(id, typ string, members []string) map[string]any {
	ms := []any{}
	for _, m := range members {
		ms = append(ms, odata(m))
	}
	return map[string]any{"@odata.id": id, "@odata.type": typ, "Name": "Collection", "Members": ms,
		"Members@odata.count": len(ms)}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("OData-Version", "4.0")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// redfishError writes a DSP0266 §9.6 error response.
func redfishError(w http.ResponseWriter, status int, id, msg string) {
	writeJSON(w, status, map[string]any{"error": map[string]any{"code": id, "message": msg,
		"@Message.ExtendedInfo": []any{map[string]any{"MessageId": id, "Message": msg, "Severity": "Warning"}}}})
}

// onSystem resolves {id} to a system the request may see (404 otherwise).
func (s *Server) onSystem(h func(http.ResponseWriter, *http.Request, *system)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		sys := s.sys(r)
		if sys == nil {
			redfishError(w, 404, "Base.1.8.ResourceMissingAtURI", "no such system")
			return
		}
		h(w, r, sys)
	}
}

func (s *Server) json(f func() any) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) { writeJSON(w, 200, f()) }
}

func (s *Server) serviceRoot(w http.ResponseWriter, r *http.Request) {
	if p := r.URL.Path; p != "/redfish/v1" && p != "/redfish/v1/" {
		redfishError(w, 404, "Base.1.8.ResourceMissingAtURI", "not found")
		return
	}
	writeJSON(w, 200, map[string]any{"@odata.id": "/redfish/v1", "@odata.type": "#ServiceRoot.v1_11_0.ServiceRoot",
		"Id": "RootService", "Name": "Kiln virtual BMC", "RedfishVersion": "1.11.0", "UUID": s.visible(r)[0].cfg.UUID,
		"Systems": odata("/redfish/v1/Systems"), "Managers": odata("/redfish/v1/Managers"),
		"Chassis": odata("/redfish/v1/Chassis"), "SessionService": odata("/redfish/v1/SessionService"),
		"UpdateService": odata("/redfish/v1/UpdateService"), "TaskService": odata("/redfish/v1/TaskService"),
		"Links": map[string]any{"Sessions": odata("/redfish/v1/SessionService/Sessions")}})
}

func eq(a, b string) bool { return subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1 }

func (s *Server) authed(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		ok := false
		if tok := r.Header.Get("X-Auth-Token"); tok != "" {
			s.mu.Lock()
			_, ok = s.sessions[tok]
			s.mu.Unlock()
		} else if u, p, has := r.BasicAuth(); has {
			ok = eq(u, s.cfg.Username) && eq(p, s.cfg.Password)
		}
		if !ok {
			w.Header().Set("WWW-Authenticate", `Basic realm="vbmc"`)
			redfishError(w, 401, "Base.1.8.NoValidSession", "authentication required")
			return
		}
		h(w, r)
	}
}

func (s *Server) createSession(w http.ResponseWriter, r *http.Request) {
	var body struct{ UserName, Password string }
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
		redfishError(w, 400, "Base.1.8.MalformedJSON", "malformed JSON")
		return
	}
	if !eq(body.UserName, s.cfg.Username) || !eq(body.Password, s.cfg.Password) {
		redfishError(w, 401, "Base.1.8.NoValidSession", "invalid credentials")
		return
	}
	tb := make([]byte, 16)
	_, _ = rand.Read(tb)
	tok := hex.EncodeToString(tb)
	s.mu.Lock()
	s.nextSess++
	id := strconv.Itoa(s.nextSess)
	s.sessions[tok] = id
	s.mu.Unlock()
	loc := "/redfish/v1/SessionService/Sessions/" + id
	w.Header().Set("X-Auth-Token", tok)
	w.Header().Set("Location", loc)
	writeJSON(w, 201, map[string]any{"@odata.id": loc, "@odata.type": "#Session.v1_3_0.Session", "Id": id,
		"Name": "Session", "UserName": body.UserName})
}

func (sys *system) powerState() string {
	sys.mu.Lock()
	defer sys.mu.Unlock()
	if sys.runningLocked() {
		return "On"
	}
	return "Off"
}

var resetTypes = []string{"On", "ForceOff", "GracefulShutdown", "ForceRestart", "GracefulRestart", "PowerCycle", "ForceOn", "PushPowerButton"}

func (s *Server) system(sys *system) any {
	sys.mu.Lock()
	b, h, biosVersion := sys.boot, sys.health, sys.fw.versions["BIOS"]
	sys.mu.Unlock()
	c := sys.cfg
	p := systemPath(sys)
	return map[string]any{"@odata.id": p, "@odata.type": "#ComputerSystem.v1_13_0.ComputerSystem",
		"Id": c.ID, "Name": "vbmc system " + c.ID, "SystemType": "Virtual", "Manufacturer": c.Manufacturer,
		"Model": c.Model, "SerialNumber": c.Serial, "UUID": c.UUID, "PowerState": sys.powerState(),
		"Status": status(h), "BiosVersion": biosVersion, "Bios": odata(p + "/Bios"),
		"Boot": map[string]any{"BootSourceOverrideTarget": b.Target, "BootSourceOverrideEnabled": b.Enabled,
			"BootSourceOverrideMode":                           b.Mode,
			"BootSourceOverrideTarget@Redfish.AllowableValues": []string{"None", "Pxe", "Hdd", "Cd", "BiosSetup"}},
		"EthernetInterfaces": odata(p + "/EthernetInterfaces"), "LogServices": odata(p + "/LogServices"),
		"Links": map[string]any{"ManagedBy": []any{odata("/redfish/v1/Managers/1")},
			"Chassis": []any{odata(chassisPath(sys))}},
		"Actions": map[string]any{"#ComputerSystem.Reset": map[string]any{
			"target":                            p + "/Actions/ComputerSystem.Reset",
			"ResetType@Redfish.AllowableValues": resetTypes}},
	}
}

// BootPatch is the validated Boot part of a PATCH to the ComputerSystem, in the order
// the half-apply quirk applies it.
type BootPatch struct {
	Keys   []string          // present property names in order Target, Enabled, Mode
	Values map[string]string // property -> value
}

var bootAllowed = map[string][]string{
	"BootSourceOverrideTarget":  {"None", "Pxe", "Hdd", "Cd", "BiosSetup"},
	"BootSourceOverrideEnabled": {"Disabled", "Once", "Continuous"},
	"BootSourceOverrideMode":    {"UEFI", "Legacy"},
}

// ParseBootPatch strictly parses a PATCH body {"Boot": {...}}: only the three override
// properties, string values from their enums (DSP2046 ComputerSystem.v1 Boot).
func ParseBootPatch(body []byte) (BootPatch, error) {
	var doc map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(&doc); err != nil {
		return BootPatch{}, fmt.Errorf("malformed JSON: %v", err)
	}
	if dec.More() {
		return BootPatch{}, errors.New("trailing data")
	}
	rawBoot, ok := doc["Boot"]
	if !ok || len(doc) != 1 {
		return BootPatch{}, errors.New("only the Boot property may be patched")
	}
	var boot map[string]json.RawMessage
	if err := json.Unmarshal(rawBoot, &boot); err != nil || boot == nil {
		return BootPatch{}, errors.New("Boot must be an object")
	}
	bp := BootPatch{Values: map[string]string{}}
	for k, raw := range boot {
		allowed, known := bootAllowed[k]
		if !known {
			return BootPatch{}, fmt.Errorf("property %s is unknown or read-only", k)
		}
		var v string
		if err := json.Unmarshal(raw, &v); err != nil {
			return BootPatch{}, fmt.Errorf("property %s must be a string", k)
		}
		okv := false
		for _, a := range allowed {
			okv = okv || a == v
		}
		if !okv {
			return BootPatch{}, fmt.Errorf("value %q not allowed for %s", v, k)
		}
		bp.Values[k] = v
	}
	for _, k := range []string{"BootSourceOverrideTarget", "BootSourceOverrideEnabled", "BootSourceOverrideMode"} {
		if _, ok := bp.Values[k]; ok {
			bp.Keys = append(bp.Keys, k)
		}
	}
	if len(bp.Keys) == 0 {
		return BootPatch{}, errors.New("empty Boot")
	}
	return bp, nil
}

func (sys *system) applyLocked(k, v string) {
	switch k {
	case "BootSourceOverrideTarget":
		sys.boot.Target = v
	case "BootSourceOverrideEnabled":
		sys.boot.Enabled = v
	case "BootSourceOverrideMode":
		sys.boot.Mode = v
	}
}

func (s *Server) patchSystem(w http.ResponseWriter, r *http.Request, sys *system) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		redfishError(w, 400, "Base.1.8.MalformedJSON", "body too large or unreadable")
		return
	}
	bp, err := ParseBootPatch(body)
	if err != nil {
		redfishError(w, 400, "Base.1.8.PropertyValueNotInList", err.Error())
		return
	}
	if k, ok := r.Context().Value(bootKeysCtx{}).(*[]string); ok {
		*k = append([]string(nil), bp.Keys...)
	}
	q := s.cfg.Quirks
	sys.mu.Lock()
	defer sys.mu.Unlock()
	if _, hasMode := bp.Values["BootSourceOverrideMode"]; q.RejectMode && hasMode {
		redfishError(w, 400, "Base.1.8.PropertyNotWritable", "The property BootSourceOverrideMode is a read only property and cannot be assigned a value.")
		return
	}
	if q.IgnoreOverride {
		w.WriteHeader(204)
		return
	}
	if q.HalfApply400 && len(bp.Keys) >= 2 {
		for _, k := range bp.Keys[:len(bp.Keys)-1] {
			sys.applyLocked(k, bp.Values[k])
		}
		redfishError(w, 400, "Base.1.8.InternalError", "The request failed due to an internal service error.")
		return
	}
	for _, k := range bp.Keys {
		sys.applyLocked(k, bp.Values[k])
	}
	w.WriteHeader(204)
}

func (s *Server) reset(w http.ResponseWriter, r *http.Request, sys *system) {
	var body struct{ ResetType string }
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
		redfishError(w, 400, "Base.1.8.MalformedJSON", "malformed JSON")
		return
	}
	sys.mu.Lock()
	defer sys.mu.Unlock()
	on := sys.runningLocked()
	simulated := sys.cfg.Power != nil
	var err error
	switch body.ResetType {
	case "On", "ForceOn":
		err = s.startLocked(sys)
	case "ForceOff", "GracefulShutdown":
		if !on {
			if s.cfg.Quirks.ErrorOffWhenOff {
				redfishError(w, 409, "Base.1.8.ActionNotSupported", "The system is already powered off.")
				return
			}
			break
		}
		if body.ResetType == "ForceOff" || simulated {
			s.stopLocked(sys, false)
			break
		}
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		_, err = QMP(ctx, s.QMPSocket(), "system_powerdown", nil)
		cancel()
		exited := sys.exited
		go func() { // a guest without ACPI handling never powers down: pull the plug later
			select {
			case <-exited:
			case <-time.After(s.cfg.GracefulTimeout):
				sys.mu.Lock()
				if sys.exited == exited {
					s.stopLocked(sys, false)
				}
				sys.mu.Unlock()
			}
		}()
	case "ForceRestart", "GracefulRestart":
		if !on {
			redfishError(w, 409, "Base.1.8.ActionNotSupported", "The system is powered off.")
			return
		}
		if sys.overridePendingLocked() || simulated || s.firmwarePendingLocked(sys) { // the override (or staged firmware) applies at the next start: restart
			s.stopLocked(sys, false)
			err = s.startLocked(sys)
			break
		}
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		_, err = QMP(ctx, s.QMPSocket(), "system_reset", nil)
		cancel()
	case "PowerCycle":
		s.stopLocked(sys, false)
		err = s.startLocked(sys)
	case "PushPowerButton":
		if on {
			s.stopLocked(sys, false)
		} else {
			err = s.startLocked(sys)
		}
	default:
		redfishError(w, 400, "Base.1.8.ActionParameterNotSupported", "unsupported ResetType")
		return
	}
	if err != nil {
		s.log.Warn("reset failed", "system", sys.cfg.ID, "type", body.ResetType, "error", err)
		redfishError(w, 500, "Base.1.8.InternalError", "reset failed")
		return
	}
	w.WriteHeader(204)
}
