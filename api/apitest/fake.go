// Package apitest provides Fake, an in-memory api.Backend for tests of the
// API and of its clients (the kiln CLI). It honours compare-and-set
// resource versions, the lifecycle transition table (store.CanTransition)
// and appends an event for every write, like the real store; it is not for
// production use.
package apitest

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"kiln/api"
	"kiln/api/agentapi"
	"kiln/appliance/lifecycle/intake"
	"kiln/store"
)

// Fake is an in-memory api.Backend. The zero value is not usable; call New.
type Fake struct {
	mu        sync.Mutex
	index     uint64 // last "raft index": resource versions and event indexes
	seq       int
	machines  map[string]store.Machine
	sites     map[string]store.Site
	racks     map[string]store.Rack
	images    map[string]store.Image
	imageData map[string][]byte
	jobs      map[string]store.Job
	bmcs      map[string]store.BMC
	passwords map[string]string // credential ref → password (never returned)
	events    []store.Event
	notify    chan struct{} // closed and replaced on every event
	tokens    map[string]string
	reports   map[string][]agentapi.Report
	health    api.Health
	now       func() time.Time
}

// New returns an empty Fake that is ready and leader.
func New() *Fake {
	return &Fake{
		machines: map[string]store.Machine{}, sites: map[string]store.Site{}, racks: map[string]store.Rack{},
		images: map[string]store.Image{}, imageData: map[string][]byte{}, jobs: map[string]store.Job{},
		bmcs: map[string]store.BMC{}, passwords: map[string]string{}, notify: make(chan struct{}),
		tokens: map[string]string{}, reports: map[string][]agentapi.Report{},
		health: api.Health{Leader: "127.0.0.1:7480", IsLeader: true, Ready: true, Version: "test",
			Stats: map[string]string{"state": "Leader"}},
		now: func() time.Time { return time.Now().UTC() },
	}
}

// SetHealth replaces what Health returns.
func (f *Fake) SetHealth(h api.Health) { f.mu.Lock(); f.health = h; f.mu.Unlock() }

// SetAgentToken makes token the per-boot agent token of machine.
func (f *Fake) SetAgentToken(machine, token string) {
	f.mu.Lock()
	f.tokens[machine] = token
	f.mu.Unlock()
}

// Reports returns the agent reports received for machine.
func (f *Fake) Reports(machine string) []agentapi.Report {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.reports[machine])
}

// Password returns the stored BMC password of a credential ref (tests check
// it was stored but never returned).
func (f *Fake) Password(ref string) string { f.mu.Lock(); defer f.mu.Unlock(); return f.passwords[ref] }

// AddEvent appends an event as if some other part of the appliance wrote one.
func (f *Fake) AddEvent(ev store.Event) uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.index++
	f.emit(ev)
	return f.index
}

// emit appends ev at the current index. Callers hold mu and have bumped index.
func (f *Fake) emit(ev store.Event) {
	ev.Index = f.index
	ev.Time = f.now()
	f.events = append(f.events, ev)
	close(f.notify)
	f.notify = make(chan struct{})
}

func (f *Fake) meta(m *store.Meta, prefix string, n int) {
	now := f.now()
	if m.ID == "" {
		m.ID = fmt.Sprintf("%s-%05d", prefix, n+1)
	}
	if m.CreatedAt.IsZero() {
		m.CreatedAt = now
	}
	m.UpdatedAt = now
	m.ResourceVersion = f.index
}

// ---- machines

// ListMachines returns machines sorted by ID; After is the last ID of the
// previous page and next is "" on the last page.
func (f *Fake) ListMachines(opt store.ListOptions) ([]store.Machine, string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	ids := slices.Sorted(maps.Keys(f.machines))
	var out []store.Machine
	for _, id := range ids {
		if opt.After != "" && id <= opt.After {
			continue
		}
		m := f.machines[id]
		if opt.State != "" && m.State != opt.State || opt.Rack != "" && m.Rack != opt.Rack {
			continue
		}
		ok := true
		for k, v := range opt.Labels {
			ok = ok && m.Labels[k] == v
		}
		if !ok {
			continue
		}
		if opt.Limit > 0 && len(out) == opt.Limit {
			return out, out[len(out)-1].ID, nil
		}
		out = append(out, m)
	}
	return out, "", nil
}

