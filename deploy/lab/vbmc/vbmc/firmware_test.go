package vbmc_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"io"
	"log/slog"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"kiln/deploy/lab/vbmc/vbmc"
)

// rf is a raw Redfish client for the vbmc-level tests (no Kiln code between).
type rf struct {
	t    *testing.T
	base string
	hc   *http.Client
}

func (c rf) do(method, path, ctype string, body []byte) (int, http.Header, map[string]any) {
	c.t.Helper()
	req, _ := http.NewRequest(method, c.base+path, bytes.NewReader(body))
	req.SetBasicAuth(testUser, testPass)
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var doc map[string]any
	_ = json.Unmarshal(raw, &doc)
	return resp.StatusCode, resp.Header, doc
}

func (c rf) get(path string) map[string]any {
	c.t.Helper()
	st, _, doc := c.do("GET", path, "", nil)
	if st != 200 {
		c.t.Fatalf("GET %s: %d %v", path, st, doc)
	}
	return doc
}

// startSimVBMC runs a vbmc with one simulated machine (no qemu).
func startSimVBMC(t *testing.T, q vbmc.Quirks) (*vbmc.Server, *fakePower, rf) {
	t.Helper()
	p := &fakePower{}
	srv, err := vbmc.New(vbmc.Config{Listen: "127.0.0.1:0", Username: testUser, Password: testPass, Quirks: q,
		FirmwareUpdateDuration: 400 * time.Millisecond,
		Systems:                []vbmc.SystemConfig{{ID: "1", Serial: "SN-FW", Manufacturer: "Acme", Model: "R1", Power: p}}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx, slog.New(slog.NewTextHandler(io.Discard, nil))) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("vbmc Run: %v", err)
		}
	})
	return srv, p, rf{t: t, base: "https://" + srv.Addr(), hc: &http.Client{Timeout: 10 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}}
}

func reset(t *testing.T, c rf, typ string) {
	t.Helper()
	if st, _, doc := c.do("POST", "/redfish/v1/Systems/1/Actions/ComputerSystem.Reset", "application/json",
		[]byte(`{"ResetType":"`+typ+`"}`)); st != 204 {
		t.Fatalf("reset %s: %d %v", typ, st, doc)
	}
}

// followMonitor polls a task monitor until it stops answering 202 and
// returns the PercentComplete values seen (in order) and the final status.
func followMonitor(t *testing.T, c rf, mon string) ([]float64, int) {
	t.Helper()
	var seen []float64
	for end := time.Now().Add(20 * time.Second); time.Now().Before(end); time.Sleep(30 * time.Millisecond) {
		st, h, doc := c.do("GET", mon, "", nil)
		if st != 202 {
			return seen, st
		}
		if h.Get("Location") != mon {
			t.Fatalf("202 without the monitor's Location: %v", h)
		}
		if p, ok := doc["PercentComplete"].(float64); ok && (len(seen) == 0 || seen[len(seen)-1] != p) {
			seen = append(seen, p)
		}
	}
	t.Fatal("task monitor still 202 after 20s")
	return nil, 0
}

