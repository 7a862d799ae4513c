package lifecycle

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"kiln/bmc"
	"kiln/deploy/lab/vbmc/vbmc"
	"kiln/store"
)

// fwFleet is vbmcFleet plus the firmware side (FirmwareBMC) over the real
// bmc.Controller; machines in ipmi get an IPMI target (no UpdateService).
type fwFleet struct {
	*vbmcFleet
	ipmi map[string]bool
}

func (f *fwFleet) tgt(id string) (bmc.Target, error) {
	if f.ipmi[id] {
		return bmc.Target{Address: "127.0.0.1:1", Driver: bmc.DriverIPMI, Username: "u", Password: "p"}, nil
	}
	return f.target(id)
}

func (f *fwFleet) FirmwareInventory(ctx context.Context, id string) ([]bmc.FirmwareComponent, error) {
	t, err := f.tgt(id)
	if err != nil {
		return nil, err
	}
	return f.ctl.FirmwareInventory(ctx, t)
}

func (f *fwFleet) UpdateFirmware(ctx context.Context, id string, u bmc.FirmwareUpdate) (bmc.TaskStatus, error) {
	t, err := f.tgt(id)
	if err != nil {
		return bmc.TaskStatus{}, err
	}
	u.PollInterval = 50 * time.Millisecond
	return f.ctl.UpdateFirmware(ctx, t, u)
}

func (f *fwFleet) BIOSAttributes(ctx context.Context, id string) (bmc.BIOS, error) {
	t, err := f.tgt(id)
	if err != nil {
		return bmc.BIOS{}, err
	}
	return f.ctl.BIOSAttributes(ctx, t)
}

func (f *fwFleet) ApplyBIOSAttributes(ctx context.Context, id string, attrs map[string]any) (bmc.BIOS, error) {
	t, err := f.tgt(id)
	if err != nil {
		return bmc.BIOS{}, err
	}
	return f.ctl.ApplyBIOSAttributes(ctx, t, attrs, 10*time.Second)
}

func (f *fwFleet) ResetSystem(ctx context.Context, id string) error {
	t, err := f.tgt(id)
	if err != nil {
		return err
	}
	return f.ctl.ResetSystem(ctx, t)
}

