package bmc

// Firmware and BIOS (issue 17) over Redfish (DSP0268 UpdateService,
// SoftwareInventory, TaskService/Task, Bios, Settings); IPMI has neither and
// answers ErrUnsupported. DESIGN.md "Firmware and BIOS".

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Bounds on the firmware and BIOS reads.
const (
	maxFirmwareComponents = 64   // SoftwareInventory members read
	maxBIOSAttributes     = 4096 // attributes of one Bios resource
	// DefaultFirmwareTimeout bounds following one update task.
	DefaultFirmwareTimeout = 30 * time.Minute
	// DefaultApplyTimeout bounds waiting for a reset to show staged firmware or BIOS settings.
	DefaultApplyTimeout = 5 * time.Minute
)

// FirmwareComponent is one member of UpdateService/FirmwareInventory (Redfish
// SoftwareInventory): Name is the stable key Kiln compares ("BIOS", "BMC",
// "NIC1" on the vbmc; "BIOS", "Integrated Dell Remote Access Controller" on an
// iDRAC; "System ROM", "iLO 5" on HPE).
type FirmwareComponent struct {
	ID         string // SoftwareInventory Id
	Path       string // its @odata.id (a SimpleUpdate Target)
	Name       string
	Version    string
	Updateable bool
	SoftwareID string
	Related    []string // RelatedItem @odata.ids
}

// FirmwareUpdate is one firmware update (Controller.UpdateFirmware).
type FirmwareUpdate struct {
	// ImageURI is an http(s) URL the BMC fetches (UpdateService.SimpleUpdate).
	ImageURI string
	// Image, when ImageURI is empty, is pushed to the BMC's MultipartHttpPushUri.
	Image []byte
	// Target is the SoftwareInventory @odata.id to update ("" = the BMC decides from the image).
	Target string
	// Timeout bounds following the task (DefaultFirmwareTimeout).
	Timeout time.Duration
	// PollInterval between task monitor reads (default 1s; the BMC's Retry-After is not honoured above it).
	PollInterval time.Duration
	// Progress, when set, is called with each changed task state, from the caller's goroutine.
	Progress func(TaskStatus)
}

// TaskStatus is a Redfish Task as last read (DSP0268 Task.v1).
type TaskStatus struct {
	ID         string   // Task Id
	Path       string   // Task @odata.id
	Monitor    string   // TaskMonitor URI
	State      string   // TaskState: New, Starting, Running, Suspended, Interrupted, Pending, Stopping, Completed, Killed, Exception, Service, Cancelling, Cancelled
	Status     string   // TaskStatus: OK, Warning, Critical
	Percent    int      // PercentComplete (0..100; -1 when the BMC gives none)
	MessageIDs []string // Messages[].MessageId, in order
	Messages   []string // Messages[].Message, in order
}

// Done reports whether the task reached a final state.
func (s TaskStatus) Done() bool {
	switch s.State {
	case "Completed", "Killed", "Exception", "Cancelled":
		return true
	}
	return false
}

// NeedsReset reports whether the update is staged until a reset of the system
// (a message Update.1.x.AwaitToActivate, or a message saying so as iDRAC and
// iLO put it).
func (s TaskStatus) NeedsReset() bool {
	for _, id := range s.MessageIDs {
		if strings.HasSuffix(id, ".AwaitToActivate") || strings.HasSuffix(id, ".ResetRequired") {
			return true
		}
	}
	for _, m := range s.Messages {
		if l := strings.ToLower(m); strings.Contains(l, "reboot") || strings.Contains(l, "next reset") {
			return true
		}
	}
	return false
}

// BIOS is a system's Bios resource and its settings object.
type BIOS struct {
	// Attributes are the current values: string, int64, float64, bool or nil.
	Attributes map[string]any
	// Pending are the Settings resource's attributes (staged; what each BMC shows
	// there: the changed ones, or all).
	Pending map[string]any
	// SettingsPath is @Redfish.Settings.SettingsObject ("" = no settings object).
	SettingsPath string
	// ApplyTimes is @Redfish.Settings.SupportedApplyTimes.
	ApplyTimes []string
	// AppliedAt is @Redfish.Settings.Time (zero if absent).
	AppliedAt time.Time
	// Registry is AttributeRegistry.
	Registry string
}

// AttrString is the text Kiln compares a BIOS attribute value by: strings as
// they are, integers in decimal, booleans true/false, null "".
func AttrString(v any) string {
	switch x := v.(type) {
	case nil:
		return ""
	case string:
		return x
	case bool:
		return strconv.FormatBool(x)
	case int64:
		return strconv.FormatInt(x, 10)
	case int:
		return strconv.Itoa(x)
	case float64:
		return strconv.FormatFloat(x, 'f', -1, 64)
	case json.Number:
		return x.String()
	}
	return fmt.Sprint(v)
}

