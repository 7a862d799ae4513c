// Firmware and BIOS baselines (issue 17): ReadFirmware reads a machine's
// firmware inventory and BIOS attributes from its BMC into
// Machine.Firmware and its drift from the model's baseline into the
// machine's diff; ApplyBaseline brings it to the baseline (firmware, then
// BIOS), step by step. DESIGN.md "Firmware and BIOS baselines".

package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"kiln/appliance/lifecycle/rules"
	"kiln/bmc"
	"kiln/store"
)

// FirmwareBMC is optionally implemented by the Config's BMC: the firmware
// and BIOS side of a machine's BMC (the appliance's adapter over
// bmc.Controller). Errors wrap bmc's sentinels (bmc.ErrUnsupported for an
// IPMI-only BMC).
type FirmwareBMC interface {
	FirmwareInventory(ctx context.Context, machineID string) ([]bmc.FirmwareComponent, error)
	UpdateFirmware(ctx context.Context, machineID string, u bmc.FirmwareUpdate) (bmc.TaskStatus, error)
	BIOSAttributes(ctx context.Context, machineID string) (bmc.BIOS, error)
	ApplyBIOSAttributes(ctx context.Context, machineID string, attrs map[string]any) (bmc.BIOS, error)
	ResetSystem(ctx context.Context, machineID string) error
}

// Errors of the firmware side.
var (
	// ErrFirmwareUnsupported: the machine's BMC cannot read or change
	// firmware/BIOS (IPMI only, or no UpdateService/Bios): the step is
	// "unsupported", never skipped silently.
	ErrFirmwareUnsupported = errors.New("lifecycle: the machine's BMC does not support firmware/BIOS management")
	// ErrNoBaseline: no baseline for the machine's vendor and model.
	ErrNoBaseline = errors.New("lifecycle: no baseline for the machine's hardware model")
)

// Reasons of firmware writes and events.
const (
	ReasonFirmwareRead    = "firmware_read"
	ReasonFirmwareApply   = "firmware_apply"
	ReasonFirmwareApplied = "firmware_applied"
	ReasonFirmwareFailed  = "firmware_failed"
)

// Diff fields of baseline drift: "firmware.<component>" and "bios.<attribute>".
const (
	FieldFirmwarePrefix = "firmware."
	FieldBIOSPrefix     = "bios."
)

// Step and run states of a store.FirmwareApply.
const (
	FWPending     = "pending"
	FWRunning     = "running"
	FWSucceeded   = "succeeded"
	FWSkipped     = "skipped"
	FWFailed      = "failed"
	FWUnsupported = "unsupported"
)

// firmwareReadTimeout bounds one ReadFirmware's BMC reads.
const firmwareReadTimeout = 60 * time.Second

func (c *Controller) firmwareBMC() (FirmwareBMC, bool) {
	if c.bmc == nil {
		return nil, false
	}
	f, ok := c.bmc.(FirmwareBMC)
	return f, ok
}

// hardwareModel is the machine's vendor and model: discovered (inspection,
// BMC) first, else intended.
func hardwareModel(m store.Machine) (vendor, model string) {
	if d := m.Discovered; d != nil {
		vendor, model = d.Vendor, d.Model
	}
	if vendor == "" {
		vendor = m.Intended.Vendor
	}
	if model == "" {
		model = m.Intended.Model
	}
	return vendor, model
}

// FirmwareDrift compares rec with baseline b: one non-blocking FieldDiff per
// baseline component whose version differs ("" when the BMC does not list
// it) and per BIOS attribute whose value differs, sorted by field.
func FirmwareDrift(rec *store.FirmwareRecord, b store.Baseline) []store.FieldDiff {
	var out []store.FieldDiff
	have := map[string]string{}
	listed := map[string]bool{}
	for _, fc := range rec.Components {
		if !listed[fc.Name] {
			have[fc.Name], listed[fc.Name] = fc.Version, true
		}
	}
	for _, f := range b.Firmware {
		if have[f.Component] != f.Version || !listed[f.Component] {
			out = append(out, store.FieldDiff{Field: FieldFirmwarePrefix + f.Component, Intended: f.Version, Discovered: have[f.Component]})
		}
	}
	for k, v := range b.BIOS {
		if cur, ok := rec.BIOS[k]; !ok || cur != v {
			out = append(out, store.FieldDiff{Field: FieldBIOSPrefix + k, Intended: v, Discovered: cur})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Field < out[j].Field })
	return out
}

