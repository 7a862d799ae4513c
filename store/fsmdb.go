package store

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
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

	lastEvent atomic.Uint64
	applied   atomic.Uint64

	nmu      sync.Mutex
	eventsCh chan struct{} // closed and replaced when events are appended
	applyCh  chan struct{} // closed and replaced when applied advances

	onApplyError func(code string)
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
	for _, p := range []string{path, path + ".restore"} { // .restore: left by a crash mid-Restore
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
	}
	f := &fsm{path: path, log: log, eventsCh: make(chan struct{}), applyCh: make(chan struct{})}
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

// applyResult is what FSM.Apply returns to the raft future: the JSON of the
// records written, or the error that refused the command.
type applyResult struct {
	Values []json.RawMessage
	Err    error
}

// Apply implements raft.FSM.
func (f *fsm) Apply(l *raft.Log) interface{} {
	return f.ApplyBatch([]*raft.Log{l})[0]
}

// ApplyBatch implements raft.BatchingFSM: all command entries of the batch
// are applied in one bbolt transaction. If any command is refused, that
// transaction is rolled back and the batch is re-applied one transaction
// per command, so a refused command never leaves partial writes and never
// affects its neighbours. Each transaction also records the "applied"
// marker (index of the last entry it covered); it travels in snapshots so
// leader and follower compare the same notion in Barrier.
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
	lastIdx := logs[len(logs)-1].Index
	var events int
	var lastEv uint64
	failed := false
	err := f.db.Update(func(tx *bbolt.Tx) error {
		for i, l := range logs {
			if l.Type != raft.LogCommand {
				continue
			}
			vals, n, err := f.applyOne(tx, l)
			if err != nil {
				failed = true
				return err
			}
			res[i] = &applyResult{Values: vals}
			if n > 0 {
				events += n
				lastEv = l.Index
			}
		}
		return putApplied(tx, lastIdx)
	})
	if failed || err != nil {
		events, lastEv = 0, 0
		for i, l := range logs {
			res[i] = nil
			if l.Type != raft.LogCommand {
				continue
			}
			var vals []json.RawMessage
			var n int
			err := f.db.Update(func(tx *bbolt.Tx) error {
				var e error
				if vals, n, e = f.applyOne(tx, l); e != nil {
					return e
				}
				return putApplied(tx, l.Index)
			})
			if err != nil {
				f.refused(l, err)
				res[i] = &applyResult{Err: err}
				continue
			}
			res[i] = &applyResult{Values: vals}
			if n > 0 {
				events += n
				lastEv = l.Index
			}
		}
		if err := f.db.Update(func(tx *bbolt.Tx) error { return putApplied(tx, lastIdx) }); err != nil {
			f.log.Error("write applied marker", "path", f.path, "err", err)
		}
	}
	f.applied.Store(lastIdx)
	if lastEv > f.lastEvent.Load() {
		f.lastEvent.Store(lastEv)
	}
	f.notify(events > 0)
	return res
}

func putApplied(tx *bbolt.Tx, idx uint64) error {
	var ib [8]byte
	binary.BigEndian.PutUint64(ib[:], idx)
	return tx.Bucket(bMeta).Put(keyApplied, ib[:])
}

func (f *fsm) applyOne(tx *bbolt.Tx, l *raft.Log) ([]json.RawMessage, int, error) {
	c, err := decodeCommand(l.Data)
	if err != nil {
		return nil, 0, err
	}
	return apply(tx, l.Index, c)
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
	f.notify(true)
	return nil
}

func beUint64(b []byte) uint64 {
	var v uint64
	for _, c := range b[:8] {
		v = v<<8 | uint64(c)
	}
	return v
}
