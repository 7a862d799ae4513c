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
	"os"
	"os/exec"
	"path/filepath"
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
}

// Boot is one VM start.
type Boot struct {
	Args     []string  // full qemu argv used
	Override string    // "pxe", "disk" or "" (no override)
	Mode     string    // BootSourceOverrideMode at start
	Serial   string    // serial log path
	PID      int       // qemu process id
	Started  time.Time // start time
}

// Request is one handled HTTP request (no bodies, except the Boot property names of a
// PATCH, sorted).
type Request struct {
	Method, Path string
	Status       int
	BootKeys     []string
}

type bootState struct{ Target, Enabled, Mode string }

// Server is the virtual BMC. Create with New, serve with Run.
type Server struct {
	cfg   Config
	ln    net.Listener
	cert  tls.Certificate
	caPEM []byte

	mu       sync.Mutex
	boot     bootState
	cmd      *exec.Cmd
	exited   chan struct{}
	boots    []Boot
	reqs     []Request
	sessions map[string]string // token -> id
	nextSess int
	log      *slog.Logger
}

// New validates cfg, loads or generates the TLS certificate and binds the listener.
func New(cfg Config) (*Server, error) {
	if cfg.Listen == "" || cfg.Username == "" || cfg.Password == "" || len(cfg.QEMUArgs) == 0 || cfg.StateDir == "" {
		return nil, fmt.Errorf("%w: Listen, Username, Password, QEMUArgs and StateDir are required", ErrConfig)
	}
	if cfg.InitialMode == "" {
		cfg.InitialMode = "Legacy"
	}
	if cfg.InitialMode != "Legacy" && cfg.InitialMode != "UEFI" {
		return nil, fmt.Errorf("%w: InitialMode %q", ErrConfig, cfg.InitialMode)
	}
	if cfg.GracefulTimeout == 0 {
		cfg.GracefulTimeout = 5 * time.Second
	}
	if cfg.UUID == "" {
		cfg.UUID = "5e1f0000-0000-4000-8000-000000000001"
	}
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrConfig, err)
	}
	s := &Server{cfg: cfg, boot: bootState{"None", "Disabled", cfg.InitialMode}, sessions: map[string]string{},
		log: slog.New(slog.NewTextHandler(io.Discard, nil))}
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

// QMPSocket is the path of the running VM's QMP socket.
func (s *Server) QMPSocket() string { return filepath.Join(s.cfg.StateDir, "qmp.sock") }

// Boots returns every VM start so far.
func (s *Server) Boots() []Boot {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Boot(nil), s.boots...)
}

// Requests returns the handled requests so far.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Request(nil), s.reqs...)
}

// Running reports whether the VM process is alive.
func (s *Server) Running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.runningLocked()
}

func (s *Server) runningLocked() bool {
	if s.cmd == nil {
		return false
	}
	select {
	case <-s.exited:
		return false
	default:
		return true
	}
}

// Run serves HTTPS until ctx ends, then stops the VM and returns nil (or the serve error).
func (s *Server) Run(ctx context.Context, log *slog.Logger) error {
	if log != nil {
		s.log = log.With("component", "vbmc")
	}
	srv := &http.Server{Handler: s.handler(), ReadHeaderTimeout: 10 * time.Second,
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{s.cert}, MinVersion: tls.VersionTLS12},
		ErrorLog:  slog.NewLogLogger(s.log.Handler(), slog.LevelDebug)}
	errc := make(chan error, 1)
	go func() { errc <- srv.ServeTLS(s.ln, "", "") }()
	s.log.Info("vbmc listening", "addr", s.Addr())
	var err error
	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	sctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	_ = srv.Shutdown(sctx)
	s.mu.Lock()
	s.stopLocked(true)
	s.mu.Unlock()
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}