// withDrift replaces the firmware/BIOS entries of diff by drift.
func withDrift(diff, drift []store.FieldDiff) []store.FieldDiff {
	out := make([]store.FieldDiff, 0, len(diff)+len(drift))
	for _, d := range diff {
		if !strings.HasPrefix(d.Field, FieldFirmwarePrefix) && !strings.HasPrefix(d.Field, FieldBIOSPrefix) {
			out = append(out, d)
		}
	}
	return append(out, drift...)
}

func attrsText(m map[string]any) map[string]string {
	if len(m) == 0 {
		return nil
	}
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = truncate(sanitize(bmc.AttrString(v)), rules.MaxTextLen)
	}
	return out
}

// ReadFirmware reads machine id's firmware inventory and BIOS attributes
// from its BMC into Machine.Firmware, compares them with the baseline of the
// machine's vendor and model (FirmwareDrift) and puts the drift in
// Machine.Diff next to the hardware fields. A BMC that cannot (IPMI) is
// recorded as Firmware.Error "unsupported" and returned as
// ErrFirmwareUnsupported; another failed read is recorded with its reason
// and returned (with the machine as written). Errors before any write
// (ErrInvalid: no BMC; store errors) return a zero Machine.
func (c *Controller) ReadFirmware(ctx context.Context, id string, w store.W) (store.Machine, error) {
	m, err := c.st.GetMachine(id)
	if err != nil {
		return store.Machine{}, fmt.Errorf("lifecycle: read firmware of %s: %w", id, err)
	}
	fb, ok := c.firmwareBMC()
	if m.BMC == "" || !ok {
		return store.Machine{}, fmt.Errorf("%w: machine %s has no BMC enrolled (POST /v1/machines/%s/bmc)", ErrInvalid, id, id)
	}
	rctx, cancel := context.WithTimeout(ctx, firmwareReadTimeout)
	defer cancel()
	rec := &store.FirmwareRecord{}
	fc, ferr := fb.FirmwareInventory(rctx, id)
	var b bmc.BIOS
	var berr error
	if ferr == nil {
		b, berr = fb.BIOSAttributes(rctx, id)
	}
	readErr := errors.Join(ferr, berr)
	if readErr == nil {
		for _, f := range fc {
			rec.Components = append(rec.Components, store.FirmwareVersion{Name: truncate(sanitize(f.Name), rules.MaxTextLen),
				Version: truncate(sanitize(f.Version), rules.MaxTextLen), ID: truncate(sanitize(f.ID), rules.MaxTextLen)})
		}
		rec.BIOS, rec.PendingBIOS = attrsText(b.Attributes), attrsText(b.Pending)
	}
	w = withDefaults(w, ReasonFirmwareRead)
	out, err := c.update(ctx, id, w, func(m *store.Machine) error {
		now := c.now()
		r := *rec
		if readErr != nil { // keep the last good read, say why this one failed
			if m.Firmware != nil {
				r = *m.Firmware
			}
			r.Error = bmc.Reason(readErr)
			if r.Error == "error" {
				r.Error = ReasonBMCFailed
			}
			r.Message = truncate(sanitize(readErr.Error()), rules.MaxDescriptionLen)
		} else if m.Firmware != nil {
			r.Apply = m.Firmware.Apply
		}
		r.ReadAt = now
		r.Baseline, r.Drift = "", nil
		vendor, model := hardwareModel(*m)
		if bl, err := c.st.BaselineFor(vendor, model); err == nil && readErr == nil {
			r.Baseline, r.Drift = bl.ID, FirmwareDrift(&r, bl)
		} else if err == nil {
			r.Baseline = bl.ID
		}
		m.Firmware = &r
		m.Diff = withDrift(m.Diff, r.Drift)
		return nil
	})
	if err != nil {
		return out, err
	}
	if errors.Is(readErr, bmc.ErrUnsupported) {
		return out, fmt.Errorf("%w: %v", ErrFirmwareUnsupported, readErr)
	}
	if readErr != nil {
		return out, fmt.Errorf("lifecycle: read firmware of %s (%s): %w", id, bmc.Reason(readErr), readErr)
	}
	return out, nil
}

