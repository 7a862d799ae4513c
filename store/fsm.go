package store

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
	"go.etcd.io/bbolt"
)

// boltTimeout bounds the wait for bbolt's file lock (another process holding
// the file gives an error instead of a hang).
const boltTimeout = 2 * time.Second

// fsm is the raft.FSM (and raft.BatchingFSM) over fsm.db. Its state is a
// cache of the raft snapshot + log: it is rebuilt on every start (see
// DESIGN.md), so writes skip fsync (bbolt NoSync).
type fsm struct {
	path string
	log  *slog.Logger

	mu sync.RWMutex // guards db (swapped by Restore)
	db *bbolt.DB
	ix *machineIndex // derived from db's machines; see machineIndex

	lastEvent atomic.Uint64
	applied   atomic.Uint64
	// versionsGen counts applied node registrations and removals (and
	// restores): the leader's version gate recomputes when it moves.
	versionsGen atomic.Uint64

	nmu      sync.Mutex
	eventsCh chan struct{} // closed and replaced when events are appended
	applyCh  chan struct{} // closed and replaced when applied advances

	onApplyError func(code string)

	// halt is set at the first entry whose command type this binary does
	// not know: from then on nothing is applied (see ApplyBatch).
	halt   atomic.Pointer[HaltError]
	onHalt func(*HaltError)
	// knownMax, when non-zero, makes types above it unknown (test hook:
	// play an older binary, Store.PlayMaxKnown).
	knownMax atomic.Uint32

	leases leaseFeed // watchers of the address view (leases.go)

	pmu sync.Mutex
	pre map[*byte]predecoded // see predecode
}

// checkBolt opens path read-only and verifies it: the file is at least as
// large as its meta page says and every page is reachable (tx.Check).
// Errors wrap ErrCorrupt and name the file.
func checkBolt(path string) error {
	st, err := os.Stat(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if st.Size() == 0 {
		return fmt.Errorf("%w: %s is empty (truncated)", ErrCorrupt, path)
	}
	if err := verifyBoltFile(path); err != nil {
		return fmt.Errorf("%w: %s: %v", ErrCorrupt, path, err)
	}
	db, err := openReadOnly(path)
	if err != nil {
		return fmt.Errorf("%w: %s: %v", ErrCorrupt, path, err)
	}
	defer db.Close()
	return db.View(func(tx *bbolt.Tx) (err error) {
		defer func() {
			if r := recover(); r != nil {
				err = fmt.Errorf("%w: %s: %v", ErrCorrupt, path, r)
			}
		}()
		if tx.Size() > st.Size() {
			return fmt.Errorf("%w: %s is truncated: %d bytes, pages need %d", ErrCorrupt, path, st.Size(), tx.Size())
		}
		for cerr := range tx.Check() {
			return fmt.Errorf("%w: %s: %v", ErrCorrupt, path, cerr)
		}
		return nil
	})
}

// openReadOnly opens a bbolt file read-only, turning a panic of bbolt's
// page checks into an error. (The freelist must be synced, i.e. never
// NoFreelistSync: rebuilding it walks pages in a goroutine that cannot be
// recovered.)
func openReadOnly(path string) (db *bbolt.DB, err error) {
	defer func() {
		if r := recover(); r != nil {
			db, err = nil, fmt.Errorf("%v", r)
		}
	}()
	return bbolt.Open(path, 0o600, &bbolt.Options{Timeout: boltTimeout, ReadOnly: true})
}

// openFSM validates an existing fsm.db (a corrupt file is a start-up error
// naming it), then starts from an empty file: raft restores the latest
// snapshot and replays the log into it.
func openFSM(path string, log *slog.Logger) (*fsm, error) {
	if err := checkBolt(path); err != nil {
		return nil, err
	}
	return newFSM(path, log)
}

// newFSM is openFSM for a path already validated (Open checks the whole
// data directory first, readDataDir).
func newFSM(path string, log *slog.Logger) (*fsm, error) {
	for _, p := range []string{path, path + ".restore"} { // .restore: left by a crash mid-Restore
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
	}
	f := &fsm{path: path, log: log, ix: newMachineIndex(), eventsCh: make(chan struct{}), applyCh: make(chan struct{})}
	db, err := openFSMFile(path)
	if err != nil {
		return nil, err
	}
	f.db = db
	return f, nil
}

func openFSMFile(path string) (*bbolt.DB, error) {
	db, err := bbolt.Open(path, 0o600, &bbolt.Options{Timeout: boltTimeout, NoSync: true, NoGrowSync: true})
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrCorrupt, path, err)
	}
	if err := db.Update(initBuckets); err != nil {
		db.Close()
		return nil, fmt.Errorf("%s: init buckets: %w", path, err)
	}
	return db, nil
}