// The vbmc's UpdateService: a SimpleUpdate fetches the image over HTTP in a
// task whose PercentComplete rises; a NIC image applies when the task
// completes, a BIOS image is staged (AwaitToActivate) and becomes the
// running BIOS (FirmwareInventory and ComputerSystem.BiosVersion) only at the
// next reset. A bad image ends the task in Exception and changes nothing. The
// multipart push does the same with the image in the request.
func TestVBMCFirmwareUpdate(t *testing.T) {
	srv, p, c := startSimVBMC(t, vbmc.Quirks{})
	images := map[string][]byte{
		"/fw/bios-2.1.0.bin": vbmc.FirmwareImage("BIOS", "2.1.0", bytes.Repeat([]byte{0xa5}, 4096)),
		"/fw/nic.bin":        vbmc.FirmwareImage("NIC1", "14.32.2004", nil),
		"/fw/garbage.bin":    []byte("MZ\x90\x00 not an image"),
	}
	fetched := map[string]int{}
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fetched[r.URL.Path]++
		b, ok := images[r.URL.Path]
		if !ok {
			http.NotFound(w, r)
			return
		}
		_, _ = w.Write(b)
	}))
	defer hs.Close()

	us := c.get("/redfish/v1/UpdateService")
	if us["@odata.type"] != "#UpdateService.v1_11_0.UpdateService" || us["MultipartHttpPushUri"] != "/redfish/v1/UpdateService/upload" {
		t.Fatalf("UpdateService %v", us)
	}
	inv := c.get("/redfish/v1/UpdateService/FirmwareInventory")
	if n := inv["Members@odata.count"]; n != float64(4) {
		t.Fatalf("FirmwareInventory members %v", inv)
	}
	if b := c.get("/redfish/v1/UpdateService/FirmwareInventory/BIOS"); b["Version"] != "1.0.0" || b["@odata.type"] != "#SoftwareInventory.v1_10_0.SoftwareInventory" {
		t.Fatalf("BIOS inventory %v", b)
	}
	update := func(path string) (map[string]any, []float64, int) {
		st, h, doc := c.do("POST", "/redfish/v1/UpdateService/Actions/UpdateService.SimpleUpdate", "application/json",
			[]byte(`{"ImageURI":"`+hs.URL+path+`","TransferProtocol":"HTTP"}`))
		if st != 202 || !strings.HasPrefix(h.Get("Location"), "/redfish/v1/TaskService/TaskMonitors/") {
			t.Fatalf("SimpleUpdate %s: %d %v %v", path, st, h, doc)
		}
		seen, final := followMonitor(t, c, h.Get("Location"))
		return c.get(doc["@odata.id"].(string)), seen, final
	}

	// NIC: applied when the task completes
	task, seen, final := update("/fw/nic.bin")
	if final != 200 || task["TaskState"] != "Completed" || task["PercentComplete"] != float64(100) || len(seen) < 3 {
		t.Fatalf("NIC task %v (monitor %d, progress %v)", task, final, seen)
	}
	for i := 1; i < len(seen); i++ {
		if seen[i] < seen[i-1] {
			t.Fatalf("PercentComplete went down: %v", seen)
		}
	}
	if v := c.get("/redfish/v1/UpdateService/FirmwareInventory/NIC1")["Version"]; v != "14.32.2004" {
		t.Fatalf("NIC1 version after the task %v", v)
	}

	// BIOS: staged until the next reset
	reset(t, c, "On")
	task, _, final = update("/fw/bios-2.1.0.bin")
	msgs, _ := json.Marshal(task["Messages"])
	if final != 200 || task["TaskState"] != "Completed" || !strings.Contains(string(msgs), "Update.1.0.AwaitToActivate") {
		t.Fatalf("BIOS task %v", task)
	}
	if v := c.get("/redfish/v1/UpdateService/FirmwareInventory/BIOS")["Version"]; v != "1.0.0" {
		t.Fatalf("BIOS version before the reset %v, want still 1.0.0", v)
	}
	if _, pending, _ := srv.Firmware("1"); pending != "2.1.0" {
		t.Fatalf("staged BIOS %q", pending)
	}
	reset(t, c, "ForceRestart")
	if v := c.get("/redfish/v1/UpdateService/FirmwareInventory/BIOS")["Version"]; v != "2.1.0" {
		t.Fatalf("BIOS version after the reset %v", v)
	}
	if v := c.get("/redfish/v1/Systems/1")["BiosVersion"]; v != "2.1.0" {
		t.Fatalf("BiosVersion after the reset %v", v)
	}
	if calls := p.log(); len(calls) != 3 || calls[1] != "off" {
		t.Fatalf("power calls %v: want on, then the reset's off+on", calls)
	}

	// a garbage image: Exception, nothing changes
	task, _, final = update("/fw/garbage.bin")
	msgs, _ = json.Marshal(task["Messages"])
	if final != 500 || task["TaskState"] != "Exception" || !strings.Contains(string(msgs), "Update.1.0.VerificationFailed") {
		t.Fatalf("garbage task %v (monitor %d)", task, final)
	}
	// a missing image: TransferFailed
	task, _, _ = update("/fw/absent.bin")
	if msgs, _ = json.Marshal(task["Messages"]); task["TaskState"] != "Exception" || !strings.Contains(string(msgs), "Update.1.0.TransferFailed") {
		t.Fatalf("absent image task %v", task)
	}
	// a NIC image aimed at the BIOS component: refused at verification
	st, h, _ := c.do("POST", "/redfish/v1/UpdateService/Actions/UpdateService.SimpleUpdate", "application/json",
		[]byte(`{"ImageURI":"`+hs.URL+`/fw/nic.bin","Targets":["/redfish/v1/UpdateService/FirmwareInventory/BIOS"]}`))
	if st != 202 {
		t.Fatalf("targeted SimpleUpdate %d", st)
	}
	if _, final := followMonitor(t, c, h.Get("Location")); final != 500 {
		t.Fatalf("NIC image to BIOS target: monitor %d, want 500", final)
	}
	if st, _, _ := c.do("POST", "/redfish/v1/UpdateService/Actions/UpdateService.SimpleUpdate", "application/json",
		[]byte(`{"ImageURI":"ftp://x/y"}`)); st != 400 {
		t.Fatalf("ftp ImageURI answered %d, want 400", st)
	}

	// multipart push of a BMC image
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	pw, _ := mw.CreateFormField("UpdateParameters")
	_, _ = pw.Write([]byte(`{"Targets":["/redfish/v1/UpdateService/FirmwareInventory/BMC"]}`))
	fw, _ := mw.CreateFormFile("UpdateFile", "bmc.bin")
	_, _ = fw.Write(vbmc.FirmwareImage("BMC", "kiln-vbmc-2", bytes.Repeat([]byte("x"), 100<<10)))
	_ = mw.Close()
	st, h, doc := c.do("POST", "/redfish/v1/UpdateService/upload", mw.FormDataContentType(), buf.Bytes())
	if st != 202 {
		t.Fatalf("multipart push: %d %v", st, doc)
	}
	if _, final := followMonitor(t, c, h.Get("Location")); final != 200 {
		t.Fatalf("multipart task monitor %d", final)
	}
	if v := c.get("/redfish/v1/UpdateService/FirmwareInventory/BMC")["Version"]; v != "kiln-vbmc-2" {
		t.Fatalf("BMC version after push %v", v)
	}
	if fetched["/fw/bios-2.1.0.bin"] != 1 || fetched["/fw/nic.bin"] != 2 {
		t.Fatalf("image fetches %v", fetched)
	}
}