// FirmwareInventory reads UpdateService/FirmwareInventory: every
// SoftwareInventory member (at most 64) that is not related to another system
// than the BMC's first, sorted by Name then ID. A BMC without an
// UpdateService, and IPMI, is ErrUnsupported.
func (c *Controller) FirmwareInventory(ctx context.Context, t Target) ([]FirmwareComponent, error) {
	var out []FirmwareComponent
	err := c.run(ctx, t, "firmware_inventory", true, func(ctx context.Context, d driver) error {
		fc, err := d.firmwareInventory(ctx)
		out = fc
		return err
	})
	return out, err
}

// UpdateFirmware starts u (SimpleUpdate with u.ImageURI, else a multipart push
// of u.Image) and follows its task monitor to a final state, at most
// u.Timeout, calling u.Progress with each change. A task that ends in
// anything but Completed is ErrTaskFailed (the status is returned too); one
// still running at the timeout is ErrTimeout. The start is not retried after
// it may have reached the BMC; the monitor reads are. Completed with
// NeedsReset() means the image is staged until the system's next reset.
func (c *Controller) UpdateFirmware(ctx context.Context, t Target, u FirmwareUpdate) (TaskStatus, error) {
	if u.ImageURI == "" && len(u.Image) == 0 {
		return TaskStatus{}, &OpError{Op: "firmware_update", Driver: t.Driver, Address: t.Address, Err: ErrInvalidTarget, Msg: "no ImageURI or Image"}
	}
	if u.ImageURI != "" {
		if p, err := url.Parse(u.ImageURI); err != nil || (p.Scheme != "http" && p.Scheme != "https") || p.Host == "" {
			return TaskStatus{}, &OpError{Op: "firmware_update", Driver: t.Driver, Address: t.Address, Err: ErrInvalidTarget, Msg: "ImageURI must be an http(s) URL"}
		}
	}
	if u.Timeout <= 0 {
		u.Timeout = DefaultFirmwareTimeout
	}
	if u.PollInterval <= 0 {
		u.PollInterval = time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, u.Timeout)
	defer cancel()
	var st TaskStatus
	if err := c.run(ctx, t, "firmware_update", false, func(ctx context.Context, d driver) error {
		s, err := d.startUpdate(ctx, u)
		st = s
		return err
	}); err != nil {
		return TaskStatus{}, err
	}
	last := st
	if u.Progress != nil {
		u.Progress(st)
	}
	for !st.Done() {
		select {
		case <-ctx.Done():
			return st, &OpError{Op: "firmware_task", Driver: t.Driver, Address: t.Address, Err: ErrTimeout,
				Msg: fmt.Sprintf("task %s still %s at %d%% after %v", st.ID, st.State, st.Percent, u.Timeout)}
		case <-time.After(u.PollInterval):
		}
		if err := c.run(ctx, t, "firmware_task", true, func(ctx context.Context, d driver) error {
			s, err := d.taskStatus(ctx, st)
			if err == nil {
				st = s
			}
			return err
		}); err != nil {
			return st, err
		}
		if u.Progress != nil && (st.State != last.State || st.Percent != last.Percent || len(st.Messages) != len(last.Messages)) {
			u.Progress(st)
		}
		last = st
	}
	if st.State != "Completed" {
		msg := "task " + st.ID + " ended " + st.State
		if n := len(st.Messages); n > 0 {
			msg += ": " + st.Messages[n-1]
		}
		return st, &OpError{Op: "firmware_update", Driver: t.Driver, Address: t.Address, Err: ErrTaskFailed, Msg: scrub(msg, t.Password)}
	}
	return st, nil
}

// BIOSAttributes reads the first system's Bios resource and, when it names
// one, its settings object (the pending attributes). A system without a Bios
// resource, and IPMI, is ErrUnsupported.
func (c *Controller) BIOSAttributes(ctx context.Context, t Target) (BIOS, error) {
	var out BIOS
	err := c.run(ctx, t, "bios", true, func(ctx context.Context, d driver) error {
		b, err := d.bios(ctx)
		out = b
		return err
	})
	return out, err
}

// SetBIOSAttributes stages attrs in the settings object (@Redfish.Settings
// SettingsObject): one PATCH {"Attributes": attrs}, with
// @Redfish.SettingsApplyTime OnReset when the BMC lists it in
// SupportedApplyTimes; a BMC that lists none gets, after the PATCH, a Dell
// configuration job (POST {manager}/Jobs {"TargetSettingsURI"}) — a 404 or 405
// there means "not Dell" and the settings apply at the next reset anyway. The
// settings object is read back: every attribute must show there as staged
// (or already be current), else ErrNotApplied. Nothing changes until the
// system resets (ApplyBIOSAttributes does that).
func (c *Controller) SetBIOSAttributes(ctx context.Context, t Target, attrs map[string]any) (BIOS, error) {
	if len(attrs) == 0 {
		return BIOS{}, &OpError{Op: "bios_set", Driver: t.Driver, Address: t.Address, Err: ErrInvalidTarget, Msg: "no attributes"}
	}
	var out BIOS
	err := c.run(ctx, t, "bios_set", true, func(ctx context.Context, d driver) error {
		b, err := d.setBIOS(ctx, attrs)
		out = b
		return err
	})
	return out, err
}