// GetMachine returns one machine or store.ErrNotFound.
func (f *Fake) GetMachine(id string) (store.Machine, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	m, ok := f.machines[id]
	if !ok {
		return m, fmt.Errorf("%w: machine %q", store.ErrNotFound, id)
	}
	return m, nil
}

// PutMachine creates (ID "") or CAS-updates a machine, validating any state change.
func (f *Fake) PutMachine(_ context.Context, m store.Machine, w store.W) (store.Machine, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.putMachine(m, w)
}

func (f *Fake) putMachine(m store.Machine, w store.W) (store.Machine, error) {
	old, exists := f.machines[m.ID]
	switch {
	case m.ID == "" || !exists && m.ResourceVersion == 0:
		if !m.State.Valid() {
			return m, fmt.Errorf("%w: state %q", store.ErrInvalid, m.State)
		}
		f.index++
		f.meta(&m.Meta, "m", len(f.machines))
		f.machines[m.ID] = m
		f.emit(store.Event{Subject: "machine/" + m.ID, Kind: "created", To: string(m.State), Actor: w.Actor, Reason: w.Reason})
		return m, nil
	case !exists:
		return m, fmt.Errorf("%w: machine %q", store.ErrNotFound, m.ID)
	case old.ResourceVersion != m.ResourceVersion:
		return m, fmt.Errorf("%w: machine %s at %d, not %d", store.ErrConflict, m.ID, old.ResourceVersion, m.ResourceVersion)
	case old.State != m.State && !store.CanTransition(old.State, m.State):
		return m, &store.IllegalTransitionError{From: old.State, To: m.State}
	}
	f.index++
	m.CreatedAt = old.CreatedAt
	f.meta(&m.Meta, "m", 0)
	f.machines[m.ID] = m
	if old.State != m.State {
		f.emit(store.Event{Subject: "machine/" + m.ID, Kind: "transition", From: string(old.State), To: string(m.State),
			Actor: w.Actor, Reason: w.Reason, Message: w.Message})
	} else {
		f.emit(store.Event{Subject: "machine/" + m.ID, Kind: "updated", Actor: w.Actor, Reason: w.Reason})
	}
	return m, nil
}

// transition moves machine id to state to (with CanTransition), applying mut first.
func (f *Fake) transition(id string, to store.MachineState, w store.W, mut func(*store.Machine)) (store.Machine, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	m, ok := f.machines[id]
	if !ok {
		return m, fmt.Errorf("%w: machine %q", store.ErrNotFound, id)
	}
	if !store.CanTransition(m.State, to) {
		return m, &store.IllegalTransitionError{From: m.State, To: to}
	}
	m.State = to
	if mut != nil {
		mut(&m)
	}
	return f.putMachine(m, w)
}

// ---- sites, racks

// ListSites returns sites sorted by ID.
func (f *Fake) ListSites() ([]store.Site, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []store.Site
	for _, id := range slices.Sorted(maps.Keys(f.sites)) {
		out = append(out, f.sites[id])
	}
	return out, nil
}

// PutSite creates or CAS-updates a site.
func (f *Fake) PutSite(_ context.Context, s store.Site, w store.W) (store.Site, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	old, ok := f.sites[s.ID]
	if s.ResourceVersion != 0 {
		if !ok {
			return s, fmt.Errorf("%w: site %q", store.ErrNotFound, s.ID)
		}
		if old.ResourceVersion != s.ResourceVersion {
			return s, fmt.Errorf("%w: site %s", store.ErrConflict, s.ID)
		}
		s.CreatedAt = old.CreatedAt
	} else if ok {
		return s, fmt.Errorf("%w: site %s exists", store.ErrConflict, s.ID)
	}
	f.index++
	f.meta(&s.Meta, "site", len(f.sites))
	f.sites[s.ID] = s
	f.emit(store.Event{Subject: "site/" + s.ID, Kind: "updated", Actor: w.Actor})
	return s, nil
}