// addModel starts machine id's vbmc as vendor/model with fast update tasks.
func (f *fwFleet) addModel(id, vendor, model string, quirks vbmc.Quirks) {
	t := f.t
	p := &simPower{}
	v, err := vbmc.New(vbmc.Config{Listen: "127.0.0.1:0", Username: "admin", Password: "Rem-Secret-1", Quirks: quirks,
		FirmwareUpdateDuration: 200 * time.Millisecond,
		Systems:                []vbmc.SystemConfig{{ID: "1", Serial: "SN-" + id, Manufacturer: vendor, Model: model, Power: p}}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = v.Run(ctx, slog.New(slog.NewTextHandler(io.Discard, nil))) }()
	t.Cleanup(func() { cancel(); <-done })
	f.mu.Lock()
	f.srv[id], f.power[id] = v, p
	f.mu.Unlock()
}

func driftFields(d []store.FieldDiff) string {
	var f []string
	for _, x := range d {
		if strings.HasPrefix(x.Field, FieldFirmwarePrefix) || strings.HasPrefix(x.Field, FieldBIOSPrefix) {
			f = append(f, x.Field+"="+x.Intended+"/"+x.Discovered)
		}
	}
	return strings.Join(f, " ")
}

// Baselines end to end over real vbmcs and the real bmc.Controller: the
// firmware read fills Machine.Firmware; setting the model's baseline shows
// the drift in the machine's diff (next to the hardware fields); ApplyBaseline
// updates firmware (task followed, BIOS activated by a reset, read back), then
// the BIOS attributes (settings object, reset, read back), records each step,
// and leaves no drift; a second run has nothing to do. A failing image fails
// its step and skips the rest; an IPMI-only BMC is "unsupported", never a
// silent success.
func TestBaselineReadDriftApply(t *testing.T) {
	st := newStore(t)
	h := newHarness(t, st, func(c *Config) { c.Inspection = InspectManual })
	f := &fwFleet{vbmcFleet: newVBMCFleet(t), ipmi: map[string]bool{}}
	h.c.bmc = f
	imgs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/images/bios-2.1.0.fw":
			_, _ = w.Write(vbmc.FirmwareImage("BIOS", "2.1.0", []byte("rom")))
		case "/images/nic.fw":
			_, _ = w.Write(vbmc.FirmwareImage("NIC1", "14.32.2004", nil))
		default:
			http.NotFound(w, r)
		}
	}))
	defer imgs.Close()
	mk := func(name, vendor, model string) store.Machine {
		m, err := st.PutMachine(bg, store.Machine{Name: name, BMC: "bmc-" + name,
			Intended: store.Hardware{Vendor: vendor, Model: model}}, store.W{Actor: "test", Reason: "setup"})
		must(t, err)
		return m
	}
	m1 := mk("n1", "Acme", "R1")
	f.addModel(m1.ID, "Acme", "R1", vbmc.Quirks{BIOSConfigJob: true})

	m, err := h.c.ReadFirmware(bg, m1.ID, store.W{Actor: "test"})
	if err != nil || m.Firmware == nil || len(m.Firmware.Components) != 4 || m.Firmware.BIOS["ProcVirtualization"] != "Enabled" ||
		m.Firmware.Baseline != "" || len(m.Firmware.Drift) != 0 {
		t.Fatalf("first read: %+v, %v", m.Firmware, err)
	}
	bl, err := h.c.SetBaseline(bg, store.Baseline{Vendor: "acme", Model: "r1",
		Firmware: []store.BaselineFirmware{{Component: "BIOS", Version: "2.1.0", ImageURI: imgs.URL + "/images/bios-2.1.0.fw"},
			{Component: "NIC1", Version: "14.32.2004", ImageURI: imgs.URL + "/images/nic.fw"}, {Component: "BMC", Version: "kiln-vbmc-1"}},
		BIOS: map[string]string{"ProcVirtualization": "Disabled", "PowerOnDelaySeconds": "5", "LogicalProc": "Enabled"}}, store.W{Actor: "api:alice"})
	must(t, err)
	m, _ = st.GetMachine(m1.ID)
	want := "bios.PowerOnDelaySeconds=5/0 bios.ProcVirtualization=Disabled/Enabled firmware.BIOS=2.1.0/1.0.0 firmware.NIC1=14.32.2004/14.32.1010"
	if got := driftFields(m.Diff); got != want || m.Firmware.Baseline != bl.ID {
		t.Fatalf("drift in the diff after SetBaseline:\n got %s\nwant %s", got, want)
	}
	for _, d := range m.Diff {
		if d.Blocking {
			t.Fatalf("drift is blocking: %+v", d)
		}
	}

	var seen []store.FirmwareApply
	run, err := h.c.ApplyBaseline(bg, m1.ID, store.W{Actor: "campaign:c1"}, func(a store.FirmwareApply) { seen = append(seen, a) })
	if err != nil || run.State != FWSucceeded || len(run.Steps) != 3 {
		t.Fatalf("apply: %+v, %v", run, err)
	}
	for i, s := range run.Steps {
		if s.State != FWSucceeded {
			t.Fatalf("step %d %+v", i, s)
		}
	}
	if run.Steps[0].Target != "BIOS" || run.Steps[0].From != "1.0.0" || run.Steps[0].To != "2.1.0" || run.Steps[0].Task == "" ||
		run.Steps[2].Kind != "bios" || run.Steps[2].Target != "PowerOnDelaySeconds,ProcVirtualization" {
		t.Fatalf("steps %+v", run.Steps)
	}
	if len(seen) < 4 {
		t.Fatalf("progress reports %d", len(seen))
	}
	fw, _, _ := f.srv[m1.ID].Firmware("1")
	cur, _, _ := f.srv[m1.ID].BIOSAttributes("1")
	if fw["BIOS"] != "2.1.0" || fw["NIC1"] != "14.32.2004" || cur["ProcVirtualization"] != "Disabled" || cur["PowerOnDelaySeconds"] != 5 {
		t.Fatalf("vbmc after apply: %v %v", fw, cur)
	}
	m, _ = st.GetMachine(m1.ID)
	if d := driftFields(m.Diff); d != "" || len(m.Firmware.Drift) != 0 || m.Firmware.Apply == nil || m.Firmware.Apply.State != FWSucceeded {
		t.Fatalf("after apply: drift %q, record %+v", d, m.Firmware)
	}
	run, err = h.c.ApplyBaseline(bg, m1.ID, store.W{Actor: "campaign:c1"}, nil)
	if err != nil || run.State != FWSucceeded || len(run.Steps) != 1 || run.Steps[0].Message != "already at the baseline" {
		t.Fatalf("second apply: %+v, %v", run, err)
	}

	// the parts alone: BIOS drift put back by hand, then the "bios" part only
	if _, err := f.ctl.ApplyBIOSAttributes(bg, mustTarget(t, f, m1.ID), map[string]any{"LogicalProc": "Disabled"}, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	run, err = h.c.ApplyBaselinePart(bg, m1.ID, BaselineFirmware, store.W{Actor: "campaign:c1"}, nil)
	if err != nil || run.State != FWSucceeded || len(run.Steps) != 0 {
		t.Fatalf("firmware part at the baseline: %+v, %v", run, err)
	}
	if m, _ = st.GetMachine(m1.ID); driftFields(m.Diff) != "bios.LogicalProc=Enabled/Disabled" {
		t.Fatalf("drift after the firmware part: %q", driftFields(m.Diff))
	}
	run, err = h.c.ApplyBaselinePart(bg, m1.ID, BaselineBIOS, store.W{Actor: "campaign:c1"}, nil)
	if err != nil || run.State != FWSucceeded || len(run.Steps) != 1 || run.Steps[0].Target != "LogicalProc" {
		t.Fatalf("bios part: %+v, %v", run, err)
	}
	if _, err := h.c.ApplyBaselinePart(bg, m1.ID, "nic", store.W{Actor: "t"}, nil); !errors.Is(err, ErrInvalid) {
		t.Fatalf("unknown part: %v", err)
	}

	// a baseline whose image is missing: the step fails (task_failed), BIOS is skipped
	m2 := mk("n2", "Acme", "R2")
	f.addModel(m2.ID, "Acme", "R2", vbmc.Quirks{})
	_, err = h.c.SetBaseline(bg, store.Baseline{Vendor: "Acme", Model: "R2",
		Firmware: []store.BaselineFirmware{{Component: "BIOS", Version: "9.9", ImageURI: imgs.URL + "/images/absent.fw"}},
		BIOS:     map[string]string{"MemTest": "Enabled"}}, store.W{Actor: "api:alice"})
	must(t, err)
	run, err = h.c.ApplyBaseline(bg, m2.ID, store.W{Actor: "campaign:c1"}, nil)
	if !errors.Is(err, bmc.ErrTaskFailed) || run.State != FWFailed || run.Steps[0].State != FWFailed || run.Steps[0].Reason != "task_failed" ||
		run.Steps[1].State != FWSkipped {
		t.Fatalf("missing image: %+v, %v", run, err)
	}
	if cur, _, _ := f.srv[m2.ID].BIOSAttributes("1"); cur["MemTest"] != "Disabled" {
		t.Fatal("BIOS changed after a failed firmware step")
	}

	// IPMI only: unsupported, recorded
	m3 := mk("n3", "Acme", "R1")
	f.ipmi[m3.ID] = true
	m, err = h.c.ReadFirmware(bg, m3.ID, store.W{Actor: "test"})
	if !errors.Is(err, ErrFirmwareUnsupported) || m.Firmware == nil || m.Firmware.Error != "unsupported" {
		t.Fatalf("IPMI read: %+v, %v", m.Firmware, err)
	}
	run, err = h.c.ApplyBaseline(bg, m3.ID, store.W{Actor: "campaign:c1"}, nil)
	if !errors.Is(err, ErrFirmwareUnsupported) || run.State != FWUnsupported || run.Steps[0].State != FWUnsupported {
		t.Fatalf("IPMI apply: %+v, %v", run, err)
	}
	// no baseline for the model
	m4 := mk("n4", "Other", "X")
	f.addModel(m4.ID, "Other", "X", vbmc.Quirks{})
	if _, err := h.c.ApplyBaseline(bg, m4.ID, store.W{Actor: "t"}, nil); !errors.Is(err, ErrNoBaseline) {
		t.Fatalf("no baseline: %v", err)
	}
	// the events
	evs, err := st.Events(0, 10000)
	must(t, err)
	kinds := map[string]int{}
	for _, e := range evs {
		if strings.HasPrefix(e.Kind, "firmware_") {
			kinds[e.Kind+"/"+e.To]++
		}
	}
	if kinds["firmware_applied/succeeded"] != 4 || kinds["firmware_apply_failed/failed"] != 1 || kinds["firmware_apply_failed/unsupported"] != 1 {
		t.Fatalf("firmware events %v", kinds)
	}
}