// ApplyBIOSAttributes is SetBIOSAttributes, then a reset (the machine is
// restarted if on, powered on if off), then BIOSAttributes until every
// attribute reads back as asked, at most timeout (DefaultApplyTimeout):
// ErrNotApplied, naming the differing attributes, when they do not.
func (c *Controller) ApplyBIOSAttributes(ctx context.Context, t Target, attrs map[string]any, timeout time.Duration) (BIOS, error) {
	if _, err := c.SetBIOSAttributes(ctx, t, attrs); err != nil {
		return BIOS{}, err
	}
	if err := c.ResetSystem(ctx, t); err != nil {
		return BIOS{}, err
	}
	if timeout <= 0 {
		timeout = DefaultApplyTimeout
	}
	end := time.Now().Add(timeout)
	for {
		b, err := c.BIOSAttributes(ctx, t)
		if err != nil {
			return BIOS{}, err
		}
		diff := BIOSDiff(b.Attributes, attrs)
		if len(diff) == 0 {
			return b, nil
		}
		if time.Now().After(end) {
			return b, &OpError{Op: "bios_apply", Driver: t.Driver, Address: t.Address, Err: ErrNotApplied,
				Msg: scrub("after the reset: "+strings.Join(diff, ", "), t.Password)}
		}
		select {
		case <-ctx.Done():
			return b, &OpError{Op: "bios_apply", Driver: t.Driver, Address: t.Address, Err: ErrCanceled, Msg: ctx.Err().Error()}
		case <-time.After(time.Second):
		}
	}
}

// ResetSystem restarts the machine if it is on and powers it on if it is off:
// what applies staged firmware and BIOS settings.
func (c *Controller) ResetSystem(ctx context.Context, t Target) error {
	st, err := c.PowerState(ctx, t)
	if err != nil {
		return err
	}
	if st == PowerOff {
		return c.Power(ctx, t, ActionOn)
	}
	return c.Power(ctx, t, ActionCycle)
}

// BIOSDiff lists "name: have X, want Y" for each attribute of want whose
// current value (AttrString) differs, sorted.
func BIOSDiff(current, want map[string]any) []string {
	var out []string
	for k, w := range want {
		cv, ok := current[k]
		if !ok {
			out = append(out, fmt.Sprintf("%s: absent, want %s", k, AttrString(w)))
		} else if AttrString(cv) != AttrString(w) {
			out = append(out, fmt.Sprintf("%s: have %s, want %s", k, AttrString(cv), AttrString(w)))
		}
	}
	sort.Strings(out)
	return out
}

// ---- parsers (network bytes; fuzzed in fuzz_test.go) ----

// rfUpdateService is what Kiln reads of an UpdateService.
type rfUpdateService struct {
	Inventory     string // FirmwareInventory @odata.id
	SimpleUpdate  string // Actions["#UpdateService.SimpleUpdate"].target
	MultipartPush string // MultipartHttpPushUri
}

func parseRfServiceRootLink(r io.Reader, name string) (string, error) {
	var doc map[string]json.RawMessage
	if err := json.NewDecoder(r).Decode(&doc); err != nil {
		return "", fmt.Errorf("%w: ServiceRoot JSON: %v", ErrBadAnswer, err)
	}
	raw, ok := doc[name]
	if !ok || string(raw) == "null" {
		return "", nil
	}
	var ref odataRef
	if err := json.Unmarshal(raw, &ref); err != nil {
		return "", fmt.Errorf("%w: ServiceRoot.%s: %v", ErrBadAnswer, name, err)
	}
	return ref.path("ServiceRoot." + name)
}

func parseRfUpdateService(r io.Reader) (rfUpdateService, error) {
	var doc struct {
		FirmwareInventory    *odataRef
		MultipartHTTPPushURI *string `json:"MultipartHttpPushUri"`
		Actions              map[string]json.RawMessage
	}
	if err := json.NewDecoder(r).Decode(&doc); err != nil {
		return rfUpdateService{}, fmt.Errorf("%w: UpdateService JSON: %v", ErrBadAnswer, err)
	}
	var out rfUpdateService
	var err error
	if doc.FirmwareInventory != nil {
		if out.Inventory, err = doc.FirmwareInventory.path("UpdateService.FirmwareInventory"); err != nil {
			return rfUpdateService{}, err
		}
	}
	if doc.MultipartHTTPPushURI != nil && *doc.MultipartHTTPPushURI != "" {
		if out.MultipartPush, err = (&odataRef{ID: doc.MultipartHTTPPushURI}).path("MultipartHttpPushUri"); err != nil {
			return rfUpdateService{}, err
		}
	}
	if raw, ok := doc.Actions["#UpdateService.SimpleUpdate"]; ok {
		var a struct{ Target *string }
		if err := json.Unmarshal(raw, &a); err != nil {
			return rfUpdateService{}, fmt.Errorf("%w: SimpleUpdate action: %v", ErrBadAnswer, err)
		}
		if out.SimpleUpdate, err = (&odataRef{ID: a.Target}).path("SimpleUpdate target"); err != nil {
			return rfUpdateService{}, err
		}
	}
	return out, nil
}

