package store

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	"go.etcd.io/bbolt"
)

// Backup, restore and recovery of a node's store (DESIGN.md "Backup,
// restore, recovery"): Backup streams a consistent copy of fsm.db;
// RestoreDataDir turns such a copy into the data directory of a new
// one-node cluster; RecoverCluster rewrites the raft configuration of a
// stopped node whose cluster lost its quorum for good.

// BackupInfo describes a backup of the FSM: the raft index it reflects
// (fsm.db's applied marker; every record's ResourceVersion and every
// event's index is ≤ Index), its size in bytes, and the node it was taken
// on.
type BackupInfo struct {
	Index  uint64 `json:"index"`
	Size   int64  `json:"size"`
	NodeID string `json:"node_id"`
}

// Backup takes a consistent copy of the FSM: one bbolt read transaction of
// fsm.db (the same image a raft snapshot holds), handed to write with its
// BackupInfo; write streams it (snap.WriteTo writes exactly info.Size
// bytes) while writes continue. On a raft store it first waits for the
// local replica to hold every write committed before the call (Barrier:
// ErrNotLeader without a reachable leader). The transaction stays open
// until write returns. A local store backs up its fsm.db the same way.
func (s *Store) Backup(ctx context.Context, write func(info BackupInfo, snap io.WriterTo) error) error {
	if err := s.Barrier(ctx); err != nil {
		return fmt.Errorf("store: backup: the local replica could not catch up with the cluster: %w", err)
	}
	s.fsm.mu.RLock()
	if s.fsm.db == nil {
		s.fsm.mu.RUnlock()
		return ErrClosed
	}
	tx, err := s.fsm.db.Begin(false)
	s.fsm.mu.RUnlock()
	if err != nil {
		return fmt.Errorf("store: backup: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	info := BackupInfo{Size: tx.Size(), NodeID: s.cfg.NodeID}
	if v := tx.Bucket(bMeta).Get(keyApplied); len(v) == 8 {
		info.Index = beUint64(v)
	}
	return write(info, tx)
}

// RestoreDataDir builds, in dir (which must not exist or be empty), the
// data directory of a new one-node cluster holding the FSM state read
// from fsmData (a Backup): a raft snapshot of that state at its applied
// index whose configuration is the single voter nodeID at raftAddr, and a
// raft.db with term 1 and an empty log. Open with the same NodeID then
// starts from that state and elects itself (Config.Bootstrap does not
// matter: the directory has raft state). The state is checked like a
// snapshot (ErrCorrupt) and must have applied entries (ErrInvalid
// otherwise). It returns the index restored.
func RestoreDataDir(dir, nodeID, raftAddr string, fsmData io.Reader) (uint64, error) {
	if !nodeIDRe.MatchString(nodeID) || raftAddr == "" {
		return 0, fmt.Errorf("%w: restore needs a node ID (1-63 letters, digits, '.', '_', '-') and a raft address", ErrInvalid)
	}
	if err := emptyDir(dir); err != nil {
		return 0, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return 0, fmt.Errorf("store: restore: %w", err)
	}
	tmp := filepath.Join(dir, FSMDBFile+".restore")
	defer os.Remove(tmp)
	out, err := os.OpenFile(tmp, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return 0, fmt.Errorf("store: restore: %w", err)
	}
	size, err := io.Copy(out, fsmData)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return 0, fmt.Errorf("store: restore: read the backed-up state: %w", err)
	}
	if err := checkBolt(tmp); err != nil {
		return 0, fmt.Errorf("store: restore: the backed-up state: %w", err)
	}
	var index uint64
	db, err := openReadOnly(tmp)
	if err != nil {
		return 0, fmt.Errorf("%w: restore: %v", ErrCorrupt, err)
	}
	_ = db.View(func(tx *bbolt.Tx) error {
		if b := tx.Bucket(bMeta); b != nil {
			if v := b.Get(keyApplied); len(v) == 8 {
				index = beUint64(v)
			}
		}
		return nil
	})
	db.Close()
	if index == 0 {
		return 0, fmt.Errorf("%w: restore: the backed-up state has no applied entries (not a Kiln fsm.db backup?)", ErrInvalid)
	}

	hlog := hclog.New(&hclog.LoggerOptions{Name: "raft", Level: hclog.Warn, Output: io.Discard})
	snaps, err := raft.NewFileSnapshotStoreWithLogger(dir, snapshotsRetained, hlog)
	if err != nil {
		return 0, fmt.Errorf("store: restore: snapshot store in %s: %w", dir, err)
	}
	conf := raft.Configuration{Servers: []raft.Server{{Suffrage: raft.Voter, ID: raft.ServerID(nodeID), Address: raft.ServerAddress(raftAddr)}}}
	_, trans := raft.NewInmemTransport("") // only encodes the configuration's addresses
	sink, err := snaps.Create(raft.SnapshotVersionMax, index, 1, conf, index, trans)
	if err != nil {
		return 0, fmt.Errorf("store: restore: %w", err)
	}
	in, err := os.Open(tmp)
	if err != nil {
		_ = sink.Cancel()
		return 0, fmt.Errorf("store: restore: %w", err)
	}
	n, err := io.Copy(sink, in)
	in.Close()
	if err == nil && n != size {
		err = fmt.Errorf("copied %d of %d bytes", n, size)
	}
	if err != nil {
		_ = sink.Cancel()
		return 0, fmt.Errorf("store: restore: write the snapshot: %w", err)
	}
	if err := sink.Close(); err != nil {
		return 0, fmt.Errorf("store: restore: write the snapshot: %w", err)
	}
	logDB, err := raftboltdb.New(raftboltdb.Options{Path: filepath.Join(dir, RaftDBFile), BoltOptions: &bbolt.Options{Timeout: boltTimeout}})
	if err != nil {
		return 0, fmt.Errorf("store: restore: %s: %w", RaftDBFile, err)
	}
	err = logDB.SetUint64([]byte("CurrentTerm"), 1) // raft's stable-store key
	if cerr := logDB.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return 0, fmt.Errorf("store: restore: %s: %w", RaftDBFile, err)
	}
	return index, nil
}

