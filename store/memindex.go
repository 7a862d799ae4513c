package store

import (
	"encoding/json"
	"fmt"
	"sort"
	"sync"

	"go.etcd.io/bbolt"
)

// machineIndex holds the derived machine indexes in memory: MAC → machine
// ID, state → machine IDs, and name / serial / BMC MAC / claimed image →
// machine IDs (the values import and image deletion check, see refKey).
// They are not stored in fsm.db (writing them there cost two random bbolt
// pages per machine write, about half of the FSM's time): fsm.db is rebuilt from snapshot + log on every start anyway,
// and the index is rebuilt from the machines bucket whenever fsm.db is
// replaced (Restore), so it is always a pure function of the records.
//
// Consistency with bbolt: the FSM commits a write transaction and merges
// that transaction's index changes while holding mu; readers begin their
// bbolt read transaction and read the index under mu.RLock, so the index a
// reader sees always belongs to the same commit as its bbolt snapshot.
type machineIndex struct {
	mu    sync.RWMutex
	mac   map[string]string                    // normalized MAC → machine ID
	state map[MachineState]map[string]struct{} // state → set of machine IDs
	ref   map[refKey]refSet                    // name, serial, BMC MAC, claimed image → machine IDs (refindex.go)
	// ver: machine ID → ResourceVersion of its committed record, so a
	// reader can tell a decoded copy it keeps is still current without
	// reading the record (MachineRefByMAC).
	ver map[string]uint64
}

func newMachineIndex() *machineIndex {
	return &machineIndex{mac: map[string]string{}, state: map[MachineState]map[string]struct{}{},
		ref: map[refKey]refSet{}, ver: map[string]uint64{}}
}

// buildMachineIndex derives the index from the machines bucket of tx.
// Errors wrap ErrCorrupt (an undecodable record).
func buildMachineIndex(tx *bbolt.Tx) (*machineIndex, error) {
	ix := newMachineIndex()
	b := tx.Bucket(bMachines)
	if b == nil {
		return ix, nil
	}
	err := b.ForEach(func(k, v []byte) error {
		var m Machine
		if err := json.Unmarshal(v, &m); err != nil {
			return fmt.Errorf("%w: stored machine %s: %v", ErrCorrupt, k, err)
		}
		macs, err := machineMACs(&m)
		if err != nil {
			return fmt.Errorf("%w: stored machine %s: %v", ErrCorrupt, k, err)
		}
		id := string(k)
		for _, mac := range macs {
			ix.mac[mac] = id
		}
		ix.addState(m.State, id)
		ix.ver[id] = m.ResourceVersion
		refs := machineRefs(&m)
		for _, r := range refs.keys() {
			ix.addRef(r, id)
		}
		return nil
	})
	return ix, err
}

func (ix *machineIndex) addState(s MachineState, id string) {
	set := ix.state[s]
	if set == nil {
		set = map[string]struct{}{}
		ix.state[s] = set
	}
	set[id] = struct{}{}
}

func (ix *machineIndex) delState(s MachineState, id string) {
	if set := ix.state[s]; set != nil {
		delete(set, id)
		if len(set) == 0 {
			delete(ix.state, s)
		}
	}
}

// idsInState returns the IDs of machines in state s, sorted. Caller holds mu.
func (ix *machineIndex) idsInState(s MachineState) []string {
	ids := make([]string, 0, len(ix.state[s]))
	for id := range ix.state[s] {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids
}

// idxTx is one write transaction's pending index changes over the
// committed index. Only the FSM goroutine uses it; the committed maps it
// reads change only on that goroutine (commit) or under the FSM's
// exclusive lock (Restore). Discarded when the bbolt tx rolls back.
type idxTx struct {
	base  *machineIndex
	mac   map[string]string    // MAC → owner ID, "" = removed in this tx
	moves map[string]stateMove // machine ID → state before this tx / now
	ref   map[refKey]refDelta  // key → holders added or removed in this tx (refindex.go)
	// leases: address records written in this tx, in order, for the
	// lease watchers (leases.go); published once the tx commits.
	leases []Lease
}

// stateMove: a machine's state before the transaction ("" = absent) and at
// its current point ("" = deleted), and the ResourceVersion it now has.
type stateMove struct {
	from, to MachineState
	ver      uint64
}

func newIdxTx(base *machineIndex) *idxTx {
	return &idxTx{base: base, mac: map[string]string{}, moves: map[string]stateMove{}, ref: map[refKey]refDelta{}}
}

// owner returns the ID of the machine owning mac, or "".
func (x *idxTx) owner(mac string) string {
	if id, ok := x.mac[mac]; ok {
		return id
	}
	return x.base.mac[mac]
}

func (x *idxTx) setOwner(mac, id string) { x.mac[mac] = id }

// move records that machine id went from state from to state to ("" =
// absent) and now has ResourceVersion ver (0 when deleted); only the first
// from of the transaction is kept. Every write and delete of a machine
// record calls it.
func (x *idxTx) move(id string, from, to MachineState, ver uint64) {
	mv, ok := x.moves[id]
	if !ok {
		mv.from = from
	}
	mv.to, mv.ver = to, ver
	x.moves[id] = mv
}

// commit merges the changes into the committed index. The caller holds
// base.mu (write) and has just committed the bbolt transaction.
func (x *idxTx) commit() {
	for mac, id := range x.mac {
		if id == "" {
			delete(x.base.mac, mac)
		} else {
			x.base.mac[mac] = id
		}
	}
	for id, mv := range x.moves {
		if mv.from != "" {
			x.base.delState(mv.from, id)
		}
		if mv.to != "" {
			x.base.addState(mv.to, id)
			x.base.ver[id] = mv.ver
		} else {
			delete(x.base.ver, id)
		}
	}
	x.commitRefs()
}