// parseRfSoftwareInventory strictly decodes one SoftwareInventory: Id and
// Name are required strings, Version a string (null = ""), RelatedItem
// /redfish/v1/ references.
func parseRfSoftwareInventory(r io.Reader) (FirmwareComponent, error) {
	var doc struct {
		ODataID     *string `json:"@odata.id"`
		ID          *string `json:"Id"`
		Name        *string
		Version     *string
		Updateable  *bool
		SoftwareID  *string `json:"SoftwareId"`
		RelatedItem []*odataRef
	}
	if err := json.NewDecoder(r).Decode(&doc); err != nil {
		return FirmwareComponent{}, fmt.Errorf("%w: SoftwareInventory JSON: %v", ErrBadAnswer, err)
	}
	if doc.ID == nil || doc.Name == nil || *doc.ID == "" || *doc.Name == "" {
		return FirmwareComponent{}, fmt.Errorf("%w: SoftwareInventory without Id or Name", ErrBadAnswer)
	}
	p, err := (&odataRef{ID: doc.ODataID}).path("SoftwareInventory")
	if err != nil {
		return FirmwareComponent{}, err
	}
	fc := FirmwareComponent{ID: clip(*doc.ID, 128), Path: p, Name: clip(*doc.Name, 128)}
	if fc.ID == "" || fc.Name == "" {
		return FirmwareComponent{}, fmt.Errorf("%w: SoftwareInventory Id or Name blank", ErrBadAnswer)
	}
	if doc.Version != nil {
		fc.Version = clip(*doc.Version, 128)
	}
	if doc.Updateable != nil {
		fc.Updateable = *doc.Updateable
	}
	if doc.SoftwareID != nil {
		fc.SoftwareID = clip(*doc.SoftwareID, 128)
	}
	for _, ri := range doc.RelatedItem {
		rp, err := ri.path("SoftwareInventory.RelatedItem")
		if err != nil {
			return FirmwareComponent{}, err
		}
		fc.Related = append(fc.Related, rp)
	}
	return fc, nil
}

// taskStates is the Task.v1 TaskState enum.
var taskStates = map[string]bool{"New": true, "Starting": true, "Running": true, "Suspended": true, "Interrupted": true,
	"Pending": true, "Stopping": true, "Completed": true, "Killed": true, "Exception": true, "Service": true,
	"Cancelling": true, "Cancelled": true}

// parseRfTask strictly decodes a Task: TaskState from the enum (required),
// TaskStatus OK/Warning/Critical or absent, PercentComplete 0..100 or absent
// (-1), Messages' MessageId/Message.
func parseRfTask(r io.Reader) (TaskStatus, error) {
	var doc struct {
		ODataID         *string `json:"@odata.id"`
		ID              *string `json:"Id"`
		TaskState       *string
		TaskStatus      *string
		PercentComplete *int
		TaskMonitor     *string
		Messages        []struct {
			MessageID *string `json:"MessageId"`
			Message   *string
		}
	}
	if err := json.NewDecoder(r).Decode(&doc); err != nil {
		return TaskStatus{}, fmt.Errorf("%w: Task JSON: %v", ErrBadAnswer, err)
	}
	if doc.TaskState == nil || !taskStates[*doc.TaskState] {
		s := "<absent>"
		if doc.TaskState != nil {
			s = *doc.TaskState
		}
		return TaskStatus{}, fmt.Errorf("%w: TaskState %.40q", ErrBadAnswer, s)
	}
	ts := TaskStatus{State: *doc.TaskState, Percent: -1}
	if doc.ID != nil {
		ts.ID = clip(*doc.ID, 64)
	}
	if doc.ODataID != nil {
		p, err := (&odataRef{ID: doc.ODataID}).path("Task")
		if err != nil {
			return TaskStatus{}, err
		}
		ts.Path = p
	}
	if doc.TaskMonitor != nil && *doc.TaskMonitor != "" {
		p, err := (&odataRef{ID: doc.TaskMonitor}).path("Task.TaskMonitor")
		if err != nil {
			return TaskStatus{}, err
		}
		ts.Monitor = p
	}
	if doc.TaskStatus != nil {
		switch *doc.TaskStatus {
		case "OK", "Warning", "Critical":
			ts.Status = *doc.TaskStatus
		default:
			return TaskStatus{}, fmt.Errorf("%w: TaskStatus %.40q", ErrBadAnswer, *doc.TaskStatus)
		}
	}
	if doc.PercentComplete != nil {
		if *doc.PercentComplete < 0 || *doc.PercentComplete > 100 {
			return TaskStatus{}, fmt.Errorf("%w: PercentComplete %d", ErrBadAnswer, *doc.PercentComplete)
		}
		ts.Percent = *doc.PercentComplete
	}
	if len(doc.Messages) > 64 {
		doc.Messages = doc.Messages[len(doc.Messages)-64:]
	}
	for _, m := range doc.Messages {
		id, text := "", ""
		if m.MessageID != nil {
			id = clip(*m.MessageID, 128)
		}
		if m.Message != nil {
			text = clip(*m.Message, 256)
		}
		ts.MessageIDs = append(ts.MessageIDs, id)
		ts.Messages = append(ts.Messages, text)
	}
	return ts, nil
}

