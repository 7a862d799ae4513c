package vbmc

// Firmware and BIOS (issue 17): UpdateService with FirmwareInventory and
// SimpleUpdate (plus a multipart push), TaskService tasks with task monitors,
// and Systems/{id}/Bios with its @Redfish.Settings object (DSP0268 schemas
// UpdateService, SoftwareInventory, Task, TaskService, Bios, Settings).

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"net/url"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Firmware components every system has, in FirmwareInventory order. Each is a
// SoftwareInventory whose Id and Name are the component name (Id prefixed with
// "{system}-" when the server has more than one system).
var firmwareComponents = []string{"BIOS", "BMC", "NIC1", "Disk1"}

// DefaultFirmware is the version of each component a system starts with when
// SystemConfig.Firmware / Config.Firmware does not say.
var DefaultFirmware = map[string]string{"BIOS": "1.0.0", "BMC": "kiln-vbmc-1", "NIC1": "14.32.1010", "Disk1": "GDC5602Q"}

// FirmwareImageMagic is the first line of a vbmc firmware image. The image is
//
//	KILNFW1\n
//	{"component":"BIOS","version":"2.1.0"}\n
//	payload (any bytes)
//
// the header a real update package carries in its own format (a Dell DUP, an
// HPE .fwpkg); the vbmc applies Version to Component once the task completes
// (BIOS: at the next reset, as real BMCs stage a BIOS image).
const FirmwareImageMagic = "KILNFW1"

// maxFirmwareImage bounds an image the vbmc fetches or accepts by push.
const maxFirmwareImage = 64 << 20

// FirmwareHeader is the JSON header line of a firmware image.
type FirmwareHeader struct {
	Component string `json:"component"`
	Version   string `json:"version"`
}

