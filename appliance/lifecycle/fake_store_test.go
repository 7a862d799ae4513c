package lifecycle

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"sync"

	"kiln/store"
)

// fakeStore is an in-memory Store with the real store's contract: every
// write is one "command" with a new index (the ResourceVersion), CAS on
// ResourceVersion (ErrConflict), CanTransition enforced
// (*IllegalTransitionError), creates only as registered/discovered, a MAC
// index (ErrDuplicateMAC), all-or-nothing PutMachines, and the same events
// (created / transition / updated / job / step...), a claim must name a
// stored image (store.ErrInvalid) and a claimed image cannot be deleted
// (store.ErrImageInUse). Records are deep-copied through JSON so callers
// never share memory with it.
type fakeStore struct {
	mu       sync.Mutex
	index    uint64
	leader   bool
	machines map[string]store.Machine
	bmcs     map[string]store.BMC
	images   map[string]store.Image
	jobs     map[string]store.Job
	secrets  map[string][]byte
	events   []store.Event
	// failPut, when set, fails the next n PutMachine calls with this error (tests).
	failPut  error
	failPutN int
}

var _ Store = (*fakeStore)(nil)
var _ Store = (*store.Store)(nil)

func newFakeStore() *fakeStore {
	return &fakeStore{leader: true, machines: map[string]store.Machine{}, bmcs: map[string]store.BMC{},
		images: map[string]store.Image{}, jobs: map[string]store.Job{}, secrets: map[string][]byte{}}
}

func deep[T any](v T) T {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	var out T
	if err := json.Unmarshal(b, &out); err != nil {
		panic(err)
	}
	return out
}

func (f *fakeStore) IsLeader() bool { f.mu.Lock(); defer f.mu.Unlock(); return f.leader }

func (f *fakeStore) setLeader(b bool) { f.mu.Lock(); f.leader = b; f.mu.Unlock() }

func (f *fakeStore) GetMachine(id string) (store.Machine, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	m, ok := f.machines[id]
	if !ok {
		return store.Machine{}, fmt.Errorf("%w: machine %s", store.ErrNotFound, id)
	}
	return deep(m), nil
}

func macsOf(m store.Machine) []string {
	var out []string
	for _, n := range m.Intended.NICs {
		out = append(out, strings.ToLower(n.MAC))
	}
	if m.Discovered != nil {
		for _, n := range m.Discovered.NICs {
			out = append(out, strings.ToLower(n.MAC))
		}
	}
	return out
}

func (f *fakeStore) MachineByMAC(mac string) (store.Machine, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	mac = strings.ToLower(mac)
	for _, m := range f.machines {
		for _, x := range macsOf(m) {
			if x == mac {
				return deep(m), nil
			}
		}
	}
	return store.Machine{}, fmt.Errorf("%w: mac %s", store.ErrNotFound, mac)
}