func (f *fsm) close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.db == nil {
		return nil
	}
	err := f.db.Close()
	f.db = nil
	return err
}

// view runs fn in a read transaction of the current fsm.db.
func (f *fsm) view(fn func(tx *bbolt.Tx) error) error {
	f.mu.RLock()
	defer f.mu.RUnlock()
	if f.db == nil {
		return ErrClosed
	}
	return f.db.View(fn)
}

// viewIndexed runs fn in a read transaction of the current fsm.db. pick
// is called first with the in-memory machine index, which then belongs to
// the same commit as the transaction; pick must copy what it needs (the
// index is not locked while fn runs).
func (f *fsm) viewIndexed(pick func(ix *machineIndex), fn func(tx *bbolt.Tx) error) error {
	f.mu.RLock()
	defer f.mu.RUnlock()
	if f.db == nil {
		return ErrClosed
	}
	f.ix.mu.RLock()
	tx, err := f.db.Begin(false)
	if err != nil {
		f.ix.mu.RUnlock()
		return err
	}
	pick(f.ix)
	f.ix.mu.RUnlock()
	defer func() { _ = tx.Rollback() }()
	return fn(tx)
}

// applyResult is what FSM.Apply returns to the raft future: the JSON of the
// records written and the records themselves (Recs[i] is the *Site,
// *Machine, ... that Values[i] encodes; only the leader's raft future
// delivers it, to the one caller of that write), or the error that refused
// the command.
type applyResult struct {
	Values []json.RawMessage
	Recs   []any
	Err    error
}

// Apply implements raft.FSM.
func (f *fsm) Apply(l *raft.Log) interface{} {
	return f.ApplyBatch([]*raft.Log{l})[0]
}

// predecoded is a command decoded by the leader from the exact bytes it
// hands to raft.Apply.
type predecoded struct {
	n int // len(data)
	c *command
}

// predecode decodes data (an encoded command about to be given to
// raft.Apply on this node) and parks the result for ApplyBatch, keyed by the
// address of data's first byte: on the leader raft passes the very same
// slice to the FSM, so ApplyBatch can skip JSON decoding on its single
// goroutine. The result is exactly what decodeCommand(data) gives in the FSM
// (same function, same bytes), so determinism is unchanged. Entries that
// reach the FSM another way (replayed from the log, or on a follower) are
// not found and decoded there. The returned func removes the parked entry;
// call it when raft.Apply has finished (the slice is kept alive until then,
// so its address cannot be reused meanwhile).
func (f *fsm) predecode(data []byte) (done func()) {
	if len(data) == 0 {
		return func() {}
	}
	c, err := decodeCommand(data)
	if err != nil {
		return func() {} // the FSM decodes it again and refuses it
	}
	key := &data[0]
	f.pmu.Lock()
	if f.pre == nil {
		f.pre = make(map[*byte]predecoded)
	}
	f.pre[key] = predecoded{n: len(data), c: c}
	f.pmu.Unlock()
	return func() {
		f.pmu.Lock()
		delete(f.pre, key)
		f.pmu.Unlock()
	}
}

// takePredecoded returns (and forgets) the command parked for data, or nil.
// It is taken once: apply mutates the command, so any re-application
// decodes afresh.
func (f *fsm) takePredecoded(data []byte) *command {
	if len(data) == 0 {
		return nil
	}
	key := &data[0]
	f.pmu.Lock()
	defer f.pmu.Unlock()
	p, ok := f.pre[key]
	if !ok || p.n != len(data) {
		return nil
	}
	delete(f.pre, key)
	return p.c
}

