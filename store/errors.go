package store

import (
	"errors"
	"fmt"
)

// Sentinel errors of the store. Callers test them with errors.Is; the store
// wraps them with %w and context (record kind, ID, file name).
var (
	// ErrNotFound: the named record does not exist.
	ErrNotFound = errors.New("store: not found")
	// ErrConflict: a compare-and-set update named a ResourceVersion other
	// than the record's current one, or a create named an existing ID.
	ErrConflict = errors.New("store: resource version conflict")
	// ErrInvalid: the record or argument is malformed (empty key, unknown
	// state, bad MAC, ...). The message says which field.
	ErrInvalid = errors.New("store: invalid argument")
	// ErrDuplicateMAC: a NIC MAC is already indexed to another machine.
	ErrDuplicateMAC = errors.New("store: MAC belongs to another machine")
	// ErrImageInUse: DeleteImage of an image that a machine's claim names
	// (release the machine first; Release drops its claim).
	ErrImageInUse = errors.New("store: image is named by a machine's claim")
	// ErrAddressTaken: BindLeases of an address another client holds
	// unexpired (or that is declined); the concrete error is
	// *AddressTakenError, naming the holder. Offer another address.
	ErrAddressTaken = errors.New("store: address held by another client")
	// ErrInconsistentDataDir: the data directory holds FSM state or
	// snapshots that its raft.db cannot account for (raft.db missing or
	// empty, a log whose start no snapshot covers, or an fsm.db ahead of
	// the log). Open refuses it and changes nothing; the message names the
	// files and the data directory and says how to recover.
	ErrInconsistentDataDir = errors.New("store: inconsistent data directory")
	// ErrNotLeader: this node is not the leader and the write could not be
	// forwarded. The concrete error is *NotLeaderError, naming the leader.
	ErrNotLeader = errors.New("store: not the leader")
	// ErrUnknownCommand: a log entry carries a command type this binary does
	// not know (written by a newer version). The FSM stops applying at it
	// (ErrFSMHalted), never skips it.
	ErrUnknownCommand = errors.New("store: unknown command type")
	// ErrFSMHalted: this node's FSM stopped applying the log at an entry
	// whose command type its binary does not know (*HaltError names the
	// entry); every later write or wait on this node fails with it. Upgrade
	// the node's binary and restart it: fsm.db is rebuilt from snapshot +
	// log and the entry applied.
	ErrFSMHalted = errors.New("store: FSM halted at a log entry this binary cannot apply")
	// ErrUnsupportedByCluster: a write needs a command type that some node
	// of the cluster does not understand yet (an older binary); the
	// concrete error is *UnsupportedByClusterError, naming the nodes.
	// Upgrade them; the write is accepted once they have re-registered.
	ErrUnsupportedByCluster = errors.New("store: command not supported by every node of the cluster")
	// ErrBadCommand: a log entry or forwarded body could not be decoded.
	ErrBadCommand = errors.New("store: malformed command")
	// ErrCorrupt: a data file (raft.db, fsm.db, a snapshot) is unreadable;
	// the message names the file.
	ErrCorrupt = errors.New("store: corrupt data file")
	// ErrClosed: the store has been closed.
	ErrClosed = errors.New("store: closed")
	// ErrTimeout: the write was not committed before ApplyTimeout.
	ErrTimeout = errors.New("store: timed out")
	// ErrUnauthenticated: a forward RPC request came without a client
	// certificate of the site CA (HTTP 401 "unauthenticated").
	ErrUnauthenticated = errors.New("store: unauthenticated")
	// ErrJoinToken: a join token was refused: unknown to this cluster,
	// already used, or expired (the message says which and what to do).
	ErrJoinToken = errors.New("store: join token refused")
	// ErrEnrollRefused: Enroll was refused by the cluster (ErrJoinToken's
	// reasons, or a bad request); retrying with the same token cannot help.
	ErrEnrollRefused = errors.New("join refused")
	// ErrCursorExpired: Events was asked for events after a cursor older
	// than the retained log (a CmdTrimEvents deleted some of them). The
	// concrete error is *CursorExpiredError, naming the oldest cursor still
	// served: resync from current state (machines, site status), then
	// follow the feed from that cursor.
	ErrCursorExpired = errors.New("store: event cursor older than the retained log")
	// ErrNoRaft: a raft-only operation (Join, Remove, JoinVia, Snapshot)
	// on a store opened with OpenLocal, which has no raft group. Open the
	// cluster's store with Open instead.
	ErrNoRaft = errors.New("store: local store (OpenLocal) has no raft")
)