// ListRacks returns racks sorted by ID.
func (f *Fake) ListRacks() ([]store.Rack, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []store.Rack
	for _, id := range slices.Sorted(maps.Keys(f.racks)) {
		out = append(out, f.racks[id])
	}
	return out, nil
}

// PutRack creates or CAS-updates a rack.
func (f *Fake) PutRack(_ context.Context, r store.Rack, w store.W) (store.Rack, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	old, ok := f.racks[r.ID]
	if r.ResourceVersion != 0 {
		if !ok {
			return r, fmt.Errorf("%w: rack %q", store.ErrNotFound, r.ID)
		}
		if old.ResourceVersion != r.ResourceVersion {
			return r, fmt.Errorf("%w: rack %s", store.ErrConflict, r.ID)
		}
		r.CreatedAt = old.CreatedAt
	} else if ok {
		return r, fmt.Errorf("%w: rack %s exists", store.ErrConflict, r.ID)
	}
	f.index++
	f.meta(&r.Meta, "rack", len(f.racks))
	f.racks[r.ID] = r
	f.emit(store.Event{Subject: "rack/" + r.ID, Kind: "updated", Actor: w.Actor})
	return r, nil
}

// ---- images

// ListImages returns images sorted by ID.
func (f *Fake) ListImages() ([]store.Image, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []store.Image
	for _, id := range slices.Sorted(maps.Keys(f.images)) {
		out = append(out, f.images[id])
	}
	return out, nil
}

// GetImage returns one image or store.ErrNotFound.
func (f *Fake) GetImage(id string) (store.Image, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	im, ok := f.images[id]
	if !ok {
		return im, fmt.Errorf("%w: image %q", store.ErrNotFound, id)
	}
	return im, nil
}

// ImageData returns the bytes uploaded for image id.
func (f *Fake) ImageData(id string) []byte { f.mu.Lock(); defer f.mu.Unlock(); return f.imageData[id] }

