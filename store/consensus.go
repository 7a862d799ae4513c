package store

import (
	"context"
	"encoding/json"

	"github.com/hashicorp/raft"
)

// consensus is what orders writes into the fsm and says who leads: raft
// (Open; raftConsensus) or the in-process local log (OpenLocal; localLog).
// Both hand each encoded command to the same fsm.ApplyBatch over fsm.db, so
// apply, CAS, transitions, events and ResourceVersions (the entry's index)
// are one code path; only the ordering and the durability differ.
type consensus interface {
	// commit prepares c (leader time, missing IDs), encodes it, gives it
	// the next log index, applies it to the fsm and returns that entry's
	// result (see applyResult). An error for which errors.Is(err,
	// raft.ErrNotLeader) holds means the entry was not enqueued and may be
	// retried elsewhere (raft only).
	commit(ctx context.Context, c *command) ([]json.RawMessage, []any, error)
	isLeader() bool
	leader() (id, raftAddr string)
	ready() bool
	barrier(ctx context.Context) error
	// stop ends ordering (Close): a commit in progress completes, later
	// ones fail with ErrClosed.
	stop() error
}

// raftConsensus is the consensus of a store opened with Open.
type raftConsensus struct{ s *Store }

func (r raftConsensus) commit(ctx context.Context, c *command) ([]json.RawMessage, []any, error) {
	return r.s.applyLocal(ctx, c)
}
func (r raftConsensus) isLeader() bool { return r.s.raft.State() == raft.Leader }
func (r raftConsensus) leader() (id, raftAddr string) {
	addr, sid := r.s.raft.LeaderWithID()
	return string(sid), string(addr)
}
func (r raftConsensus) ready() bool                       { return r.s.raftReady() }
func (r raftConsensus) barrier(ctx context.Context) error { return r.s.raftBarrier(ctx) }
func (r raftConsensus) stop() error                       { return r.s.raft.Shutdown().Error() }
