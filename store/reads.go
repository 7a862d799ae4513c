package store

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"sort"
	"time"

	"go.etcd.io/bbolt"
)

// ---- reads (local replica; call Barrier first for a current read) ----

func getRec[T any](f *fsm, bucket []byte, kind, id string) (T, error) {
	var v T
	err := f.view(func(tx *bbolt.Tx) error {
		raw := tx.Bucket(bucket).Get([]byte(id))
		if raw == nil {
			return fmt.Errorf("%w: %s %s", ErrNotFound, kind, id)
		}
		return json.Unmarshal(raw, &v)
	})
	return v, err
}

func listRec[T any](f *fsm, bucket []byte) ([]T, error) {
	var out []T
	err := f.view(func(tx *bbolt.Tx) error {
		return tx.Bucket(bucket).ForEach(func(_, raw []byte) error {
			var v T
			if err := json.Unmarshal(raw, &v); err != nil {
				return err
			}
			out = append(out, v)
			return nil
		})
	})
	return out, err
}

// GetSite returns site id or ErrNotFound.
func (s *Store) GetSite(id string) (Site, error) { return getRec[Site](s.fsm, bSites, "site", id) }

// ListSites returns every site ordered by ID.
func (s *Store) ListSites() ([]Site, error) { return listRec[Site](s.fsm, bSites) }

// GetRack returns rack id or ErrNotFound.
func (s *Store) GetRack(id string) (Rack, error) { return getRec[Rack](s.fsm, bRacks, "rack", id) }

// ListRacks returns every rack ordered by ID.
func (s *Store) ListRacks() ([]Rack, error) { return listRec[Rack](s.fsm, bRacks) }

// GetMachine returns machine id or ErrNotFound.
func (s *Store) GetMachine(id string) (Machine, error) {
	return getRec[Machine](s.fsm, bMachines, "machine", id)
}

// MachineByMAC returns the machine owning mac (any accepted MAC form; index
// over Intended.NICs and Discovered.NICs), ErrInvalid for a malformed MAC,
// or ErrNotFound.
func (s *Store) MachineByMAC(mac string) (Machine, error) {
	norm, err := NormalizeMAC(mac)
	if err != nil {
		return Machine{}, err
	}
	var m Machine
	var id string
	err = s.fsm.viewIndexed(func(ix *machineIndex) { id = ix.mac[norm] }, func(tx *bbolt.Tx) error {
		if id == "" {
			return fmt.Errorf("%w: machine with MAC %s", ErrNotFound, norm)
		}
		raw := tx.Bucket(bMachines).Get([]byte(id))
		if raw == nil {
			return fmt.Errorf("%w: index names missing machine %s", ErrCorrupt, id)
		}
		return json.Unmarshal(raw, &m)
	})
	return m, err
}

// MachineRefByMAC returns the ID and ResourceVersion of the machine owning
// mac (any accepted MAC form) from the in-memory index alone: no bbolt read,
// no decoding, so it costs a map lookup. A caller that keeps a record it got
// from MachineByMAC (the DHCP server's per-request lookup) may reuse it while
// MachineRefByMAC still returns the record's ID and ResourceVersion: every
// write of a machine changes its ResourceVersion (to the raft index of the
// write). Errors: ErrInvalid for a malformed MAC, ErrNotFound.
func (s *Store) MachineRefByMAC(mac string) (id string, version uint64, err error) {
	norm, err := NormalizeMAC(mac)
	if err != nil {
		return "", 0, err
	}
	s.fsm.mu.RLock()
	defer s.fsm.mu.RUnlock()
	if s.fsm.db == nil {
		return "", 0, ErrClosed
	}
	ix := s.fsm.ix
	ix.mu.RLock()
	id, version = ix.mac[norm], ix.ver[ix.mac[norm]]
	ix.mu.RUnlock()
	if id == "" {
		return "", 0, fmt.Errorf("%w: machine with MAC %s", ErrNotFound, norm)
	}
	return id, version, nil
}

// ListOptions filters ListMachines. Zero fields do not filter. After is a
// cursor (the last ID of the previous page); Limit ≤ 0 means no limit.
type ListOptions struct {
	State  MachineState
	Rack   string
	Labels map[string]string
	After  string
	Limit  int
}