// parallelDecodeMin is the number of entries of a batch that must be
// decoded in the FSM (not predecoded) before decoding is spread over
// several goroutines (followers, log replay).
const parallelDecodeMin = 8

// decodeBatch returns the decoded command (or decode error) of every
// LogCommand entry of logs, from the predecoded entries where present.
func (f *fsm) decodeBatch(logs []*raft.Log) []decoded {
	dec := make([]decoded, len(logs))
	var miss []int
	for i, l := range logs {
		if l.Type != raft.LogCommand {
			continue
		}
		if c := f.takePredecoded(l.Data); c != nil {
			dec[i].c = c
			continue
		}
		miss = append(miss, i)
	}
	workers := min(runtime.GOMAXPROCS(0), 4, len(miss)/parallelDecodeMin)
	if workers <= 1 {
		for _, i := range miss {
			dec[i].c, dec[i].err = decodeCommand(logs[i].Data)
		}
		return dec
	}
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for k := w; k < len(miss); k += workers {
				i := miss[k]
				dec[i].c, dec[i].err = decodeCommand(logs[i].Data)
			}
		}(w)
	}
	wg.Wait()
	return dec
}

// decoded is one entry's command, or why it could not be decoded.
type decoded struct {
	c   *command
	err error
}

// command returns the entry's command for one application and forgets it
// (apply mutates it); a second call decodes the log bytes again.
func (d *decoded) command(l *raft.Log) (*command, error) {
	c, err := d.c, d.err
	d.c, d.err = nil, nil
	if c == nil && err == nil {
		return decodeCommand(l.Data)
	}
	return c, err
}

// entryOut is what one applied entry produced.
type entryOut struct {
	vals   []json.RawMessage
	recs   []any
	events int
}

// applyTx applies entries [from, to) of logs in ONE bbolt write transaction
// and commits it with the applied marker set to marker. If entry i is
// refused, the transaction is rolled back (nothing of [from, to) is
// written) and applyTx returns bad = i with that entry's error; a failure
// not attributable to an entry (commit, marker) returns bad = -1.
func (f *fsm) applyTx(logs []*raft.Log, dec []decoded, from, to int, marker uint64) (out []entryOut, bad int, err error) {
	out = make([]entryOut, to-from)
	bad = -1
	tx, err := f.db.Begin(true)
	if err != nil {
		return out, bad, err
	}
	ix := newIdxTx(f.ix)
	for i := from; i < to; i++ {
		l := logs[i]
		if l.Type != raft.LogCommand {
			continue
		}
		c, err := dec[i].command(l)
		if err == nil && f.unknownType(c.Type) {
			err = fmt.Errorf("%w: type byte %d", ErrUnknownCommand, uint8(c.Type))
		}
		if err == nil {
			o := &out[i-from]
			o.vals, o.recs, o.events, err = apply(tx, ix, l.Index, c)
		}
		if err != nil {
			_ = tx.Rollback()
			return out, i, err
		}
	}
	if err := putApplied(tx, marker); err != nil {
		_ = tx.Rollback()
		return out, bad, err
	}
	// Commit and merge the index changes as one step for readers
	// (viewIndexed).
	f.ix.mu.Lock()
	err = tx.Commit()
	if err == nil {
		ix.commit()
	}
	f.ix.mu.Unlock()
	if err == nil {
		f.leases.publish(ix.leases)
	}
	return out, bad, err
}