var versionRe = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._+-]{0,63}$`)

// FirmwareImage builds a firmware image for component at version.
func FirmwareImage(component, version string, payload []byte) []byte {
	h, _ := json.Marshal(FirmwareHeader{Component: component, Version: version})
	return append([]byte(FirmwareImageMagic+"\n"+string(h)+"\n"), payload...)
}

// ParseFirmwareImage reads an image's header: the magic line, then one JSON
// line naming a known component and a version of [A-Za-z0-9._+-] (≤64).
func ParseFirmwareImage(b []byte) (FirmwareHeader, error) {
	r := bufio.NewReader(io.LimitReader(bytes.NewReader(b), 4096))
	magic, err := r.ReadString('\n')
	if err != nil || strings.TrimRight(magic, "\r\n") != FirmwareImageMagic {
		return FirmwareHeader{}, errors.New("not a vbmc firmware image (no KILNFW1 header)")
	}
	line, err := r.ReadString('\n')
	if err != nil {
		return FirmwareHeader{}, errors.New("firmware image header line missing")
	}
	var h FirmwareHeader
	dec := json.NewDecoder(strings.NewReader(line))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&h); err != nil {
		return FirmwareHeader{}, fmt.Errorf("firmware image header: %v", err)
	}
	known := false
	for _, c := range firmwareComponents {
		known = known || c == h.Component
	}
	if !known {
		return FirmwareHeader{}, fmt.Errorf("firmware image for unknown component %q", h.Component)
	}
	if !versionRe.MatchString(h.Version) {
		return FirmwareHeader{}, fmt.Errorf("firmware image version %q", h.Version)
	}
	return h, nil
}

// biosAttr is one attribute of the built-in BIOS attribute registry: an
// enumeration (Values) or an integer in [Min, Max].
type biosAttr struct {
	Name     string
	Values   []string // enumeration; nil = integer
	Min, Max int
	Default  any
}

// biosRegistry is the vbmc's BIOS attribute registry (names as Dell's, the
// quirk's vendor, uses them where it has one).
var biosRegistry = []biosAttr{
	{Name: "ProcVirtualization", Values: []string{"Enabled", "Disabled"}, Default: "Enabled"},
	{Name: "LogicalProc", Values: []string{"Enabled", "Disabled"}, Default: "Enabled"},
	{Name: "SriovGlobalEnable", Values: []string{"Enabled", "Disabled"}, Default: "Disabled"},
	{Name: "SysProfile", Values: []string{"PerfPerWattOptimizedOs", "PerfOptimized", "Custom"}, Default: "PerfPerWattOptimizedOs"},
	{Name: "MemTest", Values: []string{"Enabled", "Disabled"}, Default: "Disabled"},
	{Name: "PowerOnDelaySeconds", Min: 0, Max: 300, Default: 0},
}

func registryAttr(name string) *biosAttr {
	for i := range biosRegistry {
		if biosRegistry[i].Name == name {
			return &biosRegistry[i]
		}
	}
	return nil
}

// ParseBIOSPatch strictly parses a PATCH of Bios/Settings: {"Attributes":
// {...}} with registry names and values (enumeration strings, integers in
// range), and optionally "@Redfish.SettingsApplyTime": {"ApplyTime":
// "OnReset"} (DSP0266 §9.9 settings apply time). It returns the attributes
// and whether an apply time was given.
func ParseBIOSPatch(body []byte) (map[string]any, bool, error) {
	var doc map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	if err := dec.Decode(&doc); err != nil || doc == nil {
		return nil, false, errors.New("malformed JSON object")
	}
	if dec.More() {
		return nil, false, errors.New("trailing data")
	}
	applyTime := false
	for k, raw := range doc {
		switch k {
		case "Attributes":
		case "@Redfish.SettingsApplyTime":
			var at struct{ ApplyTime string }
			d := json.NewDecoder(bytes.NewReader(raw))
			d.DisallowUnknownFields()
			if err := d.Decode(&at); err != nil || at.ApplyTime != "OnReset" {
				return nil, false, errors.New(`@Redfish.SettingsApplyTime: only {"ApplyTime":"OnReset"} is supported`)
			}
			applyTime = true
		default:
			return nil, false, fmt.Errorf("property %s is unknown or read-only", k)
		}
	}
	rawAttrs, ok := doc["Attributes"]
	if !ok {
		return nil, false, errors.New("Attributes missing")
	}
	var attrs map[string]json.RawMessage
	if err := json.Unmarshal(rawAttrs, &attrs); err != nil || attrs == nil {
		return nil, false, errors.New("Attributes must be an object")
	}
	if len(attrs) == 0 {
		return nil, false, errors.New("Attributes is empty")
	}
	out := map[string]any{}
	for name, raw := range attrs {
		a := registryAttr(name)
		if a == nil {
			return nil, false, fmt.Errorf("attribute %s is not in the registry", name)
		}
		if a.Values != nil {
			var s string
			if err := json.Unmarshal(raw, &s); err != nil {
				return nil, false, fmt.Errorf("attribute %s must be a string", name)
			}
			found := false
			for _, v := range a.Values {
				found = found || v == s
			}
			if !found {
				return nil, false, fmt.Errorf("value %q not allowed for %s", s, name)
			}
			out[name] = s
			continue
		}
		var n json.Number
		if t := bytes.TrimSpace(raw); len(t) == 0 || t[0] == '"' || json.Unmarshal(t, &n) != nil {
			return nil, false, fmt.Errorf("attribute %s must be an integer", name)
		}
		i, err := strconv.Atoi(n.String())
		if err != nil || i < a.Min || i > a.Max {
			return nil, false, fmt.Errorf("attribute %s: %s not an integer in [%d, %d]", name, n, a.Min, a.Max)
		}
		out[name] = i
	}
	return out, applyTime, nil
}

// firmwareState is a system's firmware and BIOS state (guarded by system.mu).
type firmwareState struct {
	versions    map[string]string // component -> running version
	pendingBIOS string            // staged BIOS image version, applied at the next start/reset
	attrs       map[string]any    // current BIOS attributes
	pending     map[string]any    // Bios/Settings: staged attributes
	job         bool              // quirk bios-config-job: a config job (or apply time) covers pending
	applied     time.Time         // last time staged settings were applied
	appliedMsg  string            // MessageId of that apply
}

func newFirmwareState(initial map[string]string) firmwareState {
	fs := firmwareState{versions: map[string]string{}, attrs: map[string]any{}, pending: map[string]any{}}
	for _, c := range firmwareComponents {
		fs.versions[c] = DefaultFirmware[c]
		if v, ok := initial[c]; ok && v != "" {
			fs.versions[c] = v
		}
	}
	for _, a := range biosRegistry {
		fs.attrs[a.Name] = a.Default
	}
	return fs
}

// firmwarePendingLocked reports whether the next start changes firmware or
// BIOS settings (a restart then restarts the process, so the new SMBIOS BIOS
// version reaches the guest).
func (s *Server) firmwarePendingLocked(sys *system) bool {
	return sys.fw.pendingBIOS != "" || (len(sys.fw.pending) > 0 && (!s.cfg.Quirks.BIOSConfigJob || sys.fw.job))
}

// onPowerOnLocked is the firmware's part of a start (power-on or reset): the
// staged BIOS image becomes the running BIOS, and staged BIOS settings are
// applied — except, under the bios-config-job quirk, settings no config job
// covers, which stay pending across the reset as on a Dell iDRAC.
func (s *Server) onPowerOnLocked(sys *system) {
	fs := &sys.fw
	if fs.pendingBIOS != "" {
		fs.versions["BIOS"] = fs.pendingBIOS
		fs.pendingBIOS = ""
		s.log.Info("bios image activated", "system", sys.cfg.ID, "version", fs.versions["BIOS"])
	}
	if len(fs.pending) > 0 && (!s.cfg.Quirks.BIOSConfigJob || fs.job) {
		for k, v := range fs.pending {
			fs.attrs[k] = v
		}
		fs.pending, fs.job = map[string]any{}, false
		fs.applied, fs.appliedMsg = time.Now().UTC().Truncate(time.Second), "Base.1.8.Success"
		s.log.Info("bios settings applied", "system", sys.cfg.ID)
	}
}

// smbiosArgs gives qemu the running BIOS version as SMBIOS type 0 (what
// dmidecode and /sys/class/dmi/id/bios_version show in the guest).
func smbiosArgs(sys *system) []string {
	return []string{"-smbios", "type=0,vendor=Kiln vbmc,version=" + sys.fw.versions["BIOS"]}
}

// ---- tasks ----

// task is one TaskService task (DSP0268 Task.v1).
type task struct {
	ID        string
	State     string // New, Running, Completed, Exception
	Status    string // OK, Warning, Critical
	Percent   int
	Start     time.Time
	End       time.Time
	Messages  []taskMessage
	SystemID  string
	Component string
}

type taskMessage struct{ ID, Text string }

func taskPath(id string) string    { return "/redfish/v1/TaskService/Tasks/" + id }
func monitorPath(id string) string { return "/redfish/v1/TaskService/TaskMonitors/" + id }

func (t *task) doc() map[string]any {
	msgs := []any{}
	for _, m := range t.Messages {
		msgs = append(msgs, map[string]any{"MessageId": m.ID, "Message": m.Text})
	}
	d := map[string]any{"@odata.id": taskPath(t.ID), "@odata.type": "#Task.v1_7_0.Task", "Id": t.ID,
		"Name": "Firmware update " + t.ID, "TaskState": t.State, "TaskStatus": t.Status,
		"PercentComplete": t.Percent, "StartTime": t.Start.Format(time.RFC3339), "TaskMonitor": monitorPath(t.ID),
		"Messages": msgs}
	if !t.End.IsZero() {
		d["EndTime"] = t.End.Format(time.RFC3339)
	}
	return d
}

// Task returns a copy of task id's state (tests).
func (s *Server) taskCopy(id string) (task, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t, ok := s.tasks[id]
	if !ok {
		return task{}, false
	}
	c := *t
	c.Messages = append([]taskMessage(nil), t.Messages...)
	return c, true
}

func (s *Server) setTask(id string, f func(t *task)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if t, ok := s.tasks[id]; ok {
		f(t)
	}
}

// newTask registers a New task for system sys.
func (s *Server) newTask(sys *system) *task {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.nextTask++
	t := &task{ID: strconv.Itoa(s.nextTask), State: "New", Status: "OK", Start: time.Now().UTC().Truncate(time.Second),
		SystemID: sys.cfg.ID}
	if s.tasks == nil {
		s.tasks = map[string]*task{}
	}
	s.tasks[t.ID] = t
	return t
}

// runUpdate is the firmware update task: get the image (fetch, or the pushed
// bytes), verify its header against the target, progress over
// Config.FirmwareUpdateDuration, then apply (BIOS: stage for the next start).
func (s *Server) runUpdate(ctx context.Context, sys *system, t *task, imageURI string, pushed []byte, wantComponent string) {
	fail := func(id, msg string) {
		s.setTask(t.ID, func(t *task) {
			t.State, t.Status, t.End = "Exception", "Critical", time.Now().UTC().Truncate(time.Second)
			t.Messages = append(t.Messages, taskMessage{id, msg})
		})
		s.log.Warn("firmware update failed", "system", sys.cfg.ID, "task", t.ID, "message", msg)
	}
	s.setTask(t.ID, func(t *task) {
		t.State, t.Percent = "Running", 5
		t.Messages = append(t.Messages, taskMessage{"Update.1.0.TransferringToComponent", "Transferring the image to the BMC."})
	})
	img := pushed
	if img == nil {
		var err error
		if img, err = fetchImage(ctx, imageURI); err != nil {
			fail("Update.1.0.TransferFailed", "Transfer of the image failed: "+err.Error())
			return
		}
	}
	s.setTask(t.ID, func(t *task) {
		t.Percent = 20
		t.Messages = append(t.Messages, taskMessage{"Update.1.0.VerifyingAtComponent", "Verifying the image."})
	})
	h, err := ParseFirmwareImage(img)
	if err != nil {
		fail("Update.1.0.VerificationFailed", "Verification of the image failed: "+err.Error())
		return
	}
	if wantComponent != "" && h.Component != wantComponent {
		fail("Update.1.0.VerificationFailed", fmt.Sprintf("The image is for %s, the target is %s.", h.Component, wantComponent))
		return
	}
	s.setTask(t.ID, func(t *task) {
		t.Component = h.Component
		t.Messages = append(t.Messages, taskMessage{"Update.1.0.ApplyingOnComponent", "Applying the image to " + h.Component + "."})
	})
	steps := 8
	for i := 1; i <= steps; i++ {
		select {
		case <-ctx.Done():
			fail("Update.1.0.ApplyFailed", "The BMC stopped during the update.")
			return
		case <-time.After(s.cfg.FirmwareUpdateDuration / time.Duration(steps)):
		}
		s.setTask(t.ID, func(t *task) { t.Percent = 20 + 79*i/steps })
	}
	msg := taskMessage{"Update.1.0.UpdateSuccessful", fmt.Sprintf("%s updated to %s.", h.Component, h.Version)}
	sys.mu.Lock()
	if h.Component == "BIOS" {
		sys.fw.pendingBIOS = h.Version
		msg = taskMessage{"Update.1.0.AwaitToActivate", fmt.Sprintf("BIOS %s is staged; it is activated by the next reset of the system.", h.Version)}
	} else {
		sys.fw.versions[h.Component] = h.Version
	}
	sys.mu.Unlock()
	s.setTask(t.ID, func(t *task) {
		t.State, t.Percent, t.End = "Completed", 100, time.Now().UTC().Truncate(time.Second)
		t.Messages = append(t.Messages, msg)
	})
	s.log.Info("firmware update done", "system", sys.cfg.ID, "task", t.ID, "component", h.Component, "version", h.Version)
}

func fetchImage(ctx context.Context, uri string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, uri, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: HTTP %d", uri, resp.StatusCode)
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxFirmwareImage+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxFirmwareImage {
		return nil, fmt.Errorf("image larger than %d bytes", maxFirmwareImage)
	}
	return b, nil
}

// ---- resources ----

// firmwareID is a component's SoftwareInventory Id.
func (s *Server) firmwareID(sys *system, comp string) string {
	if len(s.systems) == 1 {
		return comp
	}
	return sys.cfg.ID + "-" + comp
}

func (s *Server) firmwareByID(r *http.Request, id string) (*system, string) {
	for _, sys := range s.visible(r) {
		for _, c := range firmwareComponents {
			if s.firmwareID(sys, c) == id {
				return sys, c
			}
		}
	}
	return nil, ""
}

func (s *Server) softwareInventory(sys *system, comp string) map[string]any {
	sys.mu.Lock()
	v := sys.fw.versions[comp]
	sys.mu.Unlock()
	related := systemPath(sys)
	switch comp {
	case "BMC":
		related = "/redfish/v1/Managers/1"
	case "NIC1":
		if len(sys.cfg.MACs) > 0 {
			related = systemPath(sys) + "/EthernetInterfaces/1"
		}
	}
	id := s.firmwareID(sys, comp)
	return map[string]any{"@odata.id": "/redfish/v1/UpdateService/FirmwareInventory/" + id,
		"@odata.type": "#SoftwareInventory.v1_10_0.SoftwareInventory", "Id": id, "Name": comp, "Version": v,
		"Updateable": true, "SoftwareId": "kiln-vbmc-" + strings.ToLower(comp), "Manufacturer": "Kiln",
		"Status": status("OK"), "RelatedItem": []any{odata(related)}, "RelatedItem@odata.count": 1}
}

func (s *Server) biosDoc(sys *system) map[string]any {
	sys.mu.Lock()
	defer sys.mu.Unlock()
	attrs := map[string]any{}
	for k, v := range sys.fw.attrs {
		attrs[k] = v
	}
	p := systemPath(sys) + "/Bios"
	settings := map[string]any{"@odata.type": "#Settings.v1_3_5.Settings", "SettingsObject": odata(p + "/Settings")}
	if !s.cfg.Quirks.BIOSConfigJob {
		settings["SupportedApplyTimes"] = []string{"OnReset"}
	}
	if !sys.fw.applied.IsZero() {
		settings["Time"] = sys.fw.applied.Format(time.RFC3339)
		settings["Messages"] = []any{map[string]any{"MessageId": sys.fw.appliedMsg}}
	}
	return map[string]any{"@odata.id": p, "@odata.type": "#Bios.v1_2_0.Bios", "Id": "BIOS", "Name": "BIOS Configuration Current Settings",
		"AttributeRegistry": "KilnBiosAttributeRegistry.v1_0_0", "Attributes": attrs, "@Redfish.Settings": settings,
		"Actions": map[string]any{"#Bios.ResetBios": map[string]any{"target": p + "/Actions/Bios.ResetBios"}}}
}

func (s *Server) biosSettingsDoc(sys *system) map[string]any {
	sys.mu.Lock()
	defer sys.mu.Unlock()
	attrs := map[string]any{}
	for k, v := range sys.fw.pending { // only what is pending, as iDRAC and most BMCs show it
		attrs[k] = v
	}
	p := systemPath(sys) + "/Bios/Settings"
	return map[string]any{"@odata.id": p, "@odata.type": "#Bios.v1_2_0.Bios", "Id": "Settings",
		"Name": "BIOS Configuration Pending Settings", "AttributeRegistry": "KilnBiosAttributeRegistry.v1_0_0", "Attributes": attrs}
}

// firmwareRoutes adds UpdateService, TaskService, Bios and the Dell-style job
// resource to mux.
func (s *Server) firmwareRoutes(mux *http.ServeMux) {
	mux.HandleFunc("GET /redfish/v1/UpdateService", s.authed(s.json(func() any {
		return map[string]any{"@odata.id": "/redfish/v1/UpdateService", "@odata.type": "#UpdateService.v1_11_0.UpdateService",
			"Id": "UpdateService", "Name": "Update Service", "ServiceEnabled": true, "Status": status("OK"),
			"FirmwareInventory":    odata("/redfish/v1/UpdateService/FirmwareInventory"),
			"MultipartHttpPushUri": "/redfish/v1/UpdateService/upload",
			"Actions": map[string]any{"#UpdateService.SimpleUpdate": map[string]any{
				"target": "/redfish/v1/UpdateService/Actions/UpdateService.SimpleUpdate",
				"TransferProtocol@Redfish.AllowableValues": []string{"HTTP", "HTTPS"}}}}
	})))
	mux.HandleFunc("GET /redfish/v1/UpdateService/FirmwareInventory", s.authed(func(w http.ResponseWriter, r *http.Request) {
		var ids []string
		for _, sys := range s.visible(r) {
			for _, c := range firmwareComponents {
				ids = append(ids, "/redfish/v1/UpdateService/FirmwareInventory/"+s.firmwareID(sys, c))
			}
		}
		writeJSON(w, 200, collection("/redfish/v1/UpdateService/FirmwareInventory", "#SoftwareInventoryCollection.SoftwareInventoryCollection", ids))
	}))
	mux.HandleFunc("GET /redfish/v1/UpdateService/FirmwareInventory/{fid}", s.authed(func(w http.ResponseWriter, r *http.Request) {
		sys, comp := s.firmwareByID(r, r.PathValue("fid"))
		if sys == nil {
			redfishError(w, 404, "Base.1.8.ResourceMissingAtURI", "no such firmware component")
			return
		}
		writeJSON(w, 200, s.softwareInventory(sys, comp))
	}))
	mux.HandleFunc("POST /redfish/v1/UpdateService/Actions/UpdateService.SimpleUpdate", s.authed(s.simpleUpdate))
	mux.HandleFunc("POST /redfish/v1/UpdateService/upload", s.authed(s.multipartUpdate))
	mux.HandleFunc("GET /redfish/v1/TaskService", s.authed(s.json(func() any {
		return map[string]any{"@odata.id": "/redfish/v1/TaskService", "@odata.type": "#TaskService.v1_2_0.TaskService",
			"Id": "TaskService", "Name": "Task Service", "ServiceEnabled": true, "CompletedTaskOverWritePolicy": "Oldest",
			"Tasks": odata("/redfish/v1/TaskService/Tasks")}
	})))
	mux.HandleFunc("GET /redfish/v1/TaskService/Tasks", s.authed(s.json(func() any {
		s.mu.Lock()
		var ids []string
		for id := range s.tasks {
			ids = append(ids, taskPath(id))
		}
		s.mu.Unlock()
		sort.Strings(ids)
		return collection("/redfish/v1/TaskService/Tasks", "#TaskCollection.TaskCollection", ids)
	})))
	mux.HandleFunc("GET /redfish/v1/TaskService/Tasks/{tid}", s.authed(func(w http.ResponseWriter, r *http.Request) {
		t, ok := s.taskCopy(r.PathValue("tid"))
		if !ok {
			redfishError(w, 404, "Base.1.8.ResourceMissingAtURI", "no such task")
			return
		}
		writeJSON(w, 200, t.doc())
	}))
	// The task monitor (DSP0266 §13.2 asynchronous operations): 202 while the
	// task runs, then the operation's outcome.
	mux.HandleFunc("GET /redfish/v1/TaskService/TaskMonitors/{tid}", s.authed(func(w http.ResponseWriter, r *http.Request) {
		t, ok := s.taskCopy(r.PathValue("tid"))
		if !ok {
			redfishError(w, 404, "Base.1.8.ResourceMissingAtURI", "no such task monitor")
			return
		}
		switch t.State {
		case "New", "Running":
			w.Header().Set("Location", monitorPath(t.ID))
			w.Header().Set("Retry-After", "1")
			writeJSON(w, 202, t.doc())
		case "Exception":
			msg := "The update failed."
			if n := len(t.Messages); n > 0 {
				msg = t.Messages[n-1].Text
			}
			redfishError(w, 500, "Base.1.8.InternalError", msg)
		default:
			writeJSON(w, 200, t.doc())
		}
	}))
	mux.HandleFunc("GET /redfish/v1/Systems/{id}/Bios", s.authed(s.onSystem(func(w http.ResponseWriter, r *http.Request, sys *system) {
		writeJSON(w, 200, s.biosDoc(sys))
	})))
	mux.HandleFunc("GET /redfish/v1/Systems/{id}/Bios/Settings", s.authed(s.onSystem(func(w http.ResponseWriter, r *http.Request, sys *system) {
		writeJSON(w, 200, s.biosSettingsDoc(sys))
	})))
	mux.HandleFunc("PATCH /redfish/v1/Systems/{id}/Bios/Settings", s.authed(s.onSystem(s.patchBIOS)))
	mux.HandleFunc("POST /redfish/v1/Systems/{id}/Bios/Actions/Bios.ResetBios", s.authed(s.onSystem(func(w http.ResponseWriter, r *http.Request, sys *system) {
		sys.mu.Lock()
		for _, a := range biosRegistry {
			sys.fw.pending[a.Name] = a.Default
		}
		sys.fw.job = !s.cfg.Quirks.BIOSConfigJob || sys.fw.job
		sys.mu.Unlock()
		w.WriteHeader(204)
	})))
	// Dell's OEM job queue (bios-config-job quirk only): POST
	// {"TargetSettingsURI": ".../Bios/Settings"} creates the configuration job
	// that makes the pending settings apply at the next reset.
	mux.HandleFunc("POST /redfish/v1/Managers/1/Jobs", s.authed(func(w http.ResponseWriter, r *http.Request) {
		if !s.cfg.Quirks.BIOSConfigJob {
			redfishError(w, 404, "Base.1.8.ResourceMissingAtURI", "not found")
			return
		}
		var body struct{ TargetSettingsURI string }
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
			redfishError(w, 400, "Base.1.8.MalformedJSON", "malformed JSON")
			return
		}
		var target *system
		for _, sys := range s.visible(r) {
			if body.TargetSettingsURI == systemPath(sys)+"/Bios/Settings" {
				target = sys
			}
		}
		if target == nil {
			redfishError(w, 400, "Base.1.8.PropertyValueNotInList", "TargetSettingsURI names no BIOS settings resource")
			return
		}
		target.mu.Lock()
		defer target.mu.Unlock()
		if len(target.fw.pending) == 0 {
			redfishError(w, 400, "Base.1.8.ActionNotSupported", "SYS009: No pending data present to create a Configuration job.")
			return
		}
		if target.fw.job {
			redfishError(w, 400, "Base.1.8.ActionNotSupported", "SYS011: Pending configuration values are already committed.")
			return
		}
		target.fw.job = true
		s.mu.Lock()
		s.nextTask++
		jid := "JID_" + strconv.Itoa(s.nextTask)
		s.mu.Unlock()
		w.Header().Set("Location", "/redfish/v1/Managers/1/Jobs/"+jid)
		writeJSON(w, 200, map[string]any{"Id": jid, "JobState": "Scheduled", "Message": "Task successfully scheduled.", "MessageId": "JCP001"})
	}))
}

// patchBIOS stages attributes in Bios/Settings. Generic behaviour: they apply
// at the next start or reset. Quirk bios-config-job (Dell iDRAC; Dell
// "iDRAC9 Redfish API Guide", BIOS configuration, and Dell's
// iDRAC-Redfish-Scripting SetBiosAttributesREDFISH.py): staged values apply
// only once a configuration job exists for them (POST Managers/1/Jobs with
// TargetSettingsURI, or the PATCH carries @Redfish.SettingsApplyTime); a
// reset without one leaves them pending, and a PATCH while a job is
// scheduled is refused (iDRAC's SYS011).
func (s *Server) patchBIOS(w http.ResponseWriter, r *http.Request, sys *system) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		redfishError(w, 400, "Base.1.8.MalformedJSON", "body too large or unreadable")
		return
	}
	attrs, applyTime, err := ParseBIOSPatch(body)
	if err != nil {
		redfishError(w, 400, "Base.1.8.PropertyValueNotInList", err.Error())
		return
	}
	sys.mu.Lock()
	defer sys.mu.Unlock()
	if s.cfg.Quirks.BIOSConfigJob && sys.fw.job {
		redfishError(w, 400, "Base.1.8.ActionNotSupported", "SYS011: Pending configuration values are already committed, unable to perform another set operation.")
		return
	}
	for k, v := range attrs {
		sys.fw.pending[k] = v
	}
	if applyTime {
		sys.fw.job = true
	}
	w.WriteHeader(204)
}

// updateTarget resolves SimpleUpdate's Targets to a system and, when a
// FirmwareInventory member is named, its component.
func (s *Server) updateTarget(r *http.Request, targets []string) (*system, string, error) {
	vis := s.visible(r)
	if len(targets) == 0 {
		if len(vis) != 1 {
			return nil, "", errors.New("Targets is required: this BMC manages several systems")
		}
		return vis[0], "", nil
	}
	if len(targets) != 1 {
		return nil, "", errors.New("exactly one target is supported")
	}
	for _, sys := range vis {
		if targets[0] == systemPath(sys) {
			return sys, "", nil
		}
		for _, c := range firmwareComponents {
			if targets[0] == "/redfish/v1/UpdateService/FirmwareInventory/"+s.firmwareID(sys, c) {
				return sys, c, nil
			}
		}
	}
	return nil, "", fmt.Errorf("target %q is not a system or firmware component of this BMC", targets[0])
}

func (s *Server) startUpdate(w http.ResponseWriter, sys *system, uri string, img []byte, comp string) {
	t := s.newTask(sys)
	go s.runUpdate(s.runCtx, sys, t, uri, img, comp)
	w.Header().Set("Location", monitorPath(t.ID))
	tc, _ := s.taskCopy(t.ID)
	writeJSON(w, 202, tc.doc())
}

// simpleUpdate is UpdateService.SimpleUpdate: {"ImageURI", "TransferProtocol"?,
// "Targets"?}; the vbmc fetches the image (HTTP or HTTPS) in the task.
func (s *Server) simpleUpdate(w http.ResponseWriter, r *http.Request) {
	var body struct {
		ImageURI         string
		TransferProtocol string
		Targets          []string
	}
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&body); err != nil {
		redfishError(w, 400, "Base.1.8.MalformedJSON", "malformed JSON or unknown parameter")
		return
	}
	u, err := url.Parse(body.ImageURI)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		redfishError(w, 400, "Base.1.8.ActionParameterValueFormatError", "ImageURI must be an http or https URL")
		return
	}
	if p := body.TransferProtocol; p != "" && !strings.EqualFold(p, u.Scheme) {
		redfishError(w, 400, "Base.1.8.ActionParameterValueConflict", "TransferProtocol does not match the ImageURI scheme")
		return
	}
	sys, comp, err := s.updateTarget(r, body.Targets)
	if err != nil {
		redfishError(w, 400, "Base.1.8.ActionParameterValueNotInList", err.Error())
		return
	}
	s.startUpdate(w, sys, body.ImageURI, nil, comp)
}

// multipartUpdate is the MultipartHttpPushUri (DSP0266 §9.10 multipart
// HTTP push): parts "UpdateParameters" (JSON {"Targets": [...]}) and
// "UpdateFile" (the image).
func (s *Server) multipartUpdate(w http.ResponseWriter, r *http.Request) {
	mt, params, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil || mt != "multipart/form-data" || params["boundary"] == "" {
		redfishError(w, 415, "Base.1.8.UnsupportedMediaType", "multipart/form-data required")
		return
	}
	mr := multipart.NewReader(r.Body, params["boundary"])
	var targets []string
	var img []byte
	for {
		p, err := mr.NextPart()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			redfishError(w, 400, "Base.1.8.MalformedJSON", "malformed multipart body")
			return
		}
		switch p.FormName() {
		case "UpdateParameters":
			var up struct {
				Targets []string
			}
			if err := json.NewDecoder(io.LimitReader(p, 64<<10)).Decode(&up); err != nil {
				redfishError(w, 400, "Base.1.8.MalformedJSON", "UpdateParameters is not JSON")
				return
			}
			targets = up.Targets
		case "UpdateFile":
			if img, err = io.ReadAll(io.LimitReader(p, maxFirmwareImage+1)); err != nil || len(img) > maxFirmwareImage {
				redfishError(w, 413, "Base.1.8.PayloadTooLarge", "image too large or unreadable")
				return
			}
		}
	}
	if img == nil {
		redfishError(w, 400, "Base.1.8.ActionParameterMissing", "UpdateFile part missing")
		return
	}
	sys, comp, err := s.updateTarget(r, targets)
	if err != nil {
		redfishError(w, 400, "Base.1.8.ActionParameterValueNotInList", err.Error())
		return
	}
	s.startUpdate(w, sys, "", img, comp)
}

// Firmware returns system id's running firmware versions and staged BIOS
// image version ("" none) (tests and the lab).
func (s *Server) Firmware(id string) (map[string]string, string, error) {
	sys := s.byID[id]
	if sys == nil {
		return nil, "", fmt.Errorf("%w: %q", ErrNoSystem, id)
	}
	sys.mu.Lock()
	defer sys.mu.Unlock()
	out := map[string]string{}
	for k, v := range sys.fw.versions {
		out[k] = v
	}
	return out, sys.fw.pendingBIOS, nil
}

// BIOSAttributes returns system id's current and pending BIOS attributes.
func (s *Server) BIOSAttributes(id string) (current, pending map[string]any, err error) {
	sys := s.byID[id]
	if sys == nil {
		return nil, nil, fmt.Errorf("%w: %q", ErrNoSystem, id)
	}
	sys.mu.Lock()
	defer sys.mu.Unlock()
	current, pending = map[string]any{}, map[string]any{}
	for k, v := range sys.fw.attrs {
		current[k] = v
	}
	for k, v := range sys.fw.pending {
		pending[k] = v
	}
	return current, pending, nil
}