// Bios and its @Redfish.Settings object: a PATCH of Bios/Settings stages the
// attributes (Bios/Settings shows them, Bios does not) until the next reset,
// then Bios shows them and Settings is empty. Unknown attributes and values
// outside the registry are 400.
func TestVBMCBIOSSettings(t *testing.T) {
	_, _, c := startSimVBMC(t, vbmc.Quirks{})
	bios := c.get("/redfish/v1/Systems/1/Bios")
	settings, _ := bios["@Redfish.Settings"].(map[string]any)
	if bios["@odata.type"] != "#Bios.v1_2_0.Bios" || settings["@odata.type"] != "#Settings.v1_3_5.Settings" ||
		settings["SettingsObject"].(map[string]any)["@odata.id"] != "/redfish/v1/Systems/1/Bios/Settings" {
		t.Fatalf("Bios %v", bios)
	}
	if a := bios["Attributes"].(map[string]any); a["ProcVirtualization"] != "Enabled" || a["PowerOnDelaySeconds"] != float64(0) {
		t.Fatalf("initial attributes %v", a)
	}
	for _, bad := range []string{`{"Attributes":{"NoSuch":"x"}}`, `{"Attributes":{"ProcVirtualization":"Maybe"}}`,
		`{"Attributes":{"PowerOnDelaySeconds":301}}`, `{"Attributes":{"PowerOnDelaySeconds":"5"}}`, `{"Attributes":{}}`,
		`{"Boot":{}}`, `{"Attributes":{"MemTest":"Enabled"},"@Redfish.SettingsApplyTime":{"ApplyTime":"Immediate"}}`} {
		if st, _, _ := c.do("PATCH", "/redfish/v1/Systems/1/Bios/Settings", "application/json", []byte(bad)); st != 400 {
			t.Fatalf("PATCH %s answered %d, want 400", bad, st)
		}
	}
	if st, _, doc := c.do("PATCH", "/redfish/v1/Systems/1/Bios/Settings", "application/json",
		[]byte(`{"Attributes":{"ProcVirtualization":"Disabled","PowerOnDelaySeconds":30}}`)); st != 204 {
		t.Fatalf("PATCH: %d %v", st, doc)
	}
	if a := c.get("/redfish/v1/Systems/1/Bios/Settings")["Attributes"].(map[string]any); a["ProcVirtualization"] != "Disabled" || len(a) != 2 {
		t.Fatalf("pending %v", a)
	}
	if a := c.get("/redfish/v1/Systems/1/Bios")["Attributes"].(map[string]any); a["ProcVirtualization"] != "Enabled" {
		t.Fatalf("current before reset %v", a)
	}
	reset(t, c, "On")
	bios = c.get("/redfish/v1/Systems/1/Bios")
	if a := bios["Attributes"].(map[string]any); a["ProcVirtualization"] != "Disabled" || a["PowerOnDelaySeconds"] != float64(30) {
		t.Fatalf("current after reset %v", a)
	}
	if s := bios["@Redfish.Settings"].(map[string]any); s["Time"] == nil {
		t.Fatalf("Settings.Time not set after the apply: %v", s)
	}
	if a := c.get("/redfish/v1/Systems/1/Bios/Settings")["Attributes"].(map[string]any); len(a) != 0 {
		t.Fatalf("pending after reset %v", a)
	}
}

