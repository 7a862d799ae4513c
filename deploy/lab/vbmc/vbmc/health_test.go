package vbmc_test

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"kiln/bmc"
	"kiln/deploy/lab/vbmc/vbmc"
)

// control POSTs body to the vbmc's health knob and returns the status and answer.
func control(t *testing.T, addr, id, user, pass, body string) (int, string) {
	t.Helper()
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}, Timeout: 5 * time.Second}
	req, _ := http.NewRequest("POST", "https://"+addr+"/vbmc/control/systems/"+id+"/health", strings.NewReader(body))
	if user != "" {
		req.SetBasicAuth(user, pass)
	}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// The health knob drives what Kiln's BMC controller reads: Systems/1 Status.Health,
// Chassis/1 Status.Health (via Links.Chassis) and the SEL LogService's entries.
func TestHealthKnobAndController(t *testing.T) {
	srv, tg := startVBMC(t, vbmc.Config{}, nil)
	reg := prometheus.NewRegistry()
	c := newController(t, bmc.Config{}, reg)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	h, err := c.Health(ctx, tg)
	if err != nil || h.System != bmc.HealthOK || h.Chassis != bmc.HealthOK || len(h.Events) != 0 {
		t.Fatalf("initial health %+v, %v; want OK/OK, no events", h, err)
	}
	before := time.Now().Add(-time.Second)
	st, ans := control(t, srv.Addr(), "1", testUser, testPass, `{"system":"Critical","chassis":"Warning","event":"CPU1 IERR"}`)
	if st != 200 || !strings.Contains(ans, `"system":"Critical"`) || !strings.Contains(ans, `"log_entries":1`) {
		t.Fatalf("control: %d %s", st, ans)
	}
	h, err = c.Health(ctx, tg)
	if err != nil || h.System != bmc.HealthCritical || h.Chassis != bmc.HealthWarning || len(h.Events) != 1 {
		t.Fatalf("health after knob %+v, %v; want Critical/Warning and one event", h, err)
	}
	if e := h.Events[0]; e.Source != "redfish" || e.Severity != bmc.HealthCritical || e.Message != "CPU1 IERR" || e.ID != "1" ||
		e.Time.Before(before.Truncate(time.Second)) || e.Time.After(time.Now()) {
		t.Fatalf("event %+v", e)
	}
	// a warning event alone, then the system back to OK: the log keeps both, newest first
	if st, ans := control(t, srv.Addr(), "1", testUser, testPass, `{"system":"OK","chassis":"OK","event":"PSU2 AC lost","severity":"Warning"}`); st != 200 {
		t.Fatalf("control: %d %s", st, ans)
	}
	h, err = c.Health(ctx, tg)
	if err != nil || h.System != bmc.HealthOK || h.Chassis != bmc.HealthOK || len(h.Events) != 2 ||
		h.Events[0].Message != "PSU2 AC lost" || h.Events[0].Severity != bmc.HealthWarning || h.Events[1].Message != "CPU1 IERR" {
		t.Fatalf("health %+v, %v; want OK/OK with [PSU2 AC lost, CPU1 IERR]", h, err)
	}
	// more entries than a Health returns: the newest MaxHealthEvents
	for i := 0; i < bmc.MaxHealthEvents+5; i++ {
		if err := srv.SetHealth("1", vbmc.HealthUpdate{Event: "DIMM A" + string(rune('a'+i%26)) + " uncorrectable ECC"}); err != nil {
			t.Fatal(err)
		}
	}
	if h, err = c.Health(ctx, tg); err != nil || len(h.Events) != bmc.MaxHealthEvents {
		t.Fatalf("with %d log entries: %d events, %v", len(srv.LogEntries("1")), len(h.Events), err)
	}
	// LogService.ClearLog (the Redfish action) empties it
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	req, _ := http.NewRequest("POST", "https://"+srv.Addr()+"/redfish/v1/Systems/1/LogServices/SEL/Actions/LogService.ClearLog", strings.NewReader("{}"))
	req.SetBasicAuth(testUser, testPass)
	if resp, err := hc.Do(req); err != nil || resp.StatusCode != 204 {
		t.Fatalf("ClearLog: %v", err)
	}
	if h, err = c.Health(ctx, tg); err != nil || len(h.Events) != 0 {
		t.Fatalf("after ClearLog: %+v, %v", h, err)
	}

	// a BMC that does not report health: an error, never OK
	if err := srv.SetHealth("1", vbmc.HealthUpdate{System: "null", Chassis: "null"}); err != nil {
		t.Fatal(err)
	}
	h, err = c.Health(ctx, tg)
	var oe *bmc.OpError
	if !errors.Is(err, bmc.ErrUnsupported) || !errors.As(err, &oe) || oe.Op != "health" || h.System != "" {
		t.Fatalf("no Status.Health: %+v, %v; want an OpError with ErrUnsupported", h, err)
	}
	// wrong password: auth, and the password is not in the error
	bad := tg
	bad.Password = "wrong-" + testPass
	if _, err := c.Health(ctx, bad); !errors.Is(err, bmc.ErrAuth) || strings.Contains(err.Error(), bad.Password) {
		t.Fatalf("wrong password: %v", err)
	}
	// nothing listening: unreachable, no health
	gone := tg
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	gone.Address = ln.Addr().String()
	ln.Close()
	fast := newController(t, bmc.Config{NoRetries: true, CallTimeout: 3 * time.Second}, nil)
	if h, err := fast.Health(ctx, gone); err == nil || h.System != "" {
		t.Fatalf("absent BMC: %+v, %v", h, err)
	} else if r := bmc.Reason(err); r != "unreachable" && r != "timeout" {
		t.Fatalf("absent BMC: reason %q (%v)", r, err)
	}

	// the knob's refusals
	for body, want := range map[string]int{`{"system":"Broken"}`: 400, `{}`: 400, `{"system":"OK","x":1}`: 400,
		`{"severity":"Critical"}`: 400, `{"event":"x","severity":"null"}`: 400, `[`: 400} {
		if st, ans := control(t, srv.Addr(), "1", testUser, testPass, body); st != want {
			t.Errorf("control %s: %d %s, want %d", body, st, ans, want)
		}
	}
	if st, _ := control(t, srv.Addr(), "2", testUser, testPass, `{"system":"OK"}`); st != 404 {
		t.Errorf("unknown system: %d, want 404", st)
	}
	if st, _ := control(t, srv.Addr(), "1", "", "", `{"system":"OK"}`); st != 401 {
		t.Errorf("no credentials: %d, want 401", st)
	}

	// every read went through the controller's metrics
	mfs, _ := reg.Gather()
	var ok, failed float64
	for _, mf := range mfs {
		if mf.GetName() != "kiln_bmc_ops_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			lab := map[string]string{}
			for _, l := range m.GetLabel() {
				lab[l.GetName()] = l.GetValue()
			}
			if lab["op"] == "health" && lab["result"] == "ok" {
				ok += m.GetCounter().GetValue()
			} else if lab["op"] == "health" {
				failed += m.GetCounter().GetValue()
			}
		}
	}
	if ok != 5 || failed != 2 {
		t.Fatalf("kiln_bmc_ops_total{op=health}: ok %v, failed %v; want 5 and 2", ok, failed)
	}
}