// ApplyBatch implements raft.BatchingFSM: all command entries of the batch
// are applied in one bbolt transaction, each with its own result.
//
// An entry of a command type this binary does not know halts the FSM:
// the entries before it are committed, it and every later entry (of this
// and every later batch) get the *HaltError and are not applied, and the
// applied marker stays before it (DESIGN.md "Mixed versions").
//
// A refused entry (logical refusal, malformed) must not
// affect its neighbours: when entry i is refused, the transaction is rolled
// back, the entries before i are re-applied (from fresh decodes) and
// committed in a transaction of their own, i gets its error — which is
// exactly the error it gets when applied alone on that same state — and
// the rest of the batch continues in a new transaction. So a batch costs
// (refusals + 1) transactions, and the state after it is byte-identical to
// applying every entry in its own transaction. Should a transaction fail
// for a reason not tied to one entry (bbolt commit error), the remaining
// entries are applied one transaction each so the error is attributed to
// the right entries.
//
// Each transaction also records the "applied" marker (index of the last
// entry it covered, a refused entry counting as covered); it travels in
// snapshots so leader and follower compare the same notion in Barrier.
func (f *fsm) ApplyBatch(logs []*raft.Log) []interface{} {
	res := make([]interface{}, len(logs))
	if len(logs) == 0 {
		return res
	}
	f.mu.RLock()
	defer f.mu.RUnlock()
	if f.db == nil {
		for i := range res {
			res[i] = &applyResult{Err: ErrClosed}
		}
		return res
	}
	if h := f.halt.Load(); h != nil {
		for i := range res {
			res[i] = &applyResult{Err: h}
		}
		return res
	}
	dec := f.decodeBatch(logs)
	lastIdx := logs[len(logs)-1].Index
	var events int
	var lastEv uint64
	keep := func(from int, out []entryOut) {
		for k, o := range out {
			i := from + k
			if logs[i].Type != raft.LogCommand {
				continue
			}
			res[i] = &applyResult{Values: o.vals, Recs: o.recs}
			if t := CommandType(logs[i].Data[0]); t == CmdRegisterNode || t == CmdRemoveNode {
				f.versionsGen.Add(1)
			}
			if o.events > 0 {
				events += o.events
				lastEv = logs[i].Index
			}
		}
	}
	refuse := func(i int, err error) {
		f.refused(logs[i], err)
		res[i] = &applyResult{Err: err}
	}
	for pos := 0; pos < len(logs); {
		out, bad, err := f.applyTx(logs, dec, pos, len(logs), lastIdx)
		if err == nil {
			keep(pos, out)
			break
		}
		if bad < 0 {
			if h := f.applyEach(logs, dec, pos, len(logs), refuse, keep); h >= 0 {
				return f.halted(logs, h, res)
			}
			break
		}
		unknown := errors.Is(err, ErrUnknownCommand)
		marker := logs[bad].Index
		if unknown {
			// Stop here: the prefix is applied, the entry and everything
			// after it are not (the applied marker stays before it).
			marker--
		} else {
			// Entry bad was refused on the state left by [pos, bad): commit
			// that prefix alone, then go on after bad.
			refuse(bad, err)
		}
		if unknown && bad == pos {
			f.haltAt(logs[bad], err)
			f.applied.Store(marker)
			f.notify(events > 0)
			return f.halted(logs, bad, res)
		}
		out, _, err = f.applyTx(logs, dec, pos, bad, marker)
		if err != nil {
			// The prefix applied cleanly a moment ago; a failure now is
			// not about one entry. Attribute entry by entry.
			if h := f.applyEach(logs, dec, pos, bad, refuse, keep); h >= 0 {
				return f.halted(logs, h, res)
			}
		} else {
			keep(pos, out)
		}
		if unknown {
			f.haltAt(logs[bad], fmt.Errorf("%w: type byte %d", ErrUnknownCommand, logs[bad].Data[0]))
			f.applied.Store(marker)
			f.notify(events > 0)
			return f.halted(logs, bad, res)
		}
		pos = bad + 1
	}
	f.applied.Store(lastIdx)
	if lastEv > f.lastEvent.Load() {
		f.lastEvent.Store(lastEv)
	}
	f.notify(events > 0)
	return res
}

// applyEach applies entries [from, to) one transaction each (the slow,
// fault-attributing path of ApplyBatch), then writes the applied marker of
// entry to-1. An entry of an unknown command type halts the FSM there: it
// returns that entry's position (the marker then stays before it), else -1.
func (f *fsm) applyEach(logs []*raft.Log, dec []decoded, from, to int,
	refuse func(int, error), keep func(int, []entryOut)) int {
	for i := from; i < to; i++ {
		if logs[i].Type != raft.LogCommand {
			continue
		}
		out, _, err := f.applyTx(logs, dec, i, i+1, logs[i].Index)
		if errors.Is(err, ErrUnknownCommand) {
			f.haltAt(logs[i], err)
			f.applied.Store(logs[i].Index - 1)
			f.notify(true)
			return i
		}
		if err != nil {
			refuse(i, err)
			continue
		}
		keep(i, out)
	}
	if to > from {
		if err := f.db.Update(func(tx *bbolt.Tx) error { return putApplied(tx, logs[to-1].Index) }); err != nil {
			f.log.Error("write applied marker", "path", f.path, "err", err)
		}
	}
	return -1
}

