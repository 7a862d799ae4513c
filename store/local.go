package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"

	"github.com/hashicorp/raft"
)

// LocalNodeID is the NodeID (and Leader ID) of a store opened with OpenLocal.
const LocalNodeID = "local"

// OpenLocal opens (or creates) a store in dir with no raft and no
// listeners: the same *Store, the same typed writes and reads, the same
// apply path (each write is encoded as a command and applied by the FSM's
// batched apply over dir/fsm.db), but the log is in-process. Writes are
// applied one at a time in the order they arrive, each at the next index
// (the applied index stored in fsm.db + 1; a refused write uses up its
// index too, as a refused raft entry does), so ResourceVersions, CAS,
// transitions, events and event cursors behave exactly as on a raft
// store. Reopening the same dir continues from the stored index.
//
// It is for tests (storetest.NewLocal) and single-process tools. IsLeader
// and Ready are always true, Leader is (LocalNodeID, ""), Barrier and
// WaitLeader return nil, Run only waits for its context; Join, Remove,
// JoinVia and Snapshot fail with ErrNoRaft. There are no metrics.
//
// Durability: fsm.db is the only copy and, as on a raft node, is written
// without fsync; an acknowledged write survives the process exiting or
// being killed, not a kernel crash or power loss.
//
// Errors: ErrCorrupt (fsm.db unreadable, names the file),
// ErrInconsistentDataDir (dir holds raft state: raft.db or snapshots/
// belong to a store opened with Open), and bbolt's lock timeout when
// another process holds fsm.db. log may be nil.
func OpenLocal(dir string, log *slog.Logger) (*Store, error) {
	if dir == "" {
		return nil, fmt.Errorf("%w: OpenLocal: dir is empty", ErrInvalid)
	}
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	log = log.With("component", "store", "node", LocalNodeID)
	for _, name := range []string{RaftDBFile, "snapshots"} {
		p := filepath.Join(dir, name)
		if _, err := os.Stat(p); err == nil {
			return nil, fmt.Errorf("%w: %s exists: %s holds the state of a raft store; open it with "+
				"store.Open, or give OpenLocal another directory", ErrInconsistentDataDir, p, dir)
		} else if !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("store: %w", err)
		}
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("store: data dir: %w", err)
	}
	path := filepath.Join(dir, FSMDBFile)
	if err := checkBolt(path); err != nil {
		return nil, err
	}
	db, err := openFSMFile(path)
	if err != nil {
		return nil, err
	}
	f := &fsm{path: path, log: log, db: db, ix: newMachineIndex(), eventsCh: make(chan struct{}), applyCh: make(chan struct{})}
	if err := f.loadDerived(); err != nil {
		_ = db.Close()
		return nil, err
	}
	s := &Store{cfg: Config{NodeID: LocalNodeID, DataDir: dir, ApplyTimeout: DefaultApplyTimeout},
		log: log, fsm: f, m: newMetrics(), done: make(chan struct{}), hadState: f.applied.Load() > 0}
	s.baseCtx, s.cancel = context.WithCancel(context.Background())
	s.fsm.onApplyError = func(code string) { s.m.applyErrors.WithLabelValues(code).Inc() }
	s.cons = &localLog{s: s}
	log.Info("local store open", "data_dir", dir, "applied_index", f.applied.Load())
	return s, nil
}

// localLog is the consensus of a store opened with OpenLocal: one mutex
// orders the writes, each is one entry of index applied+1 handed to
// fsm.ApplyBatch (the FSM writes the new applied index in the entry's own
// bbolt transaction, so it is persisted with it).
type localLog struct {
	s       *Store
	mu      sync.Mutex
	stopped bool
}

func (l *localLog) commit(ctx context.Context, c *command) ([]json.RawMessage, []any, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.stopped {
		return nil, nil, ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	upgradeCommand(c, func(CommandType) error { return nil }) // one node: it understands every command
	prepare(c)
	data, err := encodeCommand(c)
	if err != nil {
		return nil, nil, err
	}
	entry := &raft.Log{Index: l.s.fsm.applied.Load() + 1, Term: 1, Type: raft.LogCommand, Data: data}
	res, ok := l.s.fsm.ApplyBatch([]*raft.Log{entry})[0].(*applyResult)
	if !ok {
		return nil, nil, fmt.Errorf("store: %s: no FSM result", c.Type)
	}
	return res.Values, res.Recs, res.Err
}

func (l *localLog) isLeader() bool                { return true }
func (l *localLog) leader() (id, raftAddr string) { return LocalNodeID, "" }
func (l *localLog) ready() bool                   { return true }

func (l *localLog) barrier(ctx context.Context) error {
	if l.s.closed.Load() {
		return ErrClosed
	}
	return ctx.Err()
}

func (l *localLog) stop() error {
	l.mu.Lock()
	l.stopped = true
	l.mu.Unlock()
	return nil
}

func (l *localLog) stats() map[string]string {
	idx := fmt.Sprint(l.s.fsm.applied.Load())
	return map[string]string{"mode": "local", "state": "Leader", "last_log_index": idx, "commit_index": idx,
		"applied_index": idx, "fsm_applied_index": idx, "last_event_index": fmt.Sprint(l.s.fsm.lastEvent.Load())}
}