// UploadImage reads r to its end, checks its SHA-256 against meta.SHA256
// (store.ErrInvalid on mismatch) and stores it.
func (f *Fake) UploadImage(ctx context.Context, meta store.Image, r io.Reader, w store.W) (store.Image, error) {
	h := sha256.New()
	data, err := io.ReadAll(io.TeeReader(r, h))
	if err != nil {
		return meta, fmt.Errorf("read image: %w", err)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != meta.SHA256 {
		return meta, fmt.Errorf("%w: sha256: image is %s, declared %s", store.ErrInvalid, got, meta.SHA256)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.index++
	meta.Size = uint64(len(data))
	f.meta(&meta.Meta, "img", len(f.images))
	f.images[meta.ID] = meta
	f.imageData[meta.ID] = data
	f.emit(store.Event{Subject: "image/" + meta.ID, Kind: "created", Actor: w.Actor})
	return meta, nil
}

// DeleteImage removes an image or returns store.ErrNotFound.
func (f *Fake) DeleteImage(_ context.Context, id string, w store.W) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.images[id]; !ok {
		return fmt.Errorf("%w: image %q", store.ErrNotFound, id)
	}
	delete(f.images, id)
	delete(f.imageData, id)
	f.index++
	f.emit(store.Event{Subject: "image/" + id, Kind: "deleted", Actor: w.Actor})
	return nil
}

// ---- jobs, events, status

// AddJob stores a job (tests).
func (f *Fake) AddJob(j store.Job) store.Job {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.index++
	f.meta(&j.Meta, "job", len(f.jobs))
	f.jobs[j.ID] = j
	return j
}

// ListJobs returns the jobs of machine ("" = all), sorted by ID.
func (f *Fake) ListJobs(machine string) ([]store.Job, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []store.Job
	for _, id := range slices.Sorted(maps.Keys(f.jobs)) {
		if machine == "" || f.jobs[id].Machine == machine {
			out = append(out, f.jobs[id])
		}
	}
	return out, nil
}

// GetJob returns one job or store.ErrNotFound.
func (f *Fake) GetJob(id string) (store.Job, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	j, ok := f.jobs[id]
	if !ok {
		return j, fmt.Errorf("%w: job %q", store.ErrNotFound, id)
	}
	return j, nil
}

// Events returns up to limit events with Index > after.
func (f *Fake) Events(after uint64, limit int) ([]store.Event, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	i, _ := slices.BinarySearchFunc(f.events, after+1, func(e store.Event, t uint64) int {
		return int(e.Index) - int(t)
	})
	out := f.events[i:]
	if limit > 0 && len(out) > limit {
		out = out[:limit]
	}
	return slices.Clone(out), nil
}

// WaitEvents blocks until an event with Index > after exists or ctx ends.
func (f *Fake) WaitEvents(ctx context.Context, after uint64) error {
	for {
		f.mu.Lock()
		have := len(f.events) > 0 && f.events[len(f.events)-1].Index > after
		ch := f.notify
		f.mu.Unlock()
		if have {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// CountByState counts machines per state.
func (f *Fake) CountByState() (map[store.MachineState]int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[store.MachineState]int{}
	for _, m := range f.machines {
		out[m.State]++
	}
	return out, nil
}

// Health returns what SetHealth set (ready leader by default).
func (f *Fake) Health() api.Health {
	f.mu.Lock()
	defer f.mu.Unlock()
	h := f.health
	h.Stats = maps.Clone(h.Stats)
	return h
}

// ---- lifecycle

// Import reads a JSON array of api.MachineSpec or a CSV with the header
// name,serial,mac,rack. Any bad row rejects the whole file (*intake.ErrRows).
func (f *Fake) Import(_ context.Context, r io.Reader, format string, w store.W) (intake.Result, error) {
	var ms []store.Machine
	var bad []intake.RowError
	switch format {
	case "json":
		var specs []api.MachineSpec
		dec := json.NewDecoder(r)
		dec.DisallowUnknownFields()
		if err := dec.Decode(&specs); err != nil {
			return intake.Result{}, &intake.ErrRows{Rows: []intake.RowError{{Line: 1, Field: "", Msg: err.Error()}}}
		}
		for i, s := range specs {
			if len(s.Intended.NICs) == 0 {
				bad = append(bad, intake.RowError{Line: i + 1, Field: "intended.nics", Msg: "at least one NIC"})
			}
			ms = append(ms, store.Machine{Name: s.Name, Rack: s.Rack, Intended: s.Intended, Labels: s.Labels})
		}
	case "csv", "netbox":
		sc := bufio.NewScanner(r)
		line := 0
		for sc.Scan() {
			line++
			if line == 1 {
				if strings.TrimSpace(sc.Text()) != "name,serial,mac,rack" {
					bad = append(bad, intake.RowError{Line: 1, Field: "header", Msg: "want name,serial,mac,rack"})
				}
				continue
			}
			col := strings.Split(sc.Text(), ",")
			if len(col) != 4 {
				bad = append(bad, intake.RowError{Line: line, Field: "", Msg: "want 4 columns"})
				continue
			}
			if !strings.Contains(col[2], ":") {
				bad = append(bad, intake.RowError{Line: line, Field: "mac", Msg: fmt.Sprintf("%q is not a MAC", col[2])})
				continue
			}
			ms = append(ms, store.Machine{Name: col[0], Rack: col[3],
				Intended: store.Hardware{Serial: col[1], NICs: []store.NIC{{MAC: strings.ToLower(col[2])}}}})
		}
		if err := sc.Err(); err != nil {
			return intake.Result{}, fmt.Errorf("read import: %w", err)
		}
	default:
		return intake.Result{}, fmt.Errorf("%w: format %q", store.ErrInvalid, format)
	}
	if len(bad) > 0 {
		return intake.Result{}, &intake.ErrRows{Rows: bad}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	res := intake.Result{}
	for _, m := range ms {
		m.State = store.StateRegistered
		out, err := f.putMachine(m, w)
		if err != nil {
			return intake.Result{}, err
		}
		res.Created++
		res.IDs = append(res.IDs, out.ID)
	}
	return res, nil
}

// Provision moves an available machine to provisioning with claim c.
func (f *Fake) Provision(_ context.Context, id string, c store.Claim, w store.W) (store.Machine, error) {
	if _, err := f.GetImage(c.Image); err != nil {
		return store.Machine{}, err
	}
	return f.transition(id, store.StateProvisioning, w, func(m *store.Machine) { m.Claim = &c })
}

// ClaimMachines provisions n available machines whose labels match, all or
// nothing (store.ErrConflict when fewer are available).
func (f *Fake) ClaimMachines(ctx context.Context, role string, labels map[string]string, n int, c store.Claim, w store.W) ([]store.Machine, error) {
	avail, _, _ := f.ListMachines(store.ListOptions{State: store.StateAvailable, Labels: labels})
	if len(avail) < n {
		return nil, fmt.Errorf("%w: %d machines available for role %s, want %d", store.ErrConflict, len(avail), role, n)
	}
	var out []store.Machine
	for _, m := range avail[:n] {
		m2, err := f.Provision(ctx, m.ID, c, w)
		if err != nil {
			return nil, err
		}
		out = append(out, m2)
	}
	return out, nil
}

// Release moves a provisioned machine to erasing and drops its claim.
func (f *Fake) Release(_ context.Context, id string, w store.W) (store.Machine, error) {
	return f.transition(id, store.StateErasing, w, func(m *store.Machine) { m.Claim = nil })
}

// Erase moves a machine to erasing.
func (f *Fake) Erase(_ context.Context, id string, w store.W) (store.Machine, error) {
	return f.transition(id, store.StateErasing, w, nil)
}

// Inspect moves a machine to inspecting.
func (f *Fake) Inspect(_ context.Context, id string, w store.W) (store.Machine, error) {
	return f.transition(id, store.StateInspecting, w, nil)
}

// EnrollBMC stores b for machine machineID; the password is kept apart.
func (f *Fake) EnrollBMC(_ context.Context, machineID string, b store.BMC, password string, w store.W) (store.BMC, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	m, ok := f.machines[machineID]
	if !ok {
		return b, fmt.Errorf("%w: machine %q", store.ErrNotFound, machineID)
	}
	f.index++
	f.meta(&b.Meta, "bmc", len(f.bmcs))
	b.CredentialRef = "bmc/" + b.ID
	f.bmcs[b.ID] = b
	f.passwords[b.CredentialRef] = password
	m.BMC = b.ID
	m.ResourceVersion = f.index
	f.machines[machineID] = m
	f.emit(store.Event{Subject: "machine/" + machineID, Kind: "bmc_enrolled", Actor: w.Actor})
	return b, nil
}

// AgentRegister records a registration and answers inspect (or provision
// when the machine is provisioning).
func (f *Fake) AgentRegister(_ context.Context, machineID string, reg agentapi.Registration) (agentapi.Task, error) {
	m, err := f.GetMachine(machineID)
	if err != nil {
		return agentapi.Task{}, err
	}
	if m.State == store.StateProvisioning {
		return agentapi.Task{Action: agentapi.ActionProvision}, nil
	}
	return agentapi.Task{Action: agentapi.ActionInspect, PollAfter: time.Second}, nil
}

// AgentTask answers wait.
func (f *Fake) AgentTask(_ context.Context, machineID string) (agentapi.Task, error) {
	if _, err := f.GetMachine(machineID); err != nil {
		return agentapi.Task{}, err
	}
	return agentapi.Task{Action: agentapi.ActionWait, PollAfter: 2 * time.Second}, nil
}

// AgentReport records the report.
func (f *Fake) AgentReport(_ context.Context, machineID string, rep agentapi.Report) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reports[machineID] = append(f.reports[machineID], rep)
	return nil
}

// VerifyAgentToken checks token against the one set with SetAgentToken.
func (f *Fake) VerifyAgentToken(machineID, token string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	want, ok := f.tokens[machineID]
	return ok && want == token
}

var _ api.Backend = (*Fake)(nil)
