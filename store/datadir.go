package store

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"go.etcd.io/bbolt"
)

// snapshotsDir is raft.FileSnapshotStore's directory inside DataDir.
const snapshotsDir = "snapshots"

// dataDirState is what the files of a data directory say before anything
// is opened for writing.
type dataDirState struct {
	dir        string
	raft       *raftLog // raft.db's term and log bounds; nil when raft.db does not exist
	fsmApplied uint64   // fsm.db's "applied" marker (0: no file, or nothing applied)
	snapshots  int      // complete snapshots in snapshots/
	snapIndex  uint64   // raft index of the newest one
}

// readDataDir validates raft.db and fsm.db (ErrCorrupt naming the file)
// and reads fsm.db's applied index and the snapshots' indexes. It writes
// nothing and creates nothing.
func readDataDir(dir string) (dataDirState, error) {
	st := dataDirState{dir: dir}
	raftPath, fsmPath := filepath.Join(dir, RaftDBFile), filepath.Join(dir, FSMDBFile)
	if err := checkBolt(raftPath); err != nil {
		return st, err
	}
	if _, err := os.Stat(raftPath); err == nil {
		rl, err := readRaftLog(raftPath)
		if err != nil {
			return st, err
		}
		st.raft = &rl
	} else if !errors.Is(err, os.ErrNotExist) {
		return st, fmt.Errorf("store: %s: %w", raftPath, err)
	}
	if err := checkBolt(fsmPath); err != nil {
		return st, err
	}
	if _, err := os.Stat(fsmPath); err == nil {
		db, err := openReadOnly(fsmPath)
		if err != nil {
			return st, fmt.Errorf("%w: %s: %v", ErrCorrupt, fsmPath, err)
		}
		_ = db.View(func(tx *bbolt.Tx) error {
			if b := tx.Bucket(bMeta); b != nil {
				if v := b.Get(keyApplied); len(v) == 8 {
					st.fsmApplied = beUint64(v)
				}
			}
			return nil
		})
		db.Close()
	}
	ents, err := os.ReadDir(filepath.Join(dir, snapshotsDir))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return st, fmt.Errorf("store: %s: %w", filepath.Join(dir, snapshotsDir), err)
	}
	for _, e := range ents {
		if !e.IsDir() || strings.HasSuffix(e.Name(), ".tmp") { // .tmp: a snapshot raft never finished
			continue
		}
		raw, err := os.ReadFile(filepath.Join(dir, snapshotsDir, e.Name(), "meta.json"))
		if err != nil {
			continue // raft skips it too
		}
		var meta struct{ Index uint64 }
		if json.Unmarshal(raw, &meta) != nil {
			continue
		}
		st.snapshots++
		st.snapIndex = max(st.snapIndex, meta.Index)
	}
	return st, nil
}

// raftLog is what raft.db holds: the stable store's current term and the
// log's first and last index (0 when empty).
type raftLog struct{ term, first, last uint64 }

// readRaftLog reads raftLog from raft.db, read-only (opening it through
// raft-boltdb would commit a transaction, i.e. write to it). The layout is
// raft-boltdb/v2's: bucket "logs" keyed by 8-byte big-endian index, bucket
// "conf" with raft's stable-store key "CurrentTerm" (8-byte big-endian).
func readRaftLog(path string) (raftLog, error) {
	var rl raftLog
	db, err := openReadOnly(path)
	if err != nil {
		return rl, fmt.Errorf("%w: %s: %v", ErrCorrupt, path, err)
	}
	defer db.Close()
	err = db.View(func(tx *bbolt.Tx) error {
		if b := tx.Bucket([]byte("conf")); b != nil {
			if v := b.Get([]byte("CurrentTerm")); len(v) == 8 {
				rl.term = beUint64(v)
			}
		}
		if b := tx.Bucket([]byte("logs")); b != nil {
			c := b.Cursor()
			if k, _ := c.First(); len(k) == 8 {
				rl.first = beUint64(k)
			}
			if k, _ := c.Last(); len(k) == 8 {
				rl.last = beUint64(k)
			}
		}
		return nil
	})
	return rl, err
}