// startLocked starts qemu, applying and consuming a pending boot override.
func (s *Server) startLocked() error {
	if s.runningLocked() {
		return nil
	}
	args := append([]string(nil), s.cfg.QEMUArgs...)
	sock := s.QMPSocket()
	_ = os.Remove(sock)
	serial := filepath.Join(s.cfg.StateDir, fmt.Sprintf("serial-%d.log", len(s.boots)+1))
	args = append(args, "-qmp", "unix:"+sock+",server=on,wait=off", "-serial", "file:"+serial)
	override := ""
	if s.boot.Enabled != "Disabled" {
		switch s.boot.Target {
		case "Pxe":
			override, args = "pxe", append(args, "-boot", "once=n")
		case "Hdd":
			override, args = "disk", append(args, "-boot", "once=c")
		}
		if s.boot.Enabled == "Once" {
			s.boot.Target, s.boot.Enabled = "None", "Disabled"
		}
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
	s.cmd, s.exited = cmd, exited
	s.boots = append(s.boots, Boot{Args: args, Override: override, Mode: s.boot.Mode, Serial: serial,
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

// stopLocked ends the VM: QMP quit, then SIGKILL if it is still there after 3 s.
func (s *Server) stopLocked(force bool) {
	if !s.runningLocked() {
		return
	}
	cmd, exited := s.cmd, s.exited
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

func (s *Server) overridePendingLocked() bool {
	return s.boot.Enabled != "Disabled" && (s.boot.Target == "Pxe" || s.boot.Target == "Hdd")
}

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
	mux.HandleFunc("GET /redfish/v1/Systems", s.authed(s.json(func() any {
		return collection("/redfish/v1/Systems", "#ComputerSystemCollection.ComputerSystemCollection", []string{"/redfish/v1/Systems/1"})
	})))
	mux.HandleFunc("GET /redfish/v1/Systems/1", s.authed(s.json(s.system)))
	mux.HandleFunc("PATCH /redfish/v1/Systems/1", s.authed(s.patchSystem))
	mux.HandleFunc("POST /redfish/v1/Systems/1/Actions/ComputerSystem.Reset", s.authed(s.reset))
	mux.HandleFunc("GET /redfish/v1/Systems/1/EthernetInterfaces", s.authed(s.json(func() any {
		var ids []string
		for i := range s.cfg.MACs {
			ids = append(ids, fmt.Sprintf("/redfish/v1/Systems/1/EthernetInterfaces/%d", i+1))
		}
		return collection("/redfish/v1/Systems/1/EthernetInterfaces", "#EthernetInterfaceCollection.EthernetInterfaceCollection", ids)
	})))
	mux.HandleFunc("GET /redfish/v1/Systems/1/EthernetInterfaces/{n}", s.authed(func(w http.ResponseWriter, r *http.Request) {
		n, err := strconv.Atoi(r.PathValue("n"))
		if err != nil || n < 1 || n > len(s.cfg.MACs) {
			redfishError(w, 404, "Base.1.8.ResourceMissingAtURI", "no such interface")
			return
		}
		id := "/redfish/v1/Systems/1/EthernetInterfaces/" + r.PathValue("n")
		writeJSON(w, 200, map[string]any{"@odata.id": id, "@odata.type": "#EthernetInterface.v1_6_0.EthernetInterface",
			"Id": r.PathValue("n"), "Name": "NIC " + r.PathValue("n"), "MACAddress": s.cfg.MACs[n-1],
			"PermanentMACAddress": s.cfg.MACs[n-1], "Status": map[string]string{"State": "Enabled", "Health": "OK"}})
	}))
	mux.HandleFunc("GET /redfish/v1/Managers", s.authed(s.json(func() any {
		return collection("/redfish/v1/Managers", "#ManagerCollection.ManagerCollection", []string{"/redfish/v1/Managers/1"})
	})))
	mux.HandleFunc("GET /redfish/v1/Managers/1", s.authed(s.json(func() any {
		return map[string]any{"@odata.id": "/redfish/v1/Managers/1", "@odata.type": "#Manager.v1_10_0.Manager",
			"Id": "1", "Name": "Kiln vbmc", "ManagerType": "BMC", "FirmwareVersion": "kiln-vbmc-1",
			"Status": map[string]string{"State": "Enabled", "Health": "OK"},
			"Links": map[string]any{"ManagerForServers": []any{odata("/redfish/v1/Systems/1")},
				"ManagerForChassis": []any{odata("/redfish/v1/Chassis/1")}}}
	})))
	mux.HandleFunc("GET /redfish/v1/Chassis", s.authed(s.json(func() any {
		return collection("/redfish/v1/Chassis", "#ChassisCollection.ChassisCollection", []string{"/redfish/v1/Chassis/1"})
	})))
	mux.HandleFunc("GET /redfish/v1/Chassis/1", s.authed(s.json(func() any {
		return map[string]any{"@odata.id": "/redfish/v1/Chassis/1", "@odata.type": "#Chassis.v1_14_0.Chassis",
			"Id": "1", "Name": "Chassis", "ChassisType": "RackMount", "SerialNumber": s.cfg.Serial,
			"Manufacturer": s.cfg.Manufacturer, "Model": s.cfg.Model, "PowerState": s.powerState(),
			"Links": map[string]any{"ComputerSystems": []any{odata("/redfish/v1/Systems/1")},
				"ManagedBy": []any{odata("/redfish/v1/Managers/1")}}}
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
		r.Body = http.MaxBytesReader(w, r.Body, 64<<10)
		keys := new([]string)
		r = r.WithContext(context.WithValue(r.Context(), bootKeysCtx{}, keys))
		mux.ServeHTTP(sw, r)
		s.mu.Lock()
		s.reqs = append(s.reqs, Request{Method: r.Method, Path: r.URL.Path, Status: sw.status, BootKeys: *keys})
		s.mu.Unlock()
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

func (s *Server) json(f func() any) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) { writeJSON(w, 200, f()) }
}

func (s *Server) serviceRoot(w http.ResponseWriter, r *http.Request) {
	if p := r.URL.Path; p != "/redfish/v1" && p != "/redfish/v1/" {
		redfishError(w, 404, "Base.1.8.ResourceMissingAtURI", "not found")
		return
	}
	writeJSON(w, 200, map[string]any{"@odata.id": "/redfish/v1", "@odata.type": "#ServiceRoot.v1_11_0.ServiceRoot",
		"Id": "RootService", "Name": "Kiln virtual BMC", "RedfishVersion": "1.11.0", "UUID": s.cfg.UUID,
		"Systems": odata("/redfish/v1/Systems"), "Managers": odata("/redfish/v1/Managers"),
		"Chassis": odata("/redfish/v1/Chassis"), "SessionService": odata("/redfish/v1/SessionService"),
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

func (s *Server) powerState() string {
	if s.Running() {
		return "On"
	}
	return "Off"
}

var resetTypes = []string{"On", "ForceOff", "GracefulShutdown", "ForceRestart", "GracefulRestart", "PowerCycle", "ForceOn", "PushPowerButton"}

func (s *Server) system() any {
	s.mu.Lock()
	b := s.boot
	s.mu.Unlock()
	return map[string]any{"@odata.id": "/redfish/v1/Systems/1", "@odata.type": "#ComputerSystem.v1_13_0.ComputerSystem",
		"Id": "1", "Name": "vbmc system", "SystemType": "Virtual", "Manufacturer": s.cfg.Manufacturer,
		"Model": s.cfg.Model, "SerialNumber": s.cfg.Serial, "UUID": s.cfg.UUID, "PowerState": s.powerState(),
		"Status": map[string]string{"State": "Enabled", "Health": "OK"},
		"Boot": map[string]any{"BootSourceOverrideTarget": b.Target, "BootSourceOverrideEnabled": b.Enabled,
			"BootSourceOverrideMode":                           b.Mode,
			"BootSourceOverrideTarget@Redfish.AllowableValues": []string{"None", "Pxe", "Hdd", "Cd", "BiosSetup"}},
		"EthernetInterfaces": odata("/redfish/v1/Systems/1/EthernetInterfaces"),
		"Links": map[string]any{"ManagedBy": []any{odata("/redfish/v1/Managers/1")},
			"Chassis": []any{odata("/redfish/v1/Chassis/1")}},
		"Actions": map[string]any{"#ComputerSystem.Reset": map[string]any{
			"target":                            "/redfish/v1/Systems/1/Actions/ComputerSystem.Reset",
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

func (s *Server) applyLocked(k, v string) {
	switch k {
	case "BootSourceOverrideTarget":
		s.boot.Target = v
	case "BootSourceOverrideEnabled":
		s.boot.Enabled = v
	case "BootSourceOverrideMode":
		s.boot.Mode = v
	}
}

func (s *Server) patchSystem(w http.ResponseWriter, r *http.Request) {
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
	s.mu.Lock()
	defer s.mu.Unlock()
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
			s.applyLocked(k, bp.Values[k])
		}
		redfishError(w, 400, "Base.1.8.InternalError", "The request failed due to an internal service error.")
		return
	}
	for _, k := range bp.Keys {
		s.applyLocked(k, bp.Values[k])
	}
	w.WriteHeader(204)
}

func (s *Server) reset(w http.ResponseWriter, r *http.Request) {
	var body struct{ ResetType string }
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
		redfishError(w, 400, "Base.1.8.MalformedJSON", "malformed JSON")
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	on := s.runningLocked()
	var err error
	switch body.ResetType {
	case "On", "ForceOn":
		err = s.startLocked()
	case "ForceOff", "GracefulShutdown":
		if !on {
			if s.cfg.Quirks.ErrorOffWhenOff {
				redfishError(w, 409, "Base.1.8.ActionNotSupported", "The system is already powered off.")
				return
			}
			break
		}
		if body.ResetType == "ForceOff" {
			s.stopLocked(false)
			break
		}
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		_, err = QMP(ctx, s.QMPSocket(), "system_powerdown", nil)
		cancel()
		exited := s.exited
		go func() { // a guest without ACPI handling never powers down: pull the plug later
			select {
			case <-exited:
			case <-time.After(s.cfg.GracefulTimeout):
				s.mu.Lock()
				if s.exited == exited {
					s.stopLocked(false)
				}
				s.mu.Unlock()
			}
		}()
	case "ForceRestart", "GracefulRestart":
		if !on {
			redfishError(w, 409, "Base.1.8.ActionNotSupported", "The system is powered off.")
			return
		}
		if s.overridePendingLocked() { // the override applies at the next start: restart the process
			s.stopLocked(false)
			err = s.startLocked()
			break
		}
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		_, err = QMP(ctx, s.QMPSocket(), "system_reset", nil)
		cancel()
	case "PowerCycle":
		s.stopLocked(false)
		err = s.startLocked()
	case "PushPowerButton":
		if on {
			s.stopLocked(false)
		} else {
			err = s.startLocked()
		}
	default:
		redfishError(w, 400, "Base.1.8.ActionParameterNotSupported", "unsupported ResetType")
		return
	}
	if err != nil {
		s.log.Warn("reset failed", "type", body.ResetType, "error", err)
		redfishError(w, 500, "Base.1.8.InternalError", "reset failed")
		return
	}
	w.WriteHeader(204)
}