// parseRfAttributes decodes an Attributes object: values string, number
// (int64 when integral, else float64), bool or null; at most
// maxBIOSAttributes; names 1..128 bytes.
func parseRfAttributes(raw json.RawMessage) (map[string]any, error) {
	out := map[string]any{}
	if len(raw) == 0 || string(raw) == "null" {
		return out, nil
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var m map[string]any
	if err := dec.Decode(&m); err != nil {
		return nil, fmt.Errorf("%w: Attributes: %v", ErrBadAnswer, err)
	}
	if len(m) > maxBIOSAttributes {
		return nil, fmt.Errorf("%w: %d BIOS attributes", ErrBadAnswer, len(m))
	}
	for k, v := range m {
		if k == "" || len(k) > 128 {
			return nil, fmt.Errorf("%w: BIOS attribute name %.40q", ErrBadAnswer, k)
		}
		switch x := v.(type) {
		case nil, bool:
			out[k] = x
		case string:
			out[k] = clip(x, 256)
		case json.Number:
			if i, err := x.Int64(); err == nil {
				out[k] = i
			} else if f, err := x.Float64(); err == nil {
				out[k] = f
			} else {
				return nil, fmt.Errorf("%w: BIOS attribute %.40q number %.40q", ErrBadAnswer, k, x)
			}
		default:
			return nil, fmt.Errorf("%w: BIOS attribute %.40q is not a string, number, boolean or null", ErrBadAnswer, k)
		}
	}
	return out, nil
}

// parseRfBios strictly decodes a Bios resource: Attributes, and
// @Redfish.Settings (SettingsObject reference, SupportedApplyTimes, Time).
func parseRfBios(r io.Reader) (BIOS, error) {
	var doc struct {
		Attributes        json.RawMessage
		AttributeRegistry *string
		Settings          *struct {
			SettingsObject      *odataRef
			SupportedApplyTimes []string
			Time                *string
		} `json:"@Redfish.Settings"`
	}
	if err := json.NewDecoder(r).Decode(&doc); err != nil {
		return BIOS{}, fmt.Errorf("%w: Bios JSON: %v", ErrBadAnswer, err)
	}
	if doc.Attributes == nil {
		return BIOS{}, fmt.Errorf("%w: Bios without Attributes", ErrBadAnswer)
	}
	attrs, err := parseRfAttributes(doc.Attributes)
	if err != nil {
		return BIOS{}, err
	}
	b := BIOS{Attributes: attrs, Pending: map[string]any{}}
	if doc.AttributeRegistry != nil {
		b.Registry = clip(*doc.AttributeRegistry, 128)
	}
	if s := doc.Settings; s != nil {
		if s.SettingsObject != nil {
			if b.SettingsPath, err = s.SettingsObject.path("@Redfish.Settings.SettingsObject"); err != nil {
				return BIOS{}, err
			}
		}
		for _, at := range s.SupportedApplyTimes {
			switch at {
			case "Immediate", "OnReset", "AtMaintenanceWindowStart", "InMaintenanceWindowOnReset":
				b.ApplyTimes = append(b.ApplyTimes, at)
			default:
				return BIOS{}, fmt.Errorf("%w: SupportedApplyTimes %.40q", ErrBadAnswer, at)
			}
		}
		if s.Time != nil && *s.Time != "" {
			tm, err := time.Parse(time.RFC3339, *s.Time)
			if err != nil {
				return BIOS{}, fmt.Errorf("%w: @Redfish.Settings.Time %.40q is not RFC 3339", ErrBadAnswer, *s.Time)
			}
			b.AppliedAt = tm.UTC()
		}
	}
	return b, nil
}

// ---- Redfish driver ----

func (d *redfishDriver) updateService(ctx context.Context) (rfUpdateService, error) {
	if _, err := d.gofishClient(ctx); err != nil {
		return rfUpdateService{}, err
	}
	var usPath string
	if err := d.getDoc("/redfish/v1/", func(r io.Reader) (e error) { usPath, e = parseRfServiceRootLink(r, "UpdateService"); return }); err != nil {
		return rfUpdateService{}, err
	}
	if usPath == "" {
		return rfUpdateService{}, fmt.Errorf("%w: the BMC has no UpdateService", ErrUnsupported)
	}
	var us rfUpdateService
	err := d.getDoc(usPath, func(r io.Reader) (e error) { us, e = parseRfUpdateService(r); return })
	if isNotFound(err) {
		return rfUpdateService{}, fmt.Errorf("%w: UpdateService answers 404", ErrUnsupported)
	}
	return us, err
}

func (d *redfishDriver) firmwareInventory(ctx context.Context) ([]FirmwareComponent, error) {
	sys, err := d.system(ctx)
	if err != nil {
		return nil, err
	}
	us, err := d.updateService(ctx)
	if err != nil {
		return nil, err
	}
	if us.Inventory == "" {
		return nil, fmt.Errorf("%w: UpdateService has no FirmwareInventory", ErrUnsupported)
	}
	var members []string
	page := us.Inventory
	for i := 0; i < maxLogPages && page != "" && len(members) < maxFirmwareComponents; i++ {
		var ms []string
		if err := d.getDoc(page, func(r io.Reader) (e error) { ms, page, e = parseRfCollection(r); return }); err != nil {
			return nil, err
		}
		members = append(members, ms...)
	}
	if len(members) > maxFirmwareComponents {
		members = members[:maxFirmwareComponents]
	}
	var out []FirmwareComponent
	for _, m := range members {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		var fc FirmwareComponent
		if err := d.getDoc(m, func(r io.Reader) (e error) { fc, e = parseRfSoftwareInventory(r); return }); err != nil {
			return nil, err
		}
		if otherSystem(fc.Related, sys.ODataID) {
			continue
		}
		out = append(out, fc)
	}
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].Name != out[j].Name {
			return out[i].Name < out[j].Name
		}
		return out[i].ID < out[j].ID
	})
	return out, nil
}