// Many systems (the fleet simulator's mode): each system has its own chassis and log,
// and the knob changes one machine only.
func TestHealthManySystems(t *testing.T) {
	a, b := &fakePower{}, &fakePower{}
	srv, err := vbmc.New(vbmc.Config{Listen: "0.0.0.0:0", Username: testUser, Password: testPass, NoRequestLog: true,
		Systems: []vbmc.SystemConfig{
			{ID: "7", Addr: netip.MustParseAddr("127.0.0.2"), Serial: "SN-A", Power: a},
			{ID: "8", Addr: netip.MustParseAddr("127.0.0.3"), Serial: "SN-B", Power: b},
		}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx, slog.New(slog.NewTextHandler(io.Discard, nil))) }()
	t.Cleanup(func() { cancel(); <-done })
	_, port, _ := net.SplitHostPort(srv.Addr())
	target := func(ip string) bmc.Target {
		return bmc.Target{Address: net.JoinHostPort(ip, port), Driver: bmc.DriverRedfish, Username: testUser,
			Password: testPass, InsecureTLS: true}
	}
	c := newController(t, bmc.Config{}, nil)
	cctx, ccancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer ccancel()
	// the knob reaches system 8 through any address (here system 7's)
	if st, ans := control(t, net.JoinHostPort("127.0.0.2", port), "8", testUser, testPass, `{"chassis":"Critical","event":"PSU1 failure"}`); st != 200 {
		t.Fatalf("control: %d %s", st, ans)
	}
	if h, err := c.Health(cctx, target("127.0.0.2")); err != nil || h.System != bmc.HealthOK || h.Chassis != bmc.HealthOK || len(h.Events) != 0 {
		t.Fatalf("system 7: %+v, %v; want untouched", h, err)
	}
	h, err := c.Health(cctx, target("127.0.0.3"))
	if err != nil || h.System != bmc.HealthOK || h.Chassis != bmc.HealthCritical || len(h.Events) != 1 || h.Events[0].Message != "PSU1 failure" {
		t.Fatalf("system 8: %+v, %v; want chassis Critical with the event", h, err)
	}
	// the chassis collection as each address sees it
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	req, _ := http.NewRequest("GET", "https://"+net.JoinHostPort("127.0.0.3", port)+"/redfish/v1/Chassis", nil)
	req.SetBasicAuth(testUser, testPass)
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var col struct{ Members []map[string]string }
	_ = json.NewDecoder(resp.Body).Decode(&col)
	resp.Body.Close()
	if len(col.Members) != 1 || col.Members[0]["@odata.id"] != "/redfish/v1/Chassis/8" {
		t.Fatalf("Chassis via system 8's address: %v", col.Members)
	}
	if st, err := srv.Health("7"); err != nil || st.System != "OK" || st.LogEntries != 0 {
		t.Fatalf("Server.Health(7) = %+v, %v", st, err)
	}
	if err := srv.SetHealth("9", vbmc.HealthUpdate{System: "OK"}); !errors.Is(err, vbmc.ErrNoSystem) {
		t.Fatalf("SetHealth on an unknown system: %v", err)
	}
}