// ListMachines returns machines ordered by ID that match opt, at most
// opt.Limit, and next = the last returned ID when more matches exist ("" at
// the end). A State filter walks the in-memory state index (state→IDs),
// so it costs O(machines in that state).
func (s *Store) ListMachines(opt ListOptions) (items []Machine, next string, err error) {
	match := func(m *Machine) bool {
		if opt.Rack != "" && m.Rack != opt.Rack {
			return false
		}
		for k, v := range opt.Labels {
			if m.Labels[k] != v {
				return false
			}
		}
		return true
	}
	var stateIDs []string
	pick := func(ix *machineIndex) {
		if opt.State != "" {
			stateIDs = ix.idsInState(opt.State)
		}
	}
	err = s.fsm.viewIndexed(pick, func(tx *bbolt.Tx) error {
		machines := tx.Bucket(bMachines)
		// visit returns false to stop.
		visit := func(id, raw []byte) (bool, error) {
			var m Machine
			if err := json.Unmarshal(raw, &m); err != nil {
				return false, fmt.Errorf("%w: machine %s: %v", ErrCorrupt, id, err)
			}
			if !match(&m) {
				return true, nil
			}
			if opt.Limit > 0 && len(items) == opt.Limit {
				next = items[len(items)-1].ID
				return false, nil
			}
			items = append(items, m)
			return true, nil
		}
		if opt.State != "" {
			// stateIDs is sorted; start after the cursor.
			i := sort.SearchStrings(stateIDs, opt.After)
			if opt.After == "" {
				i = 0
			}
			for ; i < len(stateIDs); i++ {
				id := stateIDs[i]
				if opt.After != "" && id <= opt.After {
					continue
				}
				raw := machines.Get([]byte(id))
				if raw == nil {
					return fmt.Errorf("%w: state index names missing machine %s", ErrCorrupt, id)
				}
				if cont, err := visit([]byte(id), raw); err != nil || !cont {
					return err
				}
			}
			return nil
		}
		c := machines.Cursor()
		k, raw := c.First()
		if opt.After != "" {
			k, raw = c.Seek([]byte(opt.After))
			if k != nil && string(k) == opt.After {
				k, raw = c.Next()
			}
		}
		for ; k != nil; k, raw = c.Next() {
			if cont, err := visit(k, raw); err != nil || !cont {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, "", err
	}
	return items, next, nil
}

// CountByState returns the number of machines in each state (states with
// no machines are absent). Reads the in-memory state index only.
func (s *Store) CountByState() (map[MachineState]int, error) {
	out := map[MachineState]int{}
	err := s.fsm.viewIndexed(func(ix *machineIndex) {
		for st, ids := range ix.state {
			out[st] = len(ids)
		}
	}, func(*bbolt.Tx) error { return nil })
	return out, err
}

// GetBMC returns BMC id or ErrNotFound.
func (s *Store) GetBMC(id string) (BMC, error) { return getRec[BMC](s.fsm, bBMCs, "bmc", id) }

// Secret returns the sealed value stored under key, or ErrNotFound.
func (s *Store) Secret(key string) ([]byte, error) {
	var out []byte
	err := s.fsm.view(func(tx *bbolt.Tx) error {
		v := tx.Bucket(bSecrets).Get([]byte(key))
		if v == nil {
			return fmt.Errorf("%w: secret %s", ErrNotFound, key)
		}
		out = append([]byte{}, v...)
		return nil
	})
	return out, err
}

// GetImage returns image id or ErrNotFound.
func (s *Store) GetImage(id string) (Image, error) { return getRec[Image](s.fsm, bImages, "image", id) }

// ListImages returns every image ordered by ID.
func (s *Store) ListImages() ([]Image, error) { return listRec[Image](s.fsm, bImages) }

// GetRepairBrake returns the remediation brake record, or ErrNotFound
// when none was ever written (the brake is then released).
func (s *Store) GetRepairBrake() (RepairBrake, error) {
	return getRec[RepairBrake](s.fsm, bRemediation, "remediation", BrakeID)
}

// GetCampaign returns campaign id or ErrNotFound.
func (s *Store) GetCampaign(id string) (Campaign, error) {
	return getRec[Campaign](s.fsm, bCampaigns, "campaign", id)
}

// ListCampaigns returns every campaign ordered by ID.
func (s *Store) ListCampaigns() ([]Campaign, error) { return listRec[Campaign](s.fsm, bCampaigns) }

// GetJob returns job id or ErrNotFound.
func (s *Store) GetJob(id string) (Job, error) { return getRec[Job](s.fsm, bJobs, "job", id) }

// ListJobs returns the jobs of machine (all jobs when machine is ""),
// ordered by job ID.
func (s *Store) ListJobs(machine string) ([]Job, error) {
	if machine == "" {
		return listRec[Job](s.fsm, bJobs)
	}
	var out []Job
	err := s.fsm.view(func(tx *bbolt.Tx) error {
		prefix := []byte(machine + "\x00")
		jobs := tx.Bucket(bJobs)
		c := tx.Bucket(bIdxJob).Cursor()
		for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Next() {
			raw := jobs.Get(k[len(prefix):])
			if raw == nil {
				continue
			}
			var j Job
			if err := json.Unmarshal(raw, &j); err != nil {
				return err
			}
			out = append(out, j)
		}
		return nil
	})
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, err
}

// Lease returns the lease of mac (any accepted MAC form) or ErrNotFound.
func (s *Store) Lease(mac string) (Lease, error) {
	norm, err := NormalizeMAC(mac)
	if err != nil {
		return Lease{}, err
	}
	return getRec[Lease](s.fsm, bLeases, "lease", norm)
}

// Leases returns every lease ordered by MAC.
func (s *Store) Leases() ([]Lease, error) { return listRec[Lease](s.fsm, bLeases) }

// DefaultEventLimit is the page size of Events when limit ≤ 0.
const DefaultEventLimit = 1000

// Events returns up to limit events with Index > after, in (Index, Seq)
// order. The last returned event's Index is the next cursor. A page never
// splits one command's events: when limit is reached inside a raft index,
// the rest of that index's events are included too (so a page may exceed
// limit by the events of one command). A cursor older than the retained
// log (after+1 below the events floor a CmdTrimEvents set) is
// *CursorExpiredError (ErrCursorExpired), naming the oldest cursor served.
func (s *Store) Events(after uint64, limit int) ([]Event, error) {
	if limit <= 0 {
		limit = DefaultEventLimit
	}
	if after == math.MaxUint64 {
		return nil, nil // no index follows the last possible one (after+1 would wrap to 0)
	}
	var out []Event
	err := s.fsm.view(func(tx *bbolt.Tx) error {
		if floor := eventsFloor(tx); after+1 < floor {
			return &CursorExpiredError{After: after, Oldest: floor - 1}
		}
		c := tx.Bucket(bEvents).Cursor()
		var seek [8]byte
		binary.BigEndian.PutUint64(seek[:], after+1)
		for k, v := c.Seek(seek[:]); k != nil; k, v = c.Next() {
			if len(out) >= limit && binary.BigEndian.Uint64(k) != out[len(out)-1].Index {
				break
			}
			var ev Event
			if err := json.Unmarshal(v, &ev); err != nil {
				return fmt.Errorf("%w: event %x: %v", ErrCorrupt, k, err)
			}
			out = append(out, ev)
		}
		return nil
	})
	return out, err
}

// LastEventIndex returns the raft index of the newest event on this
// replica (0 when there is none).
func (s *Store) LastEventIndex() uint64 { return s.fsm.lastEvent.Load() }

// WaitEvents blocks until this replica holds an event with Index > after,
// or ctx ends (ctx.Err()), or the store closes (ErrClosed). It waits on a
// channel the FSM closes when it appends events; it does not poll.
func (s *Store) WaitEvents(ctx context.Context, after uint64) error {
	for {
		ch, _ := s.fsm.waitChans()
		if s.fsm.lastEvent.Load() > after {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		case <-s.done:
			return ErrClosed
		}
	}
}

// OldestEventCursor returns the oldest cursor Events serves completely on
// this replica: the events floor minus one (0 when never trimmed).
func (s *Store) OldestEventCursor() (uint64, error) {
	var floor uint64
	err := s.fsm.view(func(tx *bbolt.Tx) error { floor = eventsFloor(tx); return nil })
	if floor > 0 {
		floor--
	}
	return floor, err
}

// EventTrimPoint computes, from this replica's events, the Before of a
// CmdTrimEvents that applies the retention policy at time now: keep at
// most maxCount events (≤ 0: no count bound) and none older than maxAge
// (≤ 0: no age bound). The point never splits one command's events (it
// keeps all events of the index where the count bound falls, so up to one
// command's events more than maxCount stay). It returns 0 when nothing
// needs trimming (the point is at or below the current floor).
func (s *Store) EventTrimPoint(now time.Time, maxAge time.Duration, maxCount int) (uint64, error) {
	var before uint64
	err := s.fsm.view(func(tx *bbolt.Tx) error {
		b := tx.Bucket(bEvents)
		floor := eventsFloor(tx)
		c := b.Cursor()
		if maxCount > 0 {
			n := 0
			for k, _ := c.Last(); k != nil; k, _ = c.Prev() {
				if n++; n == maxCount {
					idx := binary.BigEndian.Uint64(k)
					if first, _ := c.First(); first != nil && binary.BigEndian.Uint64(first) < idx {
						before = max(before, idx) // older indexes exist: keep from this one
					}
					break
				}
			}
		}
		if maxAge > 0 {
			cutoff := now.Add(-maxAge)
			for k, v := c.First(); k != nil; k, v = c.Next() {
				var ev struct {
					Time time.Time `json:"time"`
				}
				if err := json.Unmarshal(v, &ev); err != nil {
					return fmt.Errorf("%w: event %x: %v", ErrCorrupt, k, err)
				}
				if !ev.Time.Before(cutoff) {
					break
				}
				before = max(before, binary.BigEndian.Uint64(k)+1)
			}
		}
		if before <= floor {
			before = 0
		}
		return nil
	})
	return before, err
}

// GetAttestState returns approved-state record id or ErrNotFound (issue 16).
func (s *Store) GetAttestState(id string) (AttestState, error) {
	return getRec[AttestState](s.fsm, bAttestStates, "attest_state", id)
}

// ListAttestStates returns every measured-boot state record ordered by ID.
func (s *Store) ListAttestStates() ([]AttestState, error) {
	return listRec[AttestState](s.fsm, bAttestStates)
}
