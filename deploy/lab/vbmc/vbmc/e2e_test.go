package vbmc_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"

	"kiln/bmc"
	"kiln/deploy/lab/testkit"
	"kiln/deploy/lab/testreq"
	"kiln/deploy/lab/vbmc/vbmc"
)

const (
	testUser = "admin"
	testPass = "s3cr3t-Vbmc-Pa55word"
)

// syncBuf is a goroutine-safe log sink.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) { s.mu.Lock(); defer s.mu.Unlock(); return s.b.Write(p) }
func (s *syncBuf) String() string              { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

// startVBMC runs a vbmc in-process on loopback and returns it with a Target for it.
func startVBMC(t *testing.T, cfg vbmc.Config, logw *syncBuf) (*vbmc.Server, bmc.Target) {
	t.Helper()
	cfg.Listen = "127.0.0.1:0"
	cfg.Username, cfg.Password = testUser, testPass
	if cfg.StateDir == "" {
		cfg.StateDir = t.TempDir()
	}
	if cfg.QEMUArgs == nil {
		cfg.QEMUArgs = []string{"/bin/false"} // never started by the quirk tests
	}
	srv, err := vbmc.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	var lw *slog.Logger
	if logw != nil {
		lw = slog.New(slog.NewJSONHandler(logw, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	go func() { done <- srv.Run(ctx, lw) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("vbmc Run: %v", err)
		}
	})
	return srv, bmc.Target{Address: srv.Addr(), Driver: bmc.DriverRedfish, Username: testUser, Password: testPass,
		CACertPEM: srv.CACertPEM()}
}

func newController(t *testing.T, cfg bmc.Config, reg *prometheus.Registry) *bmc.Controller {
	t.Helper()
	if cfg.CallTimeout == 0 {
		cfg.CallTimeout = 10 * time.Second
	}
	if cfg.BackoffBase == 0 {
		cfg.BackoffBase = 50 * time.Millisecond
	}
	c, err := bmc.New(cfg, reg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func qemuArgs(t *testing.T) []string {
	t.Helper()
	testreq.Commands(t, "qemu-system-x86_64")
	q, _ := exec.LookPath("qemu-system-x86_64")
	return []string{q, "-accel", "tcg", "-machine", "pc", "-m", "64", "-nodefaults", "-nographic", "-monitor", "none",
		// a NIC with qemu's iPXE option ROM; user networking restricted to the guest (no host traffic)
		"-netdev", "user,id=n0,restrict=on", "-device", "virtio-net-pci,netdev=n0,mac=52:54:00:74:00:01"}
}

func waitFor(t *testing.T, what string, d time.Duration, f func() bool) {
	t.Helper()
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		if f() {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("timed out after %v waiting for %s", d, what)
}

// firstBootFrom returns SeaBIOS's first "Booting from ..." line in a serial log.
func firstBootFrom(path string) string {
	b, _ := os.ReadFile(path)
	i := strings.Index(string(b), "Booting from ")
	if i < 0 {
		return ""
	}
	line := string(b[i:])
	j := strings.IndexAny(line, "\r\n.")
	if j < 0 {
		return "" // the line is still being written: "Booting from Ha…"
	}
	return line[:j]
}

func countIn(path, s string) int {
	b, _ := os.ReadFile(path)
	return strings.Count(string(b), s)
}

// TestRedfishEndToEndQEMU drives a real qemu VM through the controller and vbmc: power,
// one-time PXE boot (seen by the VM: iPXE runs), cycle (guest resets), reset (new start),
// off, inventory.
func TestRedfishEndToEndQEMU(t *testing.T) {
	args := qemuArgs(t)
	srv, tg := startVBMC(t, vbmc.Config{QEMUArgs: args, Serial: "KILN-SN-42", Model: "vbmc-test",
		Manufacturer: "QEMU", MACs: []string{"52:54:00:74:00:01"}}, nil)
	c := newController(t, bmc.Config{}, prometheus.NewRegistry())
	ctx := context.Background()

	st, err := c.PowerState(ctx, tg)
	if err != nil || st != bmc.PowerOff {
		t.Fatalf("initial PowerState = %q, %v; want off", st, err)
	}
	inv, err := c.Inventory(ctx, tg)
	if err != nil {
		t.Fatal(err)
	}
	if inv.Serial != "KILN-SN-42" || inv.Model != "vbmc-test" || !slices.Equal(inv.NICMACs, []string{"52:54:00:74:00:01"}) {
		t.Fatalf("inventory = %+v", inv)
	}
	if err := c.SetNextBootPXE(ctx, tg, bmc.BootLegacy); err != nil {
		t.Fatalf("SetNextBootPXE: %v", err)
	}
	if err := c.Power(ctx, tg, bmc.ActionOn); err != nil {
		t.Fatalf("power on: %v", err)
	}
	boots := srv.Boots()
	if len(boots) != 1 || boots[0].Override != "pxe" || !strings.Contains(strings.Join(boots[0].Args, " "), "-boot once=n") {
		t.Fatalf("boots after on = %+v", boots)
	}
	qs, err := vbmc.QueryStatus(ctx, srv.QMPSocket())
	if err != nil || qs != "running" {
		t.Fatalf("QMP query-status = %q, %v", qs, err)
	}
	if st, err := c.PowerState(ctx, tg); err != nil || st != bmc.PowerOn {
		t.Fatalf("PowerState after on = %q, %v", st, err)
	}
	// the VM network-boots: SeaBIOS's first boot device is the NIC's iPXE ROM (without the
	// override it tries the hard disk first), and iPXE runs
	waitFor(t, "iPXE to start on the serial console", 60*time.Second, func() bool {
		return countIn(boots[0].Serial, "iPXE (PCI 00:02.0) starting execution") > 0
	})
	if fb := firstBootFrom(boots[0].Serial); fb != "Booting from ROM" {
		t.Fatalf("first boot device of the PXE start = %q, want the NIC ROM", fb)
	}
	// one-time: consumed at the start
	if err := c.SetNextBootPXE(ctx, tg, bmc.BootLegacy); err != nil { // and can be set again
		t.Fatal(err)
	}
	// on when on: no new start
	if err := c.Power(ctx, tg, bmc.ActionOn); err != nil || len(srv.Boots()) != 1 {
		t.Fatalf("power on when on: %v, boots=%d", err, len(srv.Boots()))
	}
	// cycle: ForceRestart; the override is pending, so vbmc restarts the process with it
	if err := c.Power(ctx, tg, bmc.ActionCycle); err != nil {
		t.Fatalf("cycle: %v", err)
	}
	boots = srv.Boots()
	if len(boots) != 2 || boots[1].PID == boots[0].PID || boots[1].Override != "pxe" {
		t.Fatalf("boots after cycle = %+v", boots)
	}
	waitFor(t, "SeaBIOS on the second start", 30*time.Second, func() bool { return countIn(boots[1].Serial, "SeaBIOS") > 0 })
	// reset with nothing pending: PowerCycle -> a new process without -boot
	if err := c.Power(ctx, tg, bmc.ActionReset); err != nil {
		t.Fatalf("reset: %v", err)
	}
	boots = srv.Boots()
	if len(boots) != 3 || boots[2].Override != "" || strings.Contains(strings.Join(boots[2].Args, " "), "-boot") {
		t.Fatalf("boots after reset = %+v", boots)
	}
	waitFor(t, "SeaBIOS to pick a boot device after reset", 60*time.Second, func() bool { return firstBootFrom(boots[2].Serial) != "" })
	if fb := firstBootFrom(boots[2].Serial); fb != "Booting from Hard Disk" {
		t.Fatalf("first boot device without override = %q, want the normal order (hard disk first)", fb)
	}
	// cycle with nothing pending: QMP system_reset, the same process, the guest firmware restarts
	if err := c.Power(ctx, tg, bmc.ActionCycle); err != nil {
		t.Fatalf("cycle (reset in place): %v", err)
	}
	if b := srv.Boots(); len(b) != 3 {
		t.Fatalf("cycle without override started a new process: %+v", b)
	}
	waitFor(t, "the guest to reboot in place (second SeaBIOS banner)", 60*time.Second, func() bool {
		return countIn(boots[2].Serial, "SeaBIOS (version") >= 2
	})
	if err := c.Power(ctx, tg, bmc.ActionOff); err != nil {
		t.Fatalf("off: %v", err)
	}
	if srv.Running() {
		t.Fatal("VM still running after off")
	}
	if _, err := vbmc.QueryStatus(ctx, srv.QMPSocket()); err == nil {
		t.Fatal("QMP still answers after off")
	}
	if st, err := c.PowerState(ctx, tg); err != nil || st != bmc.PowerOff {
		t.Fatalf("PowerState after off = %q, %v", st, err)
	}
	if err := c.Power(ctx, tg, bmc.ActionOff); err != nil {
		t.Fatalf("off when off: %v", err)
	}
	if err := c.Power(ctx, tg, bmc.ActionSoftOff); err != nil {
		t.Fatalf("soft off when off: %v", err)
	}
}

func requestsOf(srv *vbmc.Server, method string) []vbmc.Request {
	var out []vbmc.Request
	for _, r := range srv.Requests() {
		if r.Method == method || method == "" {
			out = append(out, r)
		}
	}
	return out
}

func TestQuirkIgnoreOverride(t *testing.T) {
	srv, tg := startVBMC(t, vbmc.Config{Quirks: vbmc.Quirks{IgnoreOverride: true}}, nil)
	c := newController(t, bmc.Config{}, nil)
	err := c.SetNextBootPXE(context.Background(), tg, bmc.BootLegacy)
	if !errors.Is(err, bmc.ErrBootNotApplied) || bmc.Reason(err) != "boot_not_applied" {
		t.Fatalf("err = %v (reason %q), want boot_not_applied", err, bmc.Reason(err))
	}
	if p := requestsOf(srv, "PATCH"); len(p) != 1 || p[0].Status != 204 {
		t.Fatalf("PATCHes = %+v; want one accepted PATCH and no retry", p)
	}
}

func TestQuirkRejectModeFallsBackToMinimalPatch(t *testing.T) {
	srv, tg := startVBMC(t, vbmc.Config{Quirks: vbmc.Quirks{RejectMode: true}, InitialMode: "UEFI"}, nil)
	c := newController(t, bmc.Config{}, nil)
	if err := c.SetNextBootPXE(context.Background(), tg, bmc.BootUEFI); err != nil {
		t.Fatalf("SetNextBootPXE(uefi) on a Mode-rejecting BMC already in UEFI: %v", err)
	}
	p := requestsOf(srv, "PATCH")
	last := p[len(p)-1]
	if p[0].Status != 400 || !slices.Contains(p[0].BootKeys, "BootSourceOverrideMode") || last.Status != 204 ||
		!slices.Equal(last.BootKeys, []string{"BootSourceOverrideTarget", "BootSourceOverrideEnabled"}) {
		t.Fatalf("PATCH sequence = %+v; want 400 with Mode, then a minimal Target+Enabled PATCH", p)
	}
	// asking for a mode the BMC cannot set is caught by the read-back
	err := c.SetNextBootPXE(context.Background(), tg, bmc.BootLegacy)
	if !errors.Is(err, bmc.ErrBootNotApplied) {
		t.Fatalf("SetNextBootPXE(legacy) = %v, want ErrBootNotApplied", err)
	}
}

func TestQuirkHalfApply400RereadsBeforeRetry(t *testing.T) {
	srv, tg := startVBMC(t, vbmc.Config{Quirks: vbmc.Quirks{HalfApply400: true}, InitialMode: "Legacy"}, nil)
	c := newController(t, bmc.Config{}, nil)
	if err := c.SetNextBootPXE(context.Background(), tg, bmc.BootUEFI); err != nil {
		t.Fatalf("SetNextBootPXE: %v", err)
	}
	reqs := srv.Requests()
	i := slices.IndexFunc(reqs, func(r vbmc.Request) bool { return r.Method == "PATCH" })
	if i < 0 || reqs[i].Status != 400 || len(reqs[i].BootKeys) != 3 {
		t.Fatalf("first PATCH = %+v", reqs[i:])
	}
	j := slices.IndexFunc(reqs[i+1:], func(r vbmc.Request) bool { return r.Method == "PATCH" }) + i + 1
	if j <= i {
		t.Fatal("no second PATCH")
	}
	reread := slices.ContainsFunc(reqs[i+1:j], func(r vbmc.Request) bool { return r.Method == "GET" && r.Path == "/redfish/v1/Systems/1" })
	if !reread || reqs[j].Status != 204 || !slices.Equal(reqs[j].BootKeys, []string{"BootSourceOverrideMode"}) {
		t.Fatalf("after the 400: requests %+v; want a GET of the system, then a PATCH of only the missing Mode", reqs[i+1:j+1])
	}
}

func TestQuirkErrorOffWhenOff(t *testing.T) {
	srv, tg := startVBMC(t, vbmc.Config{Quirks: vbmc.Quirks{ErrorOffWhenOff: true}}, nil)
	// the quirk is real: a raw ForceOff on the powered-off system is an error
	cl := &http.Client{Transport: &http.Transport{TLSClientConfig: mustTLS(t, srv.CACertPEM())}}
	req, _ := http.NewRequest("POST", "https://"+srv.Addr()+"/redfish/v1/Systems/1/Actions/ComputerSystem.Reset",
		strings.NewReader(`{"ResetType":"ForceOff"}`))
	req.SetBasicAuth(testUser, testPass)
	resp, err := cl.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 409 {
		t.Fatalf("raw ForceOff when off: %d, want 409", resp.StatusCode)
	}
	c := newController(t, bmc.Config{}, nil)
	for _, a := range []bmc.PowerAction{bmc.ActionOff, bmc.ActionSoftOff} {
		if err := c.Power(context.Background(), tg, a); err != nil {
			t.Fatalf("Power(%s) when off on an erroring BMC: %v", a, err)
		}
	}
}

func TestQuirkSlowTimesOut(t *testing.T) {
	_, tg := startVBMC(t, vbmc.Config{Quirks: vbmc.Quirks{Slow: 3 * time.Second}}, nil)
	reg := prometheus.NewRegistry()
	c := newController(t, bmc.Config{CallTimeout: 500 * time.Millisecond, Retries: 1}, reg)
	t0 := time.Now()
	_, err := c.PowerState(context.Background(), tg)
	el := time.Since(t0)
	if !errors.Is(err, bmc.ErrTimeout) || bmc.Reason(err) != "timeout" {
		t.Fatalf("err = %v (reason %q), want timeout", err, bmc.Reason(err))
	}
	if el > 2500*time.Millisecond {
		t.Fatalf("took %v; 2 attempts of 500ms + backoff should end well before the BMC's 3s", el)
	}
	if v := testkit.Sample(t, reg, "kiln_bmc_ops_total", "op", "power_state", "result", "timeout"); v != 1 {
		t.Fatalf("kiln_bmc_ops_total{result=timeout} = %v", v)
	}
	if v := testkit.Sample(t, reg, "kiln_bmc_retries_total"); v != 1 {
		t.Fatalf("kiln_bmc_retries_total = %v, want 1", v)
	}
}

func TestAuthFailureIsAnErrorNotAState(t *testing.T) {
	_, tg := startVBMC(t, vbmc.Config{}, nil)
	tg.Password = "wrong-password"
	c := newController(t, bmc.Config{}, nil)
	st, err := c.PowerState(context.Background(), tg)
	if !errors.Is(err, bmc.ErrAuth) || st != "" {
		t.Fatalf("PowerState with a wrong password = %q, %v; want \"\", ErrAuth", st, err)
	}
	tg.Password = testPass
	tg.CACertPEM = nil // not trusted: the self-signed cert must be refused
	if _, err := c.PowerState(context.Background(), tg); !errors.Is(err, bmc.ErrTLS) {
		t.Fatalf("untrusted certificate: %v, want ErrTLS", err)
	}
	tg.InsecureTLS = true // explicit opt-out
	if st, err := c.PowerState(context.Background(), tg); err != nil || st != bmc.PowerOff {
		t.Fatalf("InsecureTLS: %q, %v", st, err)
	}
}

func TestAutoDriverAndBasicAuth(t *testing.T) {
	srv, tg := startVBMC(t, vbmc.Config{}, nil)
	tg.Driver = bmc.DriverAuto
	c := newController(t, bmc.Config{}, nil)
	if st, err := c.PowerState(context.Background(), tg); err != nil || st != bmc.PowerOff {
		t.Fatalf("auto: %q, %v", st, err)
	}
	n := len(srv.Requests())
	basic := newController(t, bmc.Config{RedfishBasicAuth: true}, nil)
	tg.Driver = bmc.DriverRedfish
	if err := basic.SetNextBootPXE(context.Background(), tg, bmc.BootUEFI); err != nil {
		t.Fatalf("basic auth boot: %v", err)
	}
	for _, r := range srv.Requests()[n:] {
		if strings.HasPrefix(r.Path, "/redfish/v1/SessionService/Sessions") {
			t.Fatalf("basic-auth controller opened a session: %+v", r)
		}
	}
}

// TestPasswordNeverAppears runs successful and failing operations with every log at
// debug level captured, then searches logs, errors, metrics and formatted targets for
// the passwords (the right one and a wrong one).
func TestPasswordNeverAppears(t *testing.T) {
	var logs syncBuf
	srv, tg := startVBMC(t, vbmc.Config{Quirks: vbmc.Quirks{RejectMode: true}}, &logs)
	slowSrv, slowTg := startVBMC(t, vbmc.Config{Quirks: vbmc.Quirks{Slow: 2 * time.Second, IgnoreOverride: true}}, &logs)
	_ = slowSrv
	reg := prometheus.NewRegistry()
	c := newController(t, bmc.Config{CallTimeout: 700 * time.Millisecond, Retries: 1,
		Logger: slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))}, reg)
	ctx := context.Background()
	const wrong = "Wr0ng-Pa55word-xyz"
	var errs []string
	note := func(err error) {
		if err != nil {
			errs = append(errs, err.Error(), fmt.Sprintf("%+v %#v", err, err))
		}
	}
	_, err := c.PowerState(ctx, tg)
	note(err)
	note(c.SetNextBootPXE(ctx, tg, bmc.BootLegacy)) // fallback path and read-back failure
	_, err = c.Inventory(ctx, tg)
	note(err)
	note(c.Power(ctx, tg, bmc.ActionOff))
	bad := tg
	bad.Password = wrong
	_, err = c.PowerState(ctx, bad)
	note(err)
	note(c.SetNextBootPXE(ctx, bad, bmc.BootUEFI))
	_, err = c.PowerState(ctx, slowTg)
	note(err)
	unreach := tg
	unreach.Address = "127.0.0.1:1"
	_, err = c.PowerState(ctx, unreach)
	note(err)
	if len(errs) < 4 {
		t.Fatalf("expected several failures to inspect, got %d", len(errs))
	}
	var metrics bytes.Buffer
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if _, err := expfmt.MetricFamilyToText(&metrics, mf); err != nil {
			t.Fatal(err)
		}
	}
	js, _ := json.Marshal(tg)
	formatted := fmt.Sprintf("%v %+v %#v %s", tg, tg, tg, tg) + string(js)
	reqs := fmt.Sprintf("%+v", srv.Requests())
	all := map[string]string{"logs": logs.String(), "errors": strings.Join(errs, "\n"), "metrics": metrics.String(),
		"formatted target": formatted, "vbmc request log": reqs}
	if !strings.Contains(all["logs"], "bmc operation failed") || metrics.Len() == 0 {
		t.Fatalf("capture is empty: logs %d bytes, metrics %d bytes", len(all["logs"]), metrics.Len())
	}
	for where, text := range all {
		for _, pw := range []string{testPass, wrong} {
			if strings.Contains(text, pw) {
				t.Errorf("password %q found in %s", pw, where)
			}
		}
	}
}