// NotLeaderError is returned (wrapping ErrNotLeader) when a write or a
// consistent read reaches a follower that cannot forward it. LeaderID and
// LeaderRaftAddr are empty when no leader is known; LeaderForwardAddr is
// empty when the leader's forward address has not been registered.
type NotLeaderError struct {
	LeaderID          string
	LeaderRaftAddr    string
	LeaderForwardAddr string
	Cause             error // why forwarding failed; may be nil
}

func (e *NotLeaderError) Error() string {
	s := "store: not the leader"
	if e.LeaderID == "" {
		s += " (no leader known)"
	} else {
		s += fmt.Sprintf(" (leader %s raft=%s forward=%s)", e.LeaderID, e.LeaderRaftAddr, e.LeaderForwardAddr)
	}
	if e.Cause != nil {
		s += ": " + e.Cause.Error()
	}
	return s
}

// Unwrap makes errors.Is(err, ErrNotLeader) true.
func (e *NotLeaderError) Unwrap() error { return ErrNotLeader }

// Conflict is one value a machine of ImportMachines may not take because
// another machine holds it. Index is the machine's position in the import;
// Field is "name", "serial" (compared case-insensitively), "bmc_mac" or
// "macs" (a NIC MAC; NIC and BMC MACs share one space); Value is the
// value. The holder is a stored machine (Holder, its ID, and HolderName) or,
// when Holder is "", the earlier machine HolderIndex of the same import.
type Conflict struct {
	Index       int    `json:"index"`
	Field       string `json:"field"`
	Value       string `json:"value"`
	Holder      string `json:"holder,omitempty"`
	HolderName  string `json:"holder_name,omitempty"`
	HolderIndex int    `json:"holder_index"`
}

// ImportConflictError (wrapping ErrConflict) refuses an ImportMachines:
// every conflicting value, in import order. Nothing was written.
type ImportConflictError struct {
	Conflicts []Conflict
}

func (e *ImportConflictError) Error() string {
	if len(e.Conflicts) == 0 {
		return "store: import conflicts with stored machines"
	}
	c := e.Conflicts[0]
	s := fmt.Sprintf("store: import: machine %d: %s %q ", c.Index, c.Field, c.Value)
	if c.Holder != "" {
		s += fmt.Sprintf("belongs to machine %s", c.Holder)
	} else {
		s += fmt.Sprintf("is also on machine %d of this import", c.HolderIndex)
	}
	if n := len(e.Conflicts) - 1; n > 0 {
		s += fmt.Sprintf(" (and %d more conflicts)", n)
	}
	return s
}

// Unwrap makes errors.Is(err, ErrConflict) true.
func (e *ImportConflictError) Unwrap() error { return ErrConflict }

// CursorExpiredError (wrapping ErrCursorExpired) refuses Events(After):
// the events after After up to Oldest were trimmed. Oldest is the oldest
// cursor Events still serves completely (the events floor minus one).
type CursorExpiredError struct {
	After, Oldest uint64
}

func (e *CursorExpiredError) Error() string {
	return fmt.Sprintf("store: event cursor %d is older than the retained log: resync from current state, "+
		"then follow events after cursor %d", e.After, e.Oldest)
}

// Unwrap makes errors.Is(err, ErrCursorExpired) true.
func (e *CursorExpiredError) Unwrap() error { return ErrCursorExpired }
