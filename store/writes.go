package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"go.etcd.io/bbolt"
)

// ---- writes (each is one raft command; ctx bounds it together with
// Config.ApplyTimeout; on a follower the command is forwarded) ----

// one returns the single record a write stored. A write applied on this
// node hands back the applied struct itself (recs[0], a *T) instead of
// decoding its JSON again: that struct was decoded from the log entry's
// JSON and apply changed only scalar fields, so it equals what GetMachine
// & co. decode from the stored JSON (TestPutReturnsStoredRecord). A
// forwarded write carries only the JSON (vals).
func one[T any](vals []json.RawMessage, recs []any, err error) (T, error) {
	var v T
	if err != nil {
		return v, err
	}
	if len(vals) != 1 {
		return v, fmt.Errorf("store: expected 1 record in result, got %d", len(vals))
	}
	if len(recs) == 1 {
		if p, ok := recs[0].(*T); ok {
			return *p, nil
		}
	}
	return v, json.Unmarshal(vals[0], &v)
}

// PutSite creates (ResourceVersion 0; empty ID → leader assigns
// "site-<16 hex>") or updates a Site; CAS on ResourceVersion≠0. A create
// never replaces a record: a chosen ID the store holds is ErrConflict,
// decided inside the raft apply (command 22, put_site_v2), so of two
// creates of one ID one wins and the other is refused. Returns the stored
// record. Errors: ErrConflict (stale ResourceVersion, or a create of a
// taken ID: update it with its current resource_version), ErrNotFound
// (RV≠0 on a missing ID), ErrNotLeader.
func (s *Store) PutSite(ctx context.Context, v Site, w W) (Site, error) {
	return one[Site](s.write(ctx, &command{Type: CmdPutSiteV2, W: w, Site: &v}))
}

// PutRack is PutSite for racks (IDs "rack-<hex>"; command 23, put_rack_v2).
func (s *Store) PutRack(ctx context.Context, v Rack, w W) (Rack, error) {
	return one[Rack](s.write(ctx, &command{Type: CmdPutRackV2, W: w, Rack: &v}))
}

// PutMachine creates a machine (ID empty → leader assigns "m-<16 hex>"; or
// ID given and absent, ResourceVersion 0) or updates one (CAS when
// ResourceVersion≠0; empty State keeps the current one). A create may use
// State registered (default) or discovered; a state change must satisfy
// CanTransition, else *IllegalTransitionError, and emits a "transition"
// event carrying w. NIC MACs are stored lower-case; a MAC held by another
// machine gives ErrDuplicateMAC. A claim the write adds, or whose image it
// changes, must name a stored image at the moment the write applies
// (ErrInvalid otherwise), so a claim never names a deleted image (see
// DeleteImage).
//
// Issue 14: the write is command 25 (put_machines_v3: the states
// remediating and rma, and the maintenance, health, remediation and drain
// fields) when m uses any of them (Machine.UsesV3), and is then refused
// with *UnsupportedByClusterError while a node of the cluster predates it;
// otherwise it is command 14, which the leader writes as 25 once every
// node understands 25 (upgradeCommand), so a write that clears those
// fields clears them.
func (s *Store) PutMachine(ctx context.Context, m Machine, w W) (Machine, error) {
	return one[Machine](s.write(ctx, &command{Type: machinesCmd(m), W: w, Machines: []Machine{m}}))
}

// machinesCmd is the command for a write of ms: put_machines_v4 when any
// uses a round-3 field, else put_machines_v3 when any uses an issue-14
// one, else put_machines_v2 (upgradeCommand writes the newest every node
// understands).
func machinesCmd(ms ...Machine) CommandType {
	t := CmdPutMachinesV2
	for i := range ms {
		if ms[i].UsesV4() {
			return CmdPutMachinesV4
		}
		if ms[i].UsesV3() {
			t = CmdPutMachinesV3
		}
	}
	return t
}

// PutMachines applies PutMachine to every element in ONE raft command,
// all-or-nothing: the first refused element fails the whole call (its
// index and ID are in the error). Returns the stored records in order.
func (s *Store) PutMachines(ctx context.Context, ms []Machine, w W) ([]Machine, error) {
	if len(ms) == 0 {
		return nil, nil
	}
	return machinesOut(s.write(ctx, &command{Type: machinesCmd(ms...), W: w, Machines: ms}))
}