// EnrollBMC reads the firmware when the machine's model has a baseline
// (the drift shows at once), and not otherwise (no extra BMC reads for a
// fleet without baselines).
func TestEnrollReadsFirmwareWithBaseline(t *testing.T) {
	st := newStore(t)
	h := newHarness(t, st, func(c *Config) { c.Inspection = InspectManual })
	f := &fwFleet{vbmcFleet: newVBMCFleet(t), ipmi: map[string]bool{}}
	h.c.bmc = f
	_, err := h.c.SetBaseline(bg, store.Baseline{Vendor: "Acme", Model: "R1", BIOS: map[string]string{"MemTest": "Enabled"}}, store.W{Actor: "t"})
	must(t, err)
	for _, model := range []string{"R1", "R9"} {
		m, err := st.PutMachine(bg, store.Machine{Name: "e-" + model, Intended: store.Hardware{Vendor: "Acme", Model: model}}, store.W{Actor: "t", Reason: "setup"})
		must(t, err)
		f.addModel(m.ID, "Acme", model, vbmc.Quirks{})
		tg, _ := f.target(m.ID)
		_, err = h.c.EnrollBMC(bg, m.ID, store.BMC{Address: tg.Address, Driver: "redfish", Username: "admin", CACertPEM: string(tg.CACertPEM)}, "Rem-Secret-1", store.W{Actor: "t"})
		must(t, err)
		m, _ = st.GetMachine(m.ID)
		switch model {
		case "R1":
			if m.Firmware == nil || driftFields(m.Diff) != "bios.MemTest=Enabled/Disabled" {
				t.Fatalf("R1 after enrollment: firmware %+v diff %+v", m.Firmware, m.Diff)
			}
		default:
			if m.Firmware != nil {
				t.Fatalf("R9 (no baseline) read at enrollment: %+v", m.Firmware)
			}
		}
	}
}