// Quirk bios-config-job (Dell iDRAC): staged settings survive a reset
// unapplied until a configuration job is created (POST Managers/1/Jobs with
// TargetSettingsURI) or the PATCH carried @Redfish.SettingsApplyTime; a PATCH
// while a job is scheduled is refused (SYS011); the Bios resource does not
// advertise SupportedApplyTimes.
func TestVBMCQuirkBIOSConfigJob(t *testing.T) {
	_, _, c := startSimVBMC(t, vbmc.Quirks{BIOSConfigJob: true})
	if s := c.get("/redfish/v1/Systems/1/Bios")["@Redfish.Settings"].(map[string]any); s["SupportedApplyTimes"] != nil {
		t.Fatalf("quirk advertises apply times: %v", s)
	}
	if st, _, _ := c.do("POST", "/redfish/v1/Managers/1/Jobs", "application/json",
		[]byte(`{"TargetSettingsURI":"/redfish/v1/Systems/1/Bios/Settings"}`)); st != 400 {
		t.Fatalf("job with nothing pending answered %d, want 400", st)
	}
	if st, _, _ := c.do("PATCH", "/redfish/v1/Systems/1/Bios/Settings", "application/json", []byte(`{"Attributes":{"SriovGlobalEnable":"Enabled"}}`)); st != 204 {
		t.Fatal("PATCH refused")
	}
	reset(t, c, "On")
	reset(t, c, "ForceRestart")
	if a := c.get("/redfish/v1/Systems/1/Bios")["Attributes"].(map[string]any); a["SriovGlobalEnable"] != "Disabled" {
		t.Fatalf("applied without a job: %v", a)
	}
	if a := c.get("/redfish/v1/Systems/1/Bios/Settings")["Attributes"].(map[string]any); a["SriovGlobalEnable"] != "Enabled" {
		t.Fatalf("pending lost across the reset: %v", a)
	}
	st, h, _ := c.do("POST", "/redfish/v1/Managers/1/Jobs", "application/json", []byte(`{"TargetSettingsURI":"/redfish/v1/Systems/1/Bios/Settings"}`))
	if st != 200 || !strings.HasPrefix(h.Get("Location"), "/redfish/v1/Managers/1/Jobs/JID_") {
		t.Fatalf("create job: %d %v", st, h)
	}
	if st, _, doc := c.do("PATCH", "/redfish/v1/Systems/1/Bios/Settings", "application/json", []byte(`{"Attributes":{"MemTest":"Enabled"}}`)); st != 400 ||
		!strings.Contains(doc["error"].(map[string]any)["message"].(string), "SYS011") {
		t.Fatalf("PATCH with a job scheduled: %d %v", st, doc)
	}
	reset(t, c, "ForceRestart")
	if a := c.get("/redfish/v1/Systems/1/Bios")["Attributes"].(map[string]any); a["SriovGlobalEnable"] != "Enabled" {
		t.Fatalf("not applied with the job: %v", a)
	}
	// the apply time in the PATCH counts as the job
	if st, _, _ := c.do("PATCH", "/redfish/v1/Systems/1/Bios/Settings", "application/json",
		[]byte(`{"Attributes":{"MemTest":"Enabled"},"@Redfish.SettingsApplyTime":{"ApplyTime":"OnReset"}}`)); st != 204 {
		t.Fatal("PATCH with apply time refused")
	}
	reset(t, c, "ForceRestart")
	if a := c.get("/redfish/v1/Systems/1/Bios")["Attributes"].(map[string]any); a["MemTest"] != "Enabled" {
		t.Fatalf("not applied with SettingsApplyTime: %v", a)
	}
}