// HaltError (wrapping ErrFSMHalted and ErrUnknownCommand) says where this
// node's FSM stopped: the log entry (Index, Term) whose command type (Type,
// its first byte) this binary does not know.
type HaltError struct {
	Index, Term uint64
	Type        int
	At          time.Time // when this process met it (local clock; not part of any state)
}

func (e *HaltError) Error() string {
	return fmt.Sprintf("store: FSM halted at raft log entry %d (term %d): command type %d is unknown to this binary "+
		"(written by a newer kiln); this node applies nothing further until it runs a kiln that knows the type: "+
		"upgrade it and restart (fsm.db is rebuilt from snapshot + log)", e.Index, e.Term, e.Type)
}

// Unwrap makes errors.Is(err, ErrFSMHalted) and errors.Is(err,
// ErrUnknownCommand) true.
func (e *HaltError) Unwrap() []error { return []error{ErrFSMHalted, ErrUnknownCommand} }

// unknownType reports whether t is a type this binary (or the binary the
// knownMax test hook plays) cannot apply.
func (f *fsm) unknownType(t CommandType) bool {
	if m := f.knownMax.Load(); m != 0 && uint32(t) > m {
		return true
	}
	// 33 and 34 are numbers reserved for issue 16's commands (command.go):
	// this binary cannot apply them, so an entry of one halts here too.
	return t == CmdInvalid || t >= cmdEnd || (t >= cmdReserved33 && t <= cmdReserved34)
}

// haltAt stops the FSM at entry l (its first unknown entry), logs it at
// ERROR and counts it; later calls keep the first halt.
func (f *fsm) haltAt(l *raft.Log, cause error) {
	typ := -1
	if len(l.Data) > 0 {
		typ = int(l.Data[0])
	}
	h := &HaltError{Index: l.Index, Term: l.Term, Type: typ, At: time.Now()}
	if !f.halt.CompareAndSwap(nil, h) {
		return
	}
	if f.onApplyError != nil {
		f.onApplyError(errCode(ErrUnknownCommand))
	}
	f.log.Error("raft log entry NOT applied: FSM halted", "index", l.Index, "term", l.Term, "type", typ, "err", cause)
	if f.onHalt != nil {
		f.onHalt(h)
	}
}

// halted fills the results of logs[from:] with the halt error.
func (f *fsm) halted(logs []*raft.Log, from int, res []interface{}) []interface{} {
	h := f.halt.Load()
	for i := from; i < len(logs); i++ {
		res[i] = &applyResult{Err: h}
	}
	return res
}

func putApplied(tx *bbolt.Tx, idx uint64) error {
	var ib [8]byte
	binary.BigEndian.PutUint64(ib[:], idx)
	return tx.Bucket(bMeta).Put(keyApplied, ib[:])
}

// refused logs and counts a command the FSM did not apply. Logical refusals
// (conflict, not found, ...) are normal and logged at debug; an unknown or
// malformed command means the log holds something this binary cannot
// execute and is logged at error level.
func (f *fsm) refused(l *raft.Log, err error) {
	code := errCode(err)
	if f.onApplyError != nil {
		f.onApplyError(code)
	}
	if errIsLogical(err) {
		f.log.Debug("command refused", "index", l.Index, "err", err)
		return
	}
	typ := -1
	if len(l.Data) > 0 {
		typ = int(l.Data[0])
	}
	f.log.Error("raft log entry NOT applied", "index", l.Index, "term", l.Term, "type", typ, "err", err)
}

func (f *fsm) notify(events bool) {
	f.nmu.Lock()
	close(f.applyCh)
	f.applyCh = make(chan struct{})
	if events {
		close(f.eventsCh)
		f.eventsCh = make(chan struct{})
	}
	f.nmu.Unlock()
}