func (f *fakeStore) ListMachines(opt store.ListOptions) ([]store.Machine, string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	ids := make([]string, 0, len(f.machines))
	for id := range f.machines {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	var out []store.Machine
	for _, id := range ids {
		m := f.machines[id]
		if opt.After != "" && id <= opt.After {
			continue
		}
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
		out = append(out, deep(m))
	}
	return out, "", nil
}

func (f *fakeStore) event(ev store.Event, seq int) {
	ev.Index, ev.Seq = f.index, seq
	f.events = append(f.events, ev)
}

// putMachineLocked validates and stages m against staged (copy-on-write view).
func (f *fakeStore) putMachineLocked(staged map[string]store.Machine, m store.Machine, w store.W, seq int) (store.Machine, []store.Event, error) {
	old, exists := staged[m.ID]
	switch {
	case m.ID == "":
		m.ID = fmt.Sprintf("m-%06d-%d", f.index, seq)
		if m.State == "" {
			m.State = store.StateRegistered
		}
		if m.State != store.StateRegistered && m.State != store.StateDiscovered {
			return m, nil, &store.IllegalTransitionError{From: "", To: m.State}
		}
		exists = false
	case !exists && m.ResourceVersion != 0:
		return m, nil, fmt.Errorf("%w: machine %s", store.ErrNotFound, m.ID)
	case exists && m.ResourceVersion != old.ResourceVersion:
		return m, nil, fmt.Errorf("%w: machine %s at %d, not %d", store.ErrConflict, m.ID, old.ResourceVersion, m.ResourceVersion)
	}
	if exists {
		if m.State == "" {
			m.State = old.State
		}
		if !m.State.Valid() {
			return m, nil, fmt.Errorf("%w: state %q", store.ErrInvalid, m.State)
		}
		if m.State != old.State && !store.CanTransition(old.State, m.State) {
			return m, nil, &store.IllegalTransitionError{From: old.State, To: m.State}
		}
	}
	if m.Claim != nil && (!exists || old.Claim == nil || old.Claim.Image != m.Claim.Image) {
		if _, ok := f.images[m.Claim.Image]; !ok {
			return m, nil, fmt.Errorf("%w: machine %s: claim.image: no image %q", store.ErrInvalid, m.ID, m.Claim.Image)
		}
	}
	for _, mac := range macsOf(m) {
		for id, o := range staged {
			if id == m.ID {
				continue
			}
			for _, x := range macsOf(o) {
				if x == mac {
					return m, nil, fmt.Errorf("%w: %s is on %s", store.ErrDuplicateMAC, mac, id)
				}
			}
		}
	}
	m.ResourceVersion = f.index
	subj := "machine/" + m.ID
	var ev store.Event
	switch {
	case !exists:
		ev = store.Event{Subject: subj, Kind: "created", To: string(m.State), Reason: or(w.Reason, m.Reason), Actor: w.Actor}
	case old.State != m.State:
		ev = store.Event{Subject: subj, Kind: "transition", From: string(old.State), To: string(m.State),
			Actor: w.Actor, Reason: or(w.Reason, m.Reason), Message: or(w.Message, m.Message)}
	default:
		ev = store.Event{Subject: subj, Kind: "updated", Actor: w.Actor}
	}
	staged[m.ID] = m
	return m, []store.Event{ev}, nil
}

func or(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

func (f *fakeStore) PutMachine(ctx context.Context, m store.Machine, w store.W) (store.Machine, error) {
	out, err := f.PutMachines(ctx, []store.Machine{m}, w)
	if err != nil {
		return store.Machine{}, err
	}
	return out[0], nil
}

func (f *fakeStore) PutMachines(_ context.Context, ms []store.Machine, w store.W) ([]store.Machine, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failPutN > 0 {
		f.failPutN--
		return nil, f.failPut
	}
	f.index++
	staged := make(map[string]store.Machine, len(f.machines))
	for k, v := range f.machines {
		staged[k] = v
	}
	var evs []store.Event
	out := make([]store.Machine, len(ms))
	for i, m := range ms {
		m = deep(m)
		got, ev, err := f.putMachineLocked(staged, m, w, i)
		if err != nil {
			return nil, fmt.Errorf("machine %d (%s): %w", i, m.ID, err)
		}
		evs = append(evs, ev...)
		out[i] = deep(got)
	}
	f.machines = staged
	for i, ev := range evs {
		f.event(ev, i)
	}
	return out, nil
}

// ImportMachines is PutMachines of new machines only. The uniqueness of
// names, serials and BMC MACs across records (*store.ImportConflictError)
// is the real store's rule and is tested against it, not re-implemented.
func (f *fakeStore) ImportMachines(ctx context.Context, ms []store.Machine, w store.W) ([]store.Machine, error) {
	f.mu.Lock()
	for i, m := range ms {
		if _, ok := f.machines[m.ID]; (ok && m.ID != "") || m.ResourceVersion != 0 {
			f.mu.Unlock()
			return nil, fmt.Errorf("%w: machine %d: %s exists", store.ErrConflict, i, m.ID)
		}
	}
	f.mu.Unlock()
	return f.PutMachines(ctx, ms, w)
}

// seed writes m as-is (any state), bypassing the FSM: test setup only.
func (f *fakeStore) seed(m store.Machine) store.Machine {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.index++
	m.ResourceVersion = f.index
	f.machines[m.ID] = deep(m)
	return deep(m)
}

func (f *fakeStore) GetBMC(id string) (store.BMC, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	b, ok := f.bmcs[id]
	if !ok {
		return b, fmt.Errorf("%w: bmc %s", store.ErrNotFound, id)
	}
	return b, nil
}

func (f *fakeStore) PutBMC(_ context.Context, b store.BMC, w store.W) (store.BMC, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.index++
	if b.ID == "" {
		b.ID = fmt.Sprintf("b-%06d", f.index)
	} else if old, ok := f.bmcs[b.ID]; ok && old.ResourceVersion != b.ResourceVersion {
		return store.BMC{}, store.ErrConflict
	}
	b.ResourceVersion = f.index
	f.bmcs[b.ID] = b
	f.event(store.Event{Subject: "bmc/" + b.ID, Kind: "updated", Actor: w.Actor}, 0)
	return b, nil
}

func (f *fakeStore) PutSecret(_ context.Context, key string, sealed []byte, w store.W) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.index++
	f.secrets[key] = append([]byte(nil), sealed...)
	f.event(store.Event{Subject: "secret/" + key, Kind: "secret_updated", Actor: w.Actor}, 0)
	return nil
}

func (f *fakeStore) GetImage(id string) (store.Image, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	im, ok := f.images[id]
	if !ok {
		return im, fmt.Errorf("%w: image %s", store.ErrNotFound, id)
	}
	return im, nil
}

func (f *fakeStore) ListImages() ([]store.Image, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []store.Image
	for _, im := range f.images {
		out = append(out, im)
	}
	return out, nil
}

func (f *fakeStore) PutImage(_ context.Context, im store.Image, w store.W) (store.Image, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.index++
	if im.ID == "" {
		im.ID = fmt.Sprintf("img-%06d", f.index)
	}
	im.ResourceVersion = f.index
	f.images[im.ID] = im
	f.event(store.Event{Subject: "image/" + im.ID, Kind: "created", Actor: w.Actor}, 0)
	return im, nil
}

func (f *fakeStore) DeleteImage(_ context.Context, id string, w store.W) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.images[id]; !ok {
		return fmt.Errorf("%w: image %s", store.ErrNotFound, id)
	}
	for _, m := range f.machines {
		if m.Claim != nil && m.Claim.Image == id {
			return fmt.Errorf("%w: image %s is claimed by machine %s", store.ErrImageInUse, id, m.ID)
		}
	}
	f.index++
	delete(f.images, id)
	f.event(store.Event{Subject: "image/" + id, Kind: "deleted", Actor: w.Actor}, 0)
	return nil
}