func mustTarget(t *testing.T, f *fwFleet, id string) bmc.Target {
	t.Helper()
	tg, err := f.tgt(id)
	if err != nil {
		t.Fatal(err)
	}
	return tg
}

// A firmware or bios campaign rolls the machine's model baseline through
// the controller's own apply (baselineApplier, the campaigns' applier when
// Config.Firmware is nil): another baseline's name and BIOS attributes that
// are not the baseline's are refused before the BMC is touched.
func TestCampaignBaselineApplier(t *testing.T) {
	st := newStore(t)
	h := newHarness(t, st, func(c *Config) { c.Inspection = InspectManual })
	f := &fwFleet{vbmcFleet: newVBMCFleet(t), ipmi: map[string]bool{}}
	h.c.bmc = f
	imgs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/images/bios-2.1.0.fw" {
			_, _ = w.Write(vbmc.FirmwareImage("BIOS", "2.1.0", []byte("rom")))
			return
		}
		http.NotFound(w, r)
	}))
	defer imgs.Close()
	m1, err := st.PutMachine(bg, store.Machine{Name: "n1", BMC: "bmc-n1", Intended: store.Hardware{Vendor: "Acme", Model: "R1"}},
		store.W{Actor: "test", Reason: "setup"})
	must(t, err)
	f.addModel(m1.ID, "Acme", "R1", vbmc.Quirks{})
	if h.c.firmwareApplier() == nil {
		t.Fatal("no applier with a BMC wired")
	}
	a := h.c.firmwareApplier()
	if err := a.ApplyFirmware(bg, m1.ID, "x"); !errors.Is(err, ErrNoBaseline) {
		t.Fatalf("no baseline yet: %v", err)
	}
	bl, err := h.c.SetBaseline(bg, store.Baseline{Vendor: "acme", Model: "r1",
		Firmware: []store.BaselineFirmware{{Component: "BIOS", Version: "2.1.0", ImageURI: imgs.URL + "/images/bios-2.1.0.fw"}},
		BIOS:     map[string]string{"ProcVirtualization": "Disabled"}}, store.W{Actor: "api:alice"})
	must(t, err)
	if err := a.ApplyFirmware(bg, m1.ID, "another-model"); !errors.Is(err, ErrInvalid) {
		t.Fatalf("another baseline's name: %v", err)
	}
	if err := a.ApplyBIOS(bg, m1.ID, map[string]string{"ProcVirtualization": "Enabled"}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("BIOS value outside the baseline: %v", err)
	}
	if fw, _, _ := f.srv[m1.ID].Firmware("1"); fw["BIOS"] != "1.0.0" {
		t.Fatalf("refused calls touched the BMC: BIOS %s", fw["BIOS"])
	}
	must(t, a.ApplyFirmware(bg, m1.ID, bl.ID))
	must(t, a.ApplyBIOS(bg, m1.ID, map[string]string{"ProcVirtualization": "Disabled"}))
	fw, _, _ := f.srv[m1.ID].Firmware("1")
	cur, _, _ := f.srv[m1.ID].BIOSAttributes("1")
	if fw["BIOS"] != "2.1.0" || cur["ProcVirtualization"] != "Disabled" {
		t.Fatalf("vbmc after the campaign applier: %v %v", fw, cur)
	}
}