// otherSystem reports whether related names a ComputerSystem other than sys
// (a component of another node of a multi-node BMC).
func otherSystem(related []string, sys string) bool {
	for _, r := range related {
		if strings.HasPrefix(r, "/redfish/v1/Systems/") {
			if r == sys || strings.HasPrefix(r, sys+"/") {
				return false
			}
			return true
		}
	}
	return false
}

// startUpdate POSTs SimpleUpdate (or the multipart push) and returns the
// task as far as the answer tells: its monitor (Location), and the Task
// when the body is one.
func (d *redfishDriver) startUpdate(ctx context.Context, u FirmwareUpdate) (TaskStatus, error) {
	us, err := d.updateService(ctx)
	if err != nil {
		return TaskStatus{}, err
	}
	var resp *http.Response
	if u.ImageURI != "" {
		if us.SimpleUpdate == "" {
			return TaskStatus{}, fmt.Errorf("%w: UpdateService offers no SimpleUpdate", ErrUnsupported)
		}
		body := map[string]any{"ImageURI": u.ImageURI, "TransferProtocol": strings.ToUpper(strings.SplitN(u.ImageURI, ":", 2)[0])}
		if u.Target != "" {
			body["Targets"] = []string{u.Target}
		}
		resp, err = d.gf.Post(us.SimpleUpdate, body)
	} else {
		if us.MultipartPush == "" {
			return TaskStatus{}, fmt.Errorf("%w: UpdateService offers no MultipartHttpPushUri", ErrUnsupported)
		}
		params := map[string]any{}
		if u.Target != "" {
			params["Targets"] = []string{u.Target}
		}
		pj, _ := json.Marshal(params)
		resp, err = d.gf.PostMultipart(us.MultipartPush, map[string]io.Reader{
			"UpdateParameters": bytes.NewReader(pj), "UpdateFile": bytes.NewReader(u.Image)})
	}
	if err != nil {
		return TaskStatus{}, err
	}
	defer resp.Body.Close()
	st := TaskStatus{State: "New", Percent: -1}
	if loc := resp.Header.Get("Location"); loc != "" {
		p, err := monitorPath(loc)
		if err != nil {
			return TaskStatus{}, err
		}
		st.Monitor = p
	}
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, maxHealthDoc))
	if len(bytes.TrimSpace(raw)) > 0 {
		if ts, err := parseRfTask(bytes.NewReader(raw)); err == nil {
			if st.Monitor == "" {
				st.Monitor = ts.Monitor
			}
			ts.Monitor = st.Monitor
			st = ts
		}
	}
	if st.Monitor == "" && st.Path == "" {
		if resp.StatusCode == http.StatusOK || resp.StatusCode == http.StatusNoContent {
			st.State = "Completed" // done synchronously
			return st, nil
		}
		// not ErrBadAnswer: that is retried, and the update may have started
		return TaskStatus{}, fmt.Errorf("%w: update answered %d with no task monitor or task", ErrUnsupported, resp.StatusCode)
	}
	return st, nil
}