// ImportMachines creates every machine of ms in ONE raft command,
// all-or-nothing: each must be new (ResourceVersion 0; empty ID → leader
// assigns one; an existing ID is ErrConflict) and may not take a name, an
// intended serial (case-insensitive), a BMC MAC or a NIC MAC that a stored
// machine or an earlier element of ms holds (NIC and BMC MACs are one
// space). The check runs inside the raft apply, so two concurrent imports
// cannot both take a value. Errors: *ImportConflictError (wraps
// ErrConflict; every conflict, by position in ms), ErrConflict, ErrInvalid
// (a malformed MAC), *IllegalTransitionError (State other than registered
// or discovered). Returns the stored records in order.
func (s *Store) ImportMachines(ctx context.Context, ms []Machine, w W) ([]Machine, error) {
	if len(ms) == 0 {
		return nil, nil
	}
	return machinesOut(s.write(ctx, &command{Type: CmdImportMachines, W: w, Machines: ms}))
}

// machinesOut is the []Machine of a machines write (see one).
func machinesOut(vals []json.RawMessage, recs []any, err error) ([]Machine, error) {
	if err != nil {
		return nil, err
	}
	out := make([]Machine, len(vals))
	for i, v := range vals {
		if len(recs) == len(vals) {
			if p, ok := recs[i].(*Machine); ok {
				out[i] = *p // see one
				continue
			}
		}
		if err := json.Unmarshal(v, &out[i]); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// ReportAgent records one agent report in ONE raft command (command 17,
// agent_report), all-or-nothing: the report's events evs and a
// compare-and-set write of machine m are stored together or not at all — a
// refused write stores no event. m must name a stored machine by ID and its
// current ResourceVersion (a report never creates a machine: an empty ID or
// ResourceVersion 0 is ErrInvalid); the write has PutMachine's rules (empty
// State keeps the current one, a state change must pass CanTransition,
// MACs, claims). The events come first, then the machine's own event
// ("updated", or "transition" carrying w), all with the write's index (=
// the returned machine's ResourceVersion, so one feed cursor covers the
// whole report) and the leader's time; an event's empty Actor, Reason or
// Message take w's. Every event needs Subject and Kind (ErrInvalid); evs
// may be empty. Returns the stored machine. Errors: ErrConflict (stale
// ResourceVersion: re-read the machine and build the report again),
// ErrNotFound (machine deleted), *IllegalTransitionError, ErrDuplicateMAC,
// ErrInvalid, ErrNotLeader, ErrTimeout.
//
// Round 3: the report is command 31 (agent_report_v2, put_machines_v4's
// rules) when m holds a round-3 field (Machine.UsesV4), refused with
// *UnsupportedByClusterError while a node predates it; otherwise command
// 17, which the leader writes as 31 once every node understands it.
func (s *Store) ReportAgent(ctx context.Context, m Machine, evs []Event, w W) (Machine, error) {
	t := CmdAgentReport
	if m.UsesV4() {
		t = CmdAgentReportV2
	}
	return one[Machine](s.write(ctx, &command{Type: t, W: w, Machines: []Machine{m}, Events: evs}))
}

// PutRepairBrake writes the remediation brake record (command 26,
// put_remediation) with compare-and-set on b.ResourceVersion (0: create);
// the ID is always BrakeID. An Engaged change appends "brake_engaged" or
// "brake_released" (subject remediation/brake) with w. Errors:
// ErrConflict, ErrNotFound, *UnsupportedByClusterError (a node predates
// command 26), ErrNotLeader.
func (s *Store) PutRepairBrake(ctx context.Context, b RepairBrake, w W) (RepairBrake, error) {
	return one[RepairBrake](s.write(ctx, &command{Type: CmdPutRemediation, W: w, Brake: &b}))
}

// DeleteMachine removes machine id and its index entries (ErrNotFound if
// absent) and emits a "deleted" event.
func (s *Store) DeleteMachine(ctx context.Context, id string, w W) error {
	_, _, err := s.write(ctx, &command{Type: CmdDeleteMachine, W: w, ID: id})
	return err
}

// PutBMC is PutSite for BMC records (IDs "bmc-<hex>").
func (s *Store) PutBMC(ctx context.Context, v BMC, w W) (BMC, error) {
	return one[BMC](s.write(ctx, &command{Type: CmdPutBMC, W: w, BMC: &v}))
}

// PutSecret stores an already-sealed (encrypted) value under key. The
// value never appears in events or logs.
func (s *Store) PutSecret(ctx context.Context, key string, sealed []byte, w W) error {
	_, _, err := s.write(ctx, &command{Type: CmdPutSecret, W: w, Key: key, Sealed: sealed})
	return err
}

// PutImage is PutSite for catalog images (IDs "img-<hex>"). An image with
// a release manifest (Layers or KubeadmVersion, issue 15) is written as
// put_image_v2 (32) and refused with *UnsupportedByClusterError while a
// node of the cluster predates it; any other as put_image (7), which the
// leader writes as 32 once every node understands it (upgradeCommand), so
// an update keeps exactly the manifest it carries.
func (s *Store) PutImage(ctx context.Context, v Image, w W) (Image, error) {
	t := CmdPutImage
	if v.IsRelease() || v.KubeadmVersion != "" {
		t = CmdPutImageV2
	}
	return one[Image](s.write(ctx, &command{Type: t, W: w, Image: &v}))
}

// DeleteImage removes image id: ErrNotFound if absent, ErrImageInUse
// (naming a machine) while any machine's claim names it, in whatever state
// (Release drops a claim). Checked inside the raft apply: a delete and a
// claim of the same image racing each other never both succeed.
//
// It writes CmdDeleteImageV3, which also leaves a tombstone (ImageTombstones)
// so every node removes the file; while some node of the cluster does not
// understand it yet (ErrUnsupportedByCluster) it writes CmdDeleteImageV2,
// which leaves none (the other nodes then keep their copies of the file).
func (s *Store) DeleteImage(ctx context.Context, id string, w W) error {
	_, _, err := s.write(ctx, &command{Type: CmdDeleteImageV3, W: w, ID: id})
	if errors.Is(err, ErrUnsupportedByCluster) {
		s.log.Warn("image deleted without a tombstone: a node of the cluster is older; other nodes keep the file", "image", id, "err", err)
		_, _, err = s.write(ctx, &command{Type: CmdDeleteImageV2, W: w, ID: id})
	}
	return err
}

// ImageTombstones lists the tombstones of deleted images (CmdDeleteImageV3)
// from the local replica, in image ID order.
func (s *Store) ImageTombstones() ([]ImageTombstone, error) {
	var out []ImageTombstone
	err := s.fsm.view(func(tx *bbolt.Tx) error {
		return tx.Bucket(bImageTombstones).ForEach(func(_, v []byte) error {
			var t ImageTombstone
			if err := json.Unmarshal(v, &t); err != nil {
				return fmt.Errorf("%w: image tombstone: %v", ErrCorrupt, err)
			}
			out = append(out, t)
			return nil
		})
	})
	return out, err
}

// PutJob is PutSite for jobs (IDs "job-<hex>"); its event has kind "job"
// and From/To = old/new Job.State.
func (s *Store) PutJob(ctx context.Context, v Job, w W) (Job, error) {
	return one[Job](s.write(ctx, &command{Type: CmdPutJob, W: w, Job: &v}))
}

// PutLeases upserts DHCP leases keyed by MAC in ONE raft command
// (CmdPutLeases, 10), checking nothing: the command of logs written before
// BindLeases, which Kiln writes instead (it refuses a second holder). Kept
// so tests can make such a log; its records also enter the address view
// (AddressLeases), where a stale one never replaces a live binding.
// Expiry is taken as given. A "lease" event is appended only when a lease
// is new or changes IP or State.
func (s *Store) PutLeases(ctx context.Context, ls []Lease) error {
	if len(ls) == 0 {
		return nil
	}
	_, _, err := s.write(ctx, &command{Type: CmdPutLeases, W: W{Actor: "dhcp"}, Leases: ls})
	return err
}

// TrimEvents writes CmdTrimEvents (command 24, trim_events): every replica
// deletes the events with Index < before and serves no cursor below
// before-1 from then on (Events: *CursorExpiredError). before comes from
// EventTrimPoint on the leader; 0 is a no-op. Errors: ErrNotLeader,
// ErrTimeout, ErrUnsupportedByCluster (a node predates command 24: upgrade it).
func (s *Store) TrimEvents(ctx context.Context, before uint64, w W) error {
	if before == 0 {
		return nil
	}
	_, _, err := s.write(ctx, &command{Type: CmdTrimEvents, W: w, Before: before})
	return err
}

// AppendEvents appends caller-made events (step reports, job progress) in
// one command. Index, Seq and Time are fixed by the store (leader time).
// Each event needs Subject and Kind (ErrInvalid).
func (s *Store) AppendEvents(ctx context.Context, evs []Event) error {
	if len(evs) == 0 {
		return nil
	}
	_, _, err := s.write(ctx, &command{Type: CmdAppendEvents, Events: evs})
	return err
}