// emptyDir refuses (ErrInvalid) a dir that exists and holds anything.
func emptyDir(dir string) error {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("store: %s: %w", dir, err)
	}
	if len(ents) > 0 {
		return fmt.Errorf("%w: %s is not empty (%s, ...): restore only into a fresh data directory; "+
			"move it aside or name another", ErrInvalid, dir, ents[0].Name())
	}
	return nil
}

// RecoverServer is one server of the configuration RecoverCluster writes.
type RecoverServer struct {
	ID       string `json:"id"`
	RaftAddr string `json:"raft_addr"`
}

// RecoverCluster is raft's peers.json for a cluster that has lost its
// quorum for good: on the stopped node whose data directory is dir, it
// replays the snapshot and the whole log (entries that never committed
// included, as raft.RecoverCluster does) into the FSM, writes a snapshot
// of the result whose configuration is servers (the survivors, each a
// voter; at least one, nodeID among them), and empties the log. Run it, with the same
// servers, on every survivor while all of them are stopped, then start
// them: they form a cluster of their own. The node must not be running
// (bbolt's file lock: ErrCorrupt naming raft.db after boltTimeout). The
// data directory is checked first like Open does (ErrCorrupt,
// ErrInconsistentDataDir); a directory with no raft state is refused.
func RecoverCluster(dir, nodeID string, servers []RecoverServer, log *slog.Logger) (uint64, error) {
	if len(servers) == 0 {
		return 0, fmt.Errorf("%w: recover needs at least one surviving server", ErrInvalid)
	}
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	conf := raft.Configuration{}
	seen := map[string]bool{}
	for _, sv := range servers {
		if !nodeIDRe.MatchString(sv.ID) || sv.RaftAddr == "" || seen[sv.ID] {
			return 0, fmt.Errorf("%w: recover: server %q at %q: want distinct node IDs, each with a raft address", ErrInvalid, sv.ID, sv.RaftAddr)
		}
		seen[sv.ID] = true
		conf.Servers = append(conf.Servers, raft.Server{Suffrage: raft.Voter, ID: raft.ServerID(sv.ID), Address: raft.ServerAddress(sv.RaftAddr)})
	}
	if !seen[nodeID] {
		return 0, fmt.Errorf("%w: recover: this node (%s) is not among the servers given; list every survivor, this node included", ErrInvalid, nodeID)
	}
	st, err := readDataDir(dir)
	if err != nil {
		return 0, err
	}
	if err := st.check(); err != nil {
		return 0, err
	}
	if st.raft == nil {
		return 0, fmt.Errorf("%w: recover: %s holds no %s: this is not a node's store directory", ErrInvalid, dir, RaftDBFile)
	}
	hlog := hclog.New(&hclog.LoggerOptions{Name: "raft", Level: hclog.Warn, Output: &slogWriter{log: log.With("sub", "raft")}})
	logDB, err := raftboltdb.New(raftboltdb.Options{Path: filepath.Join(dir, RaftDBFile), BoltOptions: &bbolt.Options{Timeout: boltTimeout}})
	if err != nil {
		return 0, fmt.Errorf("%w: %s: %v (is the node still running?)", ErrCorrupt, filepath.Join(dir, RaftDBFile), err)
	}
	defer logDB.Close()
	snaps, err := raft.NewFileSnapshotStoreWithLogger(dir, snapshotsRetained, hlog)
	if err != nil {
		return 0, fmt.Errorf("store: recover: snapshot store in %s: %w", dir, err)
	}
	f, err := newFSM(filepath.Join(dir, FSMDBFile), log)
	if err != nil {
		return 0, err
	}
	defer f.close()
	rc := raft.DefaultConfig()
	rc.LocalID = raft.ServerID(nodeID)
	rc.Logger = hlog
	_, trans := raft.NewInmemTransport("")
	if err := raft.RecoverCluster(rc, recoverFSM{f}, logDB, logDB, snaps, trans, conf); err != nil {
		return 0, fmt.Errorf("store: recover %s: %w", dir, err)
	}
	return f.applied.Load(), nil
}

// recoverFSM is the fsm as raft.RecoverCluster gets it: RecoverCluster
// persists the snapshot it takes but never releases it, so the snapshot
// releases its read transaction itself once persisted (else closing
// fsm.db would wait for it forever).
type recoverFSM struct{ *fsm }

func (r recoverFSM) Snapshot() (raft.FSMSnapshot, error) {
	snap, err := r.fsm.Snapshot()
	if err != nil {
		return nil, err
	}
	return releasingSnapshot{snap}, nil
}

type releasingSnapshot struct{ raft.FSMSnapshot }

func (s releasingSnapshot) Persist(sink raft.SnapshotSink) error {
	defer s.FSMSnapshot.Release()
	return s.FSMSnapshot.Persist(sink)
}