// recoverHint is the tail of every ErrInconsistentDataDir message: what
// restores the state, and which files to move away to give it up.
func (st dataDirState) recoverHint(restore string, discard ...string) string {
	return fmt.Sprintf("Nothing was changed. To recover: %s; or, on a node of a multi-node cluster, move the "+
		"data directory %s aside and join the node again (raft.join); or, to discard this state and start a new, "+
		"empty cluster, move %s out of %s.", restore, st.dir, strings.Join(discard, ", "), st.dir)
}

// check refuses a data directory whose FSM state or snapshots raft.db
// cannot account for, where starting would silently lose or roll back
// state. Cases:
//   - no raft state (raft.db missing, or with no term and no log) but
//     fsm.db has applied entries or a snapshot exists: raft would bootstrap
//     a new, empty cluster and the rebuilt fsm.db would replace the old one;
//   - the log starts after index 1 and no snapshot covers the entries
//     before it: the FSM cannot be rebuilt (raft would panic replaying);
//   - fsm.db has applied entries beyond the log and every snapshot:
//     raft.db is older than fsm.db, and starting would roll state back.
//
// raft.db present with fsm.db missing is fine: fsm.db is rebuilt from the
// snapshot and the log on every start (DESIGN.md "Files on disk (Config.DataDir)").
func (st dataDirState) check() error {
	log := st.raft
	raftPath := filepath.Join(st.dir, RaftDBFile)
	fsmPath := filepath.Join(st.dir, FSMDBFile)
	snapPath := filepath.Join(st.dir, snapshotsDir)
	held := func() string {
		var parts []string
		if st.fsmApplied > 0 {
			parts = append(parts, fmt.Sprintf("%s holds state up to raft index %d", fsmPath, st.fsmApplied))
		}
		if st.snapshots > 0 {
			parts = append(parts, fmt.Sprintf("%s holds %d snapshot(s), the newest at index %d", snapPath, st.snapshots, st.snapIndex))
		}
		return strings.Join(parts, " and ")
	}
	noState := log == nil || (log.term == 0 && log.last == 0)
	if noState && (st.fsmApplied > 0 || st.snapshots > 0) {
		missing := raftPath + " is missing"
		if log != nil {
			missing = raftPath + " holds no raft state (no term, no log)"
		}
		return fmt.Errorf("%w: %s, but %s: the raft log, term and vote of this node are gone, and starting "+
			"would bootstrap a new, empty cluster and replace %s. %s", ErrInconsistentDataDir, held(), missing,
			FSMDBFile, st.recoverHint("restore "+raftPath+" (with "+snapPath+") from a backup", FSMDBFile, snapshotsDir+"/"))
	}
	if log == nil {
		return nil
	}
	if log.first > 1 && (st.snapshots == 0 || st.snapIndex+1 < log.first) {
		newest := "there is no snapshot"
		if st.snapshots > 0 {
			newest = fmt.Sprintf("the newest snapshot in %s is at index %d", snapPath, st.snapIndex)
		}
		return fmt.Errorf("%w: the log in %s starts at index %d, but %s: entries 1..%d are in neither, so the "+
			"state cannot be rebuilt. %s", ErrInconsistentDataDir, raftPath, log.first, newest, log.first-1,
			st.recoverHint("restore "+snapPath+" (or "+raftPath+" and "+snapPath+" together) from a backup",
				RaftDBFile, FSMDBFile, snapshotsDir+"/"))
	}
	if end := max(log.last, st.snapIndex); st.fsmApplied > end {
		return fmt.Errorf("%w: %s holds state up to raft index %d, but %s and %s end at index %d: they are "+
			"older than %s (restored from an older backup?), and starting would roll the state back to index %d. "+
			"%s", ErrInconsistentDataDir, fsmPath, st.fsmApplied, raftPath, snapPath, end, FSMDBFile, end,
			st.recoverHint("restore the "+RaftDBFile+" and "+snapshotsDir+"/ that belong with "+FSMDBFile+
				"; if the older "+RaftDBFile+" is what you want, move "+fsmPath+" aside", RaftDBFile, FSMDBFile, snapshotsDir+"/"))
	}
	return nil
}
