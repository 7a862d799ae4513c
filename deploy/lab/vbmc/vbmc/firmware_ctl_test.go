package vbmc_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"kiln/bmc"
	"kiln/deploy/lab/vbmc/vbmc"
	"kiln/httpboot"
)

type noBoots struct{}

func (noBoots) BootFor(context.Context, net.HardwareAddr) (httpboot.Boot, error) {
	return httpboot.Boot{}, httpboot.ErrUnknownMachine
}

// kilnHTTP runs Kiln's HTTP boot server on loopback with the given images in
// its catalog (uploaded as `kiln image upload` does) and returns its base URL.
func kilnHTTP(t *testing.T, images map[string][]byte) string {
	t.Helper()
	dir := t.TempDir()
	envDir := filepath.Join(dir, "env")
	if err := os.MkdirAll(envDir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{httpboot.EnvKernel, httpboot.EnvInitramfs} {
		if err := os.WriteFile(filepath.Join(envDir, f), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	base := "http://" + ln.Addr().String()
	s, err := httpboot.New(httpboot.Config{BaseURL: base, AgentURL: "http://127.0.0.1:9", EnvDir: envDir,
		ImageDir: filepath.Join(dir, "images")}, noBoots{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for name, b := range images {
		sum := sha256.Sum256(b)
		if _, err := s.Catalog().Upload(context.Background(), name, bytes.NewReader(b), hex.EncodeToString(sum[:]), int64(len(b))); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, slog.New(slog.NewTextHandler(io.Discard, nil)), ln) }()
	t.Cleanup(func() { cancel(); <-done })
	return base
}

func component(t *testing.T, fc []bmc.FirmwareComponent, name string) bmc.FirmwareComponent {
	t.Helper()
	for _, c := range fc {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("no component %q in %+v", name, fc)
	return bmc.FirmwareComponent{}
}

// Kiln's BMC controller against the vbmc (a simulated machine, no qemu):
// FirmwareInventory; a BIOS image served by Kiln's HTTP server, applied with
// SimpleUpdate and its task followed to Completed with rising progress, staged
// until ResetSystem, then read back; a multipart push; a bad image is
// ErrTaskFailed; BIOS attributes staged through the settings object (pending,
// not current) and applied by the reset; the same through the Dell quirk
// (the controller creates the configuration job).
func TestControllerFirmwareAndBIOS(t *testing.T) {
	base := kilnHTTP(t, map[string][]byte{
		"bios-2.1.0.fw": vbmc.FirmwareImage("BIOS", "2.1.0", bytes.Repeat([]byte{1}, 8192)),
		"junk.fw":       []byte("not firmware"),
	})
	for _, quirk := range []bool{false, true} {
		srv, p, _ := startSimVBMC(t, vbmc.Quirks{BIOSConfigJob: quirk})
		tg := bmc.Target{Address: srv.Addr(), Driver: bmc.DriverRedfish, Username: testUser, Password: testPass, CACertPEM: srv.CACertPEM()}
		c := newController(t, bmc.Config{}, nil)
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()

		fc, err := c.FirmwareInventory(ctx, tg)
		if err != nil || len(fc) != 4 {
			t.Fatalf("FirmwareInventory %+v, %v", fc, err)
		}
		biosComp := component(t, fc, "BIOS")
		if biosComp.Version != "1.0.0" || !biosComp.Updateable || biosComp.Path != "/redfish/v1/UpdateService/FirmwareInventory/BIOS" {
			t.Fatalf("BIOS component %+v", biosComp)
		}
		if !quirk {
			var progress []bmc.TaskStatus
			st, err := c.UpdateFirmware(ctx, tg, bmc.FirmwareUpdate{ImageURI: base + "/images/bios-2.1.0.fw", Target: biosComp.Path,
				PollInterval: 50 * time.Millisecond, Progress: func(s bmc.TaskStatus) { progress = append(progress, s) }})
			if err != nil || st.State != "Completed" || st.Percent != 100 || !st.NeedsReset() {
				t.Fatalf("UpdateFirmware %+v, %v", st, err)
			}
			if len(progress) < 3 || progress[len(progress)-1].State != "Completed" {
				t.Fatalf("progress %+v", progress)
			}
			for i := 1; i < len(progress); i++ {
				if progress[i].Percent < progress[i-1].Percent {
					t.Fatalf("progress went down: %+v", progress)
				}
			}
			t.Logf("BIOS update task: %d progress reports, last %q", len(progress), progress[len(progress)-1].Messages)
			if fc, _ := c.FirmwareInventory(ctx, tg); component(t, fc, "BIOS").Version != "1.0.0" {
				t.Fatalf("BIOS changed before the reset: %+v", fc)
			}
			if err := c.ResetSystem(ctx, tg); err != nil {
				t.Fatal(err)
			}
			if fc, _ := c.FirmwareInventory(ctx, tg); component(t, fc, "BIOS").Version != "2.1.0" {
				t.Fatalf("BIOS after the reset: %+v", fc)
			}
			// multipart push (no URI)
			st, err = c.UpdateFirmware(ctx, tg, bmc.FirmwareUpdate{Image: vbmc.FirmwareImage("NIC1", "14.32.3000", nil), PollInterval: 50 * time.Millisecond})
			if err != nil || st.NeedsReset() {
				t.Fatalf("push %+v, %v", st, err)
			}
			if fc, _ := c.FirmwareInventory(ctx, tg); component(t, fc, "NIC1").Version != "14.32.3000" {
				t.Fatalf("NIC1 after the push: %+v", fc)
			}
			// a bad image: the task's Exception is ErrTaskFailed with the BMC's message
			st, err = c.UpdateFirmware(ctx, tg, bmc.FirmwareUpdate{ImageURI: base + "/images/junk.fw", PollInterval: 50 * time.Millisecond})
			if !errors.Is(err, bmc.ErrTaskFailed) || bmc.Reason(err) != "task_failed" || st.State != "Exception" || !strings.Contains(err.Error(), "Verification") {
				t.Fatalf("junk image: %+v, %v", st, err)
			}
			if _, err := c.UpdateFirmware(ctx, tg, bmc.FirmwareUpdate{ImageURI: "ftp://x/y"}); !errors.Is(err, bmc.ErrInvalidTarget) {
				t.Fatalf("ftp URI: %v", err)
			}
		}

		b, err := c.BIOSAttributes(ctx, tg)
		if err != nil || b.Attributes["ProcVirtualization"] != "Enabled" || b.Attributes["PowerOnDelaySeconds"] != int64(0) ||
			b.SettingsPath != "/redfish/v1/Systems/1/Bios/Settings" || len(b.Pending) != 0 {
			t.Fatalf("BIOSAttributes %+v, %v", b, err)
		}
		// staged only
		b, err = c.SetBIOSAttributes(ctx, tg, map[string]any{"ProcVirtualization": "Disabled", "PowerOnDelaySeconds": int64(5)})
		if err != nil || b.Pending["ProcVirtualization"] != "Disabled" || b.Attributes["ProcVirtualization"] != "Enabled" {
			t.Fatalf("SetBIOSAttributes (quirk %v) %+v, %v", quirk, b, err)
		}
		// set again: already staged, no second PATCH (the quirk would refuse it)
		if _, err := c.SetBIOSAttributes(ctx, tg, map[string]any{"ProcVirtualization": "Disabled"}); err != nil {
			t.Fatalf("SetBIOSAttributes again: %v", err)
		}
		calls := len(p.log())
		b, err = c.ApplyBIOSAttributes(ctx, tg, map[string]any{"ProcVirtualization": "Disabled", "PowerOnDelaySeconds": int64(5)}, 10*time.Second)
		if err != nil || b.Attributes["ProcVirtualization"] != "Disabled" || b.Attributes["PowerOnDelaySeconds"] != int64(5) || len(b.Pending) != 0 {
			t.Fatalf("ApplyBIOSAttributes (quirk %v) %+v, %v", quirk, b, err)
		}
		if len(p.log()) == calls {
			t.Fatal("ApplyBIOSAttributes did not reset the machine")
		}
		jobs := 0
		for _, r := range srv.Requests() {
			if r.Method == "POST" && r.Path == "/redfish/v1/Managers/1/Jobs" && r.Status == 200 {
				jobs++
			}
		}
		if want := map[bool]int{false: 0, true: 1}[quirk]; jobs != want {
			t.Fatalf("quirk %v: %d configuration jobs created, want %d", quirk, jobs, want)
		}
		if _, err := c.SetBIOSAttributes(ctx, tg, map[string]any{"NoSuchAttr": "x"}); !errors.Is(err, bmc.ErrRejected) {
			t.Fatalf("unknown attribute: %v, want rejected", err)
		}
	}
}

// An IPMI BMC has none of it: each method is ErrUnsupported ("unsupported"),
// never a silent success.
func TestFirmwareUnsupportedOverIPMI(t *testing.T) {
	c := newController(t, bmc.Config{NoRetries: true, CallTimeout: 2 * time.Second}, nil)
	tg := bmc.Target{Address: "127.0.0.1:1", Driver: bmc.DriverIPMI, Username: "u", Password: "p"}
	ctx := context.Background()
	_, e1 := c.FirmwareInventory(ctx, tg)
	_, e2 := c.UpdateFirmware(ctx, tg, bmc.FirmwareUpdate{ImageURI: "http://127.0.0.1:1/x"})
	_, e3 := c.BIOSAttributes(ctx, tg)
	_, e4 := c.SetBIOSAttributes(ctx, tg, map[string]any{"A": "B"})
	_, e5 := c.ApplyBIOSAttributes(ctx, tg, map[string]any{"A": "B"}, time.Second)
	for i, err := range []error{e1, e2, e3, e4, e5} {
		if !errors.Is(err, bmc.ErrUnsupported) || bmc.Reason(err) != "unsupported" {
			t.Fatalf("method %d over IPMI: %v, want unsupported", i+1, err)
		}
	}
}