// readFirmwareQuiet is ReadFirmware after an enrollment, when the
// machine's model has a baseline (without one there is no drift to show,
// and a fleet's enrollment makes no extra BMC reads; `kiln firmware read`
// reads any machine): a failure is recorded on the machine, not returned.
// Bounded like the inventory read.
func (c *Controller) readFirmwareQuiet(ctx context.Context, id string) {
	if _, ok := c.firmwareBMC(); !ok {
		return
	}
	m, err := c.st.GetMachine(id)
	if err != nil {
		return
	}
	if _, err := c.st.BaselineFor(hardwareModel(m)); err != nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, bmcInventoryTimeout)
	defer cancel()
	if _, err := c.ReadFirmware(ctx, id, store.W{Actor: "bmc", Reason: ReasonFirmwareRead}); err != nil {
		c.logger().Info("firmware read after enrollment", "machine", id, "err", err)
	}
}

// applyFrom are the states in which ApplyBaseline may reset the machine:
// never while the agent is writing a disk or erasing.
var applyFrom = []store.MachineState{store.StateDiscovered, store.StateRegistered, store.StateAvailable,
	store.StateProvisioned, store.StateFailed, store.StateQuarantined, store.StateRemediating, store.StateRMA}

// typedAttr converts a baseline's text value to the type of the BMC's
// current value of the attribute (integer, boolean, else string).
func typedAttr(cur any, v string) any {
	switch cur.(type) {
	case int64, float64:
		if i, err := strconv.ParseInt(v, 10, 64); err == nil {
			return i
		}
		if f, err := strconv.ParseFloat(v, 64); err == nil {
			return f
		}
	case bool:
		if b, err := strconv.ParseBool(v); err == nil {
			return b
		}
	}
	return v
}

// ApplyBaseline brings machine id to its model's baseline: first each
// firmware component whose version differs (UpdateFirmware with the
// baseline's image URI, following the BMC task; one reset after them when
// a task staged an image, then the inventory is read back and each
// component must show the baseline version), then the differing BIOS
// attributes (staged through the settings object, a reset, read back). The
// run and its steps are recorded in Machine.Firmware.Apply as they progress
// (progress, when set, is called with each change), and the machine's
// firmware record and drift are read again at the end.
//
// Result: Apply.State "succeeded" (nothing to do included), "failed" (a
// step failed: the error names it; later steps are "skipped"), or
// "unsupported" (an IPMI-only BMC: ErrFirmwareUnsupported). The machine
// must be out of service: ApplyBaseline resets it. Errors also:
// ErrNoBaseline, ErrInvalid (no BMC), *StateError (provisioning,
// inspecting, erasing, retired), store.ErrConflict (a run for the machine
// is already going on this node), store errors.
//
// It is the "firmware"/"bios" action campaigns call (issue 17).
func (c *Controller) ApplyBaseline(ctx context.Context, id string, w store.W, progress func(store.FirmwareApply)) (store.FirmwareApply, error) {
	return c.ApplyBaselinePart(ctx, id, BaselineAll, w, progress)
}

// Parts of a baseline ApplyBaselinePart applies.
const (
	BaselineAll      = ""         // firmware, then BIOS
	BaselineFirmware = "firmware" // the firmware components only
	BaselineBIOS     = "bios"     // the BIOS attributes only
)

