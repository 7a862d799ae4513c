package bmc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestSealerRoundTripAndTamper(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys", "site.key")
	key, err := LoadOrCreateKey(path)
	if err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(path)
	if err != nil || st.Mode().Perm() != 0o600 || st.Size() != KeySize {
		t.Fatalf("key file: %v mode %v size %d", err, st.Mode().Perm(), st.Size())
	}
	again, err := LoadOrCreateKey(path)
	if err != nil || string(again) != string(key) {
		t.Fatalf("reload: %v, same=%t", err, string(again) == string(key))
	}
	s, err := NewSealer(key)
	if err != nil {
		t.Fatal(err)
	}
	pt := []byte("bmc-password-123")
	a, b := s.Seal(pt), s.Seal(pt)
	if string(a) == string(b) || strings.Contains(string(a), string(pt)) || len(a) != 1+8+12+len(pt)+16 {
		t.Fatalf("sealed blobs: equal=%t len=%d", string(a) == string(b), len(a))
	}
	got, err := s.Open(a)
	if err != nil || string(got) != string(pt) {
		t.Fatalf("Open = %q, %v", got, err)
	}
	for i := range a { // every single-byte change is detected
		c := append([]byte(nil), a...)
		c[i] ^= 0x01
		if _, err := s.Open(c); !errors.Is(err, ErrSealed) {
			t.Fatalf("tampered byte %d: %v", i, err)
		}
	}
	if _, err := s.Open(a[:len(a)-1]); !errors.Is(err, ErrSealed) {
		t.Fatal("truncated blob opened")
	}
	other, _ := NewSealer(make([]byte, KeySize))
	if _, err := other.Open(a); !errors.Is(err, ErrSealed) {
		t.Fatal("opened with the wrong key")
	}
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadOrCreateKey(path); err == nil {
		t.Fatal("world-readable key accepted")
	}
	if err := os.WriteFile(path, []byte("short"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadOrCreateKey(path); err == nil {
		t.Fatal("short key accepted")
	}
	if _, err := NewSealer(make([]byte, 16)); err == nil {
		t.Fatal("16-byte key accepted")
	}
}

func TestTargetRedaction(t *testing.T) {
	const pw = "Hunter2-Secret"
	tg := Target{Address: "10.0.0.1", Driver: DriverRedfish, Username: "root", Password: pw}
	var logs strings.Builder
	l := slog.New(slog.NewJSONHandler(&logs, nil))
	l.Info("x", "target", tg)
	slog.New(slog.NewTextHandler(&logs, nil)).Info("y", "target", tg, "ptr", &tg)
	js, _ := json.Marshal(tg)
	out := fmt.Sprintf("%v %+v %#v %s %q", tg, tg, tg, tg, tg) + string(js) + logs.String() + fmt.Sprint(&tg)
	if strings.Contains(out, pw) {
		t.Fatalf("password leaked: %s", out)
	}
	if !strings.Contains(out, "10.0.0.1") || !strings.Contains(out, "[REDACTED]") {
		t.Fatalf("redacted output lost the useful fields: %s", out)
	}
}

func TestScrubAndOpError(t *testing.T) {
	e := &OpError{Op: "power", Driver: "ipmi", Address: "a", Err: ErrAuth, Msg: scrub("bad p@ss and p%40ss here", "p@ss")}
	if strings.Contains(e.Error(), "p@ss") || strings.Contains(e.Error(), "p%40ss") || !errors.Is(e, ErrAuth) || Reason(e) != "auth" {
		t.Fatalf("OpError = %q reason %q", e.Error(), Reason(e))
	}
	long := scrub(strings.Repeat("x", 1000), "")
	if len(long) > maxMsg+4 {
		t.Fatalf("scrub did not truncate: %d", len(long))
	}
}

func TestClassify(t *testing.T) {
	ctx := context.Background()
	dead, cancel := context.WithTimeout(ctx, time.Nanosecond)
	defer cancel()
	<-dead.Done()
	for _, tc := range []struct {
		err  error
		ctx  context.Context
		want error
	}{
		{fmt.Errorf("x: %w", ErrBootNotApplied), ctx, ErrBootNotApplied},
		{errors.New("401: {\"error\":{}}"), ctx, ErrAuth},
		{errors.New("Error: Unable to establish IPMI v2 / RMCP+ session"), ctx, ErrUnreachable},
		{errors.New("RAKP 2 message indicates an error : unauthorized name\nError: Unable to establish IPMI v2 / RMCP+ session"), ctx, ErrAuth},
		{errors.New("RAKP 2 HMAC is invalid"), ctx, ErrAuth},
		{errors.New(`Get "https://x/redfish/v1/": dial tcp 127.0.0.1:1: connect: connection refused`), ctx, ErrUnreachable},
		{errors.New(`tls: failed to verify certificate: x509: certificate signed by unknown authority`), ctx, ErrTLS},
		{errors.New("net/http: request canceled (Client.Timeout exceeded while awaiting headers)"), ctx, ErrTimeout},
		{errors.New("anything"), dead, ErrTimeout},
		{errors.New("400: {\"error\":{}}"), ctx, ErrRejected},
		{errors.New("405: method not allowed"), ctx, ErrUnsupported},
		{errors.New("invalid character 'x' looking for beginning of value"), ctx, ErrBadAnswer},
	} {
		if got := classify(tc.ctx, tc.err); got != tc.want {
			t.Errorf("classify(%q) = %v, want %v", tc.err, got, tc.want)
		}
	}
	if Reason(nil) != "" || Reason(errors.New("x")) != "error" || Reason(fmt.Errorf("w: %w", ErrTimeout)) != "timeout" {
		t.Fatal("Reason mapping")
	}
}

func TestParseIPMIPower(t *testing.T) {
	for in, want := range map[string]PowerState{
		"Chassis Power is on\n":  PowerOn,
		"Chassis Power is off\n": PowerOff,
		"  Chassis Power is on ": PowerOn,
	} {
		if got, err := parseIPMIPower(in); err != nil || got != want {
			t.Errorf("%q -> %q, %v", in, got, err)
		}
	}
	for _, in := range []string{"", "Chassis Power is unknown", "Chassis Power is on\nChassis Power is off",
		"Error: Unable to establish IPMI v2 / RMCP+ session", "chassis power is ON", "Chassis Power is on\nwarning"} {
		if got, err := parseIPMIPower(in); !errors.Is(err, ErrBadAnswer) || got != "" {
			t.Errorf("%q -> %q, %v; want ErrBadAnswer", in, got, err)
		}
	}
}

func TestParseBootParam5(t *testing.T) {
	out := "Boot parameter version: 1\nBoot parameter 5 is valid/unlocked\nBoot parameter data: a004000000\n Boot Flags :\n"
	f, err := parseBootParam5(out)
	if err != nil || f != (bootFlags{Valid: true, EFI: true, Device: 1}) {
		t.Fatalf("%+v, %v", f, err)
	}
	f, err = parseBootParam5("Boot parameter data: c008000000\n")
	if err != nil || f != (bootFlags{Valid: true, Persistent: true, Device: 2}) {
		t.Fatalf("%+v, %v", f, err)
	}
	for _, in := range []string{"", "Boot parameter data: 0004", "Boot parameter data: zz04000000",
		"Boot parameter data: 8004000000\nBoot parameter data: 8004000000"} {
		if _, err := parseBootParam5(in); !errors.Is(err, ErrBadAnswer) {
			t.Errorf("%q: %v, want ErrBadAnswer", in, err)
		}
	}
}

func TestParseRedfish(t *testing.T) {
	if s, err := parseRedfishPowerState("On"); err != nil || s != PowerOn {
		t.Fatal(s, err)
	}
	for _, in := range []string{"", "on", "PoweringOn", "Unknown", "{}"} {
		if _, err := parseRedfishPowerState(in); !errors.Is(err, ErrBadAnswer) {
			t.Errorf("%q accepted", in)
		}
	}
	b, err := parseBoot(strings.NewReader(`{"Boot":{"BootSourceOverrideTarget":"Pxe","BootSourceOverrideEnabled":"Once","BootSourceOverrideMode":"UEFI"}}`))
	if err != nil || b != (bootSettings{"Pxe", "Once", "UEFI"}) {
		t.Fatal(b, err)
	}
	for _, in := range []string{`{}`, `{"Boot":{}}`, `{"Boot":{"BootSourceOverrideTarget":"Pxe"}}`, `not json`,
		`{"Boot":{"BootSourceOverrideTarget":1,"BootSourceOverrideEnabled":"Once"}}`} {
		if _, err := parseBoot(strings.NewReader(in)); !errors.Is(err, ErrBadAnswer) {
			t.Errorf("%q: %v", in, err)
		}
	}
	want := bootSettings{"Pxe", "Once", "UEFI"}
	if p := want.patch(&bootSettings{"Pxe", "Disabled", "UEFI"}, true); len(p) != 1 || p["BootSourceOverrideEnabled"] != "Once" {
		t.Fatalf("diff patch = %v", p)
	}
	if p := want.patch(nil, false); len(p) != 2 {
		t.Fatalf("minimal patch = %v", p)
	}
}

func TestTargetEndpoint(t *testing.T) {
	for in, want := range map[string]string{"10.0.0.1": "10.0.0.1:443", "bmc1:8443": "bmc1:8443",
		"https://10.1.1.1:9443/": "10.1.1.1:9443", "[fd00::1]:443": "fd00::1:443", "fd00::1": "fd00::1:443"} {
		h, p, err := Target{Address: in}.endpoint(443)
		if err != nil || fmt.Sprintf("%s:%d", h, p) != want {
			t.Errorf("%q -> %s:%d, %v; want %s", in, h, p, err, want)
		}
	}
	for _, in := range []string{"", "h:0", "h:99999", "user:pw@h", "h/x", "h:abc"} {
		if _, _, err := (Target{Address: in}).endpoint(443); !errors.Is(err, ErrInvalidTarget) {
			t.Errorf("%q accepted", in)
		}
	}
}

// TestLocking checks the per-address lock (one operation per BMC) and the site-wide
// semaphore (MaxConcurrent) with real goroutines.
func TestLocking(t *testing.T) {
	c, err := New(Config{MaxConcurrent: 2}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var perAddr [3]atomic.Int32
	var total, maxTotal, maxPer atomic.Int32
	var wg sync.WaitGroup
	for i := 0; i < 30; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			a := i % 3
			unlock, err := c.acquire(context.Background(), fmt.Sprintf("bmc-%d", a))
			if err != nil {
				t.Error(err)
				return
			}
			n, tot := perAddr[a].Add(1), total.Add(1)
			for _, m := range []struct {
				v   int32
				max *atomic.Int32
			}{{n, &maxPer}, {tot, &maxTotal}} {
				for {
					old := m.max.Load()
					if m.v <= old || m.max.CompareAndSwap(old, m.v) {
						break
					}
				}
			}
			time.Sleep(2 * time.Millisecond)
			perAddr[a].Add(-1)
			total.Add(-1)
			unlock()
		}(i)
	}
	wg.Wait()
	if maxPer.Load() != 1 || maxTotal.Load() != 2 {
		t.Fatalf("max per address %d (want 1), max total %d (want 2)", maxPer.Load(), maxTotal.Load())
	}
	// a waiter gives up with its context
	unlock, _ := c.acquire(context.Background(), "busy")
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := c.acquire(ctx, "busy"); err == nil {
		t.Fatal("second acquire of a busy BMC succeeded")
	}
	unlock()
}

func TestConfigValidate(t *testing.T) {
	if _, err := New(Config{Retries: -1}, nil); err == nil {
		t.Fatal("negative retries accepted")
	}
	if _, err := New(Config{BackoffBase: time.Second, BackoffMax: time.Millisecond}, nil); err == nil {
		t.Fatal("base > max accepted")
	}
	c, _ := New(Config{}, nil)
	err := c.Power(context.Background(), Target{Address: "x"}, "explode")
	if !errors.Is(err, ErrInvalidTarget) {
		t.Fatalf("unknown action: %v", err)
	}
	if err := c.SetNextBootPXE(context.Background(), Target{Address: "x"}, "bios"); !errors.Is(err, ErrInvalidTarget) {
		t.Fatalf("unknown mode: %v", err)
	}
	if _, err := c.PowerState(context.Background(), Target{Address: "x", Driver: "smoke-signals"}); !errors.Is(err, ErrInvalidTarget) {
		t.Fatalf("unknown driver: %v", err)
	}
}