// monitorPath accepts a Location that is a /redfish/v1/ path or an absolute
// URL of the same BMC, and returns its path.
func monitorPath(loc string) (string, error) {
	if u, err := url.Parse(loc); err == nil && u.IsAbs() {
		loc = u.Path
	}
	return (&odataRef{ID: &loc}).path("task monitor Location")
}

// taskStatus reads the task monitor (202: running, with the task in the body
// when the BMC sends it; other: finished) and then the Task resource when
// there is one.
func (d *redfishDriver) taskStatus(ctx context.Context, prev TaskStatus) (TaskStatus, error) {
	if _, err := d.gofishClient(ctx); err != nil {
		return TaskStatus{}, err
	}
	cur := prev
	if prev.Monitor != "" {
		resp, err := d.gf.Get(prev.Monitor)
		switch {
		case err == nil && resp.StatusCode == http.StatusAccepted:
			raw, _ := io.ReadAll(io.LimitReader(resp.Body, maxHealthDoc))
			resp.Body.Close()
			if ts, perr := parseRfTask(bytes.NewReader(raw)); perr == nil {
				ts.Monitor = prev.Monitor
				if ts.Path == "" {
					ts.Path = prev.Path
				}
				return ts, nil
			}
			if cur.State == "New" {
				cur.State = "Running"
			}
			if prev.Path == "" {
				return cur, nil
			}
		case err == nil:
			raw, _ := io.ReadAll(io.LimitReader(resp.Body, maxHealthDoc))
			resp.Body.Close()
			if prev.Path == "" { // no task resource: the monitor's answer is the outcome
				if ts, perr := parseRfTask(bytes.NewReader(raw)); perr == nil {
					ts.Monitor = prev.Monitor
					return ts, nil
				}
				cur.State, cur.Percent = "Completed", 100
				return cur, nil
			}
		case isNotFound(err) && prev.Path != "":
			// the monitor is gone once the task ended (some BMCs): read the task
		default:
			if prev.Path == "" {
				if isRejection(err) { // the operation's failure, as the monitor reports it
					cur.State, cur.Status = "Exception", "Critical"
					cur.Messages = append(cur.Messages, scrub(err.Error(), d.t.Password))
					cur.MessageIDs = append(cur.MessageIDs, "")
					return cur, nil
				}
				return TaskStatus{}, err
			}
		}
	}
	var ts TaskStatus
	if err := d.getDoc(prev.Path, func(r io.Reader) (e error) { ts, e = parseRfTask(r); return }); err != nil {
		return TaskStatus{}, err
	}
	ts.Monitor = prev.Monitor
	if ts.Path == "" {
		ts.Path = prev.Path
	}
	return ts, nil
}

func (d *redfishDriver) biosPath(ctx context.Context) (string, *rfSystemLinks, error) {
	sys, err := d.system(ctx)
	if err != nil {
		return "", nil, err
	}
	var links rfSystemLinks
	if err := d.getDoc(sys.ODataID, func(r io.Reader) (e error) { links, e = parseRfSystemLinks(r); return }); err != nil {
		return "", nil, err
	}
	if links.Bios == "" {
		return "", nil, fmt.Errorf("%w: ComputerSystem %s has no Bios resource", ErrUnsupported, sys.ODataID)
	}
	return links.Bios, &links, nil
}

// rfSystemLinks is what the BIOS code reads of a ComputerSystem.
type rfSystemLinks struct {
	Bios      string   // Bios @odata.id
	ManagedBy []string // Links.ManagedBy
}

func parseRfSystemLinks(r io.Reader) (rfSystemLinks, error) {
	var doc struct {
		Bios  *odataRef
		Links *struct{ ManagedBy []*odataRef }
	}
	if err := json.NewDecoder(r).Decode(&doc); err != nil {
		return rfSystemLinks{}, fmt.Errorf("%w: ComputerSystem JSON: %v", ErrBadAnswer, err)
	}
	var out rfSystemLinks
	var err error
	if doc.Bios != nil {
		if out.Bios, err = doc.Bios.path("ComputerSystem.Bios"); err != nil {
			return rfSystemLinks{}, err
		}
	}
	if doc.Links != nil {
		for _, m := range doc.Links.ManagedBy {
			p, err := m.path("Links.ManagedBy")
			if err != nil {
				return rfSystemLinks{}, err
			}
			out.ManagedBy = append(out.ManagedBy, p)
		}
	}
	return out, nil
}