// ApplyBaselinePart is ApplyBaseline restricted to part: BaselineFirmware
// (the campaigns' "firmware" action), BaselineBIOS ("bios") or BaselineAll.
// ErrInvalid for another part.
func (c *Controller) ApplyBaselinePart(ctx context.Context, id, part string, w store.W, progress func(store.FirmwareApply)) (store.FirmwareApply, error) {
	if part != BaselineAll && part != BaselineFirmware && part != BaselineBIOS {
		return store.FirmwareApply{}, fmt.Errorf("%w: baseline part %q: want firmware, bios or both", ErrInvalid, part)
	}
	m, err := c.st.GetMachine(id)
	if err != nil {
		return store.FirmwareApply{}, fmt.Errorf("lifecycle: apply baseline to %s: %w", id, err)
	}
	if !hasState(applyFrom, m.State) {
		return store.FirmwareApply{}, &StateError{Op: "apply baseline to", Machine: id, State: m.State, Want: applyFrom}
	}
	fb, ok := c.firmwareBMC()
	if m.BMC == "" || !ok {
		return store.FirmwareApply{}, fmt.Errorf("%w: machine %s has no BMC enrolled (POST /v1/machines/%s/bmc)", ErrInvalid, id, id)
	}
	key := applyKey{c, id}
	if _, busy := applying.LoadOrStore(key, true); busy {
		return store.FirmwareApply{}, fmt.Errorf("%w: machine %s: a baseline apply is already running on this node", store.ErrConflict, id)
	}
	defer applying.Delete(key)
	vendor, model := hardwareModel(m)
	bl, err := c.st.BaselineFor(vendor, model)
	if errors.Is(err, store.ErrNotFound) {
		return store.FirmwareApply{}, fmt.Errorf("%w: %q %q (kiln baseline set)", ErrNoBaseline, vendor, model)
	}
	if err != nil {
		return store.FirmwareApply{}, err
	}
	w = withDefaults(w, ReasonFirmwareApply)
	run := store.FirmwareApply{Baseline: bl.ID, Started: c.now(), State: FWRunning}
	save := func() {
		if progress != nil {
			progress(run)
		}
		snap := run
		snap.Steps = append([]store.FirmwareStep(nil), run.Steps...)
		if _, err := c.update(ctx, id, w, func(m *store.Machine) error {
			if m.Firmware == nil {
				m.Firmware = &store.FirmwareRecord{}
			}
			m.Firmware.Apply = &snap
			return nil
		}); err != nil {
			c.logger().Warn("record firmware apply", "machine", id, "err", err)
		}
	}
	finish := func(state string, err error) (store.FirmwareApply, error) {
		run.State, run.Finished = state, c.now()
		for i := range run.Steps {
			if run.Steps[i].State == FWPending {
				run.Steps[i].State = FWSkipped
			}
		}
		save()
		if _, rerr := c.ReadFirmware(ctx, id, store.W{Actor: w.Actor, Reason: ReasonFirmwareRead}); rerr != nil && err == nil && state != FWUnsupported {
			c.logger().Warn("firmware read after apply", "machine", id, "err", rerr)
		}
		kind, reason := "firmware_applied", ReasonFirmwareApplied
		if state != FWSucceeded {
			kind, reason = "firmware_apply_failed", ReasonFirmwareFailed
		}
		msg := fmt.Sprintf("baseline %s: %s", bl.ID, state)
		if err != nil {
			msg += ": " + err.Error()
		}
		if aerr := c.st.AppendEvents(ctx, []store.Event{{Subject: "machine/" + id, Kind: kind, To: state, Actor: w.Actor,
			Reason: reason, Message: truncate(sanitize(msg), rules.MaxDescriptionLen)}}); aerr != nil {
			c.logger().Warn("firmware apply event", "machine", id, "err", aerr)
		}
		return run, err
	}
	unsupported := func(err error) (store.FirmwareApply, error) {
		run.Steps = append(run.Steps, store.FirmwareStep{Kind: "firmware", Target: "inventory", State: FWUnsupported,
			Reason: "unsupported", Message: truncate(sanitize(err.Error()), rules.MaxDescriptionLen)})
		return finish(FWUnsupported, fmt.Errorf("%w: %v", ErrFirmwareUnsupported, err))
	}
	stepFail := func(i int, err error) (store.FirmwareApply, error) {
		run.Steps[i].State, run.Steps[i].Reason = FWFailed, bmc.Reason(err)
		if errors.Is(err, bmc.ErrUnsupported) {
			run.Steps[i].State = FWUnsupported
		}
		run.Steps[i].Message = truncate(sanitize(err.Error()), rules.MaxDescriptionLen)
		st := FWFailed
		if run.Steps[i].State == FWUnsupported {
			st = FWUnsupported
			err = fmt.Errorf("%w: %v", ErrFirmwareUnsupported, err)
		}
		return finish(st, fmt.Errorf("lifecycle: %s %s: %w", run.Steps[i].Kind, run.Steps[i].Target, err))
	}

	inv, err := fb.FirmwareInventory(ctx, id)
	if errors.Is(err, bmc.ErrUnsupported) {
		return unsupported(err)
	}
	if err != nil {
		run.Steps = append(run.Steps, store.FirmwareStep{Kind: "firmware", Target: "inventory", State: FWPending})
		return stepFail(0, err)
	}
	byName := map[string]bmc.FirmwareComponent{}
	for _, f := range inv {
		if _, dup := byName[f.Name]; !dup {
			byName[f.Name] = f
		}
	}
	// plan: firmware steps, then one BIOS step
	var plan []fwPlan
	for _, f := range bl.Firmware {
		if part == BaselineBIOS {
			break
		}
		cur, listed := byName[f.Component]
		if listed && cur.Version == f.Version {
			continue
		}
		plan = append(plan, fwPlan{step: len(run.Steps), want: f, comp: cur})
		run.Steps = append(run.Steps, store.FirmwareStep{Kind: "firmware", Target: f.Component, From: cur.Version, To: f.Version, State: FWPending})
	}
	biosStep := -1
	if len(bl.BIOS) > 0 && part != BaselineFirmware {
		biosStep = len(run.Steps)
		run.Steps = append(run.Steps, store.FirmwareStep{Kind: "bios", Target: "attributes", State: FWPending})
	}
	save()

	needReset := false
	var staged []fwPlan
	for _, p := range plan {
		i := p.step
		switch {
		case p.comp.Name == "":
			return stepFail(i, fmt.Errorf("%w: the BMC lists no component %q", bmc.ErrNotApplied, p.want.Component))
		case p.want.ImageURI == "":
			return stepFail(i, fmt.Errorf("%w: the baseline has no image for %s %s", bmc.ErrInvalidTarget, p.want.Component, p.want.Version))
		}
		run.Steps[i].State = FWRunning
		save()
		last := time.Time{}
		st, err := fb.UpdateFirmware(ctx, id, bmc.FirmwareUpdate{ImageURI: p.want.ImageURI, Target: p.comp.Path,
			Progress: func(ts bmc.TaskStatus) {
				run.Steps[i].Task, run.Steps[i].Percent = ts.ID, max(ts.Percent, 0)
				if time.Since(last) > 5*time.Second || ts.Done() { // a record write per 5 s of progress at most
					last = time.Now()
					save()
				}
			}})
		if err != nil {
			return stepFail(i, err)
		}
		run.Steps[i].Task, run.Steps[i].Percent = st.ID, 100
		if st.NeedsReset() {
			needReset = true
			run.Steps[i].Message = "staged; activated by the reset"
		}
		staged = append(staged, p)
		save()
	}
	if needReset {
		if err := fb.ResetSystem(ctx, id); err != nil {
			return stepFail(staged[len(staged)-1].step, fmt.Errorf("reset to activate the firmware: %w", err))
		}
	}
	if len(staged) > 0 {
		var inv2 []bmc.FirmwareComponent
		var err error
		for end := time.Now().Add(bmc.DefaultApplyTimeout); ; time.Sleep(time.Second) {
			inv2, err = fb.FirmwareInventory(ctx, id)
			if err == nil && allVersions(inv2, staged) || time.Now().After(end) || ctx.Err() != nil {
				break
			}
		}
		if err != nil {
			return stepFail(staged[0].step, err)
		}
		have := map[string]string{}
		for _, f := range inv2 {
			if _, dup := have[f.Name]; !dup {
				have[f.Name] = f.Version
			}
		}
		for _, p := range staged {
			if have[p.want.Component] != p.want.Version {
				return stepFail(p.step, fmt.Errorf("%w: %s reads %q after the update, want %q", bmc.ErrNotApplied, p.want.Component, have[p.want.Component], p.want.Version))
			}
			run.Steps[p.step].State = FWSucceeded
		}
		save()
	}
	if biosStep >= 0 {
		cur, err := fb.BIOSAttributes(ctx, id)
		if err != nil {
			return stepFail(biosStep, err)
		}
		want := map[string]any{}
		var names []string
		for k, v := range bl.BIOS {
			cv, ok := cur.Attributes[k]
			if ok && bmc.AttrString(cv) == v {
				continue
			}
			if !ok {
				return stepFail(biosStep, fmt.Errorf("%w: the BIOS has no attribute %s", bmc.ErrNotApplied, k))
			}
			want[k] = typedAttr(cv, v)
			names = append(names, k)
		}
		sort.Strings(names)
		if len(want) == 0 {
			run.Steps[biosStep].State, run.Steps[biosStep].Message = FWSucceeded, "already at the baseline"
		} else {
			run.Steps[biosStep].State, run.Steps[biosStep].Target = FWRunning, strings.Join(names, ",")
			save()
			if _, err := fb.ApplyBIOSAttributes(ctx, id, want); err != nil {
				return stepFail(biosStep, err)
			}
			run.Steps[biosStep].State = FWSucceeded
		}
	}
	return finish(FWSucceeded, nil)
}