func (f *fakeStore) PutJob(_ context.Context, j store.Job, w store.W) (store.Job, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.index++
	ev := store.Event{Kind: "job", To: j.State, Reason: or(w.Reason, j.Reason), Actor: w.Actor}
	if j.ID == "" {
		j.ID = fmt.Sprintf("j-%06d", f.index)
	} else if old, ok := f.jobs[j.ID]; !ok {
		return store.Job{}, store.ErrNotFound
	} else if old.ResourceVersion != j.ResourceVersion {
		return store.Job{}, store.ErrConflict
	} else {
		ev.From = old.State
	}
	j.ResourceVersion = f.index
	f.jobs[j.ID] = j
	ev.Subject = "job/" + j.ID
	f.event(ev, 0)
	return j, nil
}

func (f *fakeStore) AppendEvents(_ context.Context, evs []store.Event) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, e := range evs {
		if e.Subject == "" || e.Kind == "" {
			return store.ErrInvalid
		}
	}
	f.index++
	for i, e := range evs {
		f.event(e, i)
	}
	return nil
}

func (f *fakeStore) CountByState() (map[store.MachineState]int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[store.MachineState]int{}
	for _, m := range f.machines {
		out[m.State]++
	}
	return out, nil
}

func (f *fakeStore) allEvents() []store.Event {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]store.Event(nil), f.events...)
}

func (f *fakeStore) allJobs() []store.Job {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []store.Job
	for _, j := range f.jobs {
		out = append(out, j)
	}
	sort.Slice(out, func(a, b int) bool { return out[a].ID < out[b].ID })
	return out
}