func (d *redfishDriver) bios(ctx context.Context) (BIOS, error) {
	p, _, err := d.biosPath(ctx)
	if err != nil {
		return BIOS{}, err
	}
	return d.readBIOS(p)
}

func (d *redfishDriver) readBIOS(p string) (BIOS, error) {
	var b BIOS
	err := d.getDoc(p, func(r io.Reader) (e error) { b, e = parseRfBios(r); return })
	if isNotFound(err) {
		return BIOS{}, fmt.Errorf("%w: Bios answers 404", ErrUnsupported)
	}
	if err != nil {
		return BIOS{}, err
	}
	if b.SettingsPath != "" {
		var s BIOS
		if err := d.getDoc(b.SettingsPath, func(r io.Reader) (e error) { s, e = parseRfBios(r); return }); err != nil {
			return BIOS{}, err
		}
		b.Pending = s.Attributes
	}
	return b, nil
}

func (d *redfishDriver) setBIOS(ctx context.Context, attrs map[string]any) (BIOS, error) {
	p, links, err := d.biosPath(ctx)
	if err != nil {
		return BIOS{}, err
	}
	cur, err := d.readBIOS(p)
	if err != nil {
		return BIOS{}, err
	}
	// already pending or current (a retried attempt, or nothing to do)
	if diffPending(cur, attrs) == nil {
		return cur, nil
	}
	if cur.SettingsPath == "" {
		return BIOS{}, fmt.Errorf("%w: Bios has no @Redfish.Settings object (changes would apply at once or not at all)", ErrUnsupported)
	}
	body := map[string]any{"Attributes": attrs}
	onReset := false
	for _, at := range cur.ApplyTimes {
		onReset = onReset || at == "OnReset"
	}
	if onReset {
		body["@Redfish.SettingsApplyTime"] = map[string]string{"ApplyTime": "OnReset"}
	}
	resp, err := d.gf.Patch(cur.SettingsPath, body)
	if err != nil {
		return BIOS{}, err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	resp.Body.Close()
	if !onReset && len(links.ManagedBy) > 0 {
		// Dell iDRAC: staged values apply only with a configuration job
		// (deploy/lab/vbmc quirk bios-config-job). Elsewhere this URI is absent.
		jr, err := d.gf.Post(links.ManagedBy[0]+"/Jobs", map[string]string{"TargetSettingsURI": cur.SettingsPath})
		switch {
		case err == nil:
			_, _ = io.Copy(io.Discard, io.LimitReader(jr.Body, 1<<20))
			jr.Body.Close()
			d.c.log.InfoContext(ctx, "bios configuration job created", "address", d.t.Address, "location", jr.Header.Get("Location"))
		case isNotFound(err):
		default:
			return BIOS{}, fmt.Errorf("creating the BIOS configuration job: %w", err)
		}
	}
	got, err := d.readBIOS(p)
	if err != nil {
		return BIOS{}, err
	}
	if miss := diffPending(got, attrs); miss != nil {
		return got, fmt.Errorf("%w: settings object %s does not show %s staged", ErrNotApplied, cur.SettingsPath, strings.Join(miss, ", "))
	}
	return got, nil
}

// diffPending lists the attributes of want neither staged in b.Pending nor
// already current (nil when all are).
func diffPending(b BIOS, want map[string]any) []string {
	var miss []string
	for k, v := range want {
		if pv, ok := b.Pending[k]; ok && AttrString(pv) == AttrString(v) {
			continue
		}
		if _, pend := b.Pending[k]; !pend && AttrString(b.Attributes[k]) == AttrString(v) {
			if _, ok := b.Attributes[k]; ok {
				continue
			}
		}
		miss = append(miss, k)
	}
	sort.Strings(miss)
	return miss
}

// ---- IPMI: none of it ----

func (d *ipmiDriver) firmwareInventory(context.Context) ([]FirmwareComponent, error) {
	return nil, fmt.Errorf("%w: IPMI has no firmware inventory (Redfish UpdateService needed)", ErrUnsupported)
}

func (d *ipmiDriver) startUpdate(context.Context, FirmwareUpdate) (TaskStatus, error) {
	return TaskStatus{}, fmt.Errorf("%w: IPMI has no firmware update (Redfish UpdateService needed)", ErrUnsupported)
}

func (d *ipmiDriver) taskStatus(context.Context, TaskStatus) (TaskStatus, error) {
	return TaskStatus{}, fmt.Errorf("%w: IPMI has no tasks", ErrUnsupported)
}

func (d *ipmiDriver) bios(context.Context) (BIOS, error) {
	return BIOS{}, fmt.Errorf("%w: IPMI has no BIOS attributes (Redfish Bios needed)", ErrUnsupported)
}

func (d *ipmiDriver) setBIOS(context.Context, map[string]any) (BIOS, error) {
	return BIOS{}, fmt.Errorf("%w: IPMI cannot set BIOS attributes (Redfish Bios settings needed)", ErrUnsupported)
}