// applying holds the (controller, machine) pairs with an ApplyBaseline
// running: one run per machine at a time on a node.
var applying sync.Map

type applyKey struct {
	c  *Controller
	id string
}

// fwPlan is one firmware step of ApplyBaseline.
type fwPlan struct {
	step int
	want store.BaselineFirmware
	comp bmc.FirmwareComponent
}

// allVersions reports whether inv shows every staged component at its
// baseline version.
func allVersions(inv []bmc.FirmwareComponent, staged []fwPlan) bool {
	have := map[string]string{}
	for _, f := range inv {
		if _, dup := have[f.Name]; !dup {
			have[f.Name] = f.Version
		}
	}
	for _, p := range staged {
		if have[p.want.Component] != p.want.Version {
			return false
		}
	}
	return true
}

// SetBaseline stores b as the baseline of its vendor and model (store
// command 35; resource_version 0 sets it whatever is stored), then
// recomputes the drift of every machine of that model that has a firmware
// record (no BMC read: the last read is compared). Errors: ErrInvalid
// (store.ErrInvalid: vendor, model, components, image URIs), store errors.
func (c *Controller) SetBaseline(ctx context.Context, b store.Baseline, w store.W) (store.Baseline, error) {
	for _, f := range b.Firmware {
		if err := rules.CheckText(f.Component, rules.MaxTextLen); err != nil {
			return store.Baseline{}, fmt.Errorf("%w: component: %v", ErrInvalid, err)
		}
	}
	out, err := c.st.PutBaseline(ctx, b, withDefaults(w, "baseline_set"))
	if errors.Is(err, store.ErrInvalid) {
		return out, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	if err != nil {
		return out, err
	}
	after := ""
	for {
		ms, next, err := c.st.ListMachines(store.ListOptions{After: after, Limit: 500})
		if err != nil {
			return out, err
		}
		for _, m := range ms {
			if v, mo := hardwareModel(m); m.Firmware == nil || store.BaselineID(v, mo) != out.ID || m.Firmware.Error != "" {
				continue
			}
			if _, err := c.update(ctx, m.ID, store.W{Actor: w.Actor, Reason: "baseline_set"}, func(m *store.Machine) error {
				if m.Firmware == nil {
					return nil
				}
				r := *m.Firmware
				r.Baseline, r.Drift = out.ID, FirmwareDrift(&r, out)
				m.Firmware = &r
				m.Diff = withDrift(m.Diff, r.Drift)
				return nil
			}); err != nil {
				c.logger().Warn("baseline drift", "machine", m.ID, "err", err)
			}
		}
		if next == "" {
			return out, nil
		}
		after = next
	}
}

// Baselines returns every baseline, ordered by ID.
func (c *Controller) Baselines() ([]store.Baseline, error) { return c.st.ListBaselines() }

// Service's firmware methods (api.FirmwareBackend).

// ReadFirmware is Controller.ReadFirmware.
func (s *Service) ReadFirmware(ctx context.Context, id string, w store.W) (store.Machine, error) {
	return s.c.ReadFirmware(ctx, id, w)
}

// ApplyBaseline is Controller.ApplyBaseline.
func (s *Service) ApplyBaseline(ctx context.Context, id string, w store.W, progress func(store.FirmwareApply)) (store.FirmwareApply, error) {
	return s.c.ApplyBaseline(ctx, id, w, progress)
}

// SetBaseline is Controller.SetBaseline.
func (s *Service) SetBaseline(ctx context.Context, b store.Baseline, w store.W) (store.Baseline, error) {
	return s.c.SetBaseline(ctx, b, w)
}

// Baselines is Controller.Baselines.
func (s *Service) Baselines() ([]store.Baseline, error) { return s.c.Baselines() }