func (f *fsm) waitChans() (events, applied chan struct{}) {
	f.nmu.Lock()
	defer f.nmu.Unlock()
	return f.eventsCh, f.applyCh
}

// Snapshot implements raft.FSM: it opens a bbolt read transaction; Persist
// streams it with Tx.WriteTo while Apply continues.
func (f *fsm) Snapshot() (raft.FSMSnapshot, error) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	if f.db == nil {
		return nil, ErrClosed
	}
	if h := f.halt.Load(); h != nil {
		// A snapshot now would cover the entry not applied, and compact it
		// away: an upgraded binary could then never apply it.
		return nil, fmt.Errorf("snapshot refused: %w", h)
	}
	tx, err := f.db.Begin(false)
	if err != nil {
		return nil, fmt.Errorf("snapshot %s: %w", f.path, err)
	}
	return &fsmSnapshot{tx: tx}, nil
}

type fsmSnapshot struct{ tx *bbolt.Tx }

func (s *fsmSnapshot) Persist(sink raft.SnapshotSink) error {
	if _, err := s.tx.WriteTo(sink); err != nil {
		sink.Cancel()
		return fmt.Errorf("snapshot persist: %w", err)
	}
	return sink.Close()
}

func (s *fsmSnapshot) Release() { _ = s.tx.Rollback() }

// Restore implements raft.FSM: the snapshot is written to fsm.db.restore,
// verified, then swapped in place of fsm.db.
func (f *fsm) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	if h := f.halt.Load(); h != nil {
		return fmt.Errorf("restore refused: %w", h)
	}
	tmp := f.path + ".restore"
	out, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	if _, err := io.Copy(out, rc); err != nil {
		out.Close()
		os.Remove(tmp)
		return fmt.Errorf("restore %s: %w", tmp, err)
	}
	if err := out.Close(); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("restore %s: %w", tmp, err)
	}
	if err := checkBolt(tmp); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("restore: snapshot: %w", err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.db != nil {
		if err := f.db.Close(); err != nil {
			return fmt.Errorf("restore: close %s: %w", f.path, err)
		}
		f.db = nil
	}
	if err := os.Rename(tmp, f.path); err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	db, err := openFSMFile(f.path)
	if err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	f.db = db
	if err := f.loadDerived(); err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	return nil
}

// loadDerived brings what the FSM keeps beside f.db in line with a file it
// did not build itself (a restored snapshot, or OpenLocal's fsm.db): it drops
// the index buckets of files written before the machine indexes moved to
// memory, rebuilds the machine index from the machines bucket, loads the
// applied and last-event indexes, and wakes waiters. Caller holds f.mu (or
// is the only user of f).
func (f *fsm) loadDerived() error {
	db := f.db
	if err := db.Update(func(tx *bbolt.Tx) error {
		for _, b := range legacyBuckets {
			if tx.Bucket(b) != nil {
				if err := tx.DeleteBucket(b); err != nil {
					return err
				}
			}
		}
		return rebuildLeaseAddrs(tx)
	}); err != nil {
		return fmt.Errorf("%s: %w", f.path, err)
	}
	var ix *machineIndex
	if err := db.View(func(tx *bbolt.Tx) (err error) {
		ix, err = buildMachineIndex(tx)
		return err
	}); err != nil {
		return fmt.Errorf("%s: %w", f.path, err)
	}
	f.ix.mu.Lock()
	f.ix.mac, f.ix.state, f.ix.ref = ix.mac, ix.state, ix.ref
	f.ix.mu.Unlock()
	var last, applied uint64
	_ = db.View(func(tx *bbolt.Tx) error {
		last = lastEventIndex(tx)
		if v := tx.Bucket(bMeta).Get(keyApplied); len(v) == 8 {
			applied = beUint64(v)
		}
		return nil
	})
	f.lastEvent.Store(last)
	f.applied.Store(applied)
	f.versionsGen.Add(1)
	f.notify(true)
	if err := f.leases.resetFrom(db); err != nil {
		return fmt.Errorf("restore: %s: %w", f.path, err)
	}
	return nil
}

func beUint64(b []byte) uint64 {
	var v uint64
	for _, c := range b[:8] {
		v = v<<8 | uint64(c)
	}
	return v
}
